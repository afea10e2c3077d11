# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 09 · Resume mid-epoch, exactly
#
# **Time:** 35 to 45 minutes with the predictions (advanced track). Running the cells alone
# takes under a minute.
#
# Long jobs get stopped: a preemption, a time limit, a crash. The model and optimizer go into a
# checkpoint, but the **data loader's place** in the epoch must go too, or the resumed run
# repeats the samples it already trained on (or skips some). This notebook stops a job halfway
# through an epoch, restarts it in a fresh set of ranks, and proves with the ledger that every
# sample of the epoch was seen exactly once across the two runs, three ways.
#
# **Learning goals**
#
# - Resume a `DistributedSampler` by skipping the consumed batches (what ezpz's fsdp_tp example
#   does), and see what the skip costs.
# - Save and restore `torchdata`'s `StatefulDataLoader` per rank (`state_dict` /
#   `load_state_dict`): over a map-style dataset it resumes without loading the consumed
#   samples; a stream is read again up to its place unless it saves its own state.
# - Resume the TP broadcast: only the TP leader's state matters; peers follow it.
# - Resume on a **different world size**: see what breaks and save a position that survives
#   it, for the rest of the epoch and not beyond.
# - Merge the two runs' ledgers into one (`Ledger.merge_runs`) and check it.

# %%
# %matplotlib inline
import collections
import itertools
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset, TPBroadcastDataLoader
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record

N, BATCH, SEED, EPOCH = 24, 2, 0, 3  # the job is stopped during its epoch 3

# %% [markdown]
# ## The set-up: one job, stopped after 3 steps
#
# 24 samples, 2 DP replicas, batches of 2: each replica takes 6 steps per epoch. The job is in
# its epoch 3; after step 3 it gets the signal to stop, writes its checkpoint and exits. A
# second run, in **new processes**, reads the checkpoint and finishes the epoch. The checkpoint
# is one file per rank (`rank{r}.pt`), as a real job writes next to the model's.
#
# `Counted` is the dataset with a counter: how many samples this rank actually loaded (read
# from disk, decoded, tokenised, in a real job).


# %%
class Counted(RandomTokenDataset):
    """A RandomTokenDataset that counts the samples it had to produce."""

    def __init__(self, num_samples):
        super().__init__(vocab_size=100, seq_length=4, num_samples=num_samples, seed=SEED)
        self.loads = 0

    def __getitem__(self, index):
        self.loads += 1
        return super().__getitem__(index)


def make_sampler(dataset, layout):
    return DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        seed=SEED,
        drop_last=True,
    )


def job(part, world_sizes=(2, 2), stop_after=3, drop=()):
    """Run `part` twice on fresh ranks sharing one checkpoint folder; merge their ledgers.

    `drop` names checkpoint files to delete between the two runs. Returns the merged ledger, each
    run's ledger, and how many samples each rank of each run loaded.
    """
    with tempfile.TemporaryDirectory() as ckpt:
        first = ez.launch(part, ckpt, stop_after, world_size=world_sizes[0])
        for name in drop:
            (Path(ckpt) / name).unlink()
        second = ez.launch(part, ckpt, None, world_size=world_sizes[1])
    runs = [Ledger.from_results([led for led, _ in res], num_samples=N) for res in (first, second)]
    loads = [[n for _, n in res] for res in (first, second)]
    return Ledger.merge_runs(*runs), runs, loads


def exactly_once(ledger, epoch=EPOCH):
    """{sample: how many DP replicas' steps held it}, counting each TP group once."""
    return collections.Counter(
        i for r in ledger.records if r.epoch == epoch and r.tp_rank == 0 for i in r.sample_ids
    )


# %% [markdown]
# ## 1. `DistributedSampler` + skip the consumed batches
#
# The simplest checkpoint of the data is two numbers: the epoch and the steps taken in it. On
# resume, `set_epoch(epoch)` recreates the same shuffled order (it is seeded by `seed + epoch`),
# and `itertools.islice(loader, step, None)` skips the batches the first run consumed.


# %%
def part_skip(ckpt, stop_after):
    layout = make_layout(tp_size=1)
    dataset = Counted(N)
    sampler = make_sampler(dataset, layout)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    file = Path(ckpt) / f"rank{layout.rank}.pt"
    place = torch.load(file) if file.exists() else {"epoch": EPOCH, "step": 0}
    sampler.set_epoch(place["epoch"])  # same order as the first run's
    batches = itertools.islice(loader, place["step"], None)  # skip what was consumed
    rec = record(batches, layout, epoch=place["epoch"])
    for step, _batch in enumerate(rec, start=place["step"]):
        # ... forward, backward, optimizer step ...
        if step + 1 == stop_after:  # the stop signal: checkpoint, then exit
            torch.save({"epoch": place["epoch"], "step": step + 1}, file)
            break
    return rec.ledger(), dataset.loads


