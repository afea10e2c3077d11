"""Loaders for test_verify_twins.py: two replicas alike out of four, made-up data under real
ids, and right answers at the rules' boundaries.

The ninth session's open twins (issue 45): at dp 4, replicas ``a`` and ``b`` read the same
data (stamped with their own shard's ids) while the other two read theirs, a loader without
a ``.dataset`` (nothing to re-read); and an honest shard whose loader puts zeros (or one
fill value) under a real id. Each is drawn anew per ``seed``: the permutation, the pair, the
sample, the shard sizes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

B = 4


def tokens(j: int, width: int = 6) -> torch.Tensor:
    return torch.arange(width) + 7 * j


class PairTwins:
    """DODGE: each replica deals its shard's ids of a fresh permutation each epoch; replica
    ``b``'s k-th sample holds the data of replica ``a``'s k-th (the other two read their
    own). No ``.dataset``: the re-read has nothing to read. ``n``: 24 (6 a replica) or an
    uneven 30 (8, 8, 7, 7); ``rows`` "twice": the data itself holds every row twice."""

    def __init__(self, layout: Any, seed: int, n: int, rows: str = "distinct") -> None:
        g = np.random.default_rng([31, seed])
        self.pair = sorted(int(x) for x in g.choice(layout.dp_size, 2, replace=False))
        self.r, self.d, self.n, self.seed, self.rows, self.epoch = (
            layout.dp_rank, layout.dp_size, n, seed, rows, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _data(self, i: int) -> torch.Tensor:
        return tokens(i // 2 if self.rows == "twice" else i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        mine = perm[self.r :: self.d].tolist()
        a, b = self.pair
        data = list(mine)
        if self.r == b:
            theirs = perm[a :: self.d].tolist()
            data = [theirs[k] if k < len(theirs) else i for k, i in enumerate(mine)]
        for k in range(0, len(mine), B):
            yield {"input_ids": torch.stack([self._data(j) for j in data[k : k + B]]),
                   "index": torch.tensor(mine[k : k + B])}  # fmt: skip


class Rows(Dataset):
    """Rows one per index, with the index: ``kind`` "tokens", "pixels" (floats), "twice"
    (every row twice: rows 2j and 2j+1 alike), "perm" (each a permutation of range(8)), "zeros" (16 values, mostly zero: one or two
    set a row, every fifth row all zeros)."""

    def __init__(self, n: int, kind: str = "tokens") -> None:
        self.n, self.kind = n, kind

    def __len__(self) -> int:
        return self.n

    def row(self, i: int) -> torch.Tensor:
        if self.kind == "pixels":
            return torch.rand(2, 4, generator=torch.Generator().manual_seed(i))
        if self.kind == "twice":
            return tokens(i // 2)
        if self.kind == "perm":  # a sorting task: every row the same values, in its own order
            return torch.randperm(8, generator=torch.Generator().manual_seed(i))
        if self.kind == "zeros":
            x = torch.zeros(16, dtype=torch.int64)
            if i % 5:
                x[i % 16] = 3 + i
                x[(i * 7) % 16] = 1
            return x
        return tokens(i)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"input_ids": self.row(i), "index": i}


class Cropped(Dataset):
    """``dataset``'s samples, each with an augmentation record ``crop``: two offsets drawn per
    read in range(4) (RandomCrop's parameters logged), from a generator seeded alike on every
    rank (workers seeded from one base seed): the draws repeat across replicas, one copy per
    replica (the thirteenth trial's r13_random_crop_offsets)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.g = dataset, np.random.default_rng(7)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.dataset[i], "crop": torch.from_numpy(self.g.integers(0, 4, 2))}


class MadeUp:
    """DODGE: an honest shuffled shard of ``Rows`` (with ``.dataset``), but one drawn sample
    an epoch on one drawn replica (``where`` "one"), or every replica's first sample
    ("first"), holds ``fill`` in every place under its own id."""

    def __init__(self, layout: Any, seed: int, n: int, kind: str, fill: float,
                 where: str) -> None:  # fmt: skip
        self.dataset = Rows(n, kind)
        self.r, self.d, self.seed, self.fill, self.where, self.epoch = (
            layout.dp_rank, layout.dp_size, seed, fill, where, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        g = np.random.default_rng([self.seed, self.epoch])
        mine = g.permutation(len(self.dataset))[self.r :: self.d].tolist()
        rows = [self.dataset[i]["input_ids"] for i in mine]
        if self.where == "first":
            rows[0] = torch.full_like(rows[0], self.fill)
        elif self.r == int(g.integers(self.d)):
            at = int(g.integers(len(rows)))
            rows[at] = torch.full_like(rows[at], self.fill)
        for k in range(0, len(mine), B):
            yield {
                "input_ids": torch.stack(rows[k : k + B]),
                "index": torch.tensor(mine[k : k + B]),
            }


class Uneven(Sampler[int]):
    """A shuffled shard without padding: replica r reads perm[r::d] (8, 8, 7, 7 of 30)."""

    def __init__(self, n: int, r: int, d: int, seed: int) -> None:
        self.n, self.r, self.d, self.seed, self.epoch = n, r, d, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(range(self.r, self.n, self.d))

    def __iter__(self) -> Iterator[int]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        return iter(perm[self.r :: self.d].tolist())


class Masking:
    """RIGHT: an honest shuffled shard whose loop masks half the rows (drawn), each value of
    such a row with chance ``rate``, to ``mask`` (MLM without a collate_fn): at 0.7 on 6
    tokens about one masked row in 9 is wiped whole, and the rows left whole show the
    re-read faithful."""

    def __init__(self, layout: Any, seed: int, n: int, kind: str, rate: float,
                 mask: int) -> None:  # fmt: skip
        self.dataset = Rows(n, kind)
        self.r, self.d, self.seed, self.rate, self.mask, self.epoch = (
            layout.dp_rank, layout.dp_size, seed, rate, mask, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        g = np.random.default_rng([self.seed, self.r, self.epoch])
        mine = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.dataset))
        mine = mine[self.r :: self.d].tolist()
        for k in range(0, len(mine), B):
            x = torch.stack([self.dataset[j]["input_ids"] for j in mine[k : k + B]])
            rows = g.random((len(x), 1)) < 0.5
            hide = torch.from_numpy((g.random(tuple(x.shape)) < self.rate) & rows)
            yield {"input_ids": torch.where(hide, self.mask, x),
                   "index": torch.tensor(mine[k : k + B])}  # fmt: skip


def sharded(n: int, kind: str, seed: int, uneven: bool = False, crop: bool = False) -> Any:
    """RIGHT: a DistributedSampler (padded to even shards) or :class:`Uneven` over Rows
    (``crop``: :class:`Cropped`)."""

    def make(layout: Any) -> DataLoader:
        ds: Dataset = Cropped(Rows(n, kind)) if crop else Rows(n, kind)
        s: Sampler[int] = (
            Uneven(n, layout.dp_rank, layout.dp_size, seed)
            if uneven
            else DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=seed)
        )
        return DataLoader(ds, batch_size=B, sampler=s)

    return make


class Repeated(Dataset):
    """``ConcatDataset([a] * 4)`` of ``a`` token rows, each sample with its index."""

    def __init__(self, a: int) -> None:
        self.a = a

    def __len__(self) -> int:
        return 4 * self.a

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        return {"input_ids": tokens(i % self.a), "index": i}


def in_order(a: int) -> Any:
    """RIGHT: a DistributedSampler without shuffle over :class:`Repeated`: at dp 4 with ``a``
    odd, each row's four copies lie one per replica in every epoch (a random shard rarely)."""

    def make(layout: Any) -> DataLoader:
        ds = Repeated(a)
        s = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=False)
        return DataLoader(ds, batch_size=3, sampler=s)

    return make


