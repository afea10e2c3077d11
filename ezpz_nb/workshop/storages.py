"""The same samples held four ways, and what each costs a DataLoader worker (notebook 19).

Every storage yields the same samples, ``{"index": i, "input_ids": t[:-1],
"labels": t[1:]}`` for the row ``t`` of the same seeded tokens (the next-token
shift of a language model), so their memory can be compared side by side:

* :class:`DictsDataset`: a list of Python dicts of Python ints, as a JSON file
  loads. Each int is an object with a reference count; a forked worker that
  slices the row writes every count it copies a reference to, and the kernel
  copies each page it writes (pytorch #13246);
* :class:`ArrayDataset`: one numpy array, one object: reading it writes nothing;
* :class:`ArrowDataset`: an Arrow table on disk (HF ``datasets``), memory-mapped;
* :class:`MemmapDataset`: a raw file of int64 tokens, memory-mapped, reopened by
  path in each worker (pickling an ``np.memmap`` would copy its data).

:func:`measure_workers` runs on a rank: it builds one storage, iterates an epoch
through a :class:`~torch.utils.data.DataLoader` with ``record(..., memory=...)``
and returns a :class:`Measured`: the ledger, the storage's own size in the rank, and
what reading memory cost.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter, sleep
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ezpz_nb.ledger import Ledger, record
from ezpz_nb.ledger.memory import read_memory

__all__ = [
    "STORAGES",
    "ArrayDataset",
    "ArrowDataset",
    "DictsDataset",
    "MemmapDataset",
    "Measured",
    "build",
    "measure_workers",
    "tokens",
]

#: The storages :func:`build` knows, in the order the notebook shows them.
STORAGES = ("dicts", "numpy", "arrow", "memmap")


def tokens(n: int, length: int, seed: int = 0, high: int = 50_000) -> np.ndarray:
    """The samples' tokens: ``(n, length)`` int64 in ``[1000, high)``, above 256 (Python
    caches small ints)."""
    return np.random.default_rng(seed).integers(1000, high, size=(n, length), dtype=np.int64)


def _sample(i: int, row: Any) -> dict[str, Any]:
    # The slices are views of a numpy row; of a Python list they are new lists,
    # holding a new reference to each int: the write that copies its page.
    return {
        "index": i,
        "input_ids": torch.as_tensor(row[:-1], dtype=torch.int64),
        "labels": torch.as_tensor(row[1:], dtype=torch.int64),
    }


class DictsDataset(Dataset):
    """Samples as a list of dicts of Python ints (what ``json.load`` gives)."""

    def __init__(self, data: np.ndarray) -> None:
        self.rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        return _sample(row["index"], row["tokens"])


class ArrayDataset(Dataset):
    """Samples as rows of one numpy array."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = np.ascontiguousarray(data)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _sample(i, self.data[i])


class MemmapDataset(Dataset):
    """Samples as rows of a raw int64 file, memory-mapped read-only.

    Only the path and shape travel to a worker: the map is opened on first use
    in each process, so a pickled copy (forkserver, spawn) holds no data.
    """

    def __init__(self, path: str | Path, shape: tuple[int, int]) -> None:
        self.path, self.shape = str(path), shape
        self._map: np.ndarray | None = None

    @classmethod
    def write(cls, data: np.ndarray, path: str | Path) -> MemmapDataset:
        """Write ``data`` to ``path`` and map it."""
        data.astype(np.int64).tofile(path)
        return cls(path, (int(data.shape[0]), int(data.shape[1])))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_map": None}

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.int64, mode="r", shape=self.shape)
        return _sample(i, np.array(self._map[i]))


class ArrowDataset(Dataset):
    """Samples as an Arrow table saved by HF ``datasets`` and loaded memory-mapped."""

    def __init__(self, data: np.ndarray, folder: str | Path) -> None:
        import datasets

        datasets.disable_progress_bars()
        table = datasets.Dataset.from_dict({"tokens": list(data)})
        table.save_to_disk(str(folder))
        self.table = datasets.load_from_disk(str(folder)).with_format("numpy")

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return _sample(i, self.table[i]["tokens"])


def build(storage: str, data: np.ndarray, folder: str | Path) -> Dataset:
    """The samples ``data`` held as ``storage`` (one of :data:`STORAGES`); files go in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if storage == "dicts":
        return DictsDataset(data)
    if storage == "numpy":
        return ArrayDataset(data)
    if storage == "memmap":
        return MemmapDataset.write(data, folder / "tokens.bin")
    if storage == "arrow":
        return ArrowDataset(data, folder / "arrow")
    raise ValueError(f"unknown storage {storage!r}: use one of {', '.join(STORAGES)}")


@dataclass(frozen=True)
class Measured:
    """What :func:`measure_workers` saw on one rank.

    Attributes:
        ledger: The rank's ledger, its memory samples included.
        held: Private bytes the storage added to the rank when it was built.
        data: Bytes of the samples' tokens (``n * length * 8``): the same for every storage.
        steps: Steps taken, all epochs.
        loop_s: Wall time of the epochs.
        sampled_s: Of which, reading memory.
        first_s: Of which, the first reading (taken whatever the budget).
    """

    ledger: Ledger
    held: int
    data: int
    steps: int
    loop_s: float
    sampled_s: float
    first_s: float


def measure_workers(
    storage: str | Dataset,
    *,
    n: int,
    length: int,
    folder: str,
    worker_start: str = "fork",
    workers: int = 2,
    batch_size: int = 64,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    epochs: int = 1,
    freeze: bool = False,
    budget: float = 1.0,
    step_s: float = 0.0,
) -> Measured:
    """On a rank: build ``storage`` and iterate ``epochs`` with memory sampled.

    Args:
        storage: A name from :data:`STORAGES`, or a dataset made by the caller
            (of ``n`` samples of ``length`` tokens).
        n: Samples.
        length: Tokens per sample.
        folder: Where this rank writes its files (a folder per rank).
        worker_start: The workers' start method (``multiprocessing_context``).
        workers: ``num_workers``.
        batch_size: Samples per batch.
        prefetch_factor: Batches each worker prepares ahead.
        persistent_workers: Keep the workers between epochs.
        pin_memory: Copy batches to page-locked memory (a thread in the rank).
        epochs: Passes over the data.
        freeze: ``gc.freeze()`` before the workers start, so their garbage
            collector never writes to the dataset's objects.
        budget: The sampler's share of wall time (1.0: a sample at every step).
        step_s: Seconds of work per step (a sleep), as a training step would take.
    """
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    folder_r = Path(folder) / f"rank{rank}"
    if storage == "arrow":
        import datasets  # noqa: F401  (its import is not the storage's size)
    gc.collect()
    before = read_memory()
    nbytes = n * length * 8
    ds = storage if isinstance(storage, Dataset) else build(storage, tokens(n, length), folder_r)
    gc.collect()
    after = read_memory()
    held = after.private - before.private if before and after else 0
    if freeze:
        gc.freeze()
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        multiprocessing_context=worker_start if workers else None,
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers and workers > 0,
        pin_memory=pin_memory,
    )
    rec = record(loader, memory=budget, publish=False, timings=False)
    t0 = perf_counter()
    for epoch in range(epochs):
        rec.set_epoch(epoch)
        for _batch in rec:
            if step_s:
                sleep(step_s)
    loop_s = perf_counter() - t0
    if freeze:
        gc.unfreeze()
    sampler = rec.memory_sampler
    spent = sampler.spent_s if sampler is not None else 0.0
    first = sampler.first_s if sampler is not None else 0.0
    return Measured(rec.ledger(), held, nbytes, len(rec.records), loop_s, spent, first)