skip_job, skip_runs, skip_loads = job(part_skip)
for r in (0, 1):
    print(
        f"rank {r}: first run {skip_runs[0].sample_ids(r, EPOCH)}, "
        f"resumed run {skip_runs[1].sample_ids(r, EPOCH)}"
    )
print(skip_job.summary())
print("samples loaded per rank, first run:", skip_loads[0], " resumed run:", skip_loads[1])

# %% [markdown]
# `Ledger.merge_runs(first, second)` reads the two runs as one job: the resumed run's steps
# (which its loader numbers from 0 again) follow the first run's. The checks then look at the
# whole epoch: no sample seen twice (`dp_duplicate`), none missed (`never_seen`). The proof
# below is stronger still: each rank saw **the same samples in the same order** as in an epoch
# that was never stopped (what `DistributedSampler` deals that rank).


# %%
def uninterrupted(dp_size=2, epoch=EPOCH):
    """Each replica's samples in an epoch never stopped: DistributedSampler's own shards."""
    shards = []
    for dp_rank in range(dp_size):
        sampler = DistributedSampler(
            range(N), num_replicas=dp_size, rank=dp_rank, shuffle=True, seed=SEED, drop_last=True
        )
        sampler.set_epoch(epoch)
        shards.append(list(sampler))
    return shards


straight = uninterrupted()
assert skip_job.ok
assert exactly_once(skip_job) == dict.fromkeys(range(N), 1)
assert [skip_job.sample_ids(r, EPOCH) for r in (0, 1)] == straight
assert [len(run.steps(0, EPOCH)) for run in skip_runs] == [3, 3]
assert skip_loads == [[6, 6], [12, 12]]
viz.heatmap(skip_job)

# %% [markdown]
# It is correct, and it has a price: the resumed run **loaded 12 samples per rank for 6 it used**.
# The skip runs the loader over the consumed batches and throws them away. Here that is 6
# cheap samples; after 9 hours of a 10-hour epoch of real documents it is most of an epoch's
# loading, before the first useful step.
#
# ## 2. `StatefulDataLoader`: save the loader itself
#
# `torchdata.stateful_dataloader.StatefulDataLoader` is a drop-in `DataLoader` with
# `state_dict()` and `load_state_dict()`. Its state says how far the sampler got (and, with
# workers, each worker's place). Each rank saves **its own** state: the ranks hold different
# shards, so a rank must get its own file back.
#
# torchdata 0.11 is the last release of the project, and it builds on private parts of
# `DataLoader`. ezpz_nb itself does not depend on it; this notebook does, through the `notebook`
# extra. It also calls a torch function that torch 2.13 deprecates, hence the warning filter.


# %%
def stateful_loader(*args, **kwargs):
    """A StatefulDataLoader, minus torchdata 0.11's warning about torch.set_vital."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(*args, **kwargs)


def part_stateful(ckpt, stop_after):
    layout = make_layout(tp_size=1)
    dataset = Counted(N)
    sampler = make_sampler(dataset, layout)
    loader = stateful_loader(dataset, batch_size=BATCH, sampler=sampler)
    file = Path(ckpt) / f"rank{layout.rank}.pt"
    epoch = EPOCH
    if file.exists():
        saved = torch.load(file)
        epoch = saved["epoch"]
        loader.load_state_dict(saved["loader"])
    sampler.set_epoch(epoch)
    rec = record(loader, layout, epoch=epoch)
    for step, _batch in enumerate(rec):
        if step + 1 == stop_after:
            torch.save({"epoch": epoch, "loader": loader.state_dict()}, file)
            break
    return rec.ledger(), dataset.loads


stateful_job, stateful_runs, stateful_loads = job(part_stateful)
print(stateful_job.summary())
print("samples loaded per rank, first run:", stateful_loads[0], " resumed run:", stateful_loads[1])

# %% [markdown]
# **Predict** before you read on: the resumed run takes 3 steps of 2 samples. How many samples
# does each of its ranks load?
#
# <details><summary>Answer</summary>
#
# 6, the ones it uses. The saved state holds how many indices the sampler had handed out;
# `load_state_dict` moves the sampler's iterator past them without asking the dataset for a
# single sample. The skip of part 1 loaded 12.
# </details>

# %%
assert stateful_job.ok
assert exactly_once(stateful_job) == dict.fromkeys(range(N), 1)
assert [stateful_job.sample_ids(r, EPOCH) for r in (0, 1)] == straight
assert stateful_loads == [[6, 6], [6, 6]]

# %% [markdown]
# That holds because the dataset is **map-style**: the loader's place is the sampler's place,
# and a sampler can skip indices without touching the data. A stream (an `IterableDataset`,
# notebook 10) has no sampler. If it does not save its own place, `StatefulDataLoader` can only
# **fast-forward**: start the stream again and read, and throw away, the items already consumed
# (it logs a warning saying so). A stream that defines `state_dict` and `load_state_dict` (as
# torchtitan's datasets do) is saved inside the loader's state and resumes from there.
#
# Each rank does the same with its own shard of the stream, so one process shows it. `Lines`
# counts its reads; `ResumableLines` also keeps its position (a file offset, in a real stream).


# %%
class Lines(IterableDataset):
    """A stream of `n` lines that counts how many it had to read."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __iter__(self):
        for i in range(self.n):
            self.reads += 1
            yield {"index": i}


