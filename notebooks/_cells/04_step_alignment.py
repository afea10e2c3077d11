# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Step alignment
#
# **Time:** 40 to 50 minutes with the predictions, then exercises 6 and 7 of `05_workshop`
# (25 to 30 minutes). Running the cells alone takes under a minute.
#
# Every collective pairs up with the same-numbered call on the other ranks (notebook 01). So
# all ranks of a group must take **the same number of steps**, or the ranks with more steps wait
# for the ones that left. This notebook shows how the TP leader broadcast keeps its peers in
# step, how it breaks when the data's length is not what it claims, and which remedy keeps which
# ranks in step: TP peers with their leader, or DP replicas with each other.
#
# **Learning goals**
#
# - Explain why ezpz's non-leaders iterate `range(len(loader))` instead of the loader itself.
# - See the hang when the leader's loader yields fewer batches than its `len()` claims, and read
#   each rank's stack in the `HangError`.
# - Tell the sampler's `drop_last` from the DataLoader's, and keep batch shapes static.
# - Know which remedy covers what: the leader's announcements keep a TP group in step; DP
#   replicas with uneven data need equal shards, an agreed step count, or `Join`, and `Join`
#   covers only the collectives it is given.

# %%
# %matplotlib inline
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.utils.data import DataLoader, IterableDataset

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import TPBroadcastDataLoader, get_random_dataset_fsdp_tp
from ezpz_nb.data.groups import make_layout
from ezpz_nb.examples.step_alignment import AgreedSteps
from ezpz_nb.ledger import Ledger, record

# %% [markdown]
# ## Why peers iterate a dummy range
#
# In ezpz's `TPBroadcastDataLoader` only the TP leader has a loader worth iterating; its peers
# must not load (that is the point), yet they must make one `broadcast` call per batch the
# leader sends. So they count: `for _ in range(len(loader))`, trusting **their own** `len()` to
# equal the number of batches the leader will send. Here it is in a few lines:


# %%
def seed_style(loader, tp_group):
    """ezpz's TP broadcast loop, in essence."""
    src = dist.get_global_rank(tp_group, 0)
    if dist.get_rank(tp_group) == 0:  # the leader loads...
        for batch in loader:
            box = [batch]
            dist.broadcast_object_list(box, src=src, group=tp_group)
            yield box[0]
    else:  # ...its peers receive, as many times as *their* len() says
        for _ in range(len(loader)):
            box = [None]
            dist.broadcast_object_list(box, src=src, group=tp_group)
            yield box[0]


# %% [markdown]
# ## When the length lies
#
# A dataset whose length is only an estimate is common: a stream of documents filtered while
# reading, a file whose line count was taken before cleaning. Below, each DP replica's `Stream`
# yields 6 samples but its `__len__` says 8. With batches of 2 the leader sends 3 batches while
# its peer trusts `len(loader) == 4`. We run it on 4 ranks: 2 DP replicas, each a TP group of 2.
#
# **Predict:** which ranks hang, and in which call?
#
# <details><summary>Answer</summary>
#
# The peers, ranks 1 and 3: after 3 batches they wait in `broadcast_object_list` for a fourth
# that never comes. The leaders, ranks 0 and 2, have finished.
#
# </details>


# %%
class Stream(IterableDataset):
    """One DP replica's share of `actual` samples; its length is an estimate, `claimed`."""

    def __init__(self, actual, claimed, dp_rank, dp_size):
        self.actual, self.claimed = actual, claimed
        self.dp_rank, self.dp_size = dp_rank, dp_size

    def __iter__(self):
        for i in range(self.dp_rank, self.actual, self.dp_size):
            yield {"input_ids": torch.full((4,), i), "index": i}

    def __len__(self):
        return self.claimed // self.dp_size


def stream_epoch(wrap, actual=12):
    layout = make_layout(tp_size=2)
    stream = Stream(actual=actual, claimed=16, dp_rank=layout.dp_rank, dp_size=layout.dp_size)
    steps = record(wrap(DataLoader(stream, batch_size=2), layout.tp_group), layout)
    for _batch in steps:
        pass
    return steps.ledger()


try:
    ez.launch(stream_epoch, seed_style, world_size=4, timeout=3)
