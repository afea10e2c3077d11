"""Notebook 12's exercise: the checker judges the heavy rank's measured data wait.

Right answers of different kinds pass (rebalancing, caching what the first epoch
tokenized); dodges that change the samples or hide the loading from the timings
fail, each with its own reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from ezpz_nb.examples.throughput import make_loader
from ezpz_nb.workshop import throughput as ex


def shuffled(dataset, rank, world_size):
    return make_loader(dataset, batch_size=ex.BATCH_SIZE, shuffle=True)


class Interleaved(Sampler):
    """Every rank takes heavy and light documents in turn: balanced by construction."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        self.ids = [i for i in range(n) if (i // world) % world == rank]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def interleaved(dataset, rank, world_size):
    sampler = Interleaved(len(dataset), rank, world_size)
    return DataLoader(dataset, batch_size=ex.BATCH_SIZE, sampler=sampler)


def contiguous_halves(dataset, rank, world_size):
    """Each rank a contiguous half, shuffled: equal words on both ranks (issue 45's fourth
    trial: the verdict named rank 0 twice, "rank 0 loaded 23,040 words, rank 0 23,040")."""
    n = len(dataset) // world_size
    return DataLoader(Subset(dataset, range(rank * n, (rank + 1) * n)), ex.BATCH_SIZE, shuffle=True)


