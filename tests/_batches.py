"""Types that batches and loaders of the tests are made of, importable on the ranks.

The broadcast pickles a batch's structure with plain pickle, which finds a class by
its module and name; defined here, the ranks import it (no pytest needed), so these
types take that path. A type pickle cannot name (one defined in a notebook cell, or
in the job itself) goes by value with cloudpickle instead: test_broadcast.py covers it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import torch

Point = collections.namedtuple("Point", "x y")


class Stream(torch.utils.data.IterableDataset):
    """``n`` samples a pass, no length, reshuffled by ``set_epoch``: the same order on every rank.

    The one stream of the eval, steps and stepped-loader tests. Each sample is
    ``{"index": i, "value": float(i)}``; pass ``p`` of epoch ``e`` is
    ``randperm(n)`` seeded with ``seed + e``; :attr:`passes` counts the passes begun.
    """

    def __init__(self, n: int = 10, seed: int = 0) -> None:
        self.n, self.seed, self.epoch, self.passes = n, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        """The next pass's order is this epoch's."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        for i in torch.randperm(self.n, generator=g).tolist():
            yield {"index": i, "value": torch.tensor(float(i))}
