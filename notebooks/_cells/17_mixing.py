# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 17 · Mixing data sources by weight, the same on every rank
#
# **Time:** about 58 to 73 minutes with the predictions and the exercise (advanced track), the
# exercise alone 20 to 30 of them. Running the cells alone takes under a minute.
#
# Every pretraining run mixes sources (web, code, books...) by weight, and the mixture is where
# sharding, packing and resume meet. The libraries differ: HF `interleave_datasets` draws each
# sample's source at random; Grain's `mix` (which torchtitan's `DatasetMixConfig` uses, each DP
# rank mixing its own children) interleaves by integer proportions with no randomness;
# Megatron-LM's blending index is a greedy schedule, also without randomness; MosaicML
# streaming's stratified batching gives every global batch the same fixed counts. Three
# schedules run here side by side on real text: a random draw, Megatron's greedy rule, and a
# stratified batch of our own. They promise different things per batch, in tokens, on resume
# and at another world size.
#
# **Learning goals**
#
# - Measure each design's realized share against its target, per global batch and cumulative,
#   in samples and in tokens.
# - Show, by hashing the `(source, index)` stream, that a mixture computed from `(seed, step)`
#   alone is the same at dp 1, 2 and 4, with 0 or 2 workers, and after a resume; and find the
#   first position where per-rank sampling breaks that.
# - Say why packing before or after mixing changes the token shares.
# - Write a deterministic mixing loader and have it checked on real ranks.

# %%
# %matplotlib inline
import hashlib
import tempfile

import numpy as np
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data.groups import Layout
from ezpz_nb.data.mixture import (
    METHODS,
    MixedLoader,
    Mixture,
    cumulative_gap,
    realized_shares,
    schedule,
)
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.text import PadCollate, pack_rows, split_pieces, stdlib_corpus
from ezpz_nb.verify import check_layout_invariance, check_mixture, global_batches, ledger_stream
from ezpz_nb.wrapping import wrap_message

MAX_LEN, ROW, WORLD = 8192, 1024, 4  # longest sample (every document whole), packed row, ranks
GLOBAL, BATCHES = 16, 24  # samples per global batch, global batches in the epoch
WEIGHTS = (0.5, 0.3, 0.2)  # target share of each source, in samples
NAMES = ("short docs", "medium docs", "long docs")

# %% [markdown]
# ## Three sources of different document lengths
#
# The corpus of notebook 11: 64 files of the standard library, a BPE of 512 ids, every token
# in one memory-mapped file. We sort the documents by length and cut them into thirds: three
# "sources" whose samples (whole documents) have very different lengths, as chat turns, web
# pages and books do. A source smaller than its share of the epoch is repeated, in a new order
# each pass. One warm cluster of 4 ranks runs
# everything below.

# %%
cache = tempfile.TemporaryDirectory(prefix="ezpz-mix-")  # the token file; goes with the kernel
corpus, tokenizer = stdlib_corpus(cache.name)
rank_of = np.empty(corpus.num_docs, dtype=np.int64)
rank_of[np.argsort(corpus.lengths, kind="stable")] = np.arange(corpus.num_docs)
source_of_doc = rank_of * 3 // corpus.num_docs  # 0: shortest third ... 2: longest third
pieces = split_pieces(corpus, MAX_LEN)
by_source = [[p for p in pieces if source_of_doc[p[0]] == s] for s in range(3)]
SIZES = tuple(len(b) for b in by_source)
keyed = [p for b in by_source for p in b]  # key = offset of the source + index within it
key_tokens = np.array([e - s for _, s, e in keyed])
collate = PadCollate(corpus, keyed)
for s, b in enumerate(by_source):
    lens = [e - st for _, st, e in b]
    print(f"{NAMES[s]:>12}: {len(b):3d} samples, {np.mean(lens):6.0f} tokens each on average")
cluster = ez.Cluster(WORLD)  # stops with the kernel: a last cell closing it would end the exercise

