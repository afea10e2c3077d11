"""Standby ranks for ``spawn`` (macOS, Windows): processes that imported torch ahead.

Under spawn every rank is a fresh Python that imports torch (seconds) before it can
join the group; the forkserver pays that once, spawn pays it at every launch. The
pool starts a few spawned processes at warm-up (``import ezpz_nb`` in a kernel),
each of which imports torch and the rank code and then waits
(:func:`ezpz_nb.launcher.rank.standby`). :meth:`RankProcesses.start` takes them
first and spawns fresh ones only for the ranks the pool lacks; the pool refills
once the ranks it gave are gone (or a persistent cluster is up), in the background.

Bounds: at most one launch's worth (:data:`ONE_LAUNCH` ranks, fewer where the
cores or the free memory are short: :func:`standby_size`); ``EZPZ_NB_STANDBY=0``
turns it off, ``EZPZ_NB_STANDBY=N`` asks for N. A standby process never outlives
the notebook: it has a rank's lifeline (the notebook's death, even by SIGKILL,
ends it), and closing the pool (kernel shutdown, exit) kills and reaps it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ezpz_nb._machine import available_memory
from ezpz_nb.launcher import rank as _rank
from ezpz_nb.launcher.errors import LaunchValueError
from ezpz_nb.launcher.startup import MAX_WORLD_SIZE, cores, main_hidden

__all__ = [
    "ONE_LAUNCH",
    "POOL",
    "STANDBY_ENV",
    "Standby",
    "StandbyPool",
    "size_from_env",
    "standby_size",
]

#: The variable that sizes the pool (``0``: off).
STANDBY_ENV = "EZPZ_NB_STANDBY"
#: The world size most notebook cells launch: the pool holds no more when idle.
ONE_LAUNCH = 4
#: PSS of one standby process (torch imported), as benchmarks/launch.py measures it:
#: 167 MiB (RSS 253 MiB) with torch 2.13 CPU, Python 3.11. Used only to bound the pool.
STANDBY_BYTES = 170 * 1024**2
_OFF = ("0", "off", "false", "no")


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
    text = (value or "").strip().lower()
    if text in _OFF:
        return 0
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
    """One standby process and the notebook's ends of its pipes (a rank's, plus ``warm``)."""

    proc: Any
    conn: Any
    out_r: Any
    err_r: Any
    life_w: Any
    warm_r: Any
    warm: bool = False

    def poll_warm(self) -> bool:
        """True once the process has imported torch and waits."""
        if not self.warm:
            try:
                if self.warm_r.poll():
                    self.warm_r.recv_bytes()
                    self.warm = True
            except (EOFError, OSError):
                pass
        return self.warm

    def handed_over(self) -> None:
        """The process is a rank now: its ``warm`` pipe is no longer read."""
        self.warm_r.close()

    def kill(self) -> None:
        """Kill and reap the process, close every pipe."""
        pid = self.proc.pid
        if pid is not None:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), self.proc.kill):
                try:
                    kill()
                except (ProcessLookupError, PermissionError, ValueError, AttributeError):
                    pass
            self.proc.join(2.0)
        for c in (self.conn, self.out_r, self.err_r, self.life_w, self.warm_r):
            c.close()


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
        self.refill()

    def refill(self) -> None:
        """Start standby ranks until there are ``size`` (they import torch on their own)."""
        with self._lock:
            self._ranks = [s for s in self._ranks if self._alive(s)]
            while not self.closed and len(self._ranks) < self.size:
                self._ranks.append(self._spawn())

    def take(self, n: int) -> list[Standby]:
        """Up to ``n`` standby ranks, the warm ones first; they are the caller's now."""
        with self._lock:
            self._ranks = [s for s in self._ranks if self._alive(s)]
            self._ranks.sort(key=lambda s: not s.poll_warm())
            taken, self._ranks = self._ranks[:n], self._ranks[n:]
        return taken

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
            return [s.proc.pid for s in self._ranks]

    def close(self) -> None:
        """Kill every standby rank and start no more (until :meth:`start`)."""
        with self._lock:
            self.closed = True
            ranks, self._ranks = self._ranks, []
        for s in ranks:
            s.kill()

    @staticmethod
    def _alive(s: Standby) -> bool:
        if s.proc.exitcode is None:
            return True
        s.kill()
        return False

    @staticmethod
    def _spawn() -> Standby:
        ctx = mp.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        out_r, out_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        life_r, life_w = ctx.Pipe(duplex=False)
        warm_r, warm_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank.standby,
            args=(child_conn, out_w, err_w, life_r, warm_w, os.getpid()),
            name="ezpz_nb-standby",
            daemon=False,  # a rank may start DataLoader workers: daemons may not
        )
        with main_hidden("spawn"), _sigint_ignored():
            proc.start()
        for c in (child_conn, out_w, err_w, life_r, warm_w):
            c.close()
        return Standby(proc, conn, out_r, err_r, life_w, warm_r)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Start a child that ignores SIGINT until it says otherwise (``rank.standby``).

    A standby is in the kernel's process group until its imports are done, and
    ipykernel's shutdown sends SIGINT to that group first: a refill started by the
    last launch then died in ``import site`` with "Fatal Python error" in the
    kernel's log. An ignored signal stays ignored across exec, until the standby,
    in a group of its own by then, restores it. Only the main thread may change a
    handler; elsewhere the child starts as before.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


#: This notebook's pool (empty until warm-up starts it under spawn).
POOL = StandbyPool()


def size_from_env(env: Mapping[str, str]) -> int:
    """:func:`standby_size` for this machine and ``env``."""
    return standby_size(env.get(STANDBY_ENV), cores(), available_memory())
