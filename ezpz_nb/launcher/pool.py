"""Standby ranks for ``spawn`` (macOS, Windows): processes that imported torch ahead.

Under spawn every rank is a fresh Python that imports torch (seconds) before it can
join the group; the forkserver pays that once, spawn pays it at every launch. The
pool starts a few spawned processes at warm-up (``import ezpz_nb`` in a kernel),
each of which imports torch and the rank code and then waits
(:func:`ezpz_nb.launcher.rank.standby`). :meth:`RankProcesses.start` takes them
first (:meth:`StandbyPool.take`) and spawns fresh ones only for the ranks the pool
lacks.

The notebook's one pool is its session's (``SESSION.pool``, :mod:`.session`), handed to
each cluster's processes. The refill policy lives here and nowhere else: the pool replaces what it lent only
when the launch that took them calls :meth:`StandbyPool.release`, that is once its
ranks are up for good (a persistent cluster) or gone, never while ranks are still
starting: the replacements' imports would compete with them for the cores.

Bounds: at most one launch's worth (:data:`ONE_LAUNCH` ranks, fewer where the
cores or the free memory are short: :func:`standby_size`); ``EZPZ_NB_STANDBY=0``
turns it off, ``EZPZ_NB_STANDBY=N`` asks for N. A standby process never outlives
the notebook: it has a rank's lifeline (the notebook's death, even by SIGKILL,
ends it), and closing the pool (kernel shutdown, exit) kills and reaps it.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from ezpz_nb._machine import available_memory
from ezpz_nb.launcher import rank as _rank
from ezpz_nb.launcher.children import Child, kill_group, start_child
from ezpz_nb.launcher.errors import LaunchValueError
from ezpz_nb.launcher.settings import MAX_WORLD_SIZE, ONE_LAUNCH, STANDBY_ENV, is_off
from ezpz_nb.launcher.startup import cores

__all__ = [
    "STANDBY_BYTES",
    "Standby",
    "StandbyPool",
    "size_from_env",
    "standby_size",
]

#: PSS of one standby process (torch imported), as benchmarks/launch.py measures it:
#: 167 MiB (RSS 253 MiB) with torch 2.13 CPU, Python 3.11. Used only to bound the pool.
STANDBY_BYTES = 170 * 1024**2


def standby_size(value: str | None, cores: int, available: int | None) -> int:
    """How many standby ranks to keep.

    Args:
        value: ``EZPZ_NB_STANDBY`` as set: unset or blank for automatic, ``0`` (or
            off/false/no) for none, a number for that many (up to ``MAX_WORLD_SIZE``).
        cores: CPU cores this process may use; the pool's imports share them at
            warm-up, so a one-core machine keeps 2.
        available: Free memory in bytes (None: unknown, one launch's worth).

    Raises:
        LaunchValueError: ``value`` is neither a number nor off.
    """
    if is_off(value):
        return 0
    text = (value or "").strip()
    if text:
        if not text.isdigit():
            raise LaunchValueError(
                f"{STANDBY_ENV}={value!r}: set it to a number of standby ranks "
                f"(0 turns the pool off), or unset it to size the pool from this machine"
            )
        return min(int(text), MAX_WORLD_SIZE)
    by_memory = ONE_LAUNCH if available is None else available // (4 * STANDBY_BYTES)
    # Standby ranks may take a quarter of the free memory at most.
    return max(0, min(ONE_LAUNCH, 2 * max(cores, 1), by_memory))


@dataclass
class Standby:
    """One standby process (its pipes: a rank's, plus ``warm``) and whether it is warm."""

    child: Child
    warm: bool = False

    def poll_warm(self) -> bool:
        """True once the process has imported torch and waits."""
        if not self.warm:
            try:
                if self.child.warm_r.poll():
                    self.child.warm_r.recv_bytes()
                    self.warm = True
            except (EOFError, OSError):
                pass
        return self.warm

    def handed_over(self) -> Child:
        """The process is a rank now: its ``warm`` pipe is no longer read."""
        self.child.warm_r.close()
        self.child.warm_r = None
        return self.child

    def kill(self) -> None:
        """Kill and reap the process, close every pipe."""
        kill_group(self.child.proc)
        if self.child.proc.pid is not None:
            self.child.proc.join(2.0)
        self.child.close_pipes()


class StandbyPool:
    """The notebook's standby ranks (see the module's docstring)."""

    def __init__(self) -> None:
        self.size = 0
        self.closed = False
        self._ranks: list[Standby] = []
        self._lock = threading.Lock()

    def start(self, size: int) -> None:
        """Keep ``size`` standby ranks from now on, starting them at once."""
        with self._lock:
            self.size, self.closed = size, False
        self._refill()

    def take(self, n: int) -> list[Standby]:
        """Up to ``n`` standby ranks, the warm ones first; they are the caller's now.

        The caller calls :meth:`release` once they no longer start (up, or gone).
        """
        with self._lock:
            self._ranks = [s for s in self._ranks if self._alive(s)]
            self._ranks.sort(key=lambda s: not s.poll_warm())
            taken, self._ranks = self._ranks[:n], self._ranks[n:]
        return taken

    def release(self, n: int) -> None:
        """The ``n`` ranks a launch took are up for good or gone: replace them now
        (their imports then run while the learner reads, not in the next launch)."""
        if n > 0:
            self._refill()

    def ready(self) -> bool:
        """True when the pool is full and every standby rank has imported torch."""
        with self._lock:
            return len(self._ranks) >= self.size and all(s.poll_warm() for s in self._ranks)

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for :meth:`ready`; whether it became so."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def pids(self) -> list[int]:
        """Process ids of the standby ranks (for tests and benchmarks)."""
        with self._lock:
            return [s.child.proc.pid for s in self._ranks]

    def close(self) -> None:
        """Kill every standby rank and start no more (until :meth:`start`)."""
        with self._lock:
            self.closed = True
            ranks, self._ranks = self._ranks, []
        for s in ranks:
            s.kill()

    def _refill(self) -> None:
        """Start standby ranks until there are ``size`` (they import torch on their own)."""
        with self._lock:
            self._ranks = [s for s in self._ranks if self._alive(s)]
            while not self.closed and len(self._ranks) < self.size:
                child = start_child(
                    mp.get_context("spawn"),
                    _rank.standby,
                    name="ezpz_nb-standby",
                    start_method="spawn",
                    standby=True,
                )
                self._ranks.append(Standby(child))

    @staticmethod
    def _alive(s: Standby) -> bool:
        if s.child.proc.exitcode is None:
            return True
        s.kill()
        return False


def size_from_env(env: Mapping[str, str]) -> int:
    """:func:`standby_size` for this machine and ``env``."""
    return standby_size(env.get(STANDBY_ENV), cores(), available_memory())
