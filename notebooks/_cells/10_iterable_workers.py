# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 10 · Iterable data with workers
#
# **Time:** 25 to 30 minutes with the predictions (advanced track). Running the cells alone
# takes under a minute.
#
# Big corpora are streams: files read line by line, shards fetched one after another. A stream
# is an `IterableDataset`, and no `DistributedSampler` can shard it: the dataset must shard
# itself. With DataLoader workers it is sharded twice: over the ranks **and** over each rank's
# worker processes. This notebook gets that wrong on purpose, lets the ledger catch it, and then
# fixes it, along with three more ways a stream with workers goes wrong.
#
# **Learning goals**
#
# - Split a stream the way real ones are split: whole shards (files) per rank, not every n-th
#   sample, and see what per-sample striding costs in reads.
# - Shard an `IterableDataset` over rank x `get_worker_info()`; see the classic bug where every
#   worker yields the same samples, caught by the ledger with the worker id of each sample.
# - Seed the randomness inside workers so that DP replicas differ and reruns repeat.
# - Make `set_epoch` reach `persistent_workers`.
# - Keep DP replicas in step on an uneven stream by agreeing at every step.

# %%
# %matplotlib inline
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record, tag_worker

N, BATCH = 16, 2

# %% [markdown]
# ## A stream is files: split whole shards
#
# A corpus on disk is a list of **shards**: files of many samples each, read from start to end.
# Ranks split a stream by giving each rank whole shards: HF `datasets`' `split_dataset_by_node`
# hands out whole shards when the number of shards divides by the world size (its default,
# `strategy="auto"`; `strategy="shards"` asks for whole shards always, since datasets PR #8565),
# and WebDataset's `split_by_node` splits its list of tar files. A rank then reads only its own
# files.
#
# The other way, keeping every `world`-th **sample**, gives the same samples, but each rank must
# read the whole stream to find its own, and throw away `world - 1` of every `world` it reads
# (`split_dataset_by_node` falls back to that when the shards do not divide, or always with
# `strategy="examples"`). Inside a rank the
# DataLoader's workers split again, so with striding every worker of every rank reads everything.
#
# Below, 16 samples in 8 shards of 2, and what each of 2 ranks must read to get its half. The
# stream needs no ranks to count its reads, so this runs in the notebook.

# %%
SHARDS = [[2 * s, 2 * s + 1] for s in range(8)]  # 8 files of 2 samples: 16 samples


class ShardStream(IterableDataset):
    """Whole shards per rank: rank r reads shards r, r + world, ...; counts samples read."""

    def __init__(self, rank, world):
        self.rank, self.world, self.reads = rank, world, 0

    def __iter__(self):
        for shard in SHARDS[self.rank :: self.world]:
            for i in shard:  # open the file, read it to its end
                self.reads += 1
                yield i


class StridedStream(ShardStream):
    """Every world-th sample: rank r reads the whole stream and keeps 1 in `world`."""

    def __iter__(self):
        for n, i in enumerate(i for shard in SHARDS for i in shard):
            self.reads += 1
            if n % self.world == self.rank:
                yield i


reads, covered = {}, {}
for cls in (ShardStream, StridedStream):
    ranks = [cls(rank=r, world=2) for r in (0, 1)]
    held = [list(stream) for stream in ranks]
    print(f"{cls.__name__:>13}: rank 0 gets {held[0]}, and each rank reads", end=" ")
    print(f"{[stream.reads for stream in ranks]} samples")
    reads[cls.__name__] = [stream.reads for stream in ranks]
    covered[cls.__name__] = sorted(held[0] + held[1])
assert covered["ShardStream"] == covered["StridedStream"] == list(range(16))  # each covers all
assert reads == {"ShardStream": [8, 8], "StridedStream": [16, 16]}

# %% [markdown]
# ## Over the ranks and the workers
#
# Each rank's `DataLoader` has 2 workers. Only a worker knows which worker it is
# (`torch.utils.data.get_worker_info()`), so the ledger cannot ask the loader: `tag_worker`
# wraps the dataset so each sample carries its `worker_id`, and `record` writes it into the
# ledger next to the sample id. `Stream` below gives whole shards to each rank, and, if
# `by_worker`, splits the rank's shards over its workers too.
#
# The ranks here are started by a forkserver; `multiprocessing_context="fork"` starts the
# workers as forks of the rank, which is quick, instead of fresh processes that import torch again.