# %% [markdown]
# ## 1. Three designs side by side
#
# `Mixture(sizes, weights, global_batch, method, seed).plan(n)` gives the `(source, index)` of
# every position of `n` global batches of 16 samples, by one of three schedules:
#
# - **multinomial**: each position draws its source at random with the weights as
#   probabilities (one generator per global batch, seeded by `(seed, batch)`);
# - **greedy**: Megatron-LM's rule as its `build_blending_indices` computes it (helpers.cpp):
#   sample `i` (from 0) goes to the source with the largest `weight * max(i, 1) - count`, ties
#   to the first source, no randomness;
# - **stratified**, ezpz_nb's own: each global batch gets `floor` or `ceil` of `weight * 16`
#   samples of each source (the extra ones to the sources furthest behind overall), in a
#   shuffled order. MosaicML's `batching_method="stratified"` is stricter and simpler: one
#   fixed count per source in every batch, blocks side by side, no shuffle (measured below).
#
# Which sample of a source comes next is the same in all three: a permutation per source and
# pass over it, seeded by `(seed, source, pass)`.
#
# **Predict:** (a) which design's share wanders from batch to batch, and by how much at most?
# (b) The long documents are 20% of the samples: roughly what share of the *tokens* are they?
#
# <details><summary>Answer</summary>
#
# (a) Only multinomial: at these weights the greedy and stratified shares stay within one
# sample of the target in every batch (the table gives the worst deviation of each); multinomial is off by a few
# samples in some batches and is right only on average, as the cumulative panels show. (b) Far
# more than 20%: a long-document sample holds several times the tokens of a short one, so a mix
# by samples is not a mix by tokens (the dashed lines, and the last column of the table).
#
# </details>

# %%
plans = {m: Mixture(SIZES, WEIGHTS, GLOBAL, m, seed=0).plan(BATCHES) for m in METHODS}
offsets = np.array(Mixture(SIZES, WEIGHTS, GLOBAL).offsets)
shares, worst = {}, {}
print(f"{'design':>12} | worst batch, samples | cumulative samples | cumulative tokens")
for m, plan in plans.items():
    src = plan[:, 0].reshape(BATCHES, GLOBAL)
    toks = key_tokens[offsets[plan[:, 0]] + plan[:, 1]].reshape(BATCHES, GLOBAL)
    shares[m] = {
        scope + unit: realized_shares(src, 3, amounts=amt, cumulative=scope == "cumulative")
        for scope in ("batch", "cumulative")
        for unit, amt in (("", None), ("_tokens", toks))
    }
    worst[m] = np.abs(shares[m]["batch"] - np.array(WEIGHTS)).max() * GLOBAL
    cum = " ".join(f"{x:.0%}" for x in shares[m]["cumulative"][-1])
    cum_t = " ".join(f"{x:.0%}" for x in shares[m]["cumulative_tokens"][-1])
    print(f"{m:>12} | {worst[m]:20.1f} | {cum:>18} | {cum_t:>17}")
assert worst["multinomial"] > 1 >= max(worst["greedy"], worst["stratified"])  # (a), measured
assert shares["stratified"]["cumulative_tokens"][-1][2] > 1.5 * WEIGHTS[2]  # (b), measured
viz.mix_shares(shares, WEIGHTS, NAMES, "realized share of each source against its target")


# %% [markdown]
# The same numbers as a verdict: `ezpz_nb.verify.check_mixture` holds a stream to a bound,
# per global batch or cumulative, in samples or tokens, and says pass, fail (with the first
# batch at fault, its `step`) or "not judged" (with why): a `Judgement`, what every judge of
# `ezpz_nb.verify` returns per rule (notebook 13's contract report is made of them too).

# %%
for m, plan in plans.items():
    stream = [list(map(tuple, plan[b * GLOBAL : (b + 1) * GLOBAL])) for b in range(BATCHES)]
    print(wrap_message(f"{m:>12}: {check_mixture(stream, WEIGHTS, bound=1)}"))
stratified_ok = check_mixture(
    [list(map(tuple, plans["stratified"][b * GLOBAL : (b + 1) * GLOBAL])) for b in range(BATCHES)],
    WEIGHTS,
    bound=1,
)
assert stratified_ok.passed

