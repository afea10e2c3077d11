"""Loader factories for the verify tests: one right, and one wrong per rule.

Each takes the rank's ``Layout`` and returns a loader, as a user's factory does.
They live in a module of their own so that the torchrun script imports the same
ones the in-notebook tests use.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Subset

N = 24


class Squares(Dataset):
    """Sample i: a vector derived from i alone (the same on every rank), and its index."""

    def __init__(self, n: int = N, salt: int = 0) -> None:
        self.n, self.salt = n, salt

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.arange(4) * i + self.salt, "index": i}


def _sampler(layout: Any, ds: Dataset, **kw: Any) -> DistributedSampler:
    return DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank, seed=3, **kw)


def right(layout: Any) -> DataLoader:
    """Sharded over the DP replicas, shuffled, drop_last so every batch is whole."""
    ds = Squares()
    return DataLoader(ds, batch_size=3, sampler=_sampler(layout, ds, shuffle=True))


def right_padded(layout: Any) -> DataLoader:
    """25 samples over 2 replicas: the sampler pads one, the last batch is partial."""
    ds = Squares(25)
    return DataLoader(ds, batch_size=4, sampler=_sampler(layout, ds, shuffle=False))


def right_dropped(layout: Any) -> DataLoader:
    """25 samples, drop_last on the sampler and the loader: a few never seen, by choice."""
    ds = Squares(25)
    return DataLoader(
        ds, batch_size=4, sampler=_sampler(layout, ds, drop_last=True), drop_last=True
    )


def world_sharded(layout: Any) -> DataLoader:
    """Sharded over the whole world: TP peers get different samples."""
    import torch.distributed as dist

    ds = Squares()
    s = DistributedSampler(ds, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    return DataLoader(ds, batch_size=3, sampler=s)


def seeded_by_rank(layout: Any) -> DataLoader:
    """Same indices on TP peers, bytes that depend on the global rank."""
    ds = Squares(salt=layout.rank)
    return DataLoader(ds, batch_size=3, sampler=_sampler(layout, ds))


def unsharded(layout: Any) -> DataLoader:
    """No sampler: every DP replica reads the whole dataset."""
    return DataLoader(Squares(), batch_size=3)


def too_many_shards(layout: Any) -> DataLoader:
    """Four shards for two replicas: half the data is never read."""
    ds = Squares()
    s = DistributedSampler(ds, num_replicas=2 * layout.dp_size, rank=layout.dp_rank)
    return DataLoader(ds, batch_size=3, sampler=s)


def hand_sharded(layout: Any) -> DataLoader:
    """ds[r::w] with 25 samples: replica 0 gets one batch more."""
    ds = Squares(25)
    part = Subset(ds, range(layout.dp_rank, len(ds), layout.dp_size))
    return DataLoader(part, batch_size=4)


class _Stream(IterableDataset):
    def __init__(self, layout: Any, shard_workers: bool) -> None:
        self.dp_rank, self.dp_size, self.shard_workers = (
            layout.dp_rank,
            layout.dp_size,
            shard_workers,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        w, nw = (info.id, info.num_workers) if info and self.shard_workers else (0, 1)
        for i in range(self.dp_rank * nw + w, N, self.dp_size * nw):
            yield {"x": torch.arange(4) * i, "index": i, "worker_id": info.id if info else -1}


def stream_workers_repeat(layout: Any) -> DataLoader:
    """Two workers on an IterableDataset sharded over ranks only: each sample twice."""
    return DataLoader(_Stream(layout, False), batch_size=3, num_workers=2)


def uneven_batches(layout: Any) -> DataLoader:
    """Every replica takes 3 steps, but replica 1 batches 4, 2, 4."""
    sizes = [3, 3, 3] if layout.dp_rank == 0 else [4, 2, 4]
    start = 0 if layout.dp_rank == 0 else 9
    batches, at = [], start
    for n in sizes:
        batches.append(list(range(at, at + n)))
        at += n
    return DataLoader(Squares(19), batch_sampler=batches)


class NoEpochs:
    """A wrapper that hides set_epoch: every epoch repeats the first one's order."""

    def __init__(self, loader: DataLoader) -> None:
        self.inner = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)


def no_set_epoch(layout: Any) -> NoEpochs:
    """A shuffling sampler whose epoch never changes."""
    return NoEpochs(right(layout))


class _Agreeing:
    """Like a loader that broadcasts or all-reduces per batch: one collective per step."""

    def __init__(self, loader: DataLoader, group: Any) -> None:
        self.loader, self.group = loader, group

    def __iter__(self) -> Iterator[Any]:
        import torch.distributed as dist

        for batch in self.loader:
            dist.all_reduce(torch.ones(1), group=self.group)
            yield batch


def collective_uneven(layout: Any) -> _Agreeing:
    """A collective per step over ranks with unequal step counts: the longer rank hangs."""
    return _Agreeing(hand_sharded(layout), layout.dp_group)


def sleeps_on_rank1(layout: Any) -> Iterator[dict[str, Any]]:
    """Rank 1 is stuck in time.sleep before its first batch; rank 0 yields 4 batches."""
    if layout.rank == 1:

        class Stuck:
            def __iter__(self) -> Iterator[dict[str, Any]]:
                time.sleep(3600)
                yield {}

        return Stuck()  # type: ignore[return-value]
    return iter([{"index": torch.tensor([i, i + 2])} for i in (0, 4, 8, 12)])