class Cached(Dataset):
    """Tokenize once, keep it: the first epoch waits, the next ones do not."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.memo = dataset, {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        if i not in self.memo:
            self.memo[i] = self.dataset[i]
        return self.memo[i]


def cached(dataset, rank, world_size):
    return make_loader(Cached(dataset), batch_size=ex.BATCH_SIZE)


class WholeShard(Dataset):
    """A cache filled in one go: the first read loads this rank's whole shard. The gray case
    of issue 45's trial: it is the cache above with its fill moved to the first step, inside
    the steps where the timings show it, and every document loaded once (not a preload
    before the loop, which the timings never see, nor a load at every epoch's start)."""

    def __init__(self, dataset: Any, rank: int, world: int) -> None:
        self.dataset, self.shard, self.memo = dataset, range(rank, len(dataset), world), {}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        if not self.memo:
            self.memo = {j: self.dataset[j] for j in self.shard}
        return self.memo[i]


def whole_shard_at_first_step(dataset, rank, world_size):
    return make_loader(WholeShard(dataset, rank, world_size), batch_size=ex.BATCH_SIZE)


def test_rebalancing_and_caching_pass():
    """Guards the right answers of different kinds: a shuffled sampler, a hand-made
    sampler that interleaves heavy and light documents, the notebook's two persistent
    workers on rank 1 (issue 45: rejected 5 times in 6 on a loaded machine when judged
    by its clock), a prefetching thread, and a cache that makes the last epoch's wait
    vanish, filled as the first epoch reads or with the whole shard at its first step (a
    right answer: the text and the verdict say what it costs), are all judged correct,
    counted in words loaded, not timed."""
    for fn in (shuffled, interleaved, workers_on_the_heavy_rank, prefetching_thread):
        result = ex.check_faster_loader(fn)
        assert result.passed and "a cache" not in result.message, (fn.__name__, result.message)
    # Equal words on both ranks: the verdict still names two different ranks.
    result = ex.check_faster_loader(contiguous_halves)
    assert result.passed, result.message
    said = re.search(
        r"In the last epoch rank (\d+) loaded ([\d,]+) words, rank (\d+) ([\d,]+)\.", result.message
    )
    assert said and said[2] == said[4] and said[1] != said[3], result.message
    for fn in (cached, whole_shard_at_first_step):
        result = ex.check_faster_loader(fn)
        assert result.passed and "a cache" in result.message, (fn.__name__, result.message)
        assert "holds the whole shard in memory" in result.message


def preloaded(dataset, rank, world_size):
    return list(make_loader(dataset, batch_size=ex.BATCH_SIZE))


class EagerEachEpoch:
    """Loads the whole epoch when iteration starts: the wait moves to the first step."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.loader))

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)


def eager(dataset, rank, world_size):
    return EagerEachEpoch(make_loader(dataset, batch_size=ex.BATCH_SIZE))


def lighter(dataset, rank, world_size):
    dataset.heavy_factor = 1  # shorter documents: other samples, not a faster loader
    return make_loader(dataset, batch_size=ex.BATCH_SIZE)


def without_heavy(dataset, rank, world_size):
    light = [i for i in range(len(dataset)) if dataset.words_of(i) == dataset.words]
    return make_loader(Subset(dataset, light), batch_size=ex.BATCH_SIZE)


class PartlyMoved(Sampler):
    """Swaps only 8 long documents for 8 short ones: rank 1 still loads 3x rank 0's words."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        mine = [i for i in range(n) if i % world == rank]
        theirs = [i for i in range(n) if i % world != rank]
        self.ids = theirs[:8] + mine[8:]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def partly_moved(dataset, rank, world_size):
    return DataLoader(
        dataset, batch_size=ex.BATCH_SIZE, sampler=PartlyMoved(len(dataset), rank, world_size)
    )


def not_done(dataset, rank, world_size):
    raise NotImplementedError


def swapped_shards(dataset, rank, world_size):
    """Dodge: rank 0 takes rank 1's long documents, so rank 1 looks fast."""
    ids = [i for i in range(len(dataset)) if i % world_size == (rank + 1) % world_size]
    return DataLoader(dataset, batch_size=ex.BATCH_SIZE, sampler=ids)


class _Slowed(Dataset):
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        import time

        time.sleep(0.004)  # the light rank waits too: rank 1's share falls, nobody is faster
        return self.dataset[i]


def slowed_rank_0(dataset, rank, world_size):
    """Dodge: slow the light rank down instead of speeding the heavy one up."""
    data = _Slowed(dataset) if rank == 0 else dataset
    return make_loader(data, batch_size=ex.BATCH_SIZE)


def preload_in_a_thread(dataset, rank, world_size):
    """Dodge: every batch made in a thread joined before the loop (not the main thread)."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.extend(make_loader(dataset, batch_size=ex.BATCH_SIZE)))
    t.start()
    t.join()
    return out


def preload_in_workers(dataset, rank, world_size):
    """Dodge: every batch made by DataLoader workers (other processes) before the loop."""
    return list(make_loader(dataset, batch_size=ex.BATCH_SIZE, num_workers=2))


def workers_on_the_heavy_rank(dataset, rank, world_size):
    """Right: notebook 12's own fix, two persistent workers on rank 1, counted not timed."""
    workers = 2 if rank == ex.HEAVY_RANK else 0
    return make_loader(
        dataset, batch_size=ex.BATCH_SIZE, num_workers=workers, persistent_workers=workers > 0
    )


class _Prefetching:
    """Right, unusually: a background thread loads the next batches while the steps run."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        import queue
        import threading

        q: queue.Queue = queue.Queue(maxsize=4)
        done = object()

        def fill() -> None:
            for batch in self.loader:
                q.put(batch)
            q.put(done)

        threading.Thread(target=fill, daemon=True).start()
        while (batch := q.get()) is not done:
            yield batch


def prefetching_thread(dataset, rank, world_size):
    return _Prefetching(make_loader(dataset, batch_size=ex.BATCH_SIZE))


def test_dodges_and_the_slow_loader_fail_each_with_its_reason():
    """Guards the checker against answers that only look faster: the slow loader itself,
    a list made before the loop (loading hidden outside the steps), loading the whole
    epoch when iteration starts (the wait moved to the first step), shorter documents
    (other samples), dropping the heavy documents (samples never seen), moving too few
    of the long documents (still 3x the words), and issue 45's: shards swapped (rank 0
    the straggler), the light rank slowed down, the preload in a joined thread or in
    DataLoader workers; an untouched blank is "not done"."""

    def words(rank: int) -> int:
        data = ex.dataset()
        return sum(data.words_of(i) for i in PartlyMoved(len(data), rank, ex.WORLD_SIZE))

    expected = {
        ex.slow_loader: "Load beside the steps on every rank",
        swapped_shards: "rank 0 loaded",
        slowed_rank_0: "Load beside the steps on every rank",
        preload_in_a_thread: "outside its steps",
        preload_in_workers: "outside its steps",
        partly_moved: f"rank 1 loaded {words(1):,} words, rank 0 {words(0):,}.",
        preloaded: "outside its steps",
        eager: "moved to the epoch's start",
        lighter: "differs from the dataset's samples",
        without_heavy: "never seen",
    }
    for fn, reason in expected.items():
        result = ex.check_faster_loader(fn)
        assert result.status == "wrong" and reason in result.message, (fn.__name__, result.message)
    assert ex.check_faster_loader(not_done).status == "not done"


def _step(rank: int, step: int, start: float, busy: float, wait: float) -> Any:
    from ezpz_nb.ledger import StepRecord, StepTimes

    times = StepTimes(busy, 0.0, wait + 0.001, 0.0, start, start + busy)
    return StepRecord(0, step, rank, rank, 2, 0, 1, (rank,), "loaded", "d", times=times)


def test_the_straggler_is_named_from_counts_not_from_who_entered_last():
    """Guards issue 45's flip ("No straggler" for a rank 2.9x slower, last to enter in 62% of
    8 steps under load): rank 1 does three times rank 0's work in every step, but rank 0
    started the epoch late (step 0) and was preempted before entering twice, so it entered
    last in 3 of 8 steps. Counted from the busy time since the collective they both left,
    rank 1 is the one waited for in every step after the first: the straggler."""
    from ezpz_nb.ledger import Ledger

    records = []
    for step in range(8):
        t = 100.0 + step
        late = {0: 0.5, 3: 0.04, 6: 0.04}.get(step, 0.0)  # rank 0: a late start, two preemptions
        fast, slow = 0.01, 0.03
        enter0, enter1 = t + late + fast, t + slow
        records.append(_step(0, step, t + late, fast, max(0.0, enter1 - enter0)))
        records.append(_step(1, step, t, slow, max(0.0, enter0 - enter1)))
    ledger = Ledger(records)
    last = [t.step for t in ledger.timings() if t.rank == 0 and t.entered_last]
    assert last == [0, 3, 6]  # the old rule's 62%: below its 75%, "No straggler"
    verdict = ledger.diagnose()
    assert verdict.straggler == 1, verdict.text
    assert verdict.waited_share == {0: 0.0, 1: 1.0}
    assert "rank 1 was the one waited for in 100% of the steps" in " ".join(verdict.text.split())


# Issue 45's outside trial, findings 6-7: each dodge and right variant over several draws
# (EZPZ_NB_DRAWS; each draw is one check, two trainings on the shared warm ranks).
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))


class _ReadByAHelper(Dataset):
    """Dodge: each read done by a helper thread while the training thread waits for it."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.pool = dataset, None  # type: Any, Any

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = self.pool or ThreadPoolExecutor(1)
        return self.pool.submit(self.dataset.__getitem__, i).result()