# %% [markdown]
# With 16 samples a batch and these weights, greedy and stratified give every batch the same
# counts; they differ in order (greedy interleaves the sources in a fixed pattern, stratified
# shuffles them) and in what they promise. Greedy steers the *cumulative* count of each source;
# nothing in it looks at batch boundaries.
#
# **Predict:** weights 0.9/0.05/0.05 in batches of 12. Does greedy keep every source within one
# sample of its target in every batch? And cumulatively, at the end of each batch?
#
# <details><summary>Answer</summary>
#
# Neither. Greedy gives each small source one sample in about every 20, with no regard for
# batch boundaries: some batches of 12 hold none (12 of source 0 where 10.8 are due, 1.2
# off), and at some batch ends the running count is 1.2 off too. Stratified holds the bound in
# both by construction. The next cell measures greedy's bound over every prefix of the stream.
#
# </details>

# %%
ODD = (0.9, 0.05, 0.05)
for m in ("greedy", "stratified"):
    odd = Mixture(SIZES, ODD, 12, m).plan(BATCHES)
    odd_stream = [list(map(tuple, odd[b * 12 : (b + 1) * 12])) for b in range(BATCHES)]
    per_batch = check_mixture(odd_stream, ODD, bound=1)
    print(f"{m}, weights {ODD}:")  # each verdict broken between words for the output column
    total = check_mixture(odd_stream, ODD, bound=1, per="cumulative")
    print(wrap_message(f"  per batch:  {per_batch}"))
    print(wrap_message(f"  cumulative: {total}"))
    assert per_batch.passed == (m == "stratified")

# %% [markdown]
# How far does Megatron's rule let a source stray, over every prefix of the stream and many
# weights? `cumulative_gap` measures it on the schedule this library builds (the rule above);
# the sweep draws 200 weight vectors of 2 to 7 sources. The last lines build MosaicML's
# counts for our weights (its `batching/stratified.py`): floor of `weight * 16`, the leftover
# samples to the largest remainders, the same counts in every batch, so a remainder is never
# paid back and the cumulative share drifts. Its batches also lay the sources' blocks side by
# side without shuffling: DP rank 0, reading the first slots, gets source 0 only.

# %%
draw = np.random.default_rng(0)
cases = [WEIGHTS, ODD, (0.2,) * 5]
cases += [tuple(draw.dirichlet(np.ones(k))) for k in draw.integers(2, 8, size=200)]
gaps = [cumulative_gap(schedule(w, BATCHES, GLOBAL, "greedy"), w) for w in cases]
print(f"greedy, cumulative gap: {gaps[0]:.2f} at {WEIGHTS}, {gaps[1]:.2f} at {ODD},")
print(f"  {gaps[2]:.2f} at 5 equal; worst of {len(cases)}: {max(gaps):.2f} samples")
assert 1 < max(gaps) < 2  # more than one sample, less than two: the bound, measured
w = np.array(WEIGHTS)
mosaic = np.floor(w * GLOBAL)
mosaic[np.argsort(-(w * GLOBAL - mosaic), kind="stable")[: GLOBAL - int(mosaic.sum())]] += 1
print(f"MosaicML's counts every batch: {mosaic.astype(int)}, shares {mosaic / GLOBAL} for {w}")
print(
    f"after {BATCHES} batches, source 1 is {(mosaic[1] - w[1] * GLOBAL) * BATCHES:.1f} samples over"
)


# %% [markdown]
# ## 2. The same stream at every layout
#
# `MixedLoader` gives DP rank `r` slots `r * m` to `(r + 1) * m - 1` of each global batch
# (`m = 16 / dp`), through a real `DataLoader` (with workers if asked), and its `state_dict()`
# is the number of global batches consumed. Each rank records its batches in a ledger, whose
# format 5 keeps which dataset every sample came from (`dataset_ids`). Below, the 4 ranks
# run it at dp 1, 2 and 4 (the other ranks of a replica are its TP peers), with 0 and 2 workers
# a rank, and once stopped after 10 global batches at dp 4 and resumed at dp 2; the global
# stream of `(source, index)` pairs is put back together from the ledgers
# (`ezpz_nb.verify.ledger_stream`: each step's DP leaders in DP-rank order) and hashed.
#
# **Predict:** will the hashes agree? And for a loader in which every DP rank draws its own
# sources with a seed of its own (`seed + rank`), where will dp 1 and dp 4 first differ?
#
# <details><summary>Answer</summary>
#
# The stratified mixture gives one hash at every layout and after the resume: every pair is a
# function of `(seed, position)`, and the DP rank only chooses which slots it reads. Per-rank
# sampling differs within the first global batch: at dp 4 rank 0 draws 4 sources and their
# indices from the generator that drew 16 at dp 1, and ranks 1-3 use other seeds altogether. The judge prints the first position where the two streams part.
#
# </details>


