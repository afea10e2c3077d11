# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · Real text on real ranks
#
# **Time:** 75 to 90 minutes with the predictions and the two exercises (advanced track).
# Running the cells alone takes under a minute.
#
# Every notebook so far fed tokens of one fixed length. Real pretraining and fine-tuning data is
# **documents** of wildly different lengths, and that is where distributed loading gets hard:
# padding wastes compute, token-budget batches give DP replicas different numbers of steps (the
# hang of notebook 04, now from real data), and packing removes the padding but lets attention
# cross from one document into the next unless the position ids and the mask say otherwise.
#
# **Learning goals**
#
# - Build a real corpus offline (the standard library's `.py` files), train a small BPE
#   tokenizer, tokenize once, and share the tokens with every rank through a memory map.
# - Measure what padding to the longest in a batch costs, per rank and step.
# - See token-budget batches hang DP replicas, and fix it two ways: plan globally and shard
#   *batches*, or agree on the step count. Say what each costs.
# - Pack documents into full rows, show a token of document B attending to document A, and
#   stop it with position ids that restart per document and a block-diagonal causal mask.
# - Measure the token imbalance between DP replicas, and send changing shapes through the TP
#   broadcast.

# %%
# %matplotlib inline
import pickle
import tempfile
import time

import torch
import torch.distributed as dist
from IPython.display import display
from torch.utils.data import DataLoader, DistributedSampler

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import TPBroadcastDataLoader
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.text import (
    IGNORE,
    PackedRows,
    PadCollate,
    budget_batches,
    check_documents,
    document_mask,
    plan_then_shard,
    shard_then_plan,
    split_pieces,
    stdlib_corpus,
)
from ezpz_nb.text.model import TinyLM
from ezpz_nb.wrapping import wrap_message

MAX_LEN, BUDGET, ROW, WORLD = 1024, 4096, 256, 4  # longest piece, padded tokens per batch,
# packed row length, ranks

# %% [markdown]
# ## A corpus every Python has
#
# The standard library ships its own source: a few hundred `.py` files, from a dozen lines to
# thousands. We take 64 of them, chosen evenly over the sorted names (no download, nothing
# copied into this repository; the text differs between Python versions, so this notebook
# checks properties, never content), train a byte-level BPE of 512 ids on them with HF
# `tokenizers` (about a second; without the package it falls back to one token per byte and
# says so), and write every token once to a `.npy` file, each document followed by an EOS id.
#
# Each rank opens that file with `numpy.load(mmap_mode="r")`: the pages live once in the
# operating system's cache and every rank maps the same ones, instead of each holding a copy.
# What travels to a rank is the file's path and the document offsets.

# %%
cache = tempfile.TemporaryDirectory(prefix="ezpz-text-")  # the token file; goes with the kernel
corpus, tokenizer = stdlib_corpus(cache.name)
print(tokenizer.note)
lengths = corpus.lengths
print(
    f"{corpus.num_docs} documents, {corpus.num_tokens} tokens, "
    f"{lengths.min()} to {lengths.max()} tokens each; {corpus.tokens.nbytes // 1024} KiB on disk"
)
sent = len(pickle.dumps(corpus))
print(f"what a rank receives: {sent} bytes (path and offsets), not the tokens")
assert sent * 10 < corpus.tokens.nbytes
assert lengths.max() > 10 * lengths.min()


def what_ranks_map(corpus):
    toks = corpus.tokens  # mapped here, in the rank
    return type(toks).__name__, toks.filename, int(toks[corpus.offsets[1] - 1])


mapped = ez.launch(what_ranks_map, corpus, world_size=WORLD)
print(mapped[0])
assert len(set(mapped)) == 1 and mapped[0][0] == "memmap" and mapped[0][2] == corpus.eos_id

# %% [markdown]
# ## 1. What padding costs
#
# A model sees rows of equal length, so a batch of documents is padded to its longest. Documents
# longer than the longest row we allow (1024 tokens here) are **split** into pieces of at most
# that: none is dropped (`split_pieces(..., overflow="reject")` raises instead, naming the
# document). Below, the lengths, then 4 DP replicas each taking batches of 8 pieces in random
# order (`DistributedSampler`), counting real and pad tokens at every step.
#
# **Predict:** roughly what share of each batch is padding?
#
# <details><summary>Answer</summary>
#
# A batch of 8 random pieces mixes long and short ones, so part of every batch is padding, and
# how much varies from step to step and rank to rank. The ranks measure it below (the title
# gives the share over the whole epoch); the bucketed batches of the next section cut it to
# less than half.
#
# </details>

