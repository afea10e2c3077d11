"""Notebook 19's epoch: the loader :mod:`.flat_storage`'s checker runs on its ranks, the rows
it hands ``make_flat``, and how a sample or a batch is compared with them.

The loader's settings (workers, start method, batch size, order) are the checker's: the
learner changes the storage, not the measurement. At the epoch's end, the last batch in
and the workers alive and idle, :func:`run_epoch` asks the notebook's witness
(:mod:`.witness`) to read them.

A sample or a batch is compared with digests of the rows (:mod:`.flat_rows`), never with
an array of the answers: the rank holds none while the learner's code runs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ezpz_nb.workshop.flat_rows import Expect, row_digest

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


def _tensor_differs(key: str, got: Any, want: bytes, length: int) -> str | None:
    if not torch.is_tensor(got):
        return f"{key!r} is a {type(got).__name__}, not a tensor"
    if got.dtype != torch.int64 or tuple(got.shape) != (length - 1,):
        return f"{key!r} is {got.dtype} {tuple(got.shape)}, not torch.int64 ({length - 1},)"
    if row_digest(got.numpy()) != want:
        return f"{key!r} holds other tokens"
    return None


def differs(i: int, expect: Expect, got: Any) -> str | None:
    """How ``got``, the dataset's sample ``i``, differs from the list of dicts' (as digests), or None."""
    if not isinstance(got, dict):
        return f"a {type(got).__name__}, not a dict"
    if set(got) != {"index", "input_ids", "labels"}:
        return f"keys {sorted(got)}, not ['index', 'input_ids', 'labels']"
    try:
        index = int(got["index"])
    except (TypeError, ValueError, RuntimeError):
        index = None
    if index != i:
        return f"index {got['index']!r}"
    for key, want in zip(("input_ids", "labels"), expect[i], strict=True):
        why = _tensor_differs(key, got[key], want, LENGTH)
        if why is not None:
            return why
    return None


def batch_differs(expect: Expect, batch: Any, seen: list[int]) -> str | None:
    """How a loader batch differs from the samples it names (as digests), or None; notes its indices."""
    if not isinstance(batch, dict) or set(batch) != {"index", "input_ids", "labels"}:
        return "a batch without the keys index, input_ids, labels"
    index = torch.as_tensor(batch["index"]).reshape(-1).tolist()
    if any(not 0 <= int(i) < len(expect) for i in index):
        return "an index out of range"
    seen.extend(int(i) for i in index)
    for at, key in enumerate(("input_ids", "labels")):
        got = batch[key]
        if (
            not torch.is_tensor(got)
            or got.dtype != torch.int64
            or got.shape != (len(index), LENGTH - 1)
        ):
            return f"{key!r} holds other tokens"
        rows = got.numpy()
        if any(row_digest(rows[j]) != expect[int(i)][at] for j, i in enumerate(index)):
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
