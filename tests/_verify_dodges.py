"""Trial 7's dodges of verify (issue 45), written anew, and right answers that look like them.

Each dodge turns a rule green without keeping the contract: a ``__len__`` short of storage
read modulo its size, a remainder cut from the head, a view whose ``__len__`` hides the
tail, ids stamped over data every replica reads alike (float features, a packed 1-D
stream), batches frozen at construction or one permutation rotated under ``shuffle=True``,
and a resume state that is only a ticket to a position kept elsewhere. Judged in
test_verify_dodges.py on warm ranks (dp=2).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Subset,
    random_split,
)

from ezpz_nb.data import SteppedLoader, WeightedShard

N, B = 18, 2  # 9 samples a replica at dp=2, global batch 4


class Store(Dataset):
    """Token rows in a list (finite storage) with a loss; ``short`` hides the tail from
    ``__len__`` and ``wrap`` reads the storage modulo its size (a ring buffer)."""

    def __init__(self, n: int = N, short: int = 0, wrap: bool = False) -> None:
        self.rows = [torch.arange(5) + 11 * i for i in range(n)]
        self.short, self.wrap = short, wrap

    def __len__(self) -> int:
        return len(self.rows) - self.short

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = i % len(self.rows) if self.wrap else i
        loss = torch.tensor(1.0 + (i * 7) % 5, dtype=torch.float64)
        return {"input_ids": self.rows[i], "index": i, "loss": loss}


class Pairs(Dataset):
    """RIGHT (eleventh trial): torchvision-style ``(input_ids, index)`` samples, which
    default_collate makes ``[ids, index]`` batches: the ids by their place, key="1"."""

    def __init__(self) -> None:
        self.store = Store()

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.store[i]
        return x["input_ids"], x["index"]


def pairs(layout: Any) -> DataLoader:
    ds = Pairs()
    s = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=0)
    return DataLoader(ds, batch_size=B, sampler=s)


class View(Dataset):
    """A view (``.dataset``, no ``.indices``) that reads the first ``n`` of what it wraps."""

    def __init__(self, dataset: Dataset, n: int) -> None:
        self.dataset, self.n = dataset, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


def _sampled(ds: Dataset, layout: Any, **kw: Any) -> DataLoader:
    s: DistributedSampler = DistributedSampler(
        ds, num_replicas=layout.dp_size, rank=layout.dp_rank, seed=1
    )
    return DataLoader(ds, batch_size=B, sampler=s, **kw)


# ------------------------------------------------------------------ contract: dodges
def wrap_short(layout: Any) -> DataLoader:
    return _sampled(Store(short=3, wrap=True), layout)


def head_cut(layout: Any) -> DataLoader:
    return _sampled(Subset(Store(), range(N % (B * layout.dp_size), N)), layout)


def tail_view(layout: Any) -> DataLoader:
    return _sampled(View(Store(), N - N % (B * layout.dp_size)), layout)


class Twins(IterableDataset):
    """Ids dealt as if sharded; each replica's k-th sample holds the same data (``packed``:
    the tokens of a batch end to end in one row, cut by ``cu_seqlens``; else float
    features). ``honest`` reads the data of the ids it deals."""

    def __init__(self, layout: Any, packed: bool = False, honest: bool = False) -> None:
        self.r, self.d, self.packed, self.honest, self.epoch = (
            layout.dp_rank, layout.dp_size, packed, honest, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        perm = np.random.default_rng([5, self.epoch]).permutation(N)[self.r :: self.d]
        for k in range(0, len(perm), B):
            ids = [int(i) for i in perm[k : k + B]]
            data = ids if self.honest else list(range(k, k + len(ids)))
            if self.packed:
                rows = [torch.arange(3 + j % 3) + 7 * j for j in data]
                cu = torch.tensor([0, *np.cumsum([len(r) for r in rows])])
                yield {"tokens": torch.cat(rows), "cu_seqlens": cu, "index": torch.tensor(ids)}
            else:
                g = torch.Generator().manual_seed(99)
                feats = torch.rand(N, 2, 3, generator=g)[data]  # sample j's pixels
                yield {"pixels": feats, "index": torch.tensor(ids)}


def float_twins(layout: Any) -> DataLoader:
    return DataLoader(Twins(layout), batch_size=None)


def packed_twins(layout: Any) -> DataLoader:
    return DataLoader(Twins(layout, packed=True), batch_size=None)


class Frozen(BatchSampler):
    """Batches cut once from one permutation; each epoch only reorders the batches."""

    def __init__(self, layout: Any) -> None:
        mine = np.random.default_rng(2).permutation(N)[layout.dp_rank :: layout.dp_size]
        self.batches = [mine[k : k + B].tolist() for k in range(0, len(mine), B)]
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = np.random.default_rng([4, self.epoch]).permutation(len(self.batches))
        return iter([self.batches[i] for i in order])

    def __len__(self) -> int:
        return len(self.batches)


def frozen(layout: Any) -> DataLoader:
    return DataLoader(Store(), batch_sampler=Frozen(layout))


class Rotating:
    """One permutation drawn once; epoch e starts it e places later."""

    def __init__(self, layout: Any) -> None:
        self.mine = np.random.default_rng(6).permutation(N)[layout.dp_rank :: layout.dp_size]
        self.dataset, self.epoch = Store(), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = np.roll(self.mine, -self.epoch)
        for k in range(0, len(order), B):
            items = [self.dataset[int(i)] for i in order[k : k + B]]
            yield {"input_ids": torch.stack([x["input_ids"] for x in items]),
                   "index": torch.tensor([x["index"] for x in items])}  # fmt: skip


# ------------------------------------------------------------------ contract: right answers
Pair = namedtuple("Pair", "input_ids index")


def batch_sampler_namedtuples(layout: Any) -> DataLoader:
    """A BatchSampler over a DistributedSampler, N odd, namedtuple batches."""
    ds = Store(N + 1)
    s: DistributedSampler = DistributedSampler(
        ds, num_replicas=layout.dp_size, rank=layout.dp_rank, seed=3
    )

    def collate(items: list[dict[str, Any]]) -> Pair:
        return Pair(torch.stack([x["input_ids"] for x in items]),
                    torch.tensor([x["index"] for x in items]))  # fmt: skip

    return DataLoader(ds, batch_sampler=BatchSampler(s, 3, drop_last=False), collate_fn=collate)


@dataclass
class Rec:
    input_ids: torch.Tensor
    index: torch.Tensor


def split_dataclasses(layout: Any) -> DataLoader:
    """A random_split's train part (a head cut would not be this), dataclass batches."""
    train, _ = random_split(Store(N + 3), [N, 3], generator=torch.Generator().manual_seed(0))

    def collate(items: list[dict[str, Any]]) -> Rec:
        return Rec(torch.stack([x["input_ids"] for x in items]),
                   torch.tensor([x["index"] for x in items]))  # fmt: skip

    return _sampled(train, layout, collate_fn=collate)