# %%
pieces = split_pieces(corpus, MAX_LEN)
piece_len = [e - s for _, s, e in pieces]
print(f"{len(pieces)} pieces from {corpus.num_docs} documents")
viz.doc_lengths(lengths, MAX_LEN)


# %%
def pad_cost(corpus, pieces, plan=None):
    """Real and pad tokens of each step: random batches of 8, or this replica's part of `plan`."""
    layout = make_layout()
    ids, collate = range(len(pieces)), PadCollate(corpus, pieces)
    if plan is None:
        sampler = DistributedSampler(ids, layout.dp_size, layout.dp_rank, seed=0)
        loader = DataLoader(ids, batch_size=8, sampler=sampler, collate_fn=collate)
    else:
        loader = DataLoader(ids, batch_sampler=plan[layout.dp_rank], collate_fn=collate)
    return [(int(b["real_tokens"]), int(b["pad_tokens"])) for b in loader]


random_counts = dict(enumerate(ez.launch(pad_cost, corpus, pieces, world_size=WORLD)))
random_fig = viz.token_counts(random_counts, "random batches of 8")
random_fig

# %% [markdown]
# ## 2. Token budgets: less padding, unequal steps
#
# Sorting pieces by length before batching (length **bucketing**) puts similar lengths together,
# and a **token budget** (here 4096 padded tokens: 4 rows of 1024, or 30 rows of 136) keeps every
# batch about the same cost. Done naively, each DP replica takes its share of pieces (as
# `DistributedSampler` deals them) and plans its own batches, `shard_then_plan`. Each replica
# gets the same number of *pieces*, but how many *batches* they make depends on their lengths.
#
# **Predict:** each step ends in a gradient all-reduce over the DP replicas. What happens?
#
# <details><summary>Answer</summary>
#
# The replicas take different numbers of steps. The ones with fewer finish; the others wait in
# the all-reduce of their next step, forever without a timeout (30 minutes on gloo, 10 on NCCL
# by default; under torchrun the finished ranks exit and gloo fails within seconds with
# `Connection closed by peer`). Over several epochs it is silent until the last: the extra
# all-reduce pairs with the short replica's first step of the next epoch.
#
# </details>

# %%
planned = [len(shard_then_plan(piece_len, r, WORLD, BUDGET)) for r in range(WORLD)]
print("batches each replica plans for itself:", planned)


def budget_epoch(corpus, pieces, how):
    layout = make_layout()
    lengths = [e - s for _, s, e in pieces]
    if how == "global":  # fix 1: plan over the whole corpus, deal batches over DP
        batches = plan_then_shard(lengths, layout.dp_size, BUDGET)[layout.dp_rank]
    else:  # each replica plans its own shard
        batches = shard_then_plan(lengths, layout.dp_rank, layout.dp_size, BUDGET)
    if how == "agree":  # fix 2: everyone takes the smallest count
        n = torch.tensor(len(batches))
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=layout.dp_group)
        batches = batches[: int(n)]
    loader = DataLoader(
        range(len(pieces)), batch_sampler=batches, collate_fn=PadCollate(corpus, pieces)
    )
    steps = record(loader, layout)
    for batch in steps:
        grad = batch["real_tokens"].float()  # stands in for the gradient
        dist.all_reduce(grad, group=layout.dp_group)
    return steps.ledger()


try:
    ez.launch(budget_epoch, corpus, pieces, "local", world_size=WORLD, timeout=3)
except ez.HangError as err:
    hang = err
    print(err)

# %%
partial = Ledger.from_events(hang.events, num_samples=len(pieces))
fewest = min(planned)
assert len(set(planned)) > 1
for r in range(WORLD):
    # the longer replicas took one step more and wait inside its all-reduce
    assert len(partial.steps(r, 0)) == min(planned[r], fewest + 1)
    if planned[r] == fewest:
        assert hang.stacks[r].state == "finished", hang.stacks[r].describe()
    else:
        assert hang.stacks[r].call == "all_reduce", hang.stacks[r].describe()
viz.timeline(partial, error=hang)

# %% [markdown]
# ### Fix 1: plan globally, shard *batches*
#
# `plan_then_shard` buckets and batches the **whole** corpus (every rank computes the same plan
# from the same lengths, seed and epoch), shuffles the batches, and deals them round-robin over
# the replicas. Equal counts by construction. The cost: the `len(batches) % dp_size` batches
# left over are dropped this epoch (a different few each epoch).
#
# ### Fix 2: agree on the step count
#
# Keep each replica's own plan, but all-reduce the counts with `MIN` before the loop and stop
# there (notebook 04). The cost: every replica's batches beyond the smallest count are skipped
# this epoch. Fix 1 never drops more than `dp_size - 1` batches; fix 2 has no such bound (a
# replica that drew many short pieces can plan many more batches), and it needs counts that are
# true before the loop. Below, what each left unseen in this epoch, from the ledgers.