# %%
def mixed_run(mix, dp, workers, stop=None, resume_dp=None):
    """This rank's ledger records (one list per part: straight, or stopped then resumed)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = []
    state = None
    for d in (dp, resume_dp) if resume_dp else (dp,):
        tp = world // d
        lay = Layout(rank, world, rank // tp, d, rank % tp, tp)
        loader = MixedLoader(
            mix, collate, num_batches=BATCHES, dp_rank=lay.dp_rank, dp_size=d, num_workers=workers
        )
        if state is not None:
            loader.load_state_dict(state)
        with record(loader, lay, publish=False) as rec:
            for step, _ in enumerate(rec):
                if stop is not None and state is None and step + 1 == stop:
                    break  # a run that saves after its 10th step, then stops
        state = loader.state_dict()
        parts.append(rec.ledger().records)
    return parts


def gathered(results, part=0):
    """The global batches of (dataset_id, sample_id), from every rank's ledger of one part."""
    return ledger_stream(Ledger([rec for r in results for rec in r[part]]))


def fingerprint(stream):
    return hashlib.blake2b(repr(stream).encode(), digest_size=6).hexdigest()


mix = Mixture(SIZES, WEIGHTS, GLOBAL, "stratified", seed=0)
runs = {}
for dp in (1, 2, 4):
    for workers in (0, 2):
        runs[f"dp={dp}, {workers} workers"] = gathered(cluster.run(mixed_run, mix, dp, workers))
resumed = cluster.run(mixed_run, mix, 4, 0, 10, 2)
runs["dp=4 to step 10, resumed at dp=2"] = gathered(resumed, 0) + gathered(resumed, 1)
base = runs["dp=1, 0 workers"]
for name, stream in runs.items():
    verdict = check_layout_invariance(base, stream, names=("dp=1", name))
    print(f"{name:>34}: {fingerprint(stream)}  {sum(map(len, stream))} samples  {verdict.verdict}")
    assert verdict.passed
assert len({fingerprint(s) for s in runs.values()}) == 1


# %%
def per_rank_sampling(dp, seed=0):
    """The bug: each DP rank draws its own sources and samples, seeded by its DP rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // dp
    gen = torch.Generator().manual_seed(seed + rank // tp)
    m = GLOBAL // dp
    steps = []
    for _ in range(BATCHES):
        src = torch.multinomial(torch.tensor(WEIGHTS), m, replacement=True, generator=gen)
        idx = [int(torch.randint(SIZES[s], (1,), generator=gen)) for s in src.tolist()]
        steps.append([(s, int(offsets[s] + i)) for s, i in zip(src.tolist(), idx, strict=True)])
    return [steps if rank % tp == 0 else None]


def leaders_batches(results):
    """Global batches from the DP leaders' step lists, in DP-rank order."""
    return global_batches([r[0] for r in results if r[0] is not None])


naive = {dp: leaders_batches(cluster.run(per_rank_sampling, dp)) for dp in (1, 4)}
broken = check_layout_invariance(naive[1], naive[4], names=("dp=1", "dp=4"))
print(f"hashes {fingerprint(naive[1])} and {fingerprint(naive[4])}")
print(wrap_message(str(broken)))
assert broken.verdict == "fail" and broken.step == 0  # parted within the first global batch

# %% [markdown]
# The stratified stream hashed the same at every layout, and the judge found where per-rank
# sampling parts ways. Resume at another DP size works here because the state is a count of
# *global* batches, the same number on every rank. Megatron keeps a count of *samples*
# (`consumed_samples`), which also survives a change of the global batch size (its
# `rampup_batch_size` grows it during training); a count of batches does not, so
# `MixedLoader`'s state is valid only at the same global batch. Every epoch of a
# `MixedLoader` replays the same plan; give each epoch its own `seed` for a new order. A loader
# whose state is a position in a rank's own shard (torchdata's `StatefulDataLoader`,
# torchtitan, which refuses a DP change) has to be resumed at the same layout.
#
# ## 3. Packing before or after mixing
#
# Pretraining rows are packed: documents concatenated and cut into rows of a fixed length.
# Mix the samples first and pack the mixed stream, and each source's share of the tokens is its
# share of the samples times its samples' length. Pack each source into rows first and mix the
# *rows*, and every sample is a full row: the token shares are the weights.
#
# **Predict:** in which order do the token shares match the weights, and what does the other
# order give the long documents?
#
# <details><summary>Answer</summary>
#
# Pack, then mix: the rows are all 1024 tokens, so weights in rows are weights in tokens (to
# within the last, short row of each source). Mix, then pack: the long documents get far more
# than their 20% of the tokens, the short ones far less than their 50%. Neither is wrong: say which one a
# weight means (Grain's proportions, and so torchtitan's, and HF's probabilities count samples).
#
# </details>

