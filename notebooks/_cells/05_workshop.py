# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown] tags=["workshop"]
# # 05 · Workshop
#
# **Time:** 70 to 85 minutes for all seven exercises, or 10 to 30 minutes after each of
# notebooks 01 to 04 (the table below says which exercises go with which notebook).
#
# Seven exercises on the ideas of notebooks 01 to 04. In each you fill in one function; the
# cell after it runs **your** function on real gloo ranks and tells you, in plain words, what the
# ranks did: *not done yet*, what is wrong (and a hint), or *correct*. The checkers judge
# behaviour: the values your ranks end with, the samples their loaders really yielded, how
# often each rank's dataset was read. Any code that behaves right passes; code that only looks
# right does not. What an answer could be fitted to (the values to sum or share, seeds, lengths,
# shapes) is drawn anew for every check, and each checker tries more than one setting; where a
# checker starts from an example the exercise states (as Exercise 1 does), that one stays fixed.
#
# | exercises | after notebook | skill |
# |---|---|---|
# | 1, 2 | 01 · Process groups | a collective; a broadcast inside a subgroup |
# | 3, 4 | 02 · DP sharding | shard over DP replicas; a new order every epoch |
# | 5 | 03 · TP leader broadcast | send a batch whose shapes the peers do not know |
# | 6, 7 | 04 · Step alignment | the leader announces the end; agree on a step count over a stream |
#
# **Learning goals**
#
# - Write the collectives of data loading yourself: `all_reduce`, a broadcast inside a subgroup.
# - Shard over the DP group with the settings you choose, and reshuffle every epoch.
# - Send a batch of unknown shape from a TP leader to its peers.
# - Keep ranks in step when lengths lie or are unknown.
#
# How to work: replace `raise NotImplementedError` with your code, run the function's cell, then
# the checker's cell. A hanging solution is stopped after a few seconds and reported, with where
# each rank was. Solutions are in `solutions/05_workshop_solutions.ipynb`.

# %% [markdown] tags=["solutions"]
# # 05 · Workshop: solutions
#
# **Time:** reading, about 15 minutes.
#
# The workshop's seven exercises, solved. Each checker cell asserts that the solution passes, so
# this notebook fails if a solution or a checker breaks.
#
# **Learning goals**
#
# - Compare your answers with one working solution per exercise.
# - See that each checker accepts correct behaviour, whatever code produced it.

# %%
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ezpz_nb.workshop.exercises as ex

# %% [markdown]
# ## After 01 · Process groups
#
# ### Exercise 1: a global sum
#
# Write `global_sum(x)`: it runs on every rank, each with its own tensor `x`, and must return the
# element-wise sum of `x` over all ranks, on every rank.
#
# The checker calls it twice on 4 ranks. First with the same example every time, rank `r`
# passing `x = [r + 1, 10 r]` (the sum is `[10, 60]`), so you can follow it by hand; then with
# values drawn anew for each check, so a sum fitted to the example fails.
#
# *Hint*: one collective does it, in place.


# %% tags=["workshop"]
def global_sum(x):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_global_sum(global_sum)


# %% tags=["solutions"]
def global_sum(x):
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


# %% tags=["solutions"]
assert ex.check_global_sum(global_sum).passed


# %% [markdown]
# ### Exercise 2: broadcast inside a group
#
# Write `share_from_leader(x, group)`: afterwards every rank of `group` must hold the values of
# the group's *leader*, the member the group numbers 0. Each rank starts with 3 values of its
# own, drawn anew for every check, so only a collective can tell a rank what its leader holds.
# The checker runs 4 ranks in several layouts in turn: the groups `[0, 1]` and `[2, 3]`, the
# strided pairs `[0, 2]` and `[1, 3]`, and groups of other sizes made with
# `dist.new_group(ranks, sort_ranks=False)`, which numbers the members in the order listed: there
# the leader of `[3, 2, 1, 0]` is global rank 3.
#
# *Hint*: `src=` is a **global** rank. Which global rank does the group number 0? Ask the group;
# rank arithmetic fits one layout only.


# %% tags=["workshop"]
def share_from_leader(x, group):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_share_from_leader(share_from_leader)


# %% tags=["solutions"]
def share_from_leader(x, group):
    dist.broadcast(x, src=dist.get_global_rank(group, 0), group=group)
    return x


# %% tags=["solutions"]
assert ex.check_share_from_leader(share_from_leader).passed