class ResumableLines(Lines):
    """The same stream, with its place in `state_dict` (torchdata's Stateful protocol)."""

    def __init__(self, n):
        super().__init__(n)
        self.pos = 0

    def __iter__(self):
        for i in range(self.pos, self.n):
            self.reads += 1
            self.pos = i + 1
            yield {"index": i}
        self.pos = 0  # an epoch that ended: the next starts at the top

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def resume_stream(cls, n=12, stop_after=3):
    """Stop after `stop_after` batches, resume in a fresh loader; count the reads."""
    first = stateful_loader(cls(n), batch_size=BATCH)
    it = iter(first)
    seen = [i for _ in range(stop_after) for i in next(it)["index"].tolist()]
    state = first.state_dict()
    resumed = stateful_loader(cls(n), batch_size=BATCH)
    resumed.load_state_dict(state)  # Lines: torchdata logs that it fast-forwards
    seen += [i for batch in resumed for i in batch["index"].tolist()]
    return seen, resumed.dataset.reads, state["dataset_state"]


stream_reads = {}
for cls in (Lines, ResumableLines):
    seen, reads, saved = resume_stream(cls)
    print(f"{cls.__name__:>14}: resumed run read {reads} lines to give 6; its saved state {saved}")
    assert seen == list(range(12))  # either way, every line once
    stream_reads[cls.__name__] = reads
assert stream_reads == {"Lines": 12, "ResumableLines": 6}

# %% [markdown]
# ## 3. The TP broadcast: the leader's state is the one that counts
#
# With tensor parallelism only the TP leader loads (notebook 03); its peers receive each batch.
# `TPBroadcastDataLoader.state_dict()` says so: on the leader it holds the wrapped loader's own
# state, on a peer only the step count (`"loader": None`), because a peer has no loader place to
# restore. After a restart the peers follow the leader's announcements as always, so they resume
# exactly where the leader does. It needs no collective: every rank may call it at the same step.
#
# 4 ranks: 2 DP replicas x TP 2. To show that the peers' files do not matter, the peers'
# checkpoints (ranks 1 and 3) are **deleted** before the second run.


# %%
def part_tp(ckpt, stop_after):
    layout = make_layout(tp_size=2)
    dataset = Counted(N)
    sampler = make_sampler(dataset, layout)
    loader = TPBroadcastDataLoader(
        stateful_loader(dataset, batch_size=BATCH, sampler=sampler), layout.tp_group
    )
    file = Path(ckpt) / f"rank{layout.rank}.pt"
    epoch = EPOCH
    if file.exists():
        saved = torch.load(file)
        epoch = saved["epoch"]
        loader.load_state_dict(saved["loader"])
    loader.set_epoch(epoch)
    rec = record(loader, layout, epoch=epoch)
    for step, _batch in enumerate(rec):
        if step + 1 == stop_after:
            state = loader.state_dict()
            torch.save({"epoch": epoch, "loader": state}, file)
            if layout.rank < 2:
                print(
                    "saves",
                    {
                        k: (v if k != "loader" or v is None else "<the loader's state>")
                        for k, v in state.items()
                    },
                )
            break
    return rec.ledger(), dataset.loads


tp_job, tp_runs, tp_loads = job(part_tp, world_sizes=(4, 4), drop=("rank1.pt", "rank3.pt"))
print(tp_job.summary())
print("samples loaded per rank, first run:", tp_loads[0], " resumed run:", tp_loads[1])