# %%
class Stream(IterableDataset):
    """The shards of SHARDS, split over the ranks, and over the workers if `by_worker`."""

    def __init__(self, rank, world, by_worker):
        self.rank, self.world, self.by_worker = rank, world, by_worker

    def __iter__(self):
        info = get_worker_info()  # None in the main process
        worker, workers = (info.id, info.num_workers) if info and self.by_worker else (0, 1)
        # One share of shards per (rank, worker) pair: world * workers shares in all.
        share, shares = self.rank * workers + worker, self.world * workers
        for shard in SHARDS[share::shares]:
            for i in shard:
                yield {"input_ids": torch.full((4,), i), "index": i}


def loader_for(dataset, **kwargs):
    return DataLoader(
        tag_worker(dataset),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="fork",
        **kwargs,
    )


def stream_epoch(by_worker):
    layout = make_layout(tp_size=1)
    stream = Stream(layout.rank, layout.world_size, by_worker)
    rec = record(loader_for(stream), layout)
    for _batch in rec:
        pass
    return rec.ledger()


# %% [markdown]
# **Predict**: 16 samples, 2 ranks, 2 workers per rank, batches of 2, and the stream shards over
# the ranks only (`by_worker=False`). How many steps does each rank take, and how often is each
# sample seen?
#
# <details><summary>Answer</summary>
#
# 8 steps, each sample twice. Every worker runs `__iter__` on its own copy of the dataset, so
# both workers of rank 0 yield its shards, `0, 1, 4, 5, 8, 9, 12, 13`; the loader takes batches
# from them in turn.
# Twice the steps, every sample counted twice, and nothing fails.
# </details>

# %%
naive = Ledger.from_results(ez.launch(stream_epoch, False, world_size=2), num_samples=N)
print(naive.summary())
for s in naive.steps(0, 0)[:4]:
    print(
        f"rank 0 step {s.step}: samples {s.sample_ids} from worker(s) {sorted(set(s.worker_ids))}"
    )

# %%
dup = [p for p in naive.check() if p.kind == "rank_duplicate"]
assert dup and dup[0].samples == tuple(range(N)), naive.summary()
assert "workers [0, 1]" in dup[0].message
assert "dp_duplicate" not in {p.kind for p in naive.check()}  # no sample crossed replicas
assert [len(naive.steps(r, 0)) for r in (0, 1)] == [8, 8]
assert {w for s in naive.records for w in s.worker_ids} == {0, 1}
viz.heatmap(naive)

# %% [markdown]
# The ledger's `rank_duplicate` check finds samples a rank saw more than once in an epoch, and
# the worker ids say why: the same sample came from worker 0 and from worker 1. (Without the
# worker ids it would still see the repeats, but not whose they were.) The `dp_duplicate` check
# alone would miss this: no sample crossed DP replicas.
#
# The fix is one line: split the shards over `rank * workers + worker` out of
# `world * workers` (with 8 shards, 2 ranks and 2 workers, each worker reads 2 whole shards).
# The shards must divide over ranks x workers, or some workers get more than others: have many
# more shards than that. (The later sections stride per sample to keep their code short.)

# %%
fixed = Ledger.from_results(ez.launch(stream_epoch, True, world_size=2), num_samples=N)
print(fixed.summary())
assert fixed.ok
assert sorted(i for s in fixed.records for i in s.sample_ids) == list(range(N))
assert [len(fixed.steps(r, 0)) for r in (0, 1)] == [4, 4]

# %% [markdown]
# ## Seeding the randomness in workers
#
# Streams often draw random numbers in the workers: a shuffle buffer, random cropping, masking.
# `DataLoader` seeds each worker's torch generator with `base_seed + worker_id`, where
# `base_seed` is drawn from the rank's own generator when iteration starts. Training scripts
# call `torch.manual_seed(0)` on every rank so the model starts identical everywhere. That also
# makes every rank draw the **same** `base_seed`: worker 0 of rank 0 and worker 0 of rank 1 mask
# the same positions, and the DP replicas' "random" augmentations are copies of each other.


