"""Notebook 19's exercise: make a list-of-dicts dataset flat, same samples, workers that stay small.

The learner writes ``make_flat(rows)``: given the rows of a
:class:`~ezpz_nb.workshop.memory_jobs.DictsDataset` (``{"index": i, "tokens":
[int, ...]}``), return a dataset that yields exactly what ``DictsDataset`` yields
(``{"index", "input_ids", "labels"}``, int64, in index order) and whose forked
DataLoader workers' private memory grows by less than :data:`BOUND` of the data
over an epoch. Any storage that holds no Python object per token passes: one
numpy array, one tensor, a memory-mapped file, one ``bytes`` blob.

What it checks, on 2 real ranks with fresh tokens (a new seed each check):

* first, on a dataset the rank has not read (its rows held by it alone), one
  epoch with 2 forked workers, memory sampled at every step, each worker's
  growth counted from just before its first read, less what a worker reading the
  checker's own flat array grows: a dataset that still reads the rows (wrapping
  them, converting per sample, building a private array at some read, in the
  rank or in each worker) grows, and ``gc.freeze()`` does not stop it;
* every batch the workers yield against the tokens, and every index once;
* then every sample, all of them, read in the rank, against the list of dicts'
  own (keys, dtype, values): a dataset right on the first few samples only, or
  in another order, or of another length, is wrong.

The loader's settings (workers, start method, batch size) are the checker's:
the learner changes the storage, not the measurement.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from ezpz_nb.launcher import Cluster
from ezpz_nb.ledger.memory import MIB, read_memory
from ezpz_nb.workshop.memory_jobs import ArrayDataset, DictsDataset, measure_workers, tokens
from ezpz_nb.workshop.verdicts import CheckResult, fresh_seed, judge, run_learner, wrong

__all__ = ["BOUND", "EXERCISE", "check_flat", "flat_job"]

EXERCISE = "Flat storage"
#: Largest growth of a worker's private memory, as a share of the data's bytes.
BOUND = 0.25
#: The data: samples x tokens (8 MiB of int64 tokens, 16 MiB of Python ints and more).
N, LENGTH = 4096, 256
#: The loader's workers (forked).
WORKERS = 2


def _differs(want: dict[str, Any], got: Any) -> str | None:
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


def _batch_differs(data: np.ndarray, batch: Any, seen: list[int]) -> str | None:
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


class _FirstRead(Dataset):
    """``inner``, whose workers note their private memory as they enter their first read.

    The baseline is taken there, not at the worker's start (its loader loop and
    queues are its own cost, not the storage's) and not after its first batch (a
    dataset that builds a private copy at its first read would be inside it).
    """

    def __init__(self, inner: Any, start: Any) -> None:
        self.inner, self.start, self.noted = inner, start, False

    @staticmethod
    def slots() -> Any:
        """One slot per worker in shared pages (forked workers write them, the rank reads them)."""
        return mp.get_context("fork").Array("q", [-1] * WORKERS, lock=False)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        info = get_worker_info()
        if info is not None and not self.noted:  # each worker's own copy of the flag
            got = read_memory()
            self.start[info.id] = got.private if got is not None else -1
            self.noted = True
        return self.inner[i]


def flat_job(make: Callable[[list[dict[str, Any]]], Any], seed: int) -> dict[str, Any]:
    """On a rank: measure the workers of a fresh ``make(rows)``, then compare every sample.

    The workers come first, and their growth counts from before their first read:
    whatever the dataset does on a read (build an array from the rows, in the rank
    or in each worker) is then inside the measurement, not before it. What the
    workers yield is compared too, so they cannot serve other samples than the rank.
    Growth is given beyond a flat array's worker's (see :func:`_grown`).
    """
    data = tokens(N, LENGTH, seed)
    ds = make(DictsDataset(data).rows)  # no one else holds these rows
    if ds is None:
        return {"none": True}
    try:
        size = len(ds)
    except TypeError:
        return {"bad": "it has no len(): a map-style dataset needs __len__"}
    if size != N:
        return {"bad": f"it has {size} samples, the list of dicts {N}"}
    seen: list[int] = []
    batch_why: list[str] = []

    def compare(batch: Any) -> None:
        if not batch_why:
            why = _batch_differs(data, batch, seen)
            if why is not None:
                batch_why.append(why)

    failed: Exception | None = None
    try:
        grown = _grown(ds, compare)
    except Exception as exc:  # noqa: BLE001  (a wrong sample's message, below, says more)
        failed = exc
    want = DictsDataset(data)
    for i in range(size):
        why = _differs(want[i], ds[i])
        if why is not None:
            return {"bad": f"sample {i} differs: {why}"}
    if failed is not None:
        raise failed
    if not batch_why and sorted(seen) != list(range(N)):
        batch_why.append("an epoch did not read every index once")
    if batch_why:
        return {"bad": f"the workers' batches differ from the rank's samples: {batch_why[0]}"}
    # A worker's own first batches cost it ~3 MiB whatever the storage (its
    # allocator's arenas, the first collate and put): what a worker reading the
    # checker's flat array grows is taken off.
    del want
    own = max(_grown(ArrayDataset(data)).values())
    growth = {worker: max(0, grew - own) for worker, grew in grown.items()}
    return {"growth": growth, "data": N * LENGTH * 8}


def _grown(ds: Dataset, on_batch: Callable[[Any], None] | None = None) -> dict[int, int]:
    """Each forked worker's private growth over an epoch of ``ds``, from its first read."""
    start = _FirstRead.slots()
    gc.collect()
    with tempfile.TemporaryDirectory(prefix="ezpz-flat-") as folder:
        got = measure_workers(
            _FirstRead(ds, start),
            n=N,
            length=LENGTH,
            folder=folder,
            workers=WORKERS,
            batch_size=64,
            on_batch=on_batch,
        )
    return {
        g.worker: g.end - (start[g.worker] if start[g.worker] >= 0 else g.start)
        for g in got.ledger.memory_report().growth
        if g.worker >= 0
    }