except ez.HangError as err:
    hang = err
    print(err)

# %% [markdown]
# The timeline shows the step counts: 3 on every rank, then the peers hang. Without a timeout
# this waits for torch's default collective timeout (30 minutes on gloo, 10 minutes on NCCL),
# because a notebook's finished ranks stay alive. Under torchrun the leaders would exit after
# their script, and the gloo peers would fail within seconds with `Connection closed by peer`.
#
# With several epochs it is worse: nothing hangs until the last one. A peer's 4th broadcast of
# epoch 0 pairs with its leader's **first** batch of epoch 1, so the peer trains on a batch of
# the next epoch while its leader is still in this one, and the two drift one step further
# apart every epoch. Over 3 epochs the leader sends 9 batches and the peer waits for 12: it
# hangs only in the last epoch.
#
# **Predict:** over 3 epochs, how many steps does the ledger give a peer in each epoch, and what
# does it hold at its 4th step of epoch 0?
#
# <details><summary>Answer</summary>
#
# 4, 4 and 1, against its leader's 3, 3 and 3. At its 4th step of epoch 0 it holds the
# leader's first batch of epoch 1, samples 0 and 2 (this stream is not shuffled): the ledger
# sees the peer take samples 0 and 2 twice in one epoch, and TP peers holding different batches.
#
# </details>


# %%
def stream_epochs(wrap, epochs=3):
    layout = make_layout(tp_size=2)
    stream = Stream(actual=12, claimed=16, dp_rank=layout.dp_rank, dp_size=layout.dp_size)
    loader = DataLoader(stream, batch_size=2)
    for epoch in range(epochs):  # the ledger publishes each step as it is taken
        for _batch in record(wrap(loader, layout.tp_group), layout, epoch=epoch):
            pass


try:
    ez.launch(stream_epochs, seed_style, world_size=4, timeout=5)
except ez.HangError as err:
    drift = err
drifted = Ledger.from_events(drift.events, num_samples=12)
for epoch in range(3):
    print(f"epoch {epoch}: steps per rank {[len(drifted.steps(r, epoch)) for r in range(4)]}")
print("peer 1, epoch 0:", [s.sample_ids for s in drifted.steps(1, 0)])
assert [[len(drifted.steps(r, e)) for r in range(4)] for e in range(3)] == [[3, 4, 3, 4]] * 2 + [
    [3, 1, 3, 1]
]
assert drifted.steps(1, 0)[3].sample_ids == drifted.steps(0, 1)[0].sample_ids == (0, 2)
assert {"rank_duplicate", "step_mismatch", "tp_mismatch"} <= {p.kind for p in drifted.check()}

# %%
partial = Ledger.from_events(hang.events, num_samples=12)
for r in (0, 2):
    assert hang.stacks[r].state == "finished"
for r in (1, 3):
    assert hang.stacks[r].call == "broadcast_object_list", hang.stacks[r].describe()
assert [len(partial.steps(r, 0)) for r in range(4)] == [3, 3, 3, 3]
viz.timeline(partial, error=hang)

# %% [markdown]
# ## Inside a TP group: the leader announces the end
#
# `ezpz_nb`'s `TPBroadcastDataLoader` keeps the idea (only the leader loads) but the peers do
# not count: each step, the leader announces either a batch, the end of the epoch, or its own
# exception. Peers follow the announcements.
#
# **Predict:** with the same lying `Stream`, how many steps does each rank take?
#
# <details><summary>Answer</summary>
#
# 3 on every rank: the peers stop when their leader says the epoch ended. The ledger finds
# nothing wrong: all 12 samples seen, once each.
#
# </details>

# %%
results = ez.launch(stream_epoch, TPBroadcastDataLoader, world_size=4)
announced = Ledger.from_results(results, num_samples=12)
print(announced.summary())
assert [len(announced.steps(r, 0)) for r in range(4)] == [3, 3, 3, 3]
assert announced.ok