def read_by_a_helper(dataset, rank, world_size):
    return make_loader(_ReadByAHelper(dataset), batch_size=ex.BATCH_SIZE)


class _PastTheRecorder(Dataset):
    """Dodge: the same samples read through the dataset's parent class, unnoted."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        return super(type(self.dataset), self.dataset).__getitem__(i)


def past_the_recorder(dataset, rank, world_size):
    return make_loader(_PastTheRecorder(dataset), batch_size=ex.BATCH_SIZE)


def wipes_the_read_log(dataset, rank, world_size):
    """Dodge: the slow loader, and a collate that empties every file the dataset names."""
    import os.path

    from torch.utils.data import default_collate

    logs = [v for v in vars(dataset).values() if isinstance(v, str) and os.path.isfile(v)]

    def collate(items: list) -> Any:
        for log in logs:
            open(log, "w").close()
        return default_collate(items)

    sampler = make_loader(dataset, batch_size=ex.BATCH_SIZE).sampler
    return DataLoader(dataset, batch_size=ex.BATCH_SIZE, sampler=sampler, collate_fn=collate)


def deep_prefetch_everywhere(dataset, rank, world_size):
    """Right: two persistent workers on every rank, four batches ahead each (the epoch)."""
    return make_loader(
        dataset, batch_size=ex.BATCH_SIZE, num_workers=2, prefetch_factor=4, persistent_workers=True
    )


def test_loads_counted_from_every_reader_and_checked_against_the_ledger():
    """Guards issue 45's findings 6-7: a helper thread that reads only while the training
    thread waits (counted: each read began after its step asked), reads past the recorder
    and a wiped read log (every trained sample must have been read first); a deep prefetch
    on every rank passes, on every draw."""
    expected = {
        read_by_a_helper: "Load beside the steps on every rank",
        past_the_recorder: "never read from the dataset your function got",
        wipes_the_read_log: "never read from the dataset your function got",
    }
    for _ in range(DRAWS):
        for fn, reason in expected.items():
            result = ex.check_faster_loader(fn)
            assert result.status == "wrong" and reason in result.message, (fn.__name__, result)
        result = ex.check_faster_loader(deep_prefetch_everywhere)
        assert result.passed and "beside the steps" in result.message, result.message
