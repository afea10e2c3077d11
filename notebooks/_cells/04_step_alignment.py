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
# Every collective pairs up with the same-numbered call on the other ranks (notebook 01). So
# all ranks of a group must take **the same number of steps**, or the ranks with more steps wait
# forever for the ones that left. This notebook shows how the TP leader broadcast keeps its peers
# in step, how it breaks when the data's length is not what it claims, and the remedies for
# uneven data.
#
# **Learning goals**
#
# - Explain why ezpz's non-leaders iterate `range(len(loader))` instead of the loader itself.
# - See the hang when the leader's loader yields fewer batches than its `len()` claims, and read
#   each rank's stack in the `HangError`.
# - Keep shapes static with `drop_last=True`.
# - Remedies for uneven data: announce the end of the epoch, agree on a step count, pad, or
#   use torch's `Join`.

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
# its peer, trusting `len(loader) == 4`, waits for a fourth. We run it on 4 ranks: 2 DP replicas,
# each a TP group of 2.

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


def stream_epoch(wrap):
    layout = make_layout(tp_size=2)
    stream = Stream(actual=12, claimed=16, dp_rank=layout.dp_rank, dp_size=layout.dp_size)
    steps = record(wrap(DataLoader(stream, batch_size=2), layout.tp_group), layout)
    for _batch in steps:
        pass
    return steps.ledger()


try:
    ez.launch(stream_epoch, seed_style, world_size=4, timeout=5)
except ez.HangError as err:
    hang = err
    print(err)

# %% [markdown]
# The report shows the leaders (ranks 0 and 2) finished after 3 batches, while their peers
# (ranks 1 and 3) are blocked in `broadcast_object_list`, waiting for a fourth batch that will
# never come. The timeline shows the step counts: 3 on every rank, then the peers hang.
# Without a timeout this waits for torch's default collective timeout (30 minutes on gloo).

# %%
partial = Ledger.from_events(hang.events, num_samples=12)
for r in (0, 2):
    assert hang.stacks[r].state == "finished"
for r in (1, 3):
    assert hang.stacks[r].call == "broadcast_object_list", hang.stacks[r].describe()
assert [len(partial.steps(r, 0)) for r in range(4)] == [3, 3, 3, 3]
viz.timeline(partial, error=hang)

# %% [markdown]
# ## Remedy 1: the leader announces the end
#
# `ezpz_nb`'s `TPBroadcastDataLoader` keeps the idea (only the leader loads) but the peers do
# not count: each step, the leader announces either a batch, the end of the epoch, or its own
# exception. Peers follow the announcements. The same lying `Stream` now ends cleanly: every
# rank takes 3 steps, and the ledger finds nothing wrong: all 12 samples seen, once each.

# %%
results = ez.launch(stream_epoch, TPBroadcastDataLoader, world_size=4)
announced = Ledger.from_results(results, num_samples=12)
print(announced.summary())
assert [len(announced.steps(r, 0)) for r in range(4)] == [3, 3, 3, 3]
assert announced.ok


# %% [markdown]
# ## `drop_last=True` for static shapes
#
# With 10 samples over 2 DP replicas (5 each) and batches of 2, `drop_last=False` ends each epoch
# with a batch of 1. A changing shape costs twice in TP: the broadcast must send the new shapes
# first (an extra collective), and a compiled model recompiles. `drop_last=True` drops that last
# batch: every batch has the same shape.

# %%
def batch_shapes(drop_last):
    layout = make_layout(tp_size=2)
    loader = get_random_dataset_fsdp_tp(
        batch_size=2, vocab_size=100, seq_length=8, num_samples=10, drop_last=drop_last,
        dp_group=layout.dp_group, tp_group=layout.tp_group, broadcast_within_tp=True,
        seed=0)["dataloader"]
    return [tuple(batch["input_ids"].shape) for batch in loader]


for drop_last in (False, True):
    shapes = ez.launch(batch_shapes, drop_last, world_size=4)
    print(f"drop_last={drop_last}: rank 1 (a peer) received shapes {shapes[1]}")
    assert all(s == shapes[0] for s in shapes)
    assert shapes[0] == ([(2, 8), (2, 8), (1, 8)] if not drop_last else [(2, 8), (2, 8)])


# %% [markdown]
# ## Remedy 2: agree on a step count
#
# When ranks hold uneven data (the hand-made `ds[rank::world]` of notebook 02: 3, 3, 2 and 2
# batches), they can agree **before** the loop: an `all_reduce` with `MIN` gives every rank the
# number of steps all of them can take. Everyone takes 2 steps; no hang. The price: samples
# beyond the agreed count are skipped this epoch.

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
# ## Remedy 3: pad
#
# `DistributedSampler(drop_last=False)` pads every shard to the same length by repeating
# samples (notebook 02): all ranks take the same steps at the cost of a few duplicates.
#
# ## Remedy 4: torch's `Join`
#
# When each rank must use all its data, `torch.distributed.algorithms.join.Join` lets ranks that
# run out early keep answering the collectives of the others until everyone is done. DDP and
# `ZeroRedundancyOptimizer` support it out of the box (`with Join([ddp_model]):`); here is the
# mechanism in a few lines, without DDP's start-up cost. `GradSync` stands in for DDP: every
# step it all-reduces a "gradient" (the sample id) and adds it to a running total, its stand-in
# for the model. A rank that has joined (run out of data) answers each remaining step with a
# zero gradient.
#
# With `ds[rank::world]` sharding of 10 samples, ranks 0 and 1 take 3 steps, ranks 2 and 3 take
# 2, and nothing hangs. Every rank ends with the same total, 0 + 1 + ... + 9 = 45: each sample
# counted exactly once, and the "model" identical everywhere.

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


def train_with_join():
    rank, world = dist.get_rank(), dist.get_world_size()
    my_samples = list(range(rank, 10, world))  # 3, 3, 2, 2 samples
    sync = GradSync()
    with Join([sync]):
        for sample in my_samples:
            sync.step(float(sample))
    return len(my_samples), sync.total.item()


joined = ez.launch(train_with_join, world_size=4, timeout=30)
for rank, (n, total) in enumerate(joined):
    print(f"rank {rank}: {n} steps of its own, total {total}")
assert joined == [(3, 45.0), (3, 45.0), (2, 45.0), (2, 45.0)]

# %% [markdown]
# ## Summary
#
# - Collectives pair up by call order, so every rank of a group must take the same number of
#   steps.
# - ezpz's peers count steps with their own `len()`; a loader that yields fewer batches than it
#   claims leaves them waiting in `broadcast_object_list` forever.
# - Announcing each step from the leader (ezpz_nb's `TPBroadcastDataLoader`) ends the epoch on
#   every rank together.
# - `drop_last=True` keeps batch shapes static.
# - Uneven data: agree on a step count (`all_reduce` with `MIN`), pad
#   (`DistributedSampler(drop_last=False)`), or `Join` (finished ranks keep answering the others' collectives).
#
# Next: **05 · Workshop**: write these pieces yourself; a checker runs them on real ranks.
