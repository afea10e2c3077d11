# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Data-parallel sharding
#
# **Time:** 30 to 35 minutes with the predictions, then exercises 3 and 4 of `05_workshop`
# (20 to 25 minutes). Running the cells alone takes under a minute.
#
# In data parallelism (DP) every replica trains on **different** samples and the gradients are
# averaged. Who gets which sample is decided by `torch.utils.data.DistributedSampler`. This
# notebook runs it on 4 real ranks and records, in a *sample ledger*, which rank held which
# sample at which step.
#
# **Learning goals**
#
# - Shard a dataset over the DP group with `DistributedSampler(num_replicas=, rank=)`.
# - See what the sampler's `drop_last=False` (padding with duplicates) and `drop_last=True`
#   (dropped samples) do.
# - See why `sampler.set_epoch(epoch)` must be called every epoch.
# - See why hand-made sharding (`ds[rank::world]`) hangs training.

# %%
# %matplotlib inline
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, Subset

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record

# %% [markdown]
# ## The sampler, over the DP group
#
# Here all 4 ranks are DP replicas (no tensor parallelism yet: `tp_size=1`), so the DP group is
# the whole world. The dataset has 10 samples; each sample carries its own id in `"index"`, so
# the ledger can tell which sample a rank holds. `record(loader, layout)` wraps the loader and
# notes, per step, the sample ids of the batch.
#
# We start without shuffling, so the assignment is easy to read. `drop_last` here is the
# **sampler's** flag: what to do with samples that do not divide over the replicas. (The
# DataLoader has a `drop_last` of its own, for a short last *batch*; notebook 04 uses it.)


# %%
def one_epoch(drop_last, shuffle=False, num_samples=10):
    layout = make_layout(tp_size=1)
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=num_samples)
    sampler = DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=shuffle,
        drop_last=drop_last,
        seed=0,
    )
    loader = record(DataLoader(dataset, batch_size=1, sampler=sampler), layout)
    for _batch in loader:
        pass  # a training step would go here
    return loader.ledger()


padded = Ledger.from_results(ez.launch(one_epoch, False, world_size=4))
print(padded.summary())

# %% [markdown]
# ### The sampler's `drop_last=False`: padded with duplicates
#
# 10 samples do not divide over 4 replicas. Rank `r` takes every 4th sample starting at `r`.
#
# **Predict:** with `drop_last=False`, how many samples does each rank get, and which ones does
# rank 2 get?
#
# <details><summary>Answer</summary>
#
# 3 each. `DistributedSampler` rounds the shard size **up** (3 each, 12 slots) and fills the
# two extra slots by repeating the first samples: rank 2 gets `[2, 6, 0]` and rank 3 gets
# `[3, 7, 1]`, so samples 0 and 1 are trained on twice per epoch.
#
# </details>
#
# In the heatmap each row is a rank, each column a step, each cell the sample id; the repeats
# are framed in vermillion.

# %%
for r in padded.ranks():
    print(f"rank {r}: {padded.sample_ids(r, 0)}")
assert [padded.sample_ids(r, 0) for r in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
dup = [p for p in padded.check() if p.kind == "dp_duplicate"]
assert dup and dup[0].samples == (0, 1)
viz.heatmap(padded)

# %% [markdown]
# ### The sampler's `drop_last=True`: samples dropped
#
# **Predict:** with `drop_last=True`, which samples are never seen this epoch?
#
# <details><summary>Answer</summary>
#
# 8 and 9. The shard size is rounded **down** (2 each, 8 slots) and the tail is cut off before
# sharding.
#
# </details>
#
# The coverage plot shows, for each sample id, which DP replica saw it; 8 and 9 are marked as
# never seen.

# %%
dropped = Ledger.from_results(ez.launch(one_epoch, True, world_size=4))
print(dropped.summary())
assert [dropped.sample_ids(r, 0) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
never = [p for p in dropped.check() if p.kind == "never_seen"]
assert never and never[0].samples == (8, 9)
viz.coverage(dropped)


# %% [markdown]
# Neither is wrong, and both give every replica the same number of samples: padding keeps every
# sample (a few twice), dropping keeps none twice. With shuffling, *which* samples are repeated or dropped
# changes every epoch, so over many epochs nothing is lost for good. That needs `set_epoch`.
#
# ## `set_epoch`: forgotten versus called
#
# With `shuffle=True` the sampler permutes the indices with a generator seeded by
# `seed + epoch`. The epoch is whatever `set_epoch` last set, 0 by default, so if you never call
# it, every epoch gets **the same** order. Below, 16 samples over 4 replicas for 2 epochs, once
# without and once with `set_epoch`.
#
# **Predict:** without `set_epoch`, does epoch 1 repeat epoch 0 on every rank? With it, could a
# rank see the same order twice?
#
# <details><summary>Answer</summary>
#
# Without it, yes: the same seed gives the same permutation, so every rank repeats its order.
# With it, each epoch uses `seed + epoch`: a new permutation, the same on every rank (so the
# shards still split the data), different from one epoch to the next. Any numbering works, as
# long as every rank passes the same number and it changes every epoch.
#
# </details>


# %%
def two_epochs(call_set_epoch):
    layout = make_layout(tp_size=1)
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=16)
    sampler = DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        drop_last=True,
        seed=0,
    )
    loader = record(DataLoader(dataset, batch_size=2, sampler=sampler), layout)
    for epoch in range(2):
        if call_set_epoch:
            sampler.set_epoch(epoch)
        for _batch in loader:  # the ledger labels each pass with the next epoch number
            pass
    return loader.ledger()