# %%
runs = {}
for how in ("global", "agree"):
    runs[how] = Ledger.from_results(
        ez.launch(budget_epoch, corpus, pieces, how, world_size=WORLD),
        num_samples=len(pieces),
    )
    steps = [len(runs[how].steps(r, 0)) for r in range(WORLD)]
    unseen = len(pieces) - len({i for rec in runs[how].records for i in rec.sample_ids})
    print(f"{how}: steps per rank {steps}, pieces never seen this epoch: {unseen}")
    assert len(set(steps)) == 1
    assert {p.kind for p in runs[how].check()} <= {"never_seen"}
global_plan = plan_then_shard(piece_len, WORLD, BUDGET)
dropped = len(pieces) - sum(len(b) for p in global_plan for b in p)
assert len(global_plan[0]) == len(runs["global"].steps(0, 0))
assert dropped == len(pieces) - len({i for rec in runs["global"].records for i in rec.sample_ids})
every_batch = budget_batches(piece_len, list(range(len(pieces))), BUDGET)
assert len(every_batch) - WORLD * len(global_plan[0]) < WORLD  # fix 1: fewer than dp_size
own = [shard_then_plan(piece_len, r, WORLD, BUDGET) for r in range(WORLD)]
surplus = sum(len(b) for plan in own for b in plan[fewest:])  # fix 2: each replica's surplus
assert surplus == len(pieces) - len({i for rec in runs["agree"].records for i in rec.sample_ids})

# %% [markdown]
# The pad share of the global plan, measured on the ranks, against the random batches above:

# %%
budget_counts = dict(enumerate(ez.launch(pad_cost, corpus, pieces, global_plan, world_size=WORLD)))
budget_fig = viz.token_counts(budget_counts, "token-budget batches, planned globally")
print(
    f"pad share: random batches {random_fig.ezpz_data['pad_share']:.1%}, "
    f"bucketed budget batches {budget_fig.ezpz_data['pad_share']:.1%}"
)
assert budget_fig.ezpz_data["pad_share"] < random_fig.ezpz_data["pad_share"] / 2
budget_fig

# %% [markdown]
# ## 3. Packing, and attention across documents
#
# Packing removes padding altogether: concatenate the documents (each ends with EOS) and cut the
# stream into rows of exactly 256 tokens; a document that does not fit continues in the next
# row. Rows are then samples like any other: `DistributedSampler` gives every replica the same
# number, so steps are equal too. `PackedRows` keeps, beside each token, its document id.
#
# **Predict:** in a plain causal model, can a token of the second document in a row attend to
# the first?
#
# <details><summary>Answer</summary>
#
# Yes: a causal mask lets every token see every earlier token of the row, whatever document it
# belongs to, and the position ids keep counting from the row's start, so document B's first
# token gets a position as if it continued document A.
#
# </details>

# %%
rows = PackedRows(corpus, ROW)
print(
    f"{len(rows)} rows of {ROW}; padding only in the last: {int(rows[len(rows) - 1]['pad_tokens'])}"
)
assert all(int(rows[i]["pad_tokens"]) == 0 for i in range(len(rows) - 1))
mixed = [i for i in range(len(rows)) if len(set(rows[i]["doc_ids"].tolist())) > 2][:6]
fig = viz.packed_rows(torch.stack([rows[i]["doc_ids"] for i in mixed]), f"rows {mixed}")
assert all(len(s) >= 2 for s in fig.ezpz_data["segments"])
fig


# %% [markdown]
# One epoch of packed rows on 4 DP replicas, recorded: equal steps, and, token by token, every
# document once. `PackedRows(multiple_of=4)` keeps a multiple of 4 rows so the sampler neither
# pads nor drops; the rows left out (fewer than 4) are the only tokens not seen, and
# `check_documents` (which maps each recorded row back to its pieces) names their documents.


# %%
def packed_epoch(corpus):
    layout = make_layout()
    rows = PackedRows(corpus, ROW, multiple_of=layout.dp_size)
    sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, seed=0)
    steps = record(DataLoader(rows, batch_size=4, sampler=sampler), layout)
    for batch in steps:
        dist.all_reduce(batch["real_tokens"].sum(), group=layout.dp_group)
    return steps.ledger()


