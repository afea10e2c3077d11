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
# Seven exercises, one per idea of notebooks 01 to 04. In each you fill in one function; the
# cell after it runs **your** function on real gloo ranks and tells you, in plain words, what the
# ranks saw: *not done yet*, what is wrong (and a hint), or *correct*. The checkers look only at
# behaviour, so any code that works passes.
#
# **Learning goals**
#
# - Write the collectives of data loading yourself: `all_reduce`, a broadcast inside a subgroup.
# - Shard over the DP group, and reshuffle every epoch.
# - Build a TP loader where only the leaders load.
# - Keep ranks in step with uneven data; send a batch whose shapes the receiver does not know.
#
# How to work: replace `raise NotImplementedError` with your code, run the function's cell, then
# the checker's cell. A hanging solution is stopped after a few seconds and reported.
# Solutions are in `05_workshop_solutions.ipynb`.

# %% [markdown] tags=["solutions"]
# # 05 · Workshop: solutions
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
from ezpz_nb.data import get_random_dataset_fsdp_tp

# %% [markdown]
# ## Exercise 1: a global sum
#
# Write `global_sum(x)`: it runs on every rank, each with its own tensor `x`, and must return the
# element-wise sum of `x` over all ranks, on every rank.
#
# *Hint*: one collective does it, in place.

# %% tags=["workshop"]
def global_sum(x):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_global_sum(global_sum);


# %% tags=["solutions"]
def global_sum(x):
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


# %% tags=["solutions"]
assert ex.check_global_sum(global_sum).passed


# %% [markdown]
# ## Exercise 2: broadcast inside a group
#
# Write `share_from_leader(x, group)`: afterwards every rank of `group` must hold the tensor of
# the group's first member (its *leader*). The checker runs 4 ranks in the groups `[0, 1]` and
# `[2, 3]`; rank `r` starts with `[r, r, r]`.
#
# *Hint*: `src=` is a **global** rank. Which global rank is the group's rank 0?

# %% tags=["workshop"]
def share_from_leader(x, group):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_share_from_leader(share_from_leader);


# %% tags=["solutions"]
def share_from_leader(x, group):
    dist.broadcast(x, src=dist.get_global_rank(group, 0), group=group)
    return x


# %% tags=["solutions"]
assert ex.check_share_from_leader(share_from_leader).passed


# %% [markdown]
# ## Exercise 3: shard over the DP group
#
# Write `make_sampler(dataset, layout)`: return a sampler for `dataset` such that the TP peers of
# one model replica see the same indices and the DP replicas see different ones. `layout` has
# `dp_rank`, `dp_size`, `tp_rank`, `tp_size`, `dp_group`, `tp_group` (notebook 03).

# %% tags=["workshop"]
def make_sampler(dataset, layout):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_make_sampler(make_sampler);


# %% tags=["solutions"]
def make_sampler(dataset, layout):
    return DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank,
                              shuffle=True, seed=0)


# %% tags=["solutions"]
assert ex.check_make_sampler(make_sampler).passed


# %% [markdown]
# ## Exercise 4: a new order every epoch
#
# Write `run_epochs(loader, num_epochs)`: iterate over `loader` for `num_epochs` epochs and return
# one list per epoch with the sample ids it yielded, in order (`batch["index"]` holds them). The
# loader shuffles with a `DistributedSampler`; every epoch must have its own order.

# %% tags=["workshop"]
def run_epochs(loader, num_epochs):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_run_epochs(run_epochs);


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
# ## Exercise 5: only the leaders load
#
# Write `build_tp_loader(layout)`: return a loader of 32 random-token samples (`vocab_size=64`,
# `seq_length=8`) in batches of 2 where TP peers get identical batches, DP replicas different
# samples, and only the leader of each TP group reads the dataset.
#
# *Hint*: `get_random_dataset_fsdp_tp(...)["dataloader"]` (already imported) takes
# `num_samples=`, `dp_group=`, `tp_group=` and `broadcast_within_tp=`.

# %% tags=["workshop"]
def build_tp_loader(layout):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_build_tp_loader(build_tp_loader);


# %% tags=["solutions"]
def build_tp_loader(layout):
    built = get_random_dataset_fsdp_tp(
        batch_size=2, vocab_size=64, seq_length=8, num_samples=32,
        dp_group=layout.dp_group, tp_group=layout.tp_group, broadcast_within_tp=True)
    return built["dataloader"]


# %% tags=["solutions"]
assert ex.check_build_tp_loader(build_tp_loader).passed


# %% [markdown]
# ## Exercise 6: agree on a step count
#
# Each rank holds a different number of batches (`local_batches`: 5, 3, 4 and 6 on the 4 ranks).
# Write `agreed_num_steps(local_batches)`: every rank must return the same number of steps, one
# that no rank runs out of data before reaching, as a plain `int`.

# %% tags=["workshop"]
def agreed_num_steps(local_batches):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_agreed_num_steps(agreed_num_steps);


# %% tags=["solutions"]
def agreed_num_steps(local_batches):
    n = torch.tensor(local_batches)
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    return int(n)


# %% tags=["solutions"]
assert ex.check_agreed_num_steps(agreed_num_steps).passed


# %% [markdown]
# ## Exercise 7: send a batch the peers know nothing about
#
# Write `send_batch(batch, group)`: on the group's leader `batch` is a dict of tensors; on the
# other ranks of the group it is `None` and they do not know its keys, shapes or dtypes. Every
# rank must return the leader's batch, byte for byte.
#
# *Hint*: either send the batch as an object, or send its shapes first and then the tensors.

# %% tags=["workshop"]
def send_batch(batch, group):
    raise NotImplementedError("your code here")


# %% tags=["workshop"]
ex.check_send_batch(send_batch);


# %% tags=["solutions"]
def send_batch(batch, group):
    box = [batch]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


# %% tags=["solutions"]
assert ex.check_send_batch(send_batch).passed

# %% [markdown] tags=["workshop"]
# ## Summary
#
# When every checker says *correct* you have written, yourself:
#
# - a global sum and a group broadcast from the right global source;
# - DP sharding that keeps TP peers together, reshuffled every epoch with `set_epoch`;
# - a TP loader where only the leaders load;
# - a step count every rank agrees on, and a broadcast of a batch of unknown shape.
#
# These are the building blocks of `ezpz_nb.data`; read its source to compare.

# %% [markdown] tags=["solutions"]
# ## Summary
#
# Every checker passed on real ranks. Other solutions pass too: for example exercise 7 can send
# the shapes first with `broadcast_object_list` and the tensors with `dist.broadcast`, which is
# what makes the packed path of notebook 03 fast.