forgot = Ledger.from_results(ez.launch(two_epochs, False, world_size=4))
called = Ledger.from_results(ez.launch(two_epochs, True, world_size=4))
for name, ledger in (("forgot set_epoch", forgot), ("called set_epoch", called)):
    same = all(ledger.sample_ids(r, 0) == ledger.sample_ids(r, 1) for r in ledger.ranks())
    print(f"{name}: epoch 1 repeats epoch 0 on every rank: {same}")

assert all(forgot.sample_ids(r, 0) == forgot.sample_ids(r, 1) for r in range(4))
assert all(called.sample_ids(r, 0) != called.sample_ids(r, 1) for r in range(4))

# %% [markdown]
# Without `set_epoch` the two epoch panels of the heatmap are identical, row for row:

# %%
viz.heatmap(forgot)

# %% [markdown]
# With `set_epoch` the second panel is a new permutation, and on every rank its order differs
# from the first:

# %%
viz.heatmap(called)


# %% [markdown]
# ## Hand-made sharding, and the hang it causes
#
# It is tempting to skip the sampler and slice: `dataset[rank::world]`. With 10 samples over 4
# ranks that gives ranks 0 and 1 **three** samples and ranks 2 and 3 **two**. In training, each
# step ends with a gradient `all_reduce` (DDP does this for you).
#
# **Predict:** which ranks hang, and in which call?
#
# <details><summary>Answer</summary>
#
# Ranks 0 and 1: at their third step they call `all_reduce`, but ranks 2 and 3 have run out of
# data and left the loop, so nobody answers. The ranks with **more** data are the ones that
# hang.
#
# </details>
#
# `timeout=5` turns that hang into an `ez.HangError`; the ledger records published before it
# still arrive, in `err.events`.


# %%
def train_hand_sharded():
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=10)
    my_share = Subset(dataset, range(rank, len(dataset), world))  # dataset[rank::world]
    loader = record(DataLoader(my_share, batch_size=1), make_layout(tp_size=1))
    for batch in loader:
        grad = batch["input_ids"].float().mean()
        dist.all_reduce(grad)  # stands in for DDP's gradient all_reduce
    return loader.ledger()


try:
    ez.launch(train_hand_sharded, world_size=4, timeout=5)
except ez.HangError as err:
    hang = err
    print(err)

# %% [markdown]
# The report shows ranks 0 and 1 blocked in `all_reduce` and ranks 2 and 3 finished. The
# timeline draws the steps each rank took: the bars of ranks 2 and 3 are one step shorter,
# and the ledger's check says so in words.

# %%
partial = Ledger.from_events(hang.events, num_samples=10)
print(partial.summary())
assert [hang.stacks[r].call for r in (0, 1)] == ["all_reduce", "all_reduce"]
assert [hang.stacks[r].state for r in (2, 3)] == ["finished", "finished"]
assert [len(partial.steps(r, 0)) for r in range(4)] == [3, 3, 2, 2]
assert any(p.kind == "step_mismatch" for p in partial.check())
viz.timeline(partial, error=hang)

