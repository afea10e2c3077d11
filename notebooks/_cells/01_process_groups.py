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
# **Time:** 45 to 55 minutes with the predictions, then exercises 1 and 2 of `05_workshop`
# (15 to 20 minutes). Running the cells alone takes under a minute.
#
# Distributed data loading is built from a handful of collective calls. This notebook runs each
# one on 4 real gloo ranks, so you can see what every rank holds before and after. Before each
# cell that reveals something, you are asked to predict it; the answer is folded under
# *Answer*: make your guess first, then open it or run the cell.
#
# **Learning goals**
#
# - Read a rank's identity: `dist.get_rank()`, `dist.get_world_size()`.
# - Use the three collectives data loading needs: `all_reduce`, `broadcast`, `barrier`.
# - Keep ranks alive between cells with `ez.Cluster` and the `%%ranks` magic.
# - Build subgroups with `dist.new_group`, and broadcast inside one from the right source.
# - Recognise a hang: ranks that call different collectives wait for each other; find the
#   mismatch with `TORCH_DISTRIBUTED_DEBUG=DETAIL` and the missing rank with `dist.monitored_barrier`.

# %%
# %matplotlib inline
import os
import re
import textwrap
import time
from datetime import timedelta

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
# Rank `r` starts with `[r + 1]`, and `dist.all_reduce` combines the tensors of all ranks. This
# is how DDP averages gradients, and how ranks agree on a number (for example, how many steps
# to take, in notebook 04).
#
# **Predict:** after the `all_reduce`, what does rank 3 hold? And rank 0?
#
# <details><summary>Answer</summary>
#
# Both hold 10.0, like every rank: the sum 1 + 2 + 3 + 4, written **in place** into each rank's
# own tensor. No rank keeps its own value.
#
# </details>


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
# receiving rank must allocate the buffer before the data arrives. This is the heart of the TP
# leader broadcast in notebook 03.
#
# **Predict:** what does rank 2 return?
#
# <details><summary>Answer</summary>
#
# `[0.0, 1.0, 2.0]`: rank 0's tensor, copied into the zeros rank 2 allocated. All 4 ranks
# return it.
#
# </details>


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
# records when it arrived and when it left.
#
# **Predict:** when does rank 0, the first to arrive, leave?
#
# <details><summary>Answer</summary>
#
# About 0.6 s after it arrived, when rank 3 arrives: every departure comes after the **last**
# arrival.
#
# </details>


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
# ## On GPUs: every collective on the rank's own GPU
#
# Every collective so far took CPU tensors, because these ranks use **gloo**. A GPU job uses
# **NCCL** (`dist.init_process_group("nccl")`), and NCCL only moves CUDA tensors: a CPU tensor
# in `all_reduce` raises (`No backend type associated with device type cpu`). So, in a GPU job:
#
# - Give each rank its own GPU **first**: `torch.cuda.set_device(local_rank)` with
#   `local_rank = int(os.environ["LOCAL_RANK"])` (torchrun sets it). Without it every rank's
#   `torch.cuda.current_device()` is 0, and `broadcast_object_list` and `all_gather_object`
#   put their tensors there: all ranks on `cuda:0`. Passing
#   `device_id=torch.device("cuda", local_rank)` to `init_process_group` as well binds the
#   communicator to that GPU at once, but in torch 2.13 it does **not** set the current device:
#   it is an extra, not a replacement.
# - Put the tensors of a collective on that device: `torch.tensor([x], device="cuda")`.
# - Agreements that live on the CPU (a step count, a flag, a Python object) can go on a gloo
#   side group, `cpu_group = dist.new_group(backend="gloo")`, passed as `group=`: no copy to the
#   GPU and back. (Or start both backends at once: `init_process_group("cpu:gloo,cuda:nccl")`.)
#
# The side group is an ordinary subgroup, so it runs here too:


