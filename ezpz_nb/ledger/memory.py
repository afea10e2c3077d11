"""Memory of a rank and of its DataLoader workers, sampled at a bounded cost per step.

Which number says what a loader costs the machine? ``RSS`` counts the pages a
process maps, so a forked worker shows the whole dataset at once even though it
shares those pages with its parent. ``PSS`` splits each shared page among the
processes that map it: the sum of PSS over processes is what they hold together.
A worker's own cost is its *private* memory, and the kind that matters is the
dirty kind: anonymous pages it wrote, which stay in RAM (or swap) until it exits.
Clean private pages (a memory-mapped file read by one worker only) count in
``USS`` but the kernel drops them whenever it needs the room. So:

* ``private`` (``Private_Dirty + Swap``): grows when a forked worker touches a
  Python object's reference count (the page holding it is copied: pytorch
  #13246), and is large from the start when the dataset was pickled into the
  worker (forkserver, spawn);
* ``uss``, ``pss``, ``rss``, ``shared``: as the kernel and ``psutil`` name them.

On Linux they come from ``/proc/<pid>/smaps_rollup`` (the cheaper ``statm``
cannot tell a page shared after a fork from one that was copied); elsewhere from
``psutil.Process.memory_full_info()``, whose ``uss`` stands in for ``private``.

One reading costs about 1-3 ms per process with torch loaded (the kernel walks
the page tables), more than a short step. :class:`MemorySampler` therefore
spends a share of the wall time (``budget``, 1% by default): the first reading
is taken at once, and each later one only while the readings after the first,
this one included, fit in ``budget`` of the wall time since the first. A loop
shorter than ``c / budget`` after a first reading of ``c`` seconds gets no
second reading; ``budget=1.0`` reads at every step, however long the readings
take (the figures: which steps are read must not depend on the machine's load).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

__all__ = [
    "BUDGET",
    "MemoryGrowth",
    "MemoryReport",
    "MemorySample",
    "MemorySampler",
    "ProcMemory",
    "read_memory",
    "summarise",
    "worker_pids",
]

#: Default share of wall time the sampler may spend reading memory.
BUDGET = 0.01
MIB = 1 << 20

# smaps_rollup keys (kB) for each field; several keys are summed.
_KEYS = {
    "rss": ("Rss",),
    "pss": ("Pss",),
    "uss": ("Private_Clean", "Private_Dirty", "Private_Hugetlb"),
    "private": ("Private_Dirty", "Swap"),
    "shared": ("Shared_Clean", "Shared_Dirty"),
}


@dataclass(frozen=True)
class ProcMemory:
    """One process's memory at one moment, in bytes (see the module docstring)."""

    rss: int
    pss: int
    uss: int
    private: int
    shared: int


def _from_rollup(text: str) -> ProcMemory:
    kb: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            kb[key] = int(parts[0])
    got = {name: 1024 * sum(kb.get(k, 0) for k in keys) for name, keys in _KEYS.items()}
    return ProcMemory(**got)


def read_memory(pid: int | None = None) -> ProcMemory | None:
    """The memory of process ``pid`` (this one by default); None if it is gone or unreadable."""
    pid = os.getpid() if pid is None else pid
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
                return _from_rollup(fh.read())
        except (OSError, ValueError):
            return None
    try:
        import psutil
    except ImportError:
        return None
    try:
        full = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError, NotImplementedError):  # gone, or not given here
        return None
    shared = int(getattr(full, "shared", 0))
    uss = int(getattr(full, "uss", full.rss))
    return ProcMemory(int(full.rss), int(getattr(full, "pss", uss)), uss, uss, shared)


def worker_pids(iterator: Any) -> list[tuple[int, int]]:
    """``[(worker id, pid)]`` of the DataLoader workers behind ``iter(loader)``.

    torch's multi-process iterator keeps its worker processes in ``_workers``,
    in worker-id order; any other iterator (no workers, a wrapper) gives ``[]``
    and only the rank itself is sampled.
    """
    procs = getattr(iterator, "_workers", None) or []
    return [(i, p.pid) for i, p in enumerate(procs) if getattr(p, "pid", None)]


@dataclass(frozen=True)
class MemorySample:
    """One process's memory at one step of one rank.

    Attributes:
        rank: The rank that took the sample.
        worker: The DataLoader worker id, or -1 for the rank itself.
        pid: The process read (a new one each epoch unless ``persistent_workers``).
        epoch: Epoch label of the step.
        step: Step within the epoch (taken after the step's batch arrived).
        memory: What was read.
    """

    rank: int
    worker: int
    pid: int
    epoch: int
    step: int
    memory: ProcMemory