# %%
class Masked(IterableDataset):
    """Each worker draws a masked position per sample with torch's generator."""

    def __iter__(self):
        for i in range(4):
            yield {"mask_at": torch.randint(0, 1000, ()).item(), "index": i}


def masks(seed_loader):
    """The masks of one epoch on this rank, twice: as a job and its rerun would draw them."""
    runs = []
    for _run in range(2):
        torch.manual_seed(0)  # as training scripts do, for identical model weights
        layout = make_layout(tp_size=1)
        gen = torch.Generator().manual_seed(1000 + layout.rank) if seed_loader else None
        loader = loader_for(Masked(), generator=gen)
        runs.append([m for batch in loader for m in batch["mask_at"].tolist()])
    return runs


same = [first for first, _ in ez.launch(masks, False, world_size=2)]
print("torch.manual_seed(0) on every rank:\n ", same)  # under 100 columns
assert same[0] == same[1]

# %% [markdown]
# The remedy: give each rank's `DataLoader` a generator seeded by the rank
# (`generator=torch.Generator().manual_seed(seed + rank)`): its workers then get `base_seed`
# from it, so ranks differ, workers differ (`+ worker_id`), and a rerun draws the same again.
# Seeds from `(seed, rank)` do **not** survive a change of world size; a stream that must
# reshard on resume seeds per sample instead (as `RandomTokenDataset` does).

# %%
seeded = ez.launch(masks, True, world_size=2)
print("generator seeded by rank:\n ", [first for first, _ in seeded])
assert seeded[0][0] != seeded[1][0]
assert all(first == rerun for first, rerun in seeded)  # and a rerun draws the same

# %% [markdown]
# ## `persistent_workers` and `set_epoch`
#
# A stream that shuffles per epoch (an order seeded by `seed + epoch`) needs `set_epoch(epoch)`
# every epoch, as `DistributedSampler` does. With `persistent_workers=True` the workers are
# started once and keep **their own copy** of the dataset: `set_epoch` in the rank changes the
# rank's copy, which no worker reads. Every epoch then has epoch 0's order.
#
# One remedy: keep the epoch in shared memory (`share_memory_()`), made before the workers
# start; they read it each time an epoch begins. (The other: `persistent_workers=False`, which
# starts new workers, with a fresh copy, every epoch.)


# %%
class ShuffledStream(IterableDataset):
    """A stream whose order is shuffled per epoch, sharded over ranks x workers."""

    def __init__(self, n, rank, world, shared_epoch):
        self.n, self.rank, self.world = n, rank, world
        self.epoch = torch.zeros((), dtype=torch.int64)
        if shared_epoch:
            self.epoch.share_memory_()  # the workers see what set_epoch writes

    def set_epoch(self, epoch):
        self.epoch.fill_(epoch)

    def __iter__(self):
        info = get_worker_info()
        g = torch.Generator().manual_seed(int(self.epoch))
        order = torch.randperm(self.n, generator=g).tolist()
        shard, shards = self.rank * info.num_workers + info.id, self.world * info.num_workers
        yield from ({"input_ids": torch.full((4,), i), "index": i} for i in order[shard::shards])


def epochs(shared_epoch):
    layout = make_layout(tp_size=1)
    stream = ShuffledStream(N, layout.rank, layout.world_size, shared_epoch)
    rec = record(loader_for(stream, persistent_workers=True), layout)
    for epoch in range(2):
        stream.set_epoch(epoch)  # the rank's copy; the ledger labels each pass itself
        for _batch in rec:
            pass
    return rec.ledger()


stale = Ledger.from_results(ez.launch(epochs, False, world_size=2), num_samples=N)
shared = Ledger.from_results(ez.launch(epochs, True, world_size=2), num_samples=N)
for name, led in (("plain attribute", stale), ("shared memory  ", shared)):
    print(f"{name}: rank 0 epoch 0 {led.sample_ids(0, 0)}, epoch 1 {led.sample_ids(0, 1)}")
assert stale.sample_ids(0, 0) == stale.sample_ids(0, 1)
assert shared.sample_ids(0, 0) != shared.sample_ids(0, 1)
assert stale.ok and shared.ok
viz.heatmap(stale)