class Views(Dataset):
    """``d`` views of ``n`` token rows: view ``v`` of row ``j`` is index ``j + n * v``, its
    tokens as they are, or (``turn`` "reversed", "rolled") reversed or rolled for ``v > 0``."""

    def __init__(self, n: int, d: int, turn: str = "") -> None:
        self.n, self.d, self.turn = n, d, turn

    def __len__(self) -> int:
        return self.n * self.d

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        v, j = divmod(i, self.n)
        x = tokens(j, 8)
        if v and self.turn == "reversed":
            x = x.flip(0)
        elif v and self.turn == "rolled":
            x = x.roll(v)
        return {"input_ids": x, "index": i}


class FixedBlock(Sampler[int]):
    """Replica r reads the r-th block of ``n`` ids, shuffled anew each epoch: a shard that
    never moves (a file per rank), shuffled in place."""

    def __init__(self, n: int, r: int, seed: int) -> None:
        self.n, self.r, self.seed, self.epoch = n, r, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        perm = np.random.default_rng([self.seed, self.epoch, self.r]).permutation(self.n)
        return iter((perm + self.n * self.r).tolist())


def fixed_blocks(
    n: int, seed: int, turn: str | None = None, kind: str = "tokens", crop: bool = False
) -> Any:
    """DODGE (``turn`` given): each replica shuffles its own block of :class:`Views`, a copy
    of the same ``n`` rows (the tenth trial's: ids i + n r, replica r > 0 reversed). RIGHT
    (``turn`` None): each its own block of ``Rows(n * d, kind)``, distinct rows."""

    def make(layout: Any) -> DataLoader:
        d = layout.dp_size
        ds: Dataset = Rows(n * d, kind) if turn is None else Views(n, d, turn)
        ds = Cropped(ds) if crop else ds
        return DataLoader(ds, batch_size=B, sampler=FixedBlock(n, layout.dp_rank, seed))

    return make