packed_ledger = Ledger.from_results(ez.launch(packed_epoch, corpus, world_size=WORLD))
kept = PackedRows(corpus, ROW, multiple_of=WORLD)
problems = check_documents(packed_ledger, kept)
print(packed_ledger.summary())
print(f"left out: {len(rows) - len(kept)} rows, {kept.dropped_tokens} tokens")
for p in problems:
    print(wrap_message(p.message))  # broken between words for the output column
left_out = {d for row in rows.rows[len(kept) :] for d, _, _ in row}
assert len({len(packed_ledger.steps(r, 0)) for r in range(WORLD)}) == 1 and packed_ledger.ok
assert {p.kind: set(p.samples) for p in problems} == (
    {"doc_never_seen": left_out} if left_out else {}
)


# %% [markdown]
# The fix has two parts: **position ids that restart at 0** where each document starts in the
# row (`position_ids`), and a **block-diagonal causal mask**, `document_mask(doc_ids)`: query
# `i` sees key `j` only if `j <= i` and both are in the same document. (Flash-attention kernels
# take the same information as `cu_seqlens`, the cumulative document lengths of the packed row,
# instead of an L x L mask; torch's `flex_attention` takes it as a `mask_mod` function.)
#
# On each rank, a tiny one-layer attention model (same weights everywhere) runs its first packed
# row that holds two or more documents, then the same row with document A's tokens changed
# (same length). We compare document B's logits, bit for bit.


# %%
def leak(corpus, masked):
    layout = make_layout()
    rows = PackedRows(corpus, ROW)
    sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, seed=1)
    i = next(i for i in sampler if len(set(rows[i]["doc_ids"].tolist()) - {-1}) >= 2)
    row = {k: v.unsqueeze(0) for k, v in rows[i].items() if v.dim()}
    docs = row["doc_ids"][0]
    a, b = int(docs[0]), int(docs[docs >= 0][-1])  # first and last document of the row
    changed = row["input_ids"].clone()
    changed[0, docs == a] = (changed[0, docs == a] + 1) % corpus.vocab_size
    model = TinyLM(corpus.vocab_size, ROW)
    pos = row["position_ids"] if masked else None
    mask = document_mask(row["doc_ids"]) if masked else None
    with torch.no_grad():
        before = model(row["input_ids"], pos, mask)[0, docs == b]
        after = model(changed, pos, mask)[0, docs == b]
    return i, corpus.names[a], corpus.names[b], torch.equal(before, after)


for masked in (False, True):
    out = ez.launch(leak, corpus, masked, world_size=WORLD)
    for rank, (i, a, b, same) in enumerate(out):
        print(f"mask={masked} rank {rank}: row {i}, change {a} -> {b}'s logits identical: {same}")
    assert all(same is masked for *_, same in out)

# %% [markdown]
# Without the mask, changing document A changed document B's logits on every rank: B's tokens
# attend to A. With it, B's logits are bit-identical: B sees nothing of A. (The check changes A
# without changing its length. Changing its length would also move B within the row; with the
# restarted position ids, B's inputs would be the same, but the sums inside attention would run
# in a different order, so "identical" would then mean equal up to rounding.)
#
# Below, the loss of a short DP training run on 4 ranks, with and without the mask. Nothing is
# asserted on the curves: which is lower depends on the data and the seed (without the mask the
# model can use context from the previous document, or be confused by it), and over a dozen
# steps of a tiny model they may hardly differ. The leak is about what a token's prediction
# depends on, which the check above shows exactly; a loss curve is a blunt instrument for it.


# %%
def train(corpus, masked, steps=12):
    layout = make_layout()
    rows = PackedRows(corpus, ROW)
    sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, seed=2)
    loader = DataLoader(rows, batch_size=4, sampler=sampler, drop_last=True)
    model = TinyLM(corpus.vocab_size, ROW)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _, batch in zip(range(steps), loader, strict=False):
        pos = batch["position_ids"] if masked else None
        mask = document_mask(batch["doc_ids"]) if masked else None
        logits = model(batch["input_ids"], pos, mask)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # DDP's gradient all-reduce, by hand
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= layout.dp_size
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / layout.dp_size)
    return losses


curves = {
    name: ez.launch(train, corpus, masked, world_size=WORLD)[0]
    for name, masked in (("no mask (leaks)", False), ("document mask", True))
}
viz.loss_curves(curves)