# %%
row_sources = [pack_rows(by_source[s], ROW) for s in range(3)]  # pack each source first
rows_mix = Mixture(tuple(len(r) for r in row_sources), WEIGHTS, GLOBAL, "stratified").plan(BATCHES)
row_tokens = [np.array([sum(e - st for _, st, e in row) for row in rs]) for rs in row_sources]
before = np.bincount(rows_mix[:, 0], weights=[row_tokens[s][i] for s, i in rows_mix], minlength=3)
mixed = plans["stratified"]  # mix first: the samples of section 1, then packed in that order
after_pieces = [by_source[s][i] for s, i in mixed]
after_rows = pack_rows(after_pieces, ROW)
after = np.bincount(
    [source_of_doc[d] for row in after_rows for d, _, _ in row],
    weights=[e - st for row in after_rows for _, st, e in row],
    minlength=3,
)
print(f"{'source':>12} | target | pack, then mix | mix, then pack")
for s in range(3):
    print(
        f"{NAMES[s]:>12} | {WEIGHTS[s]:6.0%} | {before[s] / before.sum():14.1%} |"
        f" {after[s] / after.sum():14.1%}"
    )
assert abs(before / before.sum() - WEIGHTS).max() < 0.01  # rows of equal length: shares hold
assert after[2] / after.sum() > 1.5 * WEIGHTS[2] and after[0] / after.sum() < 0.75 * WEIGHTS[0]

# %% [markdown]
# ## Exercise: a deterministic mixing loader
#
# Write `mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)`: this DP rank's
# part of global batch `step`, a list of `global_batch // dp_size` pairs `(source, index)` with
# `0 <= index < sizes[source]`, rank `r` holding slots `r * m` to `(r + 1) * m - 1`. The checker
# calls it on 4 real ranks inside real DataLoader workers, at dp=1, dp=2 and dp=4 with 2 workers a
# rank, with the number of sources (2 to 5), their sizes and weights, the seed, the global batch
# and the number of global batches (32 to 64) drawn anew, and once more at dp=1 and dp=3 with a
# second, different global batch and number of sources (use the arguments: a batch size, a
# number of sources or a slot size of your own fits neither the one nor the other), and with the
# first case's sizes and batch but other weights, in the same process. It passes when the stream is the
# same at every layout, every source is within one sample of `weight * global_batch` in every
# global batch and within one sample of its target over all batches so far (more than MosaicML's
# stratified batching promises: the same rounding in every batch drifts), a source hands out
# every one of its samples once before any repeats, in a new shuffled order each pass (drawn
# afresh: not the pass before riffled, permuted or its samples renamed by a fixed map, rotated
# or not, nor drawing a sample of it again within a few draws of the seam), steps
# past those batches (to 1024, and two windows of 32 consecutive global batches from steps drawn
# between 2**16 and 2**17, with both cases) are each within one sample of their targets and
# replay no batches seen before, in each window the running totals and the passes hold for some
# count of draws before it that a right stream could have (within one sample of its target, its
# passes cut every `size` draws from step 0: the checker does not see the batches before a
# window, so it tries every such count), every seed gives its own samples (a seed that changes
# nothing gives every epoch the same order; 128 more seeds drawn at random must give 128
# different first batches), and a new Python process, with another string-hash salt and none of
# the ranks' state, computes the same batches (a restarted job must draw the same stream: seed
# with numbers, not `hash()` of a string, which Python salts per process); that process runs
# before the ranks and may not read `/tmp` or write any file, so a batch kept in a file for it
# does not count. It turns down
# per-rank sampling, a round-robin that ignores the weights, a generator copied into every
# worker, one order reused pass after pass, and an ignored seed. The steps between those asked,
# and past 2**17, are not seen: keep every rule at every step. Return a list (a generator cannot
# leave a DataLoader worker), and keep each source's running total between calls, under
# everything it depends on (the weights and the global batch, not the batch alone): replaying the
# quotas from step 0 on every call costs about half a second a call near step 10**5, and the
# windows ask 128 such steps; go on from the last step asked, so a process pays for the steps
# before its first call once. You may use numpy. The checker asks nothing of the order within a
# global batch: DDP averages the ranks' gradients, each a mean over a batch of the same size, so
# which slots a rank reads does not change the step. Shuffle within the batch anyway, as the
# solution does: what a rank computes alone (BatchNorm's statistics, a per-rank loss in the logs)
# sees only the sources in its slots, as with MosaicML's side-by-side blocks above.