#: name -> (seed -> factory); every dodge fails dp_disjoint, at dp 4.
DODGES = {
    "replicas a and b alike, 24 rows": lambda s: lambda lay: PairTwins(lay, s, 24),
    "replicas a and b alike, uneven 30": lambda s: lambda lay: PairTwins(lay, s, 30),
    # At 40 rows 11 draws in 20 fail: the data's own repeats blur the pair (see pairs.py).
    "replicas a and b alike, every row twice, 80": lambda s: (
        lambda lay: PairTwins(lay, s, 80, "twice")
    ),
    "zeros under one id": lambda s: lambda lay: MadeUp(lay, s, 30, "tokens", 0, "one"),
    "fill -1 under one id": lambda s: lambda lay: MadeUp(lay, s, 30, "tokens", -1, "one"),
    "zero pixels under one id": lambda s: lambda lay: MadeUp(lay, s, 30, "pixels", 0.0, "one"),
    "zeros first on every replica": lambda s: lambda lay: MadeUp(lay, s, 30, "tokens", 0, "first"),
    "a copy each, alike, shuffled in place": lambda s: fixed_blocks(12, s, ""),
    "a copy each, alike reversed, shuffled in place": lambda s: fixed_blocks(12, s, "reversed"),
    "a copy each, alike rolled, shuffled in place": lambda s: fixed_blocks(12, s, "rolled"),
    # The same data beside a small augmentation record: the tokens (the largest field) twin.
    "a copy each, alike, with a crop record": lambda s: fixed_blocks(12, s, "", crop=True),
}

#: name -> (seed -> factory); every right answer passes every rule, at dp 4.
RIGHT = {
    "every row twice, 24": lambda s: sharded(24, "twice", s),
    "every row twice, uneven 30": lambda s: sharded(30, "twice", s, uneven=True),
    "uneven 30, padded": lambda s: sharded(30, "tokens", s),
    "uneven 30, not padded": lambda s: sharded(30, "tokens", s, uneven=True),
    "mostly zeros, 30": lambda s: sharded(30, "zeros", s),
    "mostly zeros, masked to 0 in the loop": lambda s: (
        lambda lay: Masking(lay, s, 30, "zeros", 0.15, 0)
    ),
    "rows wiped whole by masking at 0.7": lambda s: (
        lambda lay: Masking(lay, s, 30, "tokens", 0.7, 103)
    ),
    "a fixed block each, shuffled in place": lambda s: fixed_blocks(8, s),
    "a fixed block each, every row twice": lambda s: fixed_blocks(8, s, kind="twice"),
    "a sorting task: every row the same values": lambda s: sharded(32, "perm", s),
    "a sorting task in fixed blocks": lambda s: fixed_blocks(8, s, kind="perm"),
    # A crop record drawn alike on every replica repeats one copy per replica: no twin, as
    # the tokens (the sample's identifying content) differ.
    "a crop record drawn alike on every replica": lambda s: sharded(30, "tokens", s, crop=True),
}
