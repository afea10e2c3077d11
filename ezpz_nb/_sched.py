"""How long the kernel kept threads ready to run but off a CPU (their run delay), Linux.

The second field of ``/proc/<pid>/task/<tid>/schedstat`` counts, in nanoseconds, the time a
thread was runnable and waiting for a CPU. A thread asleep (blocked on a queue, a socket, a
collective) is not runnable, so the count grows only while other programs, or the thread's
own siblings, hold every CPU. Two users: the launcher's run clock (a busy machine must not
turn a working run into a hang) and a rank's step clock (a busy machine must not turn a
balanced rank into a straggler). Where the kernel does not say (not Linux, no schedstat)
every count is 0: callers fall back on the wall clock.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable

__all__ = ["ThreadDelay", "run_delays"]


def _read(path: str) -> str:
    # os.open/os.read, not open(): a step clock reads these on every step (~2 us each).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # gone meanwhile, or not Linux
        return ""
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _delay(path: str) -> int | None:
    fields = _read(path).split()
    return int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _below(pids: Iterable[int]) -> set[int]:
    """``pids`` and every live process below them (a rank's loader workers and theirs)."""
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        for tid in _tasks(pid):
            todo += [int(p) for p in _read(f"/proc/{pid}/task/{tid}/children").split()]
    return found


def run_delays(
    pids: Iterable[int], skip: int | None = None, alone: Iterable[int] = ()
) -> dict[int, int]:
    """``{thread id: nanoseconds it waited, ready, for a CPU}`` of every thread of ``pids``
    and the processes below them, and of ``alone`` (not what is below it), but thread
    ``skip``; empty where the kernel does not say."""
    out: dict[int, int] = {}
    for pid in _below(pids) | set(alone):
        for tid in _tasks(pid):
            ns = _delay(f"/proc/{pid}/task/{tid}/schedstat")
            if ns is not None and int(tid) != skip:
                out[int(tid)] = ns
    return out


class ThreadDelay:
    """One thread's run delay, and its child processes', read again cheaply (each step).

    Holds ``/proc/thread-self/schedstat`` and ``.../children`` open and re-reads them with
    ``pread`` (about 1 us, where opening anew costs about 7): a step clock reads them several
    times a step. ``/proc/thread-self`` names the thread that opened it, so the files are
    opened again when another thread asks. :meth:`close` lets them go (also on collection).
    """

    def __init__(self) -> None:
        self._tid = -1
        self._fds: tuple[int, int] | None = None
        self._closer = weakref.finalize(self, _close, [])

    def here(self) -> None:
        """Read the calling thread from now on (opens its files when another thread had them)."""
        tid = threading.get_native_id()
        if tid == self._tid:
            return
        self.close()
        self._tid = tid
        try:
            fds = (
                os.open("/proc/thread-self/schedstat", os.O_RDONLY),
                os.open("/proc/thread-self/children", os.O_RDONLY),
            )
        except OSError:  # not Linux: nothing to read, 0 every time
            return
        self._fds = fds
        self._closer = weakref.finalize(self, _close, list(fds))

    def own(self) -> tuple[int, int]:
        """``(on a CPU, waited ready for one)``, nanoseconds, of the thread of the last
        :meth:`here` ((0, 0) where the kernel does not say).

        The wait is charged when the thread next gets a CPU, on the scheduler's clock,
        which may be a tick behind: over a window of a few milliseconds it can exceed what
        the wall clock leaves after the time on a CPU. Callers bound it by that.
        """
        fds = self._fds
        if fds is None:
            return 0, 0
        # "on-CPU run-delay timeslices\n"; read several times a step, so kept short.
        on, wait, _ = os.pread(fds[0], 128, 0).split(b" ", 2)
        return int(on), int(wait)

    def children(self) -> dict[int, int]:
        """``{pid: nanoseconds its main thread waited, ready, for a CPU}`` of each process
        that thread started (a DataLoader's workers, forked by the loop's thread)."""
        out: dict[int, int] = {}
        listed = os.pread(self._fds[1], 4096, 0) if self._fds is not None else b""
        for pid in listed.split():
            ns = _delay(f"/proc/{int(pid)}/schedstat")
            if ns is not None:
                out[int(pid)] = ns
        return out

    def close(self) -> None:
        """Close the files (a later read opens them again)."""
        self._closer()
        self._fds, self._tid = None, -1


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
