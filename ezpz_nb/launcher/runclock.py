"""A run's clock that a busy machine does not stretch: wall time less the time a CPU was denied.

A run's ``timeout`` says when ranks that have not answered count as hung. Counted on the
wall clock alone, a machine busy with other programs stretches everything a rank does, its
start and a checker's own set-up included: notebook 16's checker told a right answer "the
ranks hung" at load average 30-35 (its first functional collective imports torch's compiler
stack, 820 modules: 53 s at load 27 on 2 cores, a fraction of a second on warm ranks).

The kernel counts, for every thread, how long it was ready to run but kept off a CPU (its
run delay, the second field of ``/proc/<pid>/task/<tid>/schedstat``). A thread blocked in a
collective is not ready, so it is kept waiting for nothing. :class:`RunClock` is the wall
time since the run began less the longest any one thread of the ranks (their children too)
or of this process was kept so: a deadlock reaches ``timeout`` on the wall clock, as before;
a loop that never ends reaches it once it has run ``timeout`` seconds; a rank held back by
other programs only once it had ``timeout`` seconds of its own. The longest, not the sum:
a rank's threads wait side by side, and summing would count one stolen second many times
and put off a real hang. Where the kernel does not say (not Linux, no schedstat), nothing is
subtracted: the wall clock, as before.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from ezpz_nb._sched import run_delays

__all__ = ["RunClock"]


class RunClock:
    """Seconds of a run that count towards its timeout (see the module's docstring).

    Args:
        pids: The ranks' process ids, asked each time (a cluster's ranks change when it
            restarts them). This process is watched too (a checker's server threads,
            whose answers the ranks wait for), but not the thread that made the clock:
            it only polls.
    """

    def __init__(self, pids: Callable[[], Iterable[int]]) -> None:
        self._pids = pids
        self._skip = threading.get_native_id()
        self.start = time.monotonic()
        # Threads born later waited for nothing before: their whole delay counts.
        self._before = self._delays()

    def _delays(self) -> dict[int, int]:
        # This process's own threads, not all it started: a standby pool or another
        # cluster below the notebook is no part of this run (and a walk of /proc each run).
        return run_delays(self._pids(), skip=self._skip, alone=[os.getpid()])

    def denied(self) -> float:
        """Seconds since the start that the thread kept waiting longest was kept waiting."""
        now = self._delays()
        waited = [ns - self._before.get(tid, 0) for tid, ns in now.items()]
        return max([0, *waited]) / 1e9

    def deadline(self, timeout: float) -> float:
        """The ``time.monotonic()`` at which ``timeout`` seconds will have counted, as far as
        is known now: later each time the ranks are found to have been kept waiting more."""
        return self.start + timeout + self.denied()