# %%
assert tp_job.ok  # includes tp_mismatch: peers held what their leader held, at every step
assert exactly_once(tp_job) == dict.fromkeys(range(N), 1)
assert tp_loads == [[6, 0, 6, 0], [6, 0, 6, 0]]  # peers load nothing, before or after
assert {r.source for r in tp_job.records if r.tp_rank == 1} == {"received"}
viz.heatmap(tp_job)

# %% [markdown]
# The heatmap shows the merged job: the rows of each TP group match at every step, and the two
# groups' rows hold different samples, 24 in all, none repeated. Wrapping a plain `DataLoader`
# works too: its state has no loader part, and `load_state_dict` then makes the leader skip the
# consumed batches as in part 1 (loading them again).
#
# ## 4. Resuming on a different world size
#
# The job was stopped on 2 ranks and comes back on 4 (more nodes were free). The checkpoint of
# part 1 says "epoch 3, step 3". **Predict**: with 4 DP replicas, what do the resumed ranks see?
#
# <details><summary>Answer</summary>
#
# `DistributedSampler` orders the epoch the same way whatever the world size (`randperm` seeded
# by `seed + epoch`) and deals it out round-robin: rank `r` of `R` gets positions `r, r+R, ...`
# of that order. On 2 ranks, 3 steps of 2 consumed the first 12 positions. On 4 ranks each rank
# holds 6 positions (3 batches). Ranks 0 and 1 find their files and skip 3 batches: nothing is
# left, they take no step. Ranks 2 and 3 find **no** file and start the epoch from the start:
# positions 2, 3, 6, 7, 10 and 11 were trained on already, and positions 12, 13, 16, 17, 20 and
# 21, dealt to ranks 0 and 1, are never seen. 6 samples twice, 6 never.
# </details>

# %%
resized, resized_runs, _ = job(part_skip, world_sizes=(2, 4))
print(resized.summary())
found = {p.kind: p for p in resized.check()}
assert len(found["dp_duplicate"].samples) == 6 and len(found["never_seen"].samples) == 6
assert [len(resized_runs[1].steps(r, EPOCH)) for r in range(4)] == [0, 0, 3, 3]

# %% [markdown]
# A step count is a position **per rank**, and it means something only for the world size that
# wrote it. (A `StatefulDataLoader` state has the same problem: each rank's file describes that
# rank's shard; 4 new ranks find 2 files.) What survives a resize is a **global** position: how
# many samples of the epoch's order the whole job consumed, `steps x batch x dp_size`. The sampler
# below continues that order from there and deals the rest over however many replicas there
# are now. With `start=0` it gives what `DistributedSampler` gives (checked below).
#
# The position belongs to **one** epoch. A sampler that kept skipping `start` samples in the
# epochs after the resumed one would quietly train every later epoch on part of the data (16 of
# 24 samples here, epoch after epoch, and no error). So `ResumableSampler` applies `start` only
# in `start_epoch`; torchdata's `StatefulDistributedSampler` does the same by clearing its
# offset once it has been used. The resumed run below goes on for two more epochs with the same
# sampler, and the checks cover all three.


# %%
class ResumableSampler(DistributedSampler):
    """DistributedSampler that starts `start` samples into epoch `start_epoch`'s global order.

    The saved place belongs to that one epoch: any other epoch starts at its beginning.
    """

    def __init__(self, dataset, start=0, start_epoch=0, **kwargs):
        super().__init__(dataset, **kwargs)
        self.start, self.start_epoch = start, start_epoch

    def _rest(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)  # as DistributedSampler does
        skip = self.start if self.epoch == self.start_epoch else 0
        rest = torch.randperm(len(self.dataset), generator=g).tolist()[skip:]
        return rest[: len(rest) - len(rest) % self.num_replicas]  # drop_last

    def __iter__(self):
        return iter(self._rest()[self.rank :: self.num_replicas])

    def __len__(self):
        return len(self._rest()) // self.num_replicas


