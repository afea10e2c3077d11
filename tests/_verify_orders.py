"""The ninth trial's near-frozen orders, and right answers where batches come back by chance.

Two dodges kept most batches while every replica's order changed: one permutation with
two neighbours swapped each epoch, and each replica handed the next one's fixed shard
(every global batch the same). The right answers are small (2 or 3 batches a replica an
epoch), where a few batches do come back. Judged in test_verify_dodges.py on warm ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from _verify_dodges import Store
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Sampler

#: The ninth trial's sizes: 30 samples in batches of 4 (15 a replica at dp=2).
N9, B9 = 30, 4


class _Told(Sampler[int]):
    """A sampler that says it shuffles and is told its epoch."""

    shuffle = True

    def __init__(self, layout: Any, n: int = N9, seed: int = 0) -> None:
        self.r, self.d, self.n, self.seed, self.epoch = (
            layout.dp_rank, layout.dp_size, n, seed, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(list(iter(self)))


class SwapTwo(_Told):
    """DODGE (ninth trial): one permutation drawn once, dealt over the replicas; epoch e
    only swaps two neighbours of it (at place 2e): a new order, all but a batch kept."""

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng(self.seed).permutation(self.n)
        k = 2 * self.epoch % (self.n - 1)
        order[[k, k + 1]] = order[[k + 1, k]]
        return iter(order[self.r :: self.d].tolist())


class RotatingShards(_Told):
    """DODGE (ninth trial): fixed unshuffled shards; epoch e hands replica r the shard of
    replica (r + e) % dp: each replica's order changes, every global batch stays."""

    def __iter__(self) -> Iterator[int]:
        shard = (self.r + self.epoch) % self.d
        return iter(range(shard, self.n - self.n % self.d, self.d))


class ShardShuffled(_Told):
    """Right: a fixed contiguous shard per replica, shuffled within by (seed, epoch)."""

    def __iter__(self) -> Iterator[int]:
        per = self.n // self.d
        mine = np.arange(self.r * per, (self.r + 1) * per)
        return iter(np.random.default_rng([self.seed, self.epoch]).permutation(mine).tolist())


class ReversedOddEpochs(_Told):
    """DODGE (eleventh trial): one permutation drawn once, dealt over the replicas; odd
    epochs read each replica's part backwards: a new order, no new draw."""

    def __iter__(self) -> Iterator[int]:
        mine = np.random.default_rng(self.seed).permutation(self.n)[self.r :: self.d]
        return iter((mine[::-1] if self.epoch % 2 else mine).tolist())


class OneReplicaFixed(_Told):
    """DODGE (eleventh trial): a fixed partition (ids r, r + dp, ...); replica 1 shuffles
    its part by (seed, epoch), replica 0 ignores its epoch (the same order every epoch)."""

    def __iter__(self) -> Iterator[int]:
        mine = np.arange(self.r, self.n, self.d)
        epoch = self.epoch if self.r else 0
        return iter(np.random.default_rng([self.seed, self.r, epoch]).permutation(mine).tolist())


def reversed_odd_epochs(layout: Any) -> DataLoader:
    return DataLoader(Store(N9), batch_size=B9, sampler=ReversedOddEpochs(layout))


def one_replica_fixed(layout: Any) -> DataLoader:
    return DataLoader(Store(N9), batch_size=B9, sampler=OneReplicaFixed(layout))


def swap_two(layout: Any) -> DataLoader:
    return DataLoader(Store(N9), batch_size=B9, sampler=SwapTwo(layout))


def rotating_shards(layout: Any) -> DataLoader:
    return DataLoader(Store(N9), batch_size=B9, sampler=RotatingShards(layout))


class SmallStream(IterableDataset):
    """Right: a stream of ``n`` samples dealt over the replicas from a (seed, epoch)
    permutation, in batches of ``b``."""

    def __init__(self, layout: Any, n: int, b: int, seed: int) -> None:
        self.r, self.d, self.n, self.b, self.seed, self.epoch = (
            layout.dp_rank, layout.dp_size, n, b, seed, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        mine = perm[self.r :: self.d]
        for k in range(0, len(mine), self.b):
            ids = [int(i) for i in mine[k : k + self.b]]
            yield {"input_ids": torch.stack([torch.arange(5) + 11 * i for i in ids]),
                   "index": torch.tensor(ids)}  # fmt: skip


def near_boundary(seed: int) -> dict[str, Any]:
    """Right answers with 2 or 3 batches a replica an epoch, where a few batches come back
    by chance: a shuffled DistributedSampler over 8 samples in batches of 2, one with
    drop_last over 13 in batches of 2, fixed shards of 6 shuffled within in batches of 3,
    and a stream of 12 in batches of 3; each seeded with ``seed``."""

    def dist(layout: Any, n: int, b: int, **kw: Any) -> DataLoader:
        s: DistributedSampler = DistributedSampler(
            Store(n), num_replicas=layout.dp_size, rank=layout.dp_rank, seed=seed, **kw
        )
        return DataLoader(Store(n), batch_size=b, sampler=s)

    return {
        "dist 8 by 2": lambda layout: dist(layout, 8, 2),
        "drop_last 13 by 2": lambda layout: dist(layout, 13, 2, drop_last=True),
        "shards 12 by 3": lambda layout: DataLoader(
            Store(12), batch_size=3, sampler=ShardShuffled(layout, 12, seed)
        ),
        "stream 12 by 3": lambda layout: DataLoader(
            SmallStream(layout, 12, 3, seed), batch_size=None
        ),
    }