# %% [markdown]
# ## 4. Tokens per replica: who computes longest
#
# Equal step counts do not mean equal work. With budget batches, one replica may hold 4000 real
# tokens while another holds 3000 in the same step: its attention and its loss cover fewer
# tokens, it finishes first and waits in the all-reduce. And the **global batch in tokens**
# (the sum over replicas) changes from step to step; how much each of those tokens weighs in the
# update depends on how the loss is normalized (the end of this section).
# `plan_then_shard(..., balance=True)` sorts the batches by real tokens and gives the
# replicas of one step neighbouring batches. (It also puts the small batches into the same
# steps, so the global batch in tokens can vary *more* from step to step: compare the ranges.)
#
# **Predict:** does balancing change how many batches each replica takes?


# %%
def step_tokens(corpus, pieces, balance):
    layout = make_layout()
    lengths = [e - s for _, s, e in pieces]
    plan = plan_then_shard(lengths, layout.dp_size, BUDGET, balance=balance)
    collate = PadCollate(corpus, pieces)
    loader = DataLoader(range(len(pieces)), batch_sampler=plan[layout.dp_rank], collate_fn=collate)
    steps, global_batch = record(loader, layout), []
    for batch in steps:  # the ledger keeps each step's real and pad tokens (format 4)
        real = batch["real_tokens"].reshape(1).float()
        dist.all_reduce(real, group=layout.dp_group)  # the global batch, in real tokens
        global_batch.append(int(real))
    return steps.ledger(), global_batch


spreads = {}
for balance in (False, True):
    out = ez.launch(step_tokens, corpus, pieces, balance, world_size=WORLD)
    ledger = Ledger.from_results([o[0] for o in out], num_samples=len(pieces))
    fig = viz.token_counts(ledger, f"balance={balance}")
    spreads[balance] = fig.ezpz_data["spread"]
    global_batch = out[0][1]
    steps = [len(ledger.steps(r, 0)) for r in range(WORLD)]
    print(f"balance={balance}: steps {steps}, mean spread between replicas", end=" ")
    print(f"{spreads[balance].mean():.0f} tokens,")
    print(f"  global batch {min(global_batch)} to {max(global_batch)} real tokens")
    assert len({len(ledger.steps(r, 0)) for r in range(WORLD)}) == 1
    assert global_batch == fig.ezpz_data["real"].sum(axis=0).tolist()
    display(fig)
assert spreads[True].mean() < spreads[False].mean()


# %% [markdown]
# It does not: balancing only pairs batches differently, so the counts stay equal. Packed rows
# are balanced **in tokens** by construction (every full row holds 256 real tokens), which is
# one reason large-scale pretraining packs. They are not balanced in attention work: with the
# kernels that skip what the document mask hides (flash-attention's varlen kernels,
# `flex_attention`), a document of n tokens costs about n² in attention, so a row's cost
# follows the sum of its documents' squared lengths, and a row of one long document costs more
# than a row of many short ones (measured below). A dense L x L mask, as this tiny model
# takes, costs every row the same and wastes the rest.
#
# ### The loss the optimizer sees: per token, over the whole step
#
# `train` in section 3 does what most first scripts (and DDP with `loss.mean()`) do: each rank
# takes the **mean over its own tokens**, and the gradient all-reduce averages the ranks. A
# token on a replica with fewer labelled tokens then weighs more than one on a replica with
# more. The loss of a language model is meant per token over the whole step: **the sum of the
# per-token losses divided by the step's global token count**, the count all-reduced over the
# DP replicas before the backward pass. With gradient accumulation (several micro-batches per
# optimizer step), the count covers every micro-batch of the step: each micro-batch's
# `loss_sum / global_tokens` goes into `backward()`, the gradients add up, and the all-reduce
# must **sum** them (no division by the number of ranks). DDP and FSDP average the gradients
# by default: multiply that loss by the number of DP ranks to undo their division.
#
# **Predict:** on packed rows every row holds 256 tokens. Do the two normalizations differ?
# And on budget batches?
#
# <details><summary>Answer</summary>
#
# Barely. The labels stop at each piece's end (its last token predicts nothing), so a row's
# labelled tokens are 256 minus its number of pieces, and replicas differ by a token or two a
# step. The cell also runs section 2's budget batches, where a replica can hold a thousand
# labelled tokens fewer than another in the same step; read the weights and the differences.
#
# </details>