# %% [markdown]
# ### With several epochs, the hang waits for the last one
#
# Training runs more than one epoch, and collectives pair up by **call order**, not by epoch.
# Run the same hand-made shards for 3 epochs; each step now gathers every rank's `(epoch, step)`
# (an `all_gather` in place of the gradient `all_reduce`, so we can see who met whom).
#
# **Predict:** in which epoch does the hang happen? And what meets rank 0's third step of epoch 0?
#
# <details><summary>Answer</summary>
#
# Only in the last epoch. Rank 0's extra collective of epoch 0 (its step 2) pairs with the
# **first** step of epoch 1 on ranks 2 and 3: no error, the steps of two epochs are silently
# averaged together, and the drift grows by one step per epoch. Ranks 2 and 3 run out of
# collectives after 3 x 2 = 6, while ranks 0 and 1 make 3 x 3 = 9: they hang in epoch 2, long
# after the damage was done.
#
# </details>


# %%
def train_hand_sharded_epochs(epochs=3):
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=10)
    my_share = Subset(dataset, range(rank, len(dataset), world))  # 3, 3, 2, 2 samples
    loader = record(DataLoader(my_share, batch_size=1), make_layout(tp_size=1))
    for epoch in range(epochs):
        for step, _batch in enumerate(loader):
            here = torch.tensor([epoch, step])
            everyone = [torch.zeros_like(here) for _ in range(world)]
            dist.all_gather(everyone, here)  # stands in for the gradient all_reduce
            met = [tuple(t.tolist()) for t in everyone]
            if rank == 0:
                ez.publish({"epoch": epoch, "step": step, "met": met})  # sent to the notebook
    return loader.ledger()


try:
    ez.launch(train_hand_sharded_epochs, world_size=4, timeout=5)
except ez.HangError as err:
    drift = err
meetings = [e.item for e in drift.events if isinstance(e.item, dict)]
for m in meetings:
    print(f"rank 0 at epoch {m['epoch']} step {m['step']} met (epoch, step) per rank: {m['met']}")
drifted = Ledger.from_events(drift.events, num_samples=10)
for epoch in range(3):
    print(f"epoch {epoch}: steps per rank {[len(drifted.steps(r, epoch)) for r in range(4)]}")

# %% [markdown]
# Each epoch's ledger shows the `step_mismatch` (3, 3, 2, 2 steps in epochs 0 and 1), yet only
# epoch 2 hung: the earlier epochs "worked", with mixed-up steps. The timeline draws the three
# epochs side by side.

# %%
assert {"epoch": 0, "step": 2, "met": [(0, 2), (0, 2), (1, 0), (1, 0)]} in meetings
assert [[len(drifted.steps(r, e)) for r in range(4)] for e in range(3)] == [
    [3, 3, 2, 2],
    [3, 3, 2, 2],
    [1, 1, 2, 2],  # ranks 0 and 1 hang in epoch 2, at their 7th collective
]
assert [drift.stacks[r].call for r in (0, 1)] == ["all_gather", "all_gather"]
assert {p.epoch for p in drifted.check() if p.kind == "step_mismatch"} == {0, 1, 2}
viz.timeline(drifted, error=drift)

# %% [markdown]
# ### Under torchrun, and on a GPU cluster
#
# Here the finished ranks stay alive (a notebook's ranks wait for the next cell), so the others
# wait until the collective timeout: 30 minutes on gloo and 10 on NCCL by default, 5 s here.
# Under torchrun a rank that finishes its script **exits**, and a gloo rank still waiting for it
# fails within seconds with `Connection closed by peer`, an error that names no step and no
# epoch. On NCCL, when the waiting rank notices depends on how the GPUs are connected; at worst
# it waits out the collective timeout. Either way, the error points at the wrong place: the
# cause is a step count that differed epochs earlier. The ledger (or one `all_reduce` of the
# step count at the end of each epoch) shows it in the first epoch.

# %% [markdown]
# ## Summary
#
# - `DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank)` gives each DP replica its
#   own shard; every replica gets the same number of samples.
# - The sampler's `drop_last=False` pads the last shards by repeating the first samples (0 and 1
#   twice here); its `drop_last=True` drops the remainder (8 and 9 here).
# - Call `sampler.set_epoch(epoch)` before each epoch, or every epoch repeats the same order.
# - Hand-made `ds[rank::world]` sharding gives uneven step counts: the ranks with more data wait
#   in a collective for ranks that have finished. Over several epochs the extra collectives
#   pair with the next epoch's first ones (steps silently mixed) and the hang comes only in the
#   last epoch; under torchrun it shows as `Connection closed by peer` (gloo) once the finished
#   ranks exit.
#
# Now do exercises 3 and 4 in `05_workshop.ipynb`.
#
# Next: **03 · TP leader broadcast**: when several ranks must see the *same* batch.