class NumpyShuffle:
    """A hand-written loader: numpy's generator seeded with (seed, epoch), set_epoch."""

    def __init__(self, layout: Any) -> None:
        self.r, self.d, self.epoch, self.dataset = layout.dp_rank, layout.dp_size, 0, Store()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        mine = np.random.default_rng([8, self.epoch]).permutation(N)[self.r :: self.d]
        for k in range(0, len(mine), B):
            items = [self.dataset[int(i)] for i in mine[k : k + B]]
            yield {"input_ids": torch.stack([x["input_ids"] for x in items]),
                   "index": torch.tensor([x["index"] for x in items])}  # fmt: skip


def float_honest(layout: Any) -> DataLoader:
    return DataLoader(Twins(layout, honest=True), batch_size=None)


def packed_honest(layout: Any) -> DataLoader:
    return DataLoader(Twins(layout, packed=True, honest=True), batch_size=None)


class Constant(Dataset):
    """Every sample the same features (a placeholder dataset): twins that prove nothing."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.zeros(4), "index": i}


def constant(layout: Any) -> DataLoader:
    return _sampled(Constant(), layout)


# ------------------------------------------------------------------ eval and steps
def eval_shards(ds: Dataset) -> Any:
    return lambda layout: DataLoader(WeightedShard(ds, layout.dp_rank, layout.dp_size),
                                     batch_size=B)  # fmt: skip


class SameRows(Dataset):
    """Each replica's shard ids over the first rows of the data (the same on every replica)."""

    def __init__(self, layout: Any) -> None:
        self.ids = list(range(layout.dp_rank, N, layout.dp_size))
        self.store = Store()

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k: int) -> dict[str, Any]:
        return {**self.store[k], "index": self.ids[k]}