# %%
def loss_two_ways(corpus, pieces, packed, steps=3, accum=2):
    """Per optimizer step: the mean of per-rank means, and the global per-token mean."""
    layout = make_layout()
    if packed:
        rows = PackedRows(corpus, ROW)
        sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, seed=3)
        loader = DataLoader(rows, batch_size=2, sampler=sampler, drop_last=True)
    else:  # section 2's budget batches, planned globally and dealt over the replicas
        plan = plan_then_shard([e - s for _, s, e in pieces], layout.dp_size, BUDGET)
        collate = PadCollate(corpus, pieces)
        loader = DataLoader(
            range(len(pieces)), batch_sampler=plan[layout.dp_rank], collate_fn=collate
        )
    batches, model, out = iter(loader), TinyLM(corpus.vocab_size, MAX_LEN), []
    for _ in range(steps):
        micro = [next(batches) for _ in range(accum)]  # one optimizer step = accum micro-batches
        tokens = sum((b["labels"] != IGNORE).sum() for b in micro).float()  # this rank's, all micro
        global_tokens = tokens.clone()
        dist.all_reduce(global_tokens, group=layout.dp_group)  # before any backward
        loss_sum = torch.zeros(())
        for b in micro:
            mask = document_mask(b["doc_ids"]) if packed else None  # padded rows: plain causal
            logits = model(b["input_ids"], b.get("position_ids"), mask)
            summed = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), b["labels"].flatten(), reduction="sum"
            )  # labels IGNORE (-100) are left out, as cross_entropy's default ignore_index
            (summed / global_tokens).backward()  # gradients add up over the micro-batches
            loss_sum += summed.detach()
        for p in model.parameters():  # SUM, not the mean: the division was by global_tokens
            dist.all_reduce(p.grad, group=layout.dp_group)
            p.grad = None  # (no optimizer here: only the numbers are compared)
        per_rank = torch.stack([loss_sum / tokens, tokens])  # this rank's mean, and its weight
        gathered = [torch.zeros(2) for _ in range(layout.dp_size)]
        dist.all_gather(gathered, per_rank, group=layout.dp_group)
        global_sum = loss_sum.clone()
        dist.all_reduce(global_sum, group=layout.dp_group)
        means, counts = torch.stack(gathered).T
        out.append((means.mean().item(), (global_sum / global_tokens).item(), counts.tolist()))
    return out


gaps = {}
for packed in (True, False):
    two_ways = ez.launch(loss_two_ways, corpus, pieces, packed, world_size=WORLD)[0]
    print("packed rows:" if packed else "budget batches:")
    for step, (mean_of_means, per_token, counts) in enumerate(two_ways):
        # Short lines: one long line would wrap mid-word in a notebook's output column.
        print(
            f"  step {step}: labelled tokens per replica {[int(c) for c in counts]}\n"
            f"    in the mean of rank means a token of the smallest weighs "
            f"{max(counts) / min(counts):.2f}x one of the largest\n"
            f"    mean of rank means {mean_of_means:.5f}, per-token mean {per_token:.5f}, "
            f"difference {per_token - mean_of_means:+.1e}"
        )
        assert len(set(counts)) == 1 or mean_of_means != per_token
    gaps[packed] = max(abs(per_token - m) for m, per_token, _ in two_ways)
print(f"largest difference: packed rows {gaps[True]:.1e}, budget batches {gaps[False]:.1e}")

# %% [markdown]
# The losses differ little here because this model is untrained: its loss is about the same on
# every token, so weighing tokens differently hardly moves the mean. What differs is the
# **weight** of each token in the gradient, printed per step: on the budget step where one
# replica holds fewer labelled tokens, each of its tokens counts more than a token elsewhere.
# In training, where some replicas hold harder text than others, that bias moves the update.
#
# With gradient accumulation the per-rank habit compounds: dividing each micro-batch's mean by
# the number of micro-batches weighs a micro-batch of few tokens like one of many. The global
# count fixes both at once, and it costs one all-reduce of a single number per step, before the
# backward pass. Below, the attention work of packed rows: the sum of squared document lengths
# per row, from the rows' `doc_ids`.

# %%
work = []
for i in range(len(rows) - 1):  # the last row holds padding
    _, lengths = torch.unique(rows[i]["doc_ids"], return_counts=True)
    work.append(int((lengths.long() ** 2).sum()))
print(f"{len(work)} rows of {ROW} tokens: attention work (sum of squared document lengths)")
print(f"  from {min(work)} to {max(work)}, {max(work) / min(work):.1f}x apart")
assert max(work) <= ROW**2 and min(work) >= ROW
#
# ## 5. The TP broadcast with changing shapes
#
# With tensor parallelism only the TP leader loads and broadcasts each batch to its peers
# (notebook 03). Budget batches change shape every step (4 x 1024, then 30 x 136...), so the
# broadcast must send the shapes first. `TPBroadcastDataLoader` does: each step its header
# carries the shapes, then one flat tensor carries the bytes. Below, 2 DP replicas of 2 TP ranks.
#
# **Predict:** do the peers receive the same bytes as their leader, at every step?