# %% [markdown]
# ## Two flags called `drop_last`
#
# Two different flags share this name, and `get_random_dataset_fsdp_tp(drop_last=...)` passes
# it to both:
#
# - the **sampler's** `drop_last` (notebook 02) trims the dataset's tail so that it divides over
#   the DP replicas, instead of padding with repeats;
# - the **DataLoader's** `drop_last` drops a last batch that is shorter than `batch_size`.
#
# Below, 10 samples over 2 DP replicas (5 each: they divide, so the sampler's flag changes
# nothing) in batches of 2.
#
# **Predict:** what batch shapes does rank 1, a TP peer, receive with `drop_last=False`, and with
# `drop_last=True`?
#
# <details><summary>Answer</summary>
#
# `[(2, 8), (2, 8), (1, 8)]`, then `[(2, 8), (2, 8)]`: the DataLoader's flag drops the batch of 1.
# A changing shape costs twice in TP: the broadcast must send the new shapes first (an extra
# collective), and a compiled model recompiles.
#
# </details>


# %%
def batch_shapes(drop_last):
    layout = make_layout(tp_size=2)
    loader = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=10,
        drop_last=drop_last,
        dp_group=layout.dp_group,
        tp_group=layout.tp_group,
        broadcast_within_tp=True,
        seed=0,
    )["dataloader"]
    return [tuple(batch["input_ids"].shape) for batch in loader]


for drop_last in (False, True):
    shapes = ez.launch(batch_shapes, drop_last, world_size=4)
    print(f"drop_last={drop_last}: rank 1 (a peer) received shapes {shapes[1]}")
    assert all(s == shapes[0] for s in shapes)
    assert shapes[0] == ([(2, 8), (2, 8), (1, 8)] if not drop_last else [(2, 8), (2, 8)])


# %% [markdown]
# ## Between DP replicas, the announcements do not help
#
# The leader's announcements keep **one TP group** in step with its leader. DP replicas have
# different leaders, and each step ends in a collective across them: the gradient all-reduce
# over the DP group (DDP or FSDP does it). If one replica has fewer batches, its ranks leave the
# loop while the other replica's ranks wait in that all-reduce.
#
# Below, the same lying `Stream` over 9 samples: replica 0 gets 5 (3 batches), replica 1 gets
# 4 (2 batches). Both TP groups announce; each step all-reduces over the DP group.
#
# **Predict:** does it hang? If so, which ranks wait?
#
# <details><summary>Answer</summary>
#
# It hangs. Ranks 0 and 1 (replica 0, the one with **more** data) wait in the gradient
# all-reduce of their third step for ranks 2 and 3, which have finished. (With more epochs to
# go, that all-reduce would instead pair with replica 1's first step of the next epoch.)
#
# </details>


# %%
def dp_epoch(agree):
    layout = make_layout(tp_size=2)
    stream = Stream(actual=9, claimed=16, dp_rank=layout.dp_rank, dp_size=layout.dp_size)
    loader = TPBroadcastDataLoader(DataLoader(stream, batch_size=2), layout.tp_group)
    if agree:  # one all-reduce per step over the DP group: "do we all still have a batch?"
        loader = AgreedSteps(loader, layout.dp_group)
    steps = record(loader, layout)
    for batch in steps:
        grad = batch["input_ids"].float().mean()
        dist.all_reduce(grad, group=layout.dp_group)  # stands in for DDP's gradient all-reduce
    return steps.ledger()


try:
    ez.launch(dp_epoch, False, world_size=4, timeout=3)
except ez.HangError as err:
    dp_hang = err
    print(err)
assert [dp_hang.stacks[r].call for r in (0, 1)] == ["all_reduce", "all_reduce"]
assert [dp_hang.stacks[r].state for r in (2, 3)] == ["finished", "finished"]

# %% [markdown]
# ### Agree on each step
#
# When no rank can know its count in advance (a stream, a `len()` that lies), the DP replicas
# can agree **before every step**: one small all-reduce with `MIN` of "I still have a batch"
# over the DP group, and all stop as soon as one has run out. `AgreedSteps` (from
# `ezpz_nb.examples.step_alignment`, the walkthrough that also runs under torchrun) does this;
# in exercise 7 you write it yourself. Every rank takes 2 steps, and the batches a replica has
# beyond the agreed count are skipped this epoch: the ledger reports replica 0's third batch
# (sample 8) as never seen.
#
# The price is one small collective per step, and on a GPU it is more than its bytes. Under
# NCCL the flag is a CUDA tensor, and `if not have` reads it on the CPU (an `.item()`): the CPU
# waits for the GPU to finish everything queued so far, every step, and can no longer queue the
# next step's kernels while the GPU works. (ezpz_nb's own TP announcements under nccl pay the
# same: each peer copies the 32-byte header to the CPU every step, `ezpz_nb/data/broadcast.py`.)
# Two ways around it: agree on a gloo side group, `dist.new_group(backend="gloo")`, so the flag
# never leaves the CPU (notebook 01); or do not ask every step at all: run a fixed number of
# steps over streams that never end (each rank starts its stream again when it runs out), as
# torchtitan's training loop does.