# %%
def cpu_agreement():
    cpu_group = dist.new_group(backend="gloo")  # every rank calls it (groups: see below)
    have_batch = torch.tensor([1])  # a CPU tensor: fine on a gloo group, even in an NCCL job
    dist.all_reduce(have_batch, op=dist.ReduceOp.MIN, group=cpu_group)
    return dist.get_backend(cpu_group), have_batch.item()


agreed = ez.launch(cpu_agreement, world_size=4)
print(agreed)
assert agreed == [("gloo", 1)] * 4


# %% [markdown]
# ## Ranks that stay: `ez.Cluster` and `%%ranks`
#
# `ez.launch` starts fresh ranks every time. An `ez.Cluster` keeps them running, so state set in
# one call (a variable, a DataLoader iterator) is still there in the next one. The `%%ranks`
# magic runs a whole cell on every rank of the running cluster, and the last line's value is
# printed per rank.
#
# A `%%ranks` cell runs in **each rank's own namespace**, not the notebook's:
#
# - `rank`, `world_size`, `torch`, `dist` and `ez` are predefined there;
# - variables a `%%ranks` cell sets stay on that rank, for the next `%%ranks` cells;
# - the notebook's functions, classes and modules that the cell names travel with it (by value,
#   as with `ez.launch`), so a helper defined in an ordinary cell can be called;
# - the notebook's data (numbers, lists, tensors) does not travel: a `%%ranks` cell that uses a
#   notebook variable raises a `NameError` that says so. Compute data on the ranks, or pass it
#   as an argument to `ez.launch` or `cluster.run`.

# %%
# %load_ext ezpz_nb
cluster = ez.Cluster(world_size=4)

# %%
# %%ranks -n 4
total = torch.tensor([float(rank)])
dist.all_reduce(total)
total.item()

# %% [markdown]
# The variable `total` still exists on every rank, so the next cell can use it. It calls
# `double`, a function defined in the ordinary cell below: it travels to the ranks because the
# cell names it.
#
# **Predict:** what does each rank print?
#
# <details><summary>Answer</summary>
#
# 12.0 on every rank: each rank doubles its own copy of `total`, which the previous cell left
# at 0 + 1 + 2 + 3 = 6.
#
# </details>


# %%
def double(t):
    return t * 2


# %%
# %%ranks -n 4
total = double(total)
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
# Two options bend these rules, and are worth knowing when you read other people's code:
# `dist.new_group(ranks, use_local_synchronization=True)` lets ranks outside `ranks` skip the
# call (only the members meet; all ranks must still create overlapping groups in the same
# order), and `sort_ranks=False` keeps the order given, so group rank 0 of
# `dist.new_group([3, 2], sort_ranks=False)` is global rank 3, not the smallest. That is one more
# reason to ask the group (`dist.get_global_rank(group, 0)`) rather than compute the leader.
#
# Below, ranks 0 and 1 form one group and ranks 2 and 3 another. Each rank `all_reduce`s its
# rank number in its group, then each group broadcasts from its first member.
#
# **Predict:** what pair (sum, broadcast value) does rank 3 return?
#
# <details><summary>Answer</summary>
#
# `(5.0, 2.0)`: the group sum covers only its members, 2 + 3 = 5, and the broadcast comes from
# the group's first member, global rank 2. Ranks 0 and 1 return `(1.0, 0.0)`.
#
# </details>


# %%
def subgroup_demo():
    rank = dist.get_rank()
    first = dist.new_group([0, 1])  # every rank creates both groups...
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


# %%
def unsorted_group():
    group = dist.new_group([3, 2], sort_ranks=False)  # every rank, same list
    if dist.get_rank() not in (2, 3):
        return None
    return dist.get_global_rank(group, 0), dist.get_rank(group)


leaders = ez.launch(unsorted_group, world_size=4)
print(leaders)  # (global rank of group rank 0, my group rank) on ranks 2 and 3
assert leaders[2:] == [(3, 1), (3, 0)]