# %%
def tp_epoch(corpus, pieces, fixed):
    layout = make_layout(tp_size=2)
    lengths = [e - s for _, s, e in pieces]
    batches = plan_then_shard(lengths, layout.dp_size, BUDGET)[layout.dp_rank]
    if fixed:  # batches of 4 full pieces: one shape, the budget's bytes
        full = [i for i, n in enumerate(lengths) if n == MAX_LEN]
        batches = [full[j : j + 4] for j in range(4 * layout.dp_rank, len(full) - 3, 8)]
    collate = PadCollate(corpus, pieces)
    # Loaded up front, so the time below is the broadcast's, not the collate's.
    ready = [collate(b) for b in batches] if layout.tp_rank == 0 else []
    steps = record(TPBroadcastDataLoader(ready, layout.tp_group), layout)
    shapes, start = [], time.perf_counter()
    for batch in steps:
        shapes.append(tuple(batch["input_ids"].shape))
    return steps.ledger(), shapes, (time.perf_counter() - start) / max(1, len(shapes))


per_step = {}
for fixed in (False, True):
    out = ez.launch(tp_epoch, corpus, pieces, fixed, world_size=WORLD)
    tp_ledger = Ledger.from_results([o[0] for o in out], num_samples=len(pieces))
    assert out[0][1] == out[1][1] and out[2][1] == out[3][1]
    assert (len(set(out[0][1])) == 1) is fixed  # the shapes changed, or not
    assert "tp_mismatch" not in {p.kind for p in tp_ledger.check()}
    for leader, peer in ((0, 1), (2, 3)):
        assert [s.digest for s in tp_ledger.steps(leader, 0)] == [
            s.digest for s in tp_ledger.steps(peer, 0)
        ]
    per_step[fixed] = (out[1][2] + out[3][2]) / 2
    print(f"fixed={fixed}: the shapes a peer received: {sorted(set(out[1][1]))}")
print(
    f"per step on the peers: {1e3 * per_step[False]:.2f} ms with changing shapes, "
    f"{1e3 * per_step[True]:.2f} ms with one shape"
)

# %% [markdown]
# Every step, each peer held exactly the bytes its leader loaded (equal digests in the ledger),
# whatever the shape. What changing shapes cost: `TPBroadcastDataLoader` sends one buffer per
# step while the shapes stay the same, and when they change, a second broadcast with the new
# shapes (pickled) first. The times above are one run on a busy machine, so read them as an
# order of magnitude, not a verdict. With `torch.compile`, the first new shape triggers one
# recompile, which marks the dimensions that changed as dynamic (automatic dynamic shapes);
# later shapes reuse that graph. CUDA graphs (`mode="reduce-overhead"`) are recorded per shape,
# so there every new shape costs a new recording, and kernels tuned for one shape lose on
# others: one reason packed rows of one fixed shape are the usual choice on GPUs.

# %% [markdown]
# ## Exercises
#
# ### 1. A packing collate
#
# Write `pack(docs, row_len)`: `docs` is a list of 1-D int64 token tensors; return a dict with
# `input_ids` and `position_ids` (`rows x row_len`, padding id `0`) and `mask` (`rows x row_len x
# row_len`, True where a query may attend to a key). The checker deals 24 documents of fresh
# random lengths (some three rows long) over 4 ranks; each rank packs them in calls of 1 to 6
# documents, drawn (read `len(docs)`, never assume one), at two row lengths drawn anew (call by
# call: read `row_len`, never assume one). It passes when
# no token attends to another document, to padding or to a later token, every earlier token of
# its own document is visible, position ids count from where each document starts in the row
# (or go on counting for a document continued from the previous row), each call has less than
# one row of padding and enough rows for its tokens (`ceil(tokens / row_len)`: a last row less
# than half full is still a row), and every token of every document is in exactly one row over
# the epoch. Two documents of a call may have the same length, and share token ids (as words
# recur over texts): tell them apart by which tensor a token came from, not by its length or ids.
# Building the mask from document ids with `document_mask` (used above) is fine: the packing and
# the positions are the exercise.

# %% tags=["workshop"]
import ezpz_nb.workshop.exercises as ex


def pack(docs, row_len):
    raise NotImplementedError  # your code: rows, position ids and a block-diagonal causal mask


# %% tags=["workshop"]
ex.check_pack(pack)

# %% tags=["solutions"]
import ezpz_nb.workshop.exercises as ex