# %%
agreed = Ledger.from_results(ez.launch(dp_epoch, True, world_size=4), num_samples=9)
print(agreed.summary())
assert [len(agreed.steps(r, 0)) for r in range(4)] == [2, 2, 2, 2]


# %% [markdown]
# ### Agree once, up front
#
# When every rank knows its true count, one `all_reduce` with `MIN` before the loop gives every
# rank the number of steps all of them can take. Below, the hand-made `ds[rank::world]` of
# notebook 02: 3, 3, 2 and 2 batches.
#
# **Predict:** how many steps does each rank take?
#
# <details><summary>Answer</summary>
#
# 2 on every rank, the smallest count; the third batch of ranks 0 and 1 is skipped this epoch.
# This needs counts that are true: a `len()` that lies (above) breaks it.
#
# </details>


# %%
def agreed_steps():
    rank, world = dist.get_rank(), dist.get_world_size()
    my_batches = list(range(rank, 10, world))  # 3, 3, 2, 2 batches
    n = torch.tensor(len(my_batches))
    dist.all_reduce(n, op=dist.ReduceOp.MIN)  # the count every rank can reach
    for step in range(int(n)):
        grad = torch.tensor(float(my_batches[step]))
        dist.all_reduce(grad)
    return int(n)


steps = ez.launch(agreed_steps, world_size=4, timeout=30)
print(steps)
assert steps == [2, 2, 2, 2]


# %% [markdown]
# ### Equal shards by construction
#
# With a map-style dataset, `DistributedSampler` gives every replica the same number of samples
# (notebook 02): its `drop_last=False` pads with repeats, its `drop_last=True` drops the tail. With
# the DataLoader's `drop_last=True` too, every replica also has the same number of full batches.
#
# ### torch's `Join`
#
# When each rank must use all its data, `torch.distributed.algorithms.join.Join` lets ranks that
# run out early keep **shadowing** the collectives of the ranks still training, until all are
# done. It shadows only the collectives of the *Joinables* it is given: DDP's gradient
# all-reduce (`with Join([ddp_model]):`) and `ZeroRedundancyOptimizer`'s. Here is the mechanism
# in a few lines, without DDP's start-up cost. `GradSync` stands in for DDP: every step it
# all-reduces a "gradient" (the sample id) and adds it to a running total, its stand-in for the
# model. A rank that has joined (run out of data) answers each remaining step with a zero
# gradient.
#
# With `ds[rank::world]` sharding of 10 samples, ranks 0 and 1 take 3 steps, ranks 2 and 3
# take 2.
#
# **Predict:** does it hang? What total does each rank end with?
#
# <details><summary>Answer</summary>
#
# No hang, and 45.0 everywhere: 0 + 1 + ... + 9, each sample counted exactly once, the "model"
# identical on every rank.
#
# </details>


# %%
class ZeroGradients(JoinHook):
    def __init__(self, sync):
        self.sync = sync

    def main_hook(self):  # runs on a joined rank for each step the others still take
        zero = torch.zeros(1)
        dist.all_reduce(zero)
        self.sync.total += zero


class GradSync(Joinable):
    def __init__(self):
        super().__init__()
        self.total = torch.zeros(1)

    def step(self, grad):
        Join.notify_join_context(self)  # tells Join this rank is still stepping
        g = torch.tensor([grad])
        dist.all_reduce(g)
        self.total += g

    def join_hook(self, **kwargs):
        return ZeroGradients(self)

    @property
    def join_device(self):
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


