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
# In data parallelism (DP) every replica trains on **different** samples and the gradients are
# averaged. Who gets which sample is decided by `torch.utils.data.DistributedSampler`. This
# notebook runs it on 4 real ranks and records, in a *sample ledger*, which rank held which
# sample at which step.
#
# **Learning goals**
#
# - Shard a dataset over the DP group with `DistributedSampler(num_replicas=, rank=)`.
# - See what `drop_last=False` (padding with duplicates) and `drop_last=True` (dropped samples) do.
# - See why `sampler.set_epoch(epoch)` must be called every epoch.
# - See why hand-made sharding (`ds[rank::world]`) hangs training.

# %%
# %matplotlib inline
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
# We start without shuffling, so the assignment is easy to read.

# %%
def one_epoch(drop_last, shuffle=False, num_samples=10):
    layout = make_layout(tp_size=1)
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=num_samples)
    sampler = DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank,
                                 shuffle=shuffle, drop_last=drop_last, seed=0)
    loader = record(DataLoader(dataset, batch_size=1, sampler=sampler), layout)
    for _batch in loader:
        pass  # a training step would go here
    return loader.ledger()


padded = Ledger.from_results(ez.launch(one_epoch, False, world_size=4))
print(padded.summary())

# %% [markdown]
# ### `drop_last=False`: padded with duplicates
#
# 10 samples do not divide over 4 replicas. `DistributedSampler` rounds the shard size **up**
# (3 each, 12 slots) and fills the two extra slots by repeating the first samples. Rank 2 gets
# `[2, 6, 0]` and rank 3 gets `[3, 7, 1]`: samples 0 and 1 are trained on twice per epoch. In the
# heatmap each row is a rank, each column a step, each cell the sample id; the repeats are
# marked.

# %%
for r in padded.ranks():
    print(f"rank {r}: {padded.sample_ids(r, 0)}")
assert [padded.sample_ids(r, 0) for r in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
dup = [p for p in padded.check() if p.kind == "dp_duplicate"]
assert dup and dup[0].samples == (0, 1)
viz.heatmap(padded)

# %% [markdown]
# ### `drop_last=True`: samples dropped
#
# Now the shard size is rounded **down** (2 each, 8 slots): samples 8 and 9 are never seen in
# this epoch. The coverage plot shows, for each sample id, which DP replica saw it; 8 and 9 are
# marked as never seen.

# %%
dropped = Ledger.from_results(ez.launch(one_epoch, True, world_size=4))
print(dropped.summary())
assert [dropped.sample_ids(r, 0) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
never = [p for p in dropped.check() if p.kind == "never_seen"]
assert never and never[0].samples == (8, 9)
viz.coverage(dropped)


# %% [markdown]
# Neither is wrong: padding keeps every sample (a few twice), dropping keeps every replica's
# step count equal with no repeats. With shuffling, *which* samples are repeated or dropped
# changes every epoch, so over many epochs nothing is lost for good. That needs `set_epoch`.
#
# ## `set_epoch`: forgotten versus called
#
# With `shuffle=True` the sampler permutes the indices with a generator seeded by
# `seed + epoch`. The epoch is whatever `set_epoch` last set, 0 by default, so if you never call
# it, every epoch gets **the same** order. Below, 16 samples over 4 replicas for 2 epochs, once
# without and once with `set_epoch`.

# %%
def two_epochs(call_set_epoch):
    layout = make_layout(tp_size=1)
    dataset = RandomTokenDataset(vocab_size=100, seq_length=4, num_samples=16)
    sampler = DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank,
                                 shuffle=True, drop_last=True, seed=0)
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
# step ends with a gradient `all_reduce` (DDP does this for you). At step 3 ranks 0 and 1 call
# `all_reduce`, but ranks 2 and 3 have run out of data and left the loop, so nobody answers.
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
# ## Summary
#
# - `DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank)` gives each DP replica its
#   own shard; every replica gets the same number of samples.
# - `drop_last=False` pads the last shard by repeating the first samples (0 and 1 twice here);
#   `drop_last=True` drops the remainder (8 and 9 here).
# - Call `sampler.set_epoch(epoch)` before each epoch, or every epoch repeats the same order.
# - Hand-made `ds[rank::world]` sharding gives uneven step counts: the ranks with more data wait
#   forever in a collective for ranks that have finished.
#
# Next: **03 · TP leader broadcast**: when several ranks must see the *same* batch.
