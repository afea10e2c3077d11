"""Shared memory for DataLoader batches: how big ``/dev/shm`` is, what a loader will use.

A DataLoader worker builds each batch in shared memory (torch's collate writes
the batch straight into it) and hands the rank a file descriptor; on Linux
that memory is a file in the tmpfs at ``/dev/shm``, so ``df /dev/shm`` counts
it. At any moment a rank holds up to ``prefetch_factor`` batches per worker
made ahead and waiting, plus the batch its loop holds:

    peak = ranks x (workers x prefetch_factor + 1) x bytes per batch

each tensor of the batch rounded up to whole pages. Docker gives a container
64 MiB of ``/dev/shm`` unless ``--shm-size`` says otherwise; a batch that does not
fit fails in the worker (pytorch #5040, #16979, #1355): ``No space left on
device``, a ``Bus error``, or a loader that waits forever.

Nothing here imports torch: ``ezpz-nb doctor`` reads it where torch is broken.
macOS has no ``/dev/shm`` (torch passes file descriptors of unnamed shared
memory there): :func:`shm_size` gives None and only the prediction stands.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from ezpz_nb.errors import EzpzWarning

__all__ = [
    "SHM",
    "ShmPlan",
    "ShmPoller",
    "ShmWarning",
    "paged",
    "plan_shm",
    "predict_peak",
    "shm_size",
    "shm_used",
]

#: Where Linux keeps POSIX shared memory.
SHM = "/dev/shm"
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MIB = 1 << 20


class ShmWarning(EzpzWarning):
    """A loader's batches will not fit in ``/dev/shm``."""


def shm_size(path: str = SHM) -> int | None:
    """Bytes ``path`` can hold in all, or None where there is no such file system."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_blocks * st.f_frsize


def shm_used(path: str = SHM) -> int | None:
    """Bytes in use in ``path`` now (files unlinked but still open count: torch's do)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def paged(tensor_bytes: Iterable[int]) -> int:
    """Bytes one batch takes in shared memory: each tensor's bytes rounded up to pages."""
    return sum(-(-b // PAGE) * PAGE for b in tensor_bytes)


def predict_peak(
    batch_bytes: int, *, workers: int, prefetch_factor: int = 2, ranks: int = 1
) -> int:
    """Peak bytes of ``/dev/shm`` a loader uses (the formula in the module docstring).

    Args:
        batch_bytes: One batch in shared memory (:func:`paged`).
        workers: ``num_workers``; 0 makes batches in the rank, outside shared memory.
        prefetch_factor: Batches each worker makes ahead.
        ranks: Ranks on this machine, each with such a loader.

    Raises:
        ValueError: ``batch_bytes`` is under one page: no batch in shared memory is
            that small, so it was given in another unit (MiB, most likely).
    """
    if batch_bytes < PAGE:
        # Shared memory comes in whole pages: a batch takes one page at least (paged()).
        raise ValueError(
            f"batch_bytes={batch_bytes} is less than one page ({PAGE} bytes), smaller than any "
            f"batch in shared memory: batch_bytes is in bytes, not MiB. For {batch_bytes} MiB "
            f"pass {batch_bytes} * MIB (MIB = 2**20 = {MIB} bytes); paged([...]) gives a batch's "
            "bytes from its tensors' bytes."
        )
    if workers <= 0:
        return 0
    return ranks * (workers * prefetch_factor + 1) * batch_bytes


@dataclass(frozen=True)
class ShmPlan:
    """A loader configuration against this machine's ``/dev/shm``.

    Attributes:
        peak: Predicted peak bytes (:func:`predict_peak`).
        size: ``/dev/shm``'s size, or None where there is none.
        free: Bytes free in it now, or None.
        config: The configuration, in words.
    """

    peak: int
    size: int | None
    free: int | None
    config: str

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits in what is free now; None without ``/dev/shm``."""
        return None if self.free is None else self.peak <= self.free

    def __str__(self) -> str:
        head = f"{self.config}: predicted peak {self.peak / MIB:.1f} MiB of shared memory"
        if self.size is None or self.free is None:
            return (
                head + f"; no {SHM} here (macOS passes unnamed shared memory): nothing to compare"
            )
        where = f"{SHM} holds {self.size / MIB:.0f} MiB, {self.free / MIB:.0f} MiB free"
        if self.fits:
            return f"{head}; {where}: fits"
        return (
            f"{head}; {where}: does NOT fit. Workers will fail ('No space left on device', "
            "'Bus error') or the loader will wait forever. Lower prefetch_factor or "
            "num_workers, or give the container more (docker run --shm-size=1g; in "
            "Kubernetes an emptyDir with medium: Memory mounted at /dev/shm)"
        )


def plan_shm(
    batch_bytes: int,
    *,
    workers: int,
    prefetch_factor: int = 2,
    ranks: int = 1,
    path: str = SHM,
    warn: bool = False,
) -> ShmPlan:
    """Predict a loader's peak and compare it with ``path``; with ``warn``, warn if it won't fit.

    Raises nothing: the run may still be what the user wants (a failure to show).
    """
    size, used = shm_size(path), shm_used(path)
    free = None if size is None or used is None else size - used
    config = (
        f"{ranks} rank(s) x {workers} worker(s) x prefetch {prefetch_factor} "
        f"of {batch_bytes / MIB:.1f} MiB batches"
    )
    plan = ShmPlan(
        predict_peak(batch_bytes, workers=workers, prefetch_factor=prefetch_factor, ranks=ranks),
        size,
        free,
        config,
    )
    if warn and plan.fits is False:
        warnings.warn(str(plan), ShmWarning, stacklevel=2)
    return plan


class ShmPoller:
    """Poll ``/dev/shm``'s use in a thread; ``peak`` is the most above where it started.

    Measured, not computed: ``with ShmPoller() as p: run(); p.peak``. A poll costs
    one ``statvfs`` (microseconds); ``every`` seconds apart.
    """

    def __init__(self, path: str = SHM, every: float = 0.001) -> None:
        self.path, self.every = path, every
        self.base = 0
        self.top = 0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="ezpz-shm-poll")

    def _poll(self) -> None:
        while not self._stop.is_set():
            used = shm_used(self.path) or 0
            self.top = max(self.top, used)
            self.polls += 1
            time.sleep(self.every)

    def __enter__(self) -> ShmPoller:
        self.base = self.top = shm_used(self.path) or 0
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int:
        """Most bytes in use above the use when polling started."""
        return self.top - self.base