# %% [markdown]
# The ledger's checks pass for both: no epoch repeats or misses a sample. A stale order is only
# visible across epochs: the heatmap's two epoch panels are identical, as in notebook 02 without
# `set_epoch`.
#
# %% [markdown]
# ## An uneven stream: agree at every step
#
# Streams rarely split evenly: a filter drops more documents on one shard than another. With a
# map-style dataset the ranks can agree on a step count before the epoch (notebook 04); a stream
# does not know its length. So the ranks agree **at every step**: each says whether it has a
# batch, an `all_reduce(MIN)` over the DP group tells everyone whether all of them do, and they
# stop together at the first step where one has run out.


# %%
class Filtered(IterableDataset):
    """Rank r keeps its share of the stream except samples divisible by (3 + 2 * r)."""

    def __init__(self, n, rank, world):
        self.n, self.rank, self.world = n, rank, world

    def __iter__(self):
        info = get_worker_info()
        shard, shards = self.rank * info.num_workers + info.id, self.world * info.num_workers
        for i in range(shard, self.n, shards):
            if i % (3 + 2 * self.rank):
                yield {"input_ids": torch.full((4,), i), "index": i}


def agreed(loader, group=None):
    """Yield batches while every rank of `group` still has one."""
    it = iter(loader)
    while True:
        batch = next(it, None)
        have = torch.tensor(int(batch is not None))
        dist.all_reduce(have, op=dist.ReduceOp.MIN, group=group)
        if not have:
            return
        yield batch


def uneven(agree):
    layout = make_layout(tp_size=1)
    loader = loader_for(Filtered(2 * N, layout.rank, layout.world_size))
    rec = record(agreed(loader, layout.dp_group) if agree else loader, layout)
    for _batch in rec:
        pass  # a training step with a gradient all_reduce would go here
    return rec.ledger()


ragged = Ledger.from_results(ez.launch(uneven, False, world_size=2))
print(ragged.summary())
together = Ledger.from_results(ez.launch(uneven, True, world_size=2))
print(together.summary())

# %%
steps = [len(ragged.steps(r, 0)) for r in (0, 1)]
assert steps[0] != steps[1] and [p.kind for p in ragged.check()] == ["step_mismatch"]
assert [len(together.steps(r, 0)) for r in (0, 1)] == [min(steps)] * 2
assert together.ok

# %% [markdown]
# Without agreement the ledger finds a `step_mismatch`: in training, the rank with more batches
# would wait in its next gradient `all_reduce` for a partner that has left (the hang of notebook
# 04), or, with epochs to come, pair it with the other's next epoch. With it, both ranks stop at
# the shorter one's end, and the longer rank's tail of the stream is not used this epoch.
#
# The price is one `all_reduce` per step, and on GPUs a device-to-host sync: under NCCL the
# flag is a CUDA tensor, and `if not have` waits for the GPU to finish all queued work, every
# step. Agree on a gloo side group (`dist.new_group(backend="gloo")`, pass it as `group`) to keep
# the flag on the CPU, or, as torchtitan does, run a fixed number of steps over streams that
# restart when they run out, so that no rank ever needs to ask.
#
# ## Summary
#
# - Split a stream by whole shards (files) per rank, as `split_dataset_by_node` (when the shards
#   divide, or with `strategy="shards"`) and WebDataset do; striding per sample makes every rank
#   and worker read everything.
# - An `IterableDataset` shards itself: over `rank x get_worker_info()` (`rank * workers +
#   worker` of `world * workers`), or every worker yields the same samples.
# - Only a worker knows its id, so the sample carries it (`tag_worker`); the ledger's
#   `rank_duplicate` check then names the workers that repeated a sample.
# - Workers' random seeds come from the rank's generator: seed the loader's `generator` per rank,
#   or identical `manual_seed`s make every DP replica draw the same.
# - `persistent_workers` keep their copy of the dataset: pass the epoch through shared memory (or
#   restart the workers).
# - An uneven stream: agree at every step (`all_reduce(MIN)` of "I have a batch"; on NCCL on a
#   gloo side group), or run a fixed number of steps over streams that never end.