class MemorySampler:
    """Read a rank's and its workers' memory when it is due, within a share of wall time.

    Args:
        budget: Share of wall time the readings may take (0.01: 1%).

    Attributes:
        spent_s: Seconds spent reading so far.
        first_s: Of which, the first reading (taken whatever the budget).
        readings: Processes read so far.
    """

    def __init__(self, budget: float = BUDGET) -> None:
        if not 0 < budget <= 1:
            raise ValueError(f"memory budget must be a share of time in (0, 1], got {budget}")
        self.budget = budget
        self.spent_s = 0.0
        self.readings = 0
        self.first_s = 0.0
        self._first: float | None = None
        self._last = 0.0

    def due(self, step: int = 0, workers: int = 0) -> bool:
        """Whether a reading is due at ``step`` of an epoch with ``workers`` workers.

        The first reading always is, and so is every step before ``workers``: worker
        ``w``'s first batch is the epoch's step ``w`` (torch hands out indices round
        robin and delivers in order), and its growth is counted from the reading
        after it (see :func:`summarise`). After those, while the budget allows.
        """
        if self._first is None or self.budget >= 1 or step < workers:
            # 1.0 means every step: a count, whatever the readings cost. Costed, a
            # reading slowed by a loaded machine (longer than the step before it)
            # would skip steps, and which ones would depend on the load.
            return True
        later = self.spent_s - self.first_s + self._last  # with this one, costed as the last
        return later <= self.budget * (perf_counter() - self._first)

    def sample(
        self, rank: int, epoch: int, step: int, workers: Sequence[tuple[int, int]]
    ) -> list[MemorySample]:
        """Read the rank (this process) and ``workers`` (``[(id, pid)]``) now, due or not."""
        t0 = perf_counter()
        if self._first is None:
            self._first = t0
        out = []
        for worker, pid in [(-1, os.getpid()), *workers]:
            mem = read_memory(pid)
            if mem is not None:  # a worker that exited between listing and reading
                out.append(MemorySample(rank, worker, pid, epoch, step, mem))
        t1 = perf_counter()
        self.spent_s += t1 - t0
        self.readings += len(out)
        self._last = t1 - t0
        if self._first == t0:
            self.first_s = t1 - t0
        return out


@dataclass(frozen=True)
class MemoryGrowth:
    """One process's private memory over the samples of it (bytes).

    Attributes:
        rank: The rank.
        worker: Worker id, -1 for the rank itself.
        pid: The process.
        epoch: Epoch of its first sample.
        start: Private memory at its first sample (a worker's: once it made a batch).
        peak: The largest private memory sampled.
        end: Private memory at its last sample.
        samples: How many samples there were (from the start).
    """

    rank: int
    worker: int
    pid: int
    epoch: int
    start: int
    peak: int
    end: int
    samples: int

    @property
    def growth(self) -> int:
        """``end - start``: what the process added while it ran."""
        return self.end - self.start

    @property
    def name(self) -> str:
        """``"rank 1"`` or ``"rank 1 worker 0"``."""
        return f"rank {self.rank}" + (f" worker {self.worker}" if self.worker >= 0 else "")


def summarise(samples: Iterable[MemorySample]) -> list[MemoryGrowth]:
    """Start, peak and end of each process's private memory, by rank, epoch and worker.

    A worker's start is its first reading at or after the step of its first batch
    (step ``w`` for worker ``w``, in its first epoch): a forked worker writes a few
    MiB of its parent's pages while it starts up, and a reading taken during that
    (worker 1 read at step 0 on a busy machine, before it ran) would count its
    start-up as growth by as much as the clock allowed it.
    """
    by_proc: dict[tuple[int, int, int], list[MemorySample]] = {}
    for s in samples:
        by_proc.setdefault((s.rank, s.worker, s.pid), []).append(s)
    out = []
    for (rank, worker, pid), got in by_proc.items():
        got.sort(key=lambda s: (s.epoch, s.step))
        first = got[0].epoch
        got = [s for s in got if s.epoch > first or s.step >= worker] or got
        private = [s.memory.private for s in got]
        out.append(
            MemoryGrowth(rank, worker, pid, first, private[0], max(private), private[-1], len(got))
        )
    return sorted(out, key=lambda g: (g.epoch, g.rank, g.worker, g.pid))


@dataclass(frozen=True)
class MemoryReport:
    """Private memory per rank and worker, in words: ``print(ledger.memory_report())``.

    Attributes:
        growth: One :class:`MemoryGrowth` per process sampled.
    """

    growth: list[MemoryGrowth]

    def worst(self) -> MemoryGrowth | None:
        """The worker that grew most (None without worker samples)."""
        workers = [g for g in self.growth if g.worker >= 0]
        return max(workers, key=lambda g: g.growth, default=None)

    def __str__(self) -> str:
        if not self.growth:
            return "No memory recorded: record(..., memory=True) samples it."
        lines = ["private memory (MiB): start -> peak, growth, per process and epoch"]
        for g in self.growth:
            lines.append(
                f"  epoch {g.epoch} {g.name:<16} {g.start / MIB:8.1f} -> {g.peak / MIB:8.1f}"
                f"  growth {g.growth / MIB:+8.1f}  ({g.samples} samples)"
            )
        return "\n".join(lines)