def train_with_join(log_loss=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    my_samples = list(range(rank, 10, world))  # 3, 3, 2, 2 samples
    sync = GradSync()
    with Join([sync]):
        for sample in my_samples:
            sync.step(float(sample))
            if log_loss:  # a collective Join knows nothing about
                loss = torch.tensor([float(sample)])
                dist.all_reduce(loss)
    return len(my_samples), sync.total.item()


joined = ez.launch(train_with_join, world_size=4, timeout=30)
for rank, (n, total) in enumerate(joined):
    print(f"rank {rank}: {n} steps of its own, total {total}")
assert joined == [(3, 45.0), (3, 45.0), (2, 45.0), (2, 45.0)]

# %% [markdown]
# ### What `Join` does not cover
#
# A joined rank shadows only the Joinables' collectives. Any other collective in the loop has no
# shadow: an all-reduce that averages the loss for logging, a metric, the TP broadcast of the
# next batch. Below, the same loop also all-reduces its loss each step.
#
# **Predict:** does it still finish?
#
# <details><summary>Answer</summary>
#
# No. The logging all-reduces of ranks 0 and 1 pair up with `Join`'s own bookkeeping on the
# joined ranks 2 and 3, the ranks fall out of step, and ranks 2 and 3 wait inside `Join`.
#
# </details>

# %%
try:
    ez.launch(train_with_join, log_loss=True, world_size=4, timeout=3)
except ez.HangError as err:
    join_hang = err
    print(err)
assert [join_hang.stacks[r].call for r in (2, 3)] == ["all_reduce", "all_reduce"]

# %% [markdown]
# Two more things to know about DDP under `Join`. The joined ranks contribute zero gradients,
# and DDP divides the sum by the **initial** world size, so late steps get smaller updates,
# unless you pass `Join([ddp_model], divide_by_initial_world_size=False)` to divide by the ranks
# still training. And `Join(..., throw_on_early_termination=True)` makes every rank raise as soon
# as one runs out, for loops that cannot go on with fewer ranks.
#
# ## Which remedy covers what
#
# | the ranks that must stay in step | why their counts differ | remedy |
# |---|---|---|
# | the TP peers and their leader | the peers do not load, so they cannot know when the leader's data ends | the leader announces every step and the end (`TPBroadcastDataLoader`) |
# | DP replicas, map-style data | the shards differ in length (`ds[rank::world]`) | `DistributedSampler` (pads or, with its `drop_last=True`, drops) |
# | DP replicas, true counts known | uneven data | agree once: `all_reduce(MIN)` of the counts |
# | DP replicas, counts unknown or estimated | a stream, a `len()` that lies | agree each step: `all_reduce(MIN)` of "I have a batch" (on NCCL: on a gloo side group), or a fixed step count over endless streams |
# | DP replicas, every sample must be used | uneven data | `Join` with DDP or ZeRO; every other collective in the loop still needs the same count |
#
# ## Summary
#
# - Collectives pair up by call order, so every rank of a group must take the same number of
#   steps.
# - ezpz's peers count steps with their own `len()`; a loader that yields fewer batches than it
#   claims leaves them waiting in `broadcast_object_list` (30 minutes on gloo, 10 on NCCL, by
#   default, while the leaders stay alive; under torchrun the gloo peers fail within seconds
#   with `Connection closed by peer` once the leaders exit). Over several epochs they take the
#   next epoch's batches first and hang only in the last epoch.
# - Announcing each step from the leader (ezpz_nb's `TPBroadcastDataLoader`) ends the epoch on
#   every rank of a TP group together; it does nothing for DP replicas of different lengths.
# - The sampler's `drop_last` decides what happens to samples that do not divide over the DP
#   replicas; the DataLoader's drops a short last batch and keeps shapes static.
# - Between DP replicas: equal shards (`DistributedSampler`), an agreed count (once if the
#   counts are true, each step if they are not), or `Join`, which shadows only DDP's (or ZeRO's)
#   collectives and divides by the initial world size unless told otherwise.
# - Agreeing each step costs a collective, and on NCCL a device-to-host sync: agree on a gloo
#   side group, or run a fixed number of steps over endless streams.
#
# Now do exercises 6 and 7 in `05_workshop.ipynb`.
#
# Next: **05 · Workshop** (the exercises, if you have not done them along the way), then
# **06 · Explorer** (optional).