def endless(layout: Any) -> Iterator[dict[str, Any]]:
    """A stream that never ends."""

    def gen() -> Iterator[dict[str, Any]]:
        i = layout.dp_rank
        while True:
            yield {"x": torch.zeros(2), "index": i}
            i += layout.dp_size
            time.sleep(0.001)

    class Endless:
        def __iter__(self) -> Iterator[dict[str, Any]]:
            return gen()

    return Endless()


def keyed(layout: Any) -> list[dict[str, Any]]:
    """webdataset-style samples named by ``__key__``, a plain list as the loader."""
    return [
        {"__key__": [f"shard0/{i:04d}" for i in range(b, b + 2)], "x": torch.ones(2, 2) * b}
        for b in range(layout.dp_rank * 2, 12, layout.dp_size * 2)
    ]


def tuples(layout: Any) -> DataLoader:
    """(x, y) batches with no id at all: only key='digest' tells the samples apart."""
    xs = torch.arange(N * 2, dtype=torch.float32).reshape(N, 2)
    ds = torch.utils.data.TensorDataset(xs, xs.sum(1))
    return DataLoader(ds, batch_size=4, sampler=_sampler(layout, ds))


def cp_slices(layout: Any) -> list[dict[str, Any]]:
    """CP peers: the same samples, each its own half of every sequence (a right answer)."""
    out = []
    for i in range(layout.dp_rank, 8, layout.dp_size):
        seq = torch.arange(8) + 100 * i
        half = seq.chunk(layout.cp_size)[layout.cp_rank]
        out.append({"input_ids": half[None], "index": torch.tensor([i])})
    return out


def cp_split_samples(layout: Any) -> list[dict[str, Any]]:
    """CP peers given different samples (sharded over CP as if it were DP)."""
    shards = layout.dp_size * layout.cp_size
    me = layout.dp_rank * layout.cp_size + layout.cp_rank
    return [
        {"input_ids": torch.arange(4)[None] + i, "index": torch.tensor([i])}
        for i in range(me, 8, shards)
    ]


# ------------------------------------------------------------------ bad factories
def raises_on_rank1(layout: Any) -> DataLoader:
    if layout.rank == 1:
        raise FileNotFoundError("no shard file on this node")
    return right(layout)


def not_iterable(layout: Any) -> int:
    return len(Squares())


def structure_by_rank(layout: Any) -> list[dict[str, Any]]:
    name = "input_ids" if layout.rank == 0 else "tokens"
    return [{name: torch.zeros(2), "index": torch.tensor([i])} for i in range(layout.rank, 8, 2)]


def hangs_on_rank1(layout: Any) -> DataLoader:
    if layout.rank == 1:
        time.sleep(3600)
    return right(layout)


def no_ids(layout: Any) -> DataLoader:
    return tuples(layout)


# ------------------------------------------------------------------ resumable loaders
def stateful(layout: Any, num_workers: int = 0) -> Any:
    """torchdata's StatefulDataLoader over a DistributedSampler: it fast-forwards on load."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = Squares()
    s = _sampler(layout, ds, shuffle=True)
    return StatefulDataLoader(ds, batch_size=3, sampler=s, num_workers=num_workers)


def stateful_sampler(layout: Any) -> Any:
    """StatefulDataLoader with torchdata's StatefulDistributedSampler."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    ds = Squares()
    s = StatefulDistributedSampler(
        ds, num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=True, seed=3
    )
    return StatefulDataLoader(ds, batch_size=3, sampler=s)


class Forgetful:
    """Has state_dict/load_state_dict, but its state says nothing: every resume restarts."""

    def __init__(self, layout: Any) -> None:
        self.loader = right(layout)

    def set_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def forgetful(layout: Any) -> Forgetful:
    return Forgetful(layout)


class Elastic:
    """Keeps its position in samples of the whole job and cuts the rest of the epoch
    anew over the replicas it finds (as MosaicML streaming does): a state saved at
    DP 2 resumes exactly once at DP 4.

    ``per_rank=True`` is the classic mistake: the position counts this rank's samples
    only, so a resumed job re-reads what the other replicas already trained on.
    """

    def __init__(self, layout: Any, per_rank: bool = False, batch: int = 3) -> None:
        self.dp_rank, self.dp_size = layout.dp_rank, layout.dp_size
        self.per_rank, self.batch = per_rank, batch
        self.epoch, self.start, self.taken = 0, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        g = torch.Generator().manual_seed(3 + self.epoch)
        rest = torch.randperm(N, generator=g).tolist()[self.start :]
        mine = rest[self.dp_rank :: self.dp_size]
        self.taken = 0
        for i in range(0, len(mine), self.batch):
            ids = mine[i : i + self.batch]
            self.taken += len(ids)
            yield {"x": torch.stack([Squares()[j]["x"] for j in ids]), "index": torch.tensor(ids)}
        self.epoch, self.start, self.taken = self.epoch + 1, 0, 0  # the next epoch, from 0

    def state_dict(self) -> dict[str, int]:
        done = self.taken * (1 if self.per_rank else self.dp_size)
        return {"epoch": self.epoch, "position": self.start + done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.start = state["epoch"], state["position"]


def elastic(layout: Any) -> Elastic:
    return Elastic(layout)


def elastic_per_rank(layout: Any) -> Elastic:
    return Elastic(layout, per_rank=True)