def part_global(ckpt, stop_after, last_epoch=EPOCH + 2):
    layout = make_layout(tp_size=1)
    dataset = Counted(N)
    file = Path(ckpt) / "job.pt"  # one file for the job: the position is global
    place = torch.load(file) if file.exists() else {"epoch": EPOCH, "consumed": 0}
    # One file for all ranks: nobody may write the next checkpoint before every rank has read
    # this one. (A real job's first gradient all_reduce would make them wait too.)
    dist.barrier()
    sampler = ResumableSampler(
        dataset,
        start=place["consumed"],
        start_epoch=place["epoch"],
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        seed=SEED,
        drop_last=True,
    )
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    rec = record(loader, layout, epoch=place["epoch"])  # later passes: the next epochs
    for epoch in range(place["epoch"], last_epoch + 1):
        sampler.set_epoch(epoch)
        for step, _batch in enumerate(rec):
            if step + 1 == stop_after:
                if layout.rank == 0:
                    consumed = place["consumed"] + (step + 1) * BATCH * layout.dp_size
                    torch.save({"epoch": epoch, "consumed": consumed}, file)
                return rec.ledger(), dataset.loads
    return rec.ledger(), dataset.loads


plain = DistributedSampler(
    range(N), num_replicas=2, rank=1, shuffle=True, seed=SEED, drop_last=True
)
plain.set_epoch(EPOCH)
again = ResumableSampler(range(N), num_replicas=2, rank=1, shuffle=True, seed=SEED, drop_last=True)
again.set_epoch(EPOCH)
assert list(again) == list(plain)
# Resumed 8 samples into epoch EPOCH on 4 replicas: that epoch deals the rest, the next two
# deal whole epochs, exactly as DistributedSampler does.
for epoch in (EPOCH, EPOCH + 1, EPOCH + 2):
    shards = []
    for r in range(4):
        resumed = ResumableSampler(
            range(N), start=8, start_epoch=EPOCH, num_replicas=4, rank=r, seed=SEED, drop_last=True
        )
        resumed.set_epoch(epoch)
        shards.append(list(resumed))
    dealt = sorted(i for shard in shards for i in shard)
    assert len(dealt) == (N - 8 if epoch == EPOCH else N) and len(set(dealt)) == len(dealt)
    if epoch != EPOCH:
        assert shards == uninterrupted(dp_size=4, epoch=epoch)

regrown, regrown_runs, regrown_loads = job(part_global, world_sizes=(2, 4), stop_after=2)
print(regrown.summary())
print(
    "steps per rank in the resumed run:", [len(regrown_runs[1].steps(r, EPOCH)) for r in range(4)]
)

# %% [markdown]
# Stopped after 2 steps on 2 ranks (8 samples consumed), resumed on 4: the 16 left are dealt
# out 4 per rank, 2 steps each; then two whole epochs of 6 per rank. Every sample once per epoch,
# and nothing loaded twice. The summary's `step_mismatch` in the resumed epoch is expected and
# harmless: the first run had 2 ranks, the second 4, so ranks 2 and 3 took only the resumed
# run's steps; inside each run every rank took the same number (the assertions check both).

# %%
for epoch in (EPOCH, EPOCH + 1, EPOCH + 2):  # every epoch whole, not only the resumed one
    assert exactly_once(regrown, epoch) == dict.fromkeys(range(N), 1), epoch
assert {(p.kind, p.epoch) for p in regrown.check()} == {("step_mismatch", EPOCH)}
assert all(p.kind != "step_mismatch" for run in regrown_runs for p in run.check())
assert [len(regrown_runs[1].steps(r, EPOCH)) for r in range(4)] == [2, 2, 2, 2]
assert [len(regrown_runs[1].steps(r, EPOCH + 2)) for r in range(4)] == [3, 3, 3, 3]
assert regrown_loads == [[4, 4], [4 + 6 + 6] * 4]
viz.heatmap(regrown)

# %% [markdown]
# ## Summary
#
# - A checkpoint holds the data's place, not only the model: the epoch (for `set_epoch`) and how
#   far into it the job got.
# - Skipping the consumed batches of the loader (`islice`) is exact, but it loads them again;
#   skipping in the sampler (part 4) loads nothing.
# - `StatefulDataLoader` saves each rank's place (`state_dict()` per rank, `load_state_dict()` in
#   the new process). Over a map-style dataset it resumes without loading the consumed samples;
#   a stream is fast-forwarded (read again up to its place) unless it has its own `state_dict`.
# - With the TP broadcast, only the TP leader's state holds the loader's place; peers follow the
#   leader after a restart as before.
# - A per-rank place (a step count, a per-rank loader state) is tied to the world size. Save a
#   global position (samples consumed in the epoch's order) to resume on another one, and apply
#   it to that epoch only.
# - `Ledger.merge_runs(first, second)` turns the runs of one job into one ledger, and its checks
#   prove the restart repeated nothing and skipped nothing.
#
# Next: **10 · Iterable data with workers**: streams, ranks and DataLoader workers.