def pack(docs, row_len):
    tokens = torch.cat(docs)
    doc = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])
    rows = -(-len(tokens) // row_len)
    pad = rows * row_len - len(tokens)
    input_ids = torch.cat([tokens, torch.zeros(pad, dtype=torch.int64)]).view(rows, row_len)
    doc = torch.cat([doc, torch.full((pad,), -1)]).view(rows, row_len)
    # a segment starts at each row's first token and wherever the document changes
    start = torch.ones_like(doc, dtype=torch.bool)
    start[:, 1:] = doc[:, 1:] != doc[:, :-1]
    col = torch.arange(row_len).expand(rows, row_len)
    seg_start = torch.cummax(torch.where(start, col, 0), dim=1).values
    position_ids = col - seg_start
    same = (doc.unsqueeze(-1) == doc.unsqueeze(-2)) & (doc >= 0).unsqueeze(-1)
    mask = same & torch.ones(row_len, row_len, dtype=torch.bool).tril()
    return {"input_ids": input_ids, "position_ids": position_ids, "mask": mask}


# %% tags=["solutions"]
assert ex.check_pack(pack).passed

# %% [markdown]
# ### 2. A token-budget plan that keeps steps equal
#
# Write `plan_batches(lengths, dp_rank, dp_size, budget)`: this replica's batches, each a list
# of document ids with `len(batch) * longest <= budget`. The checker draws two cases (the DP
# size, the budget, 160 to 720 documents), runs each on real ranks, one of them with two TP ranks
# per DP replica (so `dp_rank` and `dp_size` are not the global rank and world size, and TP peers
# must plan the same batches), and each step of your plan ends in an all-reduce over all ranks. It passes when every replica has the same number of batches, no
# document is planned twice, no more is left out than equal counts need, and the batches are
# about as full, and as little padded, as batches sorted by length over the same documents,
# and sorted the same way: sort the whole shard (or corpus) by length, exactly (not small pools
# of it, nor buckets of similar lengths shuffled within).
# Either fix of section 2 passes (a count fixed in advance does not, nor one each replica works
# out alone, such as the global plan's batches // dp_size); you may call collectives inside. Section 2's `plan_then_shard` and `shard_then_plan` are those fixes: calling one passes
# (the checker judges the plan, not who wrote it), writing it yourself is the exercise.


# %% tags=["workshop"]
def plan_batches(lengths, dp_rank, dp_size, budget):
    raise NotImplementedError  # your code: a list of batches (lists of document ids)


# %% tags=["workshop"]
ex.check_budget_plan(plan_batches)


# %% tags=["solutions"]
def plan_batches(lengths, dp_rank, dp_size, budget):
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches = [[]]
    for i in order:  # longest first: a batch's first document is its longest
        if batches[-1] and (len(batches[-1]) + 1) * lengths[batches[-1][0]] > budget:
            batches.append([])
        batches[-1].append(i)
    steps = len(batches) // dp_size  # the same plan on every rank; deal whole batches
    return batches[: steps * dp_size][dp_rank::dp_size]


# %% tags=["solutions"]
assert ex.check_budget_plan(plan_batches).passed

# %% [markdown]
# ## Summary
#
# - The standard library is a real corpus on every machine; tokenize once, write one file, and
#   let every rank memory-map it (only a path and offsets travel).
# - Padding to the longest in a batch wastes a large, variable share of every step; bucketing
#   by length with a token budget cuts it.
# - Token-budget batches planned per replica give unequal step counts and hang the next
#   collective. Plan globally and deal *batches* over DP (drops fewer than `dp_size` batches per
#   epoch), or agree on the count with `all_reduce(MIN)` (skips each replica's surplus).
# - Packing fills every row, but a causal mask lets tokens attend across documents. Restart the
#   position ids per document and use a block-diagonal causal mask (`cu_seqlens` in flash
#   attention): document B's logits then do not depend on document A, bit for bit.
# - Equal steps are not equal work: real tokens per replica differ per step unless the plan
#   balances them or the rows are packed; packed rows still differ in attention work (the sum
#   of squared document lengths).
# - Normalize the training loss per token over the whole step: the sum of per-token losses
#   divided by the global token count (all-reduced before the backward, over every
#   micro-batch of an accumulated step), and sum the gradients (under DDP or FSDP, which
#   average them, multiply that loss by the number of DP ranks).
# - The TP broadcast carries changing shapes in its header; peers receive identical bytes.
#
# The same packed pipeline runs under torchrun and writes one ledger per rank, with the
# documents of every row:
#
# ```
# python -m torch.distributed.run --standalone --nproc_per_node=4 \
#     -m ezpz_nb.examples.packed --tp-size 2 --out /tmp/packed_ledger --check
# ```
#
# Next: **12 · Throughput**.