# %% [markdown]
# ## What a hang looks like
#
# Collectives match up **by order**: each rank's *n*-th collective call meets the *n*-th call of
# the others. Below, rank 0 calls `barrier` while rank 1 calls `all_reduce`.
#
# **Predict:** what happens?
#
# <details><summary>Answer</summary>
#
# On gloo neither call can finish: each rank waits for a partner that never makes the same
# call. `timeout=3` stops it after 3 seconds, and the `ez.HangError` says where each rank was.
#
# </details>


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
# ### On a real cluster
#
# Without a short timeout, a hang lasts until the collective timeout of the process group:
# torch's default is **30 minutes on gloo and 10 minutes on NCCL**, the backend of GPU clusters
# (`dist.init_process_group(timeout=timedelta(...))` changes it). What you see then depends on
# the backend:
#
# - **gloo**: the waiting call raises in the rank's own thread, so its traceback names your
#   line (as `HangError` does here).
# - **NCCL**: collectives run on the GPU, and a watchdog thread notices the timeout and **aborts
#   the process**. Its message names the collective (`OpType=ALLREDUCE`, its sequence number) but
#   not your line. NCCL's counterpart of `HangError` is the **Flight Recorder**: each rank already
#   keeps its last 2000 collectives with their stacks (`TORCH_FR_BUFFER_SIZE`, formerly
#   `TORCH_NCCL_TRACE_BUFFER_SIZE`; 2000 is torch 2.13's default on NCCL, so setting it to 2000
#   changes nothing; only the opt-in torchcomms path starts at 0), and
#   `TORCH_NCCL_DUMP_ON_TIMEOUT=1` has the watchdog write them to one file per rank when it fires
#   (its default has changed between releases; setting it makes sure). `TORCH_FR_DUMP_TEMP_FILE`
#   sets the path prefix; each rank writes on its own node, so unless that path is shared, gather
#   the files into one folder, then `torchfrtrace DIR`, installed with torch, reads all ranks'
#   files and names the first collective they disagree on.
# - Under **torchrun** a rank that finished its script exits, and a gloo rank still waiting for
#   it fails within seconds with `Connection closed by peer`, naming no step (notebook 02).
#
# On NCCL this very mismatch may not hang at all: NCCL implements `barrier()` as an `all_reduce`
# of a one-element tensor, so rank 0's barrier can pair up with rank 1's one-element
# `all_reduce`, and both return as if nothing were wrong. The ranks are then out of step, and a
# later collective fails, or silently mixes up data. Two tools name the problem instead.
#
# ### `TORCH_DISTRIBUTED_DEBUG=DETAIL`: name the mismatch
#
# With this environment variable set, every collective first checks that all ranks of the group
# are making the same call (operation, shapes, dtypes), and raises at once, on every rank, if
# they are not. It works on gloo and NCCL alike, and costs an extra check per collective: use it
# to debug, not to train. torch reads it when `torch.distributed` is imported and applies it to
# the process groups made after that; in a script, set it before the program starts
# (`TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun ...`). Each rank here reads it again from the
# notebook's environment as it starts, so setting it in the notebook before `ez.launch` is enough.
#
# **Predict:** how long does the same mismatched function take to fail now, and what does each
# rank's error say?
#
# <details><summary>Answer</summary>
#
# It fails at once, not after the 10 s timeout: each rank raises
# `Detected mismatch between collectives`, naming its own call (`BARRIER` on rank 0,
# `ALLREDUCE` on rank 1) and the rank whose call differs.
#
# </details>

# %%
os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
start = time.perf_counter()
try:
    ez.launch(mismatched, world_size=2, timeout=10)
except ez.RankError as err:
    detail = err
finally:
    del os.environ["TORCH_DISTRIBUTED_DEBUG"]  # the later cells run without the checks
print(f"failed after {time.perf_counter() - start:.1f} s")

