# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Process groups
#
# Distributed data loading is built from a handful of collective calls. This notebook runs each
# one on 4 real gloo ranks, so you can see what every rank holds before and after.
#
# **Learning goals**
#
# - Read a rank's identity: `dist.get_rank()`, `dist.get_world_size()`.
# - Use the three collectives data loading needs: `all_reduce`, `broadcast`, `barrier`.
# - Keep ranks alive between cells with `ez.Cluster` and the `%%ranks` magic.
# - Build subgroups with `dist.new_group`, and broadcast inside one from the right source.
# - Recognise a hang: ranks that call different collectives wait for each other forever.

# %%
# %matplotlib inline
import time

import torch
import torch.distributed as dist

import ezpz_nb as ez

# %% [markdown]
# ## Who am I?
#
# Every rank runs the same function; only `dist.get_rank()` tells them apart.

# %%
def whoami():
    return dist.get_rank(), dist.get_world_size()


ids = ez.launch(whoami, world_size=4)
print(ids)
assert ids == [(0, 4), (1, 4), (2, 4), (3, 4)]


# %% [markdown]
# ## `all_reduce`: everyone gets the total
#
# Rank `r` starts with `[r + 1]`. After `dist.all_reduce` every rank holds the sum
# 1 + 2 + 3 + 4 = 10. This is how DDP averages gradients, and how ranks agree on a number
# (for example, how many steps to take, in notebook 04).

# %%
def all_reduce_demo():
    t = torch.tensor([dist.get_rank() + 1.0])
    before = t.item()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # in place, on every rank
    return before, t.item()


for rank, (before, after) in enumerate(ez.launch(all_reduce_demo, world_size=4)):
    print(f"rank {rank}: before {before}, after {after}")
    assert (before, after) == (rank + 1.0, 10.0)


# %% [markdown]
# ## `broadcast`: everyone gets the source's tensor
#
# Only rank 0 holds real data; the others hold zeros **of the same shape and dtype**: a
# receiving rank must allocate the buffer before the data arrives. After the broadcast all 4
# ranks hold `[0, 1, 2]`. This is the heart of the TP leader broadcast in notebook 03.

# %%
def broadcast_demo():
    if dist.get_rank() == 0:
        t = torch.arange(3.0)
    else:
        t = torch.zeros(3)  # same shape and dtype as the source's
    dist.broadcast(t, src=0)
    return t.tolist()


received = ez.launch(broadcast_demo, world_size=4)
print(received)
assert received == [[0.0, 1.0, 2.0]] * 4


# %% [markdown]
# ## `barrier`: nobody leaves until everybody has arrived
#
# Rank `r` sleeps `0.2 × r` seconds before the barrier, so rank 3 arrives last. Every rank
# records when it arrived and when it left: every departure comes after the **last** arrival.

# %%
def barrier_demo():
    time.sleep(0.2 * dist.get_rank())
    arrived = time.time()
    dist.barrier()
    return arrived, time.time()


times = ez.launch(barrier_demo, world_size=4)
t0 = min(a for a, _ in times)
for rank, (arrived, left) in enumerate(times):
    print(f"rank {rank}: arrived at +{arrived - t0:.2f} s, left at +{left - t0:.2f} s")
last_arrival = max(a for a, _ in times)
assert all(left >= last_arrival for _, left in times)

# %% [markdown]
# ## Ranks that stay: `ez.Cluster` and `%%ranks`
#
# `ez.launch` starts fresh ranks every time. An `ez.Cluster` keeps them running, so state set in
# one call (a variable, a DataLoader iterator) is still there in the next one. The `%%ranks`
# magic runs a whole cell on every rank of the running cluster; inside it, `rank`,
# `world_size`, `torch` and `dist` are predefined, and the last line's value is printed per rank.

# %%
# %load_ext ezpz_nb
cluster = ez.Cluster(world_size=4)

# %%
# %%ranks -n 4
total = torch.tensor([float(rank)])
dist.all_reduce(total)
total.item()

# %% [markdown]
# The variable `total` still exists on every rank, so the next cell can use it: each rank
# doubles its own copy, and they all print 12.0.

# %%
# %%ranks -n 4
total *= 2
assert total.item() == 12.0
total.item()

# %%
cluster.close()  # ends the ranks; %%ranks would start new ones when next used


# %% [markdown]
# ## Subgroups
#
# `dist.new_group(ranks)` makes a smaller group. Two rules:
#
# 1. **Every** rank must call `new_group` for **every** group, in the same order, even for groups
#    it is not in (creating a group is itself a collective).
# 2. `src=` in `broadcast` is a **global** rank. Inside the group `[2, 3]` the first member is
#    global rank 2; `dist.get_global_rank(group, 0)` finds it.
#
# Below, ranks 0 and 1 form one group and ranks 2 and 3 another. An `all_reduce` in each group
# sums only its members: 0 + 1 = 1 and 2 + 3 = 5. A broadcast from each group's first member
# gives ranks 0 and 1 the value 0, ranks 2 and 3 the value 2.

# %%
def subgroup_demo():
    rank = dist.get_rank()
    first = dist.new_group([0, 1])   # every rank creates both groups...
    second = dist.new_group([2, 3])
    mine = first if rank < 2 else second  # ...and then uses its own

    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=mine)

    value = torch.tensor([float(rank)])
    dist.broadcast(value, src=dist.get_global_rank(mine, 0), group=mine)
    return total.item(), value.item()


sub = ez.launch(subgroup_demo, world_size=4)
print(sub)
assert sub == [(1.0, 0.0), (1.0, 0.0), (5.0, 2.0), (5.0, 2.0)]


# %% [markdown]
# ## What a hang looks like
#
# Collectives match up **by order**: each rank's *n*-th collective call meets the *n*-th call of
# the others. Below, rank 0 calls `barrier` while rank 1 calls `all_reduce`. Neither can finish.
# On a real cluster this waits for the default timeout (30 minutes or more) and then dies with
# an unhelpful message. Here `timeout=3` stops it after 3 seconds, and the `ez.HangError` says
# where each rank was stuck.

# %%
def mismatched():
    t = torch.ones(1)
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.all_reduce(t)
    return t.item()


try:
    ez.launch(mismatched, world_size=2, timeout=3)
except ez.HangError as err:
    hang = err
    print(err)

# %% [markdown]
# The report names the call each rank was blocked in: `barrier` on rank 0 and `all_reduce` on
# rank 1, with the line of the cell each one came from.

# %%
for stack in hang.stacks.values():
    print(stack.describe())
assert hang.stacks[0].call == "barrier"
assert hang.stacks[1].call == "all_reduce"

# %% [markdown]
# ## Summary
#
# - `all_reduce` leaves the same combined value on every rank; `broadcast` copies one rank's
#   tensor into buffers the others allocated; `barrier` holds every rank until the last arrives.
# - `ez.Cluster` and `%%ranks` keep ranks and their state alive across cells.
# - Subgroups: every rank creates every group; `src=` is a global rank
#   (`dist.get_global_rank(group, 0)`).
# - Collectives pair up by call order. Ranks that disagree on the sequence hang; a short
#   `timeout=` turns the hang into a report of where each rank waits.
#
# Next: **02 · DP sharding**: giving each data-parallel replica its own samples.