def check_flat(
    make_flat: Callable[[list[dict[str, Any]]], Any],
    *,
    cluster: Cluster | None = None,
    timeout: float = 90.0,
) -> CheckResult:
    """Notebook 19's exercise: same samples as the list of dicts, workers that do not grow.

    Args:
        make_flat: The learner's function (or class) from the rows to a dataset.
        cluster: A warm 2-rank :class:`~ezpz_nb.Cluster`; fresh ranks when None.
        timeout: Seconds for the run (building, comparing, one epoch).
    """

    def body() -> str:
        got = run_learner(
            flat_job, make_flat, fresh_seed(), world_size=2, timeout=timeout, cluster=cluster
        )
        first = got[0]
        if first.get("none"):
            raise wrong("make_flat returned None: return the dataset you built.")
        if "bad" in first:
            raise wrong(f"{first['bad']}. It must yield what the list of dicts yields.")
        bound = BOUND * first["data"]
        for rank, out in enumerate(got):
            for worker, grew in sorted(out["growth"].items()):
                if grew >= bound:
                    raise wrong(
                        f"rank {rank}'s worker {worker} grew by {grew / MIB:.1f} MiB over an "
                        "epoch, from before its first read, more than a worker reading one "
                        f"flat array (the bound is {bound / MIB:.1f} MiB, {BOUND:.0%} of the data): "
                        "its samples are still read from Python objects, whose reference "
                        "counts the worker writes. Hold the tokens in one array."
                    )
        worst = max(g for out in got for g in out["growth"].values())
        return (
            f"Same {N} samples, and no worker grew by more than {worst / MIB:.1f} MiB over an "
            f"epoch beyond a flat array's worker (bound {bound / MIB:.1f} MiB): nothing in your storage is written by reading."
        )

    return judge(EXERCISE, body)
