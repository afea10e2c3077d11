"""Notebook 12's exercise: the checker judges the heavy rank's measured data wait.

Right answers of different kinds pass (rebalancing, caching what the first epoch
tokenized); dodges that change the samples or hide the loading from the timings
fail, each with its own reason.
"""

from __future__ import annotations

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


def test_rebalancing_and_caching_pass():
    """Guards the right answers of different kinds: a shuffled sampler, a hand-made
    sampler that interleaves heavy and light documents, and a cache that makes the
    last epoch's wait vanish are all judged correct on what the ranks measured."""
    for fn in (shuffled, interleaved):
        result = ex.check_faster_loader(fn)
        assert result.passed, result.message
    result = ex.check_faster_loader(cached)
    assert result.passed and "with yours" in result.message, result.message


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


def test_dodges_and_the_slow_loader_fail_each_with_its_reason():
    """Guards the checker against answers that only look faster: the slow loader itself,
    a list made before the loop (loading hidden outside the steps), loading the whole
    epoch when iteration starts (the wait moved to the first step), shorter documents
    (other samples), dropping the heavy documents (samples never seen), moving too few
    of the long documents (still 3x the words); an untouched blank is "not done"."""

    def words(rank: int) -> int:
        data = ex.dataset()
        return sum(data.words_of(i) for i in PartlyMoved(len(data), rank, ex.WORLD_SIZE))

    expected = {
        ex.slow_loader: "Cut the wait at least in half",
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