def eval_twins(layout: Any) -> DataLoader:
    return DataLoader(SameRows(layout), batch_size=B)


def steps_of(ds: Dataset, steps: int) -> Any:
    return lambda layout: SteppedLoader(ds, B, layout.dp_rank, layout.dp_size, steps=steps)


class Hidden:
    """A loader without ``.dataset``: its iteration only (a stream's wrapper)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)


def skips_sample_0(steps: int) -> Any:
    """DODGE (eleventh trial): a stepped loader dealing samples 1 to N - 1 only, without a
    ``.dataset`` to say N: the universe is the ids seen."""
    return lambda layout: Hidden(
        SteppedLoader(Subset(Store(), range(1, N)), B, layout.dp_rank, layout.dp_size, steps=steps)
    )


class StepTwins:
    """SteppedLoader's ids and epochs over the c-th row read (the same on every replica)."""

    def __init__(self, layout: Any, steps: int) -> None:
        self.inner = SteppedLoader(Store(), B, layout.dp_rank, layout.dp_size, steps=steps)
        self.dataset = self.inner.dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        c = 0
        for b in self.inner:
            n = len(b["index"])
            yield {**b, "input_ids": torch.stack([Store().rows[(c + j) % N] for j in range(n)])}
            c += n


# ------------------------------------------------------------------ resume
class Kept:
    """An honest hand-written stateful loader: (epoch, batches taken) in its state."""

    def __init__(self, layout: Any) -> None:
        self.r, self.d, self.dataset = layout.dp_rank, layout.dp_size, Store()
        self.epoch, self.done = 0, 0
        self.pending: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _mine(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([1, epoch]).permutation(N)[self.r :: self.d]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = 0
        if self.pending is not None:
            (e, k), self.pending = self.pending, None
            start = k if e == self.epoch else 0
        self.done, mine = start, self._mine(self.epoch)
        for k in range(start, -(-len(mine) // B)):
            self.done = k + 1
            yield {"index": torch.tensor(mine[k * B : (k + 1) * B])}

    def position(self) -> tuple[int, int]:
        return self.pending if self.pending is not None else (self.epoch, self.done)

    def state_dict(self) -> dict[str, Any]:
        e, k = self.position()
        return {"epoch": np.int64(e), "left": self._mine(e)[k * B :].copy()}  # numpy state

    def load_state_dict(self, s: dict[str, Any]) -> None:
        e = int(s["epoch"])
        self.pending = (e, (len(self._mine(e)) - len(s["left"])) // B)


class TicketInFile(Kept):
    """DODGE: the state is a fresh ticket; the position is in a file named by it."""

    folder = ""

    def state_dict(self) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        with open(os.path.join(self.folder, ticket), "w") as f:
            f.write("{} {}".format(*self.position()))
        return {"ticket": ticket}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        with open(os.path.join(self.folder, s["ticket"])) as f:
            e, k = map(int, f.read().split())
        self.pending = (e, k)


class TicketInMemory(Kept):
    """DODGE: the state is a fresh ticket; the position stays in the warm rank's memory."""

    def _store(self) -> dict[str, tuple[int, int]]:
        return sys.modules["json"].__dict__.setdefault("_dodge_tickets", {})

    def state_dict(self) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._store()[ticket] = self.position()
        return {"ticket": ticket}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.pending = self._store()[s["ticket"]]