# %% [markdown]
# ## After 02 · DP sharding
#
# ### Exercise 3: shard over the DP group
#
# Write `make_sampler(dataset, layout, seed)`: return a sampler for `dataset`, an object the
# training loop iterates for indices and tells the epoch with `sampler.set_epoch(epoch)` before
# each pass. The checker runs 4 ranks as 2 DP replicas of 2 ranks each (notebook 03 explains
# why two ranks share one replica; here it only matters that they must get the same data).
# `layout` has `dp_rank`, `dp_size`, `tp_rank`, `tp_size`, `dp_group` and `tp_group`.
#
# `dataset` has an **odd** number of samples `n` (drawn for every check), which does not divide
# over 2 replicas. What is wanted, exactly (what the sampler's `drop_last=True` gives):
#
# - the 2 ranks of a replica get the same indices, in the same order;
# - no sample goes to two replicas, and none twice to one;
# - equal shard lengths: `n // 2` per replica; the 1 sample left over is dropped;
# - a shuffle: the order follows from `seed` and the epoch alone. Another epoch or another seed
#   gives another order; the same seed and epoch give the same order again, on every rank, on a
#   fresh sampler, and however often it is read.


# %% tags=["workshop"]
def make_sampler(dataset, layout, seed):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_make_sampler(make_sampler)


# %% tags=["solutions"]
def make_sampler(dataset, layout, seed):
    return DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        drop_last=True,
        seed=seed,
    )


# %% tags=["solutions"]
assert ex.check_make_sampler(make_sampler).passed


# %% [markdown]
# ### Exercise 4: a new order every epoch
#
# Write `run_epochs(loader, num_epochs)`: iterate over `loader` once per epoch for `num_epochs`
# epochs and return one list per epoch with the sample ids it yielded, in order
# (`batch["index"]` holds them). The loader shuffles with a `DistributedSampler`
# (`loader.sampler`) over the DP group of 4 ranks (2 DP replicas × 2). Every epoch must have its
# own order; the 2 ranks of a replica must still see the same order, and the 2 replicas must
# still split the data between them. The checker compares what you return with what the loader
# really yielded.


# %% tags=["workshop"]
def run_epochs(loader, num_epochs):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_run_epochs(run_epochs)


# %% tags=["solutions"]
def run_epochs(loader, num_epochs):
    orders = []
    for epoch in range(num_epochs):
        loader.sampler.set_epoch(epoch)
        orders.append([i for batch in loader for i in batch["index"].tolist()])
    return orders


# %% tags=["solutions"]
assert ex.check_run_epochs(run_epochs).passed


# %% [markdown]
# ## After 03 · TP leader broadcast
#
# ### Exercise 5: send a batch the peers know nothing about
#
# Write `send_batch(batch, group)`: on the group's leader `batch` is a dict of tensors; on the
# other ranks of the group it is `None` and they do not know its keys, shapes or dtypes. Every
# rank must return the leader's batch, byte for byte, key by key (the order of the keys does not
# matter). The checker calls it twice, with batches of different keys, shapes and dtypes.
#
# *Hint*: either send the batch as an object, or send its shapes first and then the tensors.


# %% tags=["workshop"]
def send_batch(batch, group):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_send_batch(send_batch)


# %% tags=["solutions"]
def send_batch(batch, group):
    box = [batch]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


# %% tags=["solutions"]
assert ex.check_send_batch(send_batch).passed


# %% [markdown]
# ## After 04 · Step alignment
#
# ### Exercise 6: the leader announces, the peers follow
#
# Write `leader_batches(loader, group)`, used on every rank of a TP group as
# `for batch in leader_batches(loader, group): ...`. Only the group's leader (its rank 0) may
# iterate `loader`; every rank must get the leader's batches, and all must stop together when
# the leader's loader ends.
#
# Each rank is handed its own loader over a filtered stream (an `IterableDataset`): how many
# batches it holds is known only by reading it, and its `len()` is only an estimate. The checker
# runs it once with a `len()` that claims more batches than come, once with one that claims
# fewer (and 2 DataLoader workers). The stream counts how often it is read, on each rank and in
# the workers: a peer that reads it fails, whatever it then yields.
#
# *Hint*: peers cannot count their steps. Each step, the leader must tell them whether a batch
# follows. `dist.broadcast_object_list` sends any picklable object, `None` included.


# %% tags=["workshop"]
def leader_batches(loader, group):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_leader_batches(leader_batches)


