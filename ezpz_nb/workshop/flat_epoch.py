"""Notebook 19's epoch: the loader :mod:`.flat_storage`'s checker runs on its ranks, and how
a sample or a batch is compared with the list of dicts'.

The loader's settings (workers, start method, batch size, order) are the checker's: the
learner changes the storage, not the measurement. At the epoch's end, the last batch in
and the workers alive and idle, :func:`run_epoch` asks the notebook's witness
(:mod:`.witness`) to read them.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "BATCH",
    "LENGTH",
    "N",
    "ORDER",
    "WORKERS",
    "Reads",
    "batch_differs",
    "differs",
    "run_epoch",
]

#: The data: samples x tokens (8 MiB of int64 tokens, 16 MiB of Python ints and more).
N, LENGTH = 4096, 256
#: The loader's workers (forked), and its batch size (a divisor of N).
WORKERS, BATCH = 2, 64
#: The loader's order: every sample twice, the second pass a batch on, so that each of the
#: 2 workers (batches go to them in turn) reads every sample: a storage written by reading
#: (Python objects, a ``bytes`` or a pickle per row) is then written all over in each.
ORDER = (*range(N), *range(BATCH, N), *range(BATCH))


class Reads(Dataset):
    """A dataset as the checker's loader sees it: the checker's length, each read passed on.

    So the loader, in the rank, calls none of the learner's code during the epoch (its
    ``__len__`` is asked before, once); the workers call its ``__getitem__``.
    """

    def __init__(self, ds: Any, size: int) -> None:
        self.ds, self.size = ds, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]


def differs(want: dict[str, Any], got: Any) -> str | None:
    """How ``got`` differs from the list of dicts' sample ``want``, or None."""
    if not isinstance(got, dict):
        return f"a {type(got).__name__}, not a dict"
    if set(got) != set(want):
        return f"keys {sorted(got)}, not {sorted(want)}"
    for key, value in want.items():
        if key == "index":
            if int(got[key]) != value:
                return f"index {got[key]!r}"
            continue
        other = got[key]
        if not torch.is_tensor(other):
            return f"{key!r} is a {type(other).__name__}, not a tensor"
        if other.dtype != value.dtype or other.shape != value.shape:
            return f"{key!r} is {other.dtype} {tuple(other.shape)}, not {value.dtype} {tuple(value.shape)}"
        if not torch.equal(other, value):
            return f"{key!r} holds other tokens"
    return None


def batch_differs(data: np.ndarray, batch: Any, seen: list[int]) -> str | None:
    """How a loader batch differs from the rows of ``data`` it names, or None; notes its indices."""
    if not isinstance(batch, dict) or set(batch) != {"index", "input_ids", "labels"}:
        return "a batch without the keys index, input_ids, labels"
    index = torch.as_tensor(batch["index"]).reshape(-1).tolist()
    if any(not 0 <= int(i) < len(data) for i in index):
        return "an index out of range"
    seen.extend(int(i) for i in index)
    rows = torch.from_numpy(data[[int(i) for i in index]])
    for key, want in (("input_ids", rows[:, :-1]), ("labels", rows[:, 1:])):
        got = batch[key]
        if not torch.is_tensor(got) or got.dtype != want.dtype or not torch.equal(got, want):
            return f"{key!r} holds other tokens"
    return None


def run_epoch(
    ds: Reads,
    compare: Callable[[Any], object],
    ask: Callable[[str], None],
    label: str,
    *,
    _loader: type[DataLoader] = DataLoader,
    _collect: Callable[[], int] = gc.collect,
    _order: tuple[int, ...] = ORDER,
) -> None:
    """One epoch of ``ds`` through the checker's loader; the witness reads its workers at the end.

    The last batch in, every worker has read all it will and waits, alive, for the
    loader's next index: the witness reads them then (``ask``), before they exit. The
    loader, the collector and the order are bound here, at import, not looked up after the
    learner's code ran in the rank (and :func:`~.flat_storage.flat_job` holds this function likewise).
    """
    _collect()  # every loader's workers fork from a rank collected alike
    loader = _loader(
        ds,
        batch_size=BATCH,
        sampler=_order,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        prefetch_factor=2,
    )
    batches = iter(loader)
    for _ in range(len(_order) // BATCH):
        compare(next(batches))
    ask(label)
    for batch in batches:  # none left: the loop's end shuts the workers down
        compare(batch)
