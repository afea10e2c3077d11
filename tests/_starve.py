"""A rank held back by a busy machine, made without a clock (tests of the run and step clocks).

The kernel counts, per thread, the time it was ready to run but kept off a CPU
(``/proc/<pid>/task/<tid>/schedstat``). :func:`kept_off_the_cpu` makes that count grow by a
given amount, as other programs on a busy machine would: deterministic, whatever the load.
"""

from __future__ import annotations

import os
import threading

import pytest

#: Linux's per-thread run delay, and CPU pinning: what these tests need.
NEEDS_SCHEDSTAT = pytest.mark.skipif(
    not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat")
    or not hasattr(os, "sched_setaffinity"),
    reason="needs Linux's per-thread run delay (/proc/<pid>/task/<tid>/schedstat)",
)


def _waited(pid: int, tid: int) -> int:
    """Nanoseconds thread ``tid`` of ``pid`` has waited, ready to run, for a CPU."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[1])


def kept_off_the_cpu(seconds: float) -> float:
    """Rank side: stay ready to run while the kernel keeps this thread off its CPU for
    ``seconds`` (its own count), as a long import on a busy machine would; return that count.

    A child forked here, pinned to the same CPU, spins at this thread's priority while this
    thread drops to the lowest (nice 19: irreversible, so fresh ranks only), until the
    kernel says this thread has waited ``seconds``.
    """
    me, tid = os.getpid(), threading.get_native_id()
    start = _waited(me, tid)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # this thread, and the child
    child = os.fork()
    if child == 0:
        while _waited(me, tid) - start < seconds * 1e9 and os.getppid() == me:
            for _ in range(10_000):
                pass
        os._exit(0)
    os.setpriority(os.PRIO_PROCESS, 0, 19)  # on Linux: this thread only
    while _waited(me, tid) - start < seconds * 1e9:
        pass
    os.waitpid(child, 0)
    return (_waited(me, tid) - start) / 1e9


#: This process's spinner for :func:`held_back`: (the pid that forked it, the pipe that wakes it).
_SPINNER: tuple[int, int] | None = None


def held_back(seconds: float) -> None:
    """As :func:`kept_off_the_cpu`, each call, for the calling thread, but with one spinner
    forked at the first call and kept (asleep on a pipe between calls): a fork per call would
    add the fork's own work to the thread's time. The spinner leaves when this process does
    (its pipe closes: the spinner reads it between calls, and a spin ends once the count is
    reached, which it is while this thread waits for it)."""
    global _SPINNER
    me, tid = os.getpid(), threading.get_native_id()
    if _SPINNER is None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        r, w = os.pipe()
        # Forked twice, the middle one leaving at once: the spinner is no child of this
        # thread, which a step clock would take for a loader worker.
        middle = os.fork()
        if middle == 0:
            if os.fork() != 0:
                os._exit(0)
            os.close(w)
            while len(msg := os.read(r, 8)) == 8:
                target = int.from_bytes(msg, "little")
                while _waited(me, tid) < target:
                    for _ in range(10_000):
                        pass
            os._exit(0)
        os.waitpid(middle, 0)
        os.close(r)
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        _SPINNER = (middle, w)
    target = _waited(me, tid) + int(seconds * 1e9)
    os.write(_SPINNER[1], target.to_bytes(8, "little"))
    while _waited(me, tid) < target:
        pass