# %% tags=["workshop"]
import ezpz_nb.workshop.mixture as ex


def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    raise NotImplementedError  # your code: the whole global batch from (seed, step), your slots


# %% tags=["workshop"]
ex.check_mix_batch(mix_batch, cluster=cluster)

# %% tags=["solutions"]
import ezpz_nb.workshop.mixture as ex

totals = {}  # (weights, global_batch): (a step, each source's draws before it), between calls


# Each source's draws before global batch `step`, and its quota in it: the floor of
# w * global_batch, the rest to the sources furthest behind over all batches so far.
def draws_before(w, global_batch, step):
    b, done = totals.get((w, global_batch), (0, (0,) * len(w)))
    b, done = (0, (0,) * len(w)) if b > step else (b, done)  # an earlier step: from step 0
    while True:  # from the last step asked: a process pays for the steps before it once
        quota = [int(x * global_batch) for x in w]
        upto = (b + 1) * global_batch  # draws up to the end of batch b
        behind = [x * upto - d - q for x, d, q in zip(w, done, quota, strict=True)]
        for s in sorted(range(len(w)), key=lambda s: -behind[s])[: global_batch - sum(quota)]:
            quota[s] += 1
        if b == step:
            totals[w, global_batch] = (step, done)
            return list(done), quota
        done, b = tuple(d + q for d, q in zip(done, quota, strict=True)), b + 1


def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    w = tuple(x / sum(weights) for x in weights)
    k, quota = draws_before(w, global_batch, step)
    rng = np.random.default_rng([seed, step])  # the order within the batch
    out = []
    for s in rng.permutation(np.repeat(np.arange(len(w)), quota)):
        n, size = k[s], sizes[s]
        perm = np.random.default_rng([seed, 1 + s, n // size]).permutation(size)
        out.append((int(s), int(perm[n % size])))  # a new order for every pass
        k[s] += 1
    m = global_batch // dp_size
    return out[dp_rank * m : (dp_rank + 1) * m]


# %% tags=["solutions"]
assert ex.check_mix_batch(mix_batch, cluster=cluster).passed

# %% [markdown]
# ## Summary
#
# - Sample by weight at random (HF `interleave_datasets`) and the mix is right only on
#   average: a global batch can be off by several samples. Megatron's greedy rule keeps every
#   source near its target cumulatively, under two samples (measured above, not within one);
#   our stratified batch keeps within one sample in every batch. Grain (and so torchtitan)
#   interleaves by integer proportions, and MosaicML's stratified batches repeat one fixed
#   count per source, whose cumulative share can drift from the weight.
# - A weight in samples is not a weight in tokens: sources of long documents get far more
#   tokens than their weight. Pack each source first and mix rows to make weights mean tokens.
# - Compute the mixture from `(seed, position)`, let the DP rank choose only which slots it
#   reads, and count resume state in global batches: the stream is then the same at every DP
#   size, worker count and resume, and a hash of it proves it.
# - Per-rank (or per-worker) random draws make the stream depend on the layout; the
#   layout-invariance judge names the first position where two layouts differ.
#
# On the learner's next machine: nothing here uses a collective, so NCCL changes nothing;
# under torchrun each rank builds its `MixedLoader` from its own DP rank and size (and several
# nodes only change those numbers). Save the loader state once: it is the same on every rank.
#
# The three designs, and what each promises on resume and at another world size:
# `docs/mixing.md`.