# %% tags=["solutions"]
def leader_batches(loader, group):
    src = dist.get_global_rank(group, 0)
    if dist.get_rank(group) == 0:
        for batch in loader:
            dist.broadcast_object_list([batch], src=src, group=group)
            yield batch
        dist.broadcast_object_list([None], src=src, group=group)  # the end of the epoch
    else:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=src, group=group)
            if box[0] is None:
                return
            yield box[0]


# %% tags=["solutions"]
assert ex.check_leader_batches(leader_batches).passed


# %% [markdown]
# ### Exercise 7: agree on a step count over a stream
#
# Write `steps_over_stream(stream, train_step)`. The checker runs 4 DP ranks; each rank's
# `stream` is an iterator of batches with no `len()`. The streams end after different numbers
# of batches, unknown in advance, and on one rank the stream never ends. Call
# `train_step(batch)` once per step: it all-reduces a gradient over all ranks, so every rank must
# call it the same number of times. Take as many steps as every rank can (stop when the first
# stream runs out) and return the number of steps taken. The streams hold hundreds of batches,
# and each counts what is pulled from it: a rank may read at most one batch beyond the steps
# it takes.
#
# *Hint*: before each step, the ranks must agree that every one of them still has a batch.
# `next(it, None)` returns `None` at the end instead of raising.


# %% tags=["workshop"]
def steps_over_stream(stream, train_step):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_steps_over_stream(steps_over_stream)


# %% tags=["solutions"]
def steps_over_stream(stream, train_step):
    it, steps = iter(stream), 0
    while True:
        batch = next(it, None)
        have = torch.tensor(0 if batch is None else 1)
        dist.all_reduce(have, op=dist.ReduceOp.MIN)  # 0 as soon as one rank has run out
        if have.item() == 0:
            return steps
        train_step(batch)
        steps += 1


# %% tags=["solutions"]
assert ex.check_steps_over_stream(steps_over_stream).passed

# %% [markdown] tags=["workshop"]
# ## Summary
#
# When every checker says *correct* you have written, yourself:
#
# - a global sum and a group broadcast from the right global source;
# - DP sharding with equal, shuffled shards that keeps TP peers together, reshuffled every epoch;
# - a broadcast of a batch of unknown shape;
# - a TP loop where only the leader loads and announces the end, and a step count every rank
#   agrees on without knowing its data's length.
#
# These are the building blocks of `ezpz_nb.data`; read its source to compare.

# %% [markdown] tags=["solutions"]
# ## Summary
#
# Every checker passed on real ranks. Other solutions pass too: exercise 2 can name the source
# by its place in the group (`dist.broadcast(x, group=group, group_src=0)`); exercise 3 can be
# a small class of your own that cuts contiguous blocks of `torch.randperm(n)` drawn from a
# generator seeded with `seed + epoch`; exercise 4 can number epochs from 1;
# exercise 5 can send the shapes first with `broadcast_object_list` and the tensors with
# `dist.broadcast` (what makes the packed path of notebook 03 fast), in any order of the keys;
# exercise 6 can send a "more?" flag each step, then the batch; exercise 7 can gather every
# rank's "done" flag with `all_gather_object`.

# %% [markdown]
# ## What next
#
# - **Explore** (optional, about 20 minutes): `06_explorer` reruns the loading on 4 ranks as you
#   change the world size, the TP size, `drop_last` or `set_epoch`, and redraws what each rank saw.
# - **Run it on a cluster.** The same workers run under torchrun, Slurm or PBS: see
#   `docs/scale-out.md` in the repository (*Beyond the notebook: torchrun, Slurm and PBS*), and
#   start with
#   `python -m torch.distributed.run --standalone --nproc_per_node=4 -m ezpz_nb.examples.tp_broadcast`.
# - **Shard the model, not only the data.** PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`)
#   over the DP dimension of a `DeviceMesh`, with tensor parallelism
#   (`torch.distributed.tensor.parallel`) over its TP dimension: the same 2-D layout as here.
# - **A full training stack.** torchtitan (pytorch/torchtitan) puts FSDP2, TP and pipeline
#   parallelism together; note that its ranks each load their own DP shard instead of
#   broadcasting within TP.
# - **Resume mid-epoch.** `StatefulDataLoader` from torchdata (`torchdata.stateful_dataloader`)
#   saves and restores a loader's position, so a restarted job does not repeat or skip batches.