for rank, failure in detail.failures.items():
    own = re.search(
        r"Rank (\d+) is running collective: CollectiveFingerPrint\("
        r"SequenceNumber=\d+,? ?OpType=(\w+)",
        failure.message,
    )
    other = re.search(r"but Rank (\d+) is running", failure.message)
    if own and other:
        print(
            f"rank {rank}: mismatch detected: rank {own[1]} runs {own[2]}, "
            f"but rank {other[1]} runs something else"
        )
    else:  # another torch version may word it differently
        print(f"rank {rank}: {failure.message[:200]}")
    assert "Detected mismatch between collectives" in failure.message

# %% [markdown]
# ### `dist.monitored_barrier`: name the missing rank
#
# A common hang is a rank that never arrives: it ran out of data, or caught an exception and
# moved on. `dist.monitored_barrier(timeout=...)` is a barrier that rank 0 watches: every other
# rank checks in with rank 0, and when one has not within the timeout, rank 0 raises an error
# that names it (`wait_all_ranks=True` names every missing rank, not just the first). It exists
# on gloo only; in an NCCL job, make a gloo group for it with `dist.new_group(backend="gloo")`
# and pass `group=`. Put one where all ranks must meet, such as the end of an epoch.
#
# Below, rank 3 leaves early; the others call `monitored_barrier` with a 2-second timeout.
#
# **Predict:** which ranks raise, and which rank does the error name?
#
# <details><summary>Answer</summary>
#
# Rank 0 raises `Ranks 3 failed to pass monitoredBarrier`. Ranks 1 and 2 raise too: they did
# reach the barrier, but rank 0 stopped answering, and their message says to look at rank 0's.
# Rank 3 returned normally.
#
# </details>


# %%
def check_in():
    if dist.get_rank() == 3:
        return "left early"  # e.g. its data ran out
    dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
    return "passed"


try:
    ez.launch(check_in, world_size=4, timeout=10)
except ez.RankError as err:
    missing = err
for rank, failure in missing.failures.items():
    # torch's message, broken between words for the output column
    print(
        textwrap.fill(f"rank {rank}: {failure.message.splitlines()[0]}", 96, subsequent_indent="  ")
    )
assert "3 failed to pass monitoredBarrier" in missing.failures[0].message
assert 3 not in missing.failures

# %% [markdown]
# ## Summary
#
# - `all_reduce` leaves the same combined value on every rank; `broadcast` copies one rank's
#   tensor into buffers the others allocated; `barrier` holds every rank until the last arrives.
# - `ez.Cluster` and `%%ranks` keep ranks and their state alive across cells; a `%%ranks` cell
#   runs in each rank's own namespace, where the notebook's functions travel but its data does not.
# - Subgroups: every rank creates every group; `src=` is a global rank
#   (`dist.get_global_rank(group, 0)`).
# - Subgroup options: `use_local_synchronization=True` lets non-members skip `new_group`;
#   `sort_ranks=False` makes group rank 0 the first rank listed, not the smallest.
# - On NCCL: `torch.cuda.set_device(local_rank)` first (`device_id=` binds the communicator but
#   does not set the device), collective tensors on that GPU, CPU-side agreements on a
#   `dist.new_group(backend="gloo")` side group.
# - Collectives pair up by call order. Ranks that disagree on the sequence hang (for 30 minutes
#   on gloo, 10 on NCCL, by default) or, on NCCL, may even go on out of step.
#   `TORCH_DISTRIBUTED_DEBUG=DETAIL` names the mismatched calls; `dist.monitored_barrier` names
#   the rank that did not arrive. On NCCL a timeout aborts the process: the Flight Recorder
#   (recording by default; `TORCH_NCCL_DUMP_ON_TIMEOUT=1` has each rank write its records
#   where it runs, `torchfrtrace` reads them gathered) says where each rank was.
#
# Now do exercises 1 and 2 in `05_workshop.ipynb`.
#
# Next: **02 · DP sharding**: giving each data-parallel replica its own samples.
