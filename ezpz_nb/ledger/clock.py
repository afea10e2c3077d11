"""A rank's step clock: where each step's time went (data, compute, collective).

The recorder (:class:`~ezpz_nb.ledger.RecordingLoader`) owns one and stamps the
loader's side (asking for a batch, getting it, the loop coming back); the loop
marks its own side with ``rec.compute()`` and ``rec.collective()`` blocks. The
clock reads ``time.perf_counter()`` for durations and ``time.time()`` only for
the two stamps that are compared across ranks (a step's start and its entry
into the collective): on one machine every process reads the same wall clock;
across nodes it is as close as NTP keeps them (about a millisecond), and the
ledger never counts more wait than the rank spent in the collective.

Each step also counts the time the kernel kept the rank ready to run but off a CPU
outside its collective (``delay_s``, see :mod:`ezpz_nb._sched`): the loop's thread, and
the longest of its loader workers' (no more than the data wait). On a machine busy with
other programs a balanced rank's steps stretch by exactly that, so the ledger's verdict
judges each rank by its time less this delay. Where the kernel does not say it is 0.
"""

from __future__ import annotations

from time import perf_counter, time

from ezpz_nb._sched import ThreadDelay
from ezpz_nb.ledger.records import StepTimes

__all__ = ["Mark", "StepClock"]


class Mark:
    """A reusable ``with`` block that adds its duration to one of the clock's sums.

    Made once per clock, not per step: entering one costs two clock reads.
    """

    __slots__ = ("_clock", "_collective", "_t0")

    def __init__(self, clock: StepClock, *, collective: bool) -> None:
        self._clock = clock
        self._collective = collective
        self._t0 = 0.0

    def __enter__(self) -> Mark:
        clock = self._clock
        if self._collective:
            if clock.entered_at is None:
                clock.entered_at = time()
            # A wait for a CPU inside the collective is not the rank's own slowness.
            clock.add(clock.delays.own())
        self._t0 = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        dt = perf_counter() - self._t0
        clock = self._clock
        if self._collective:
            clock.collective_s += dt
            clock.add(clock.delays.own(), -1)
        else:
            clock.compute_s += dt
            clock.compute_marked = True


class StepClock:
    """Measures one step at a time: call :meth:`asking`, :meth:`got`, then :meth:`finish`.

    Attributes:
        compute: The ``with`` block that marks the step's own work.
        collective: The ``with`` block that marks the step's collective.
    """

    def __init__(self) -> None:
        self.compute = Mark(self, collective=False)
        self.collective = Mark(self, collective=True)
        self.compute_s = 0.0
        self.collective_s = 0.0
        self.compute_marked = False
        self.entered_at: float | None = None
        #: The loop thread's time on a CPU and its run delay this step, outside collectives.
        self.cpu_ns = self.delay_ns = 0
        self.delays = ThreadDelay()
        self._workers: dict[int, int] = {}
        self._workers_seen: dict[int, int] | None = None
        self._start_at = 0.0
        self._asked = 0.0
        self._got = 0.0
        self._handed = 0.0

    def add(self, reading: tuple[int, int], sign: int = 1) -> None:
        """Add (``sign=-1``: take away) a :class:`ThreadDelay` reading to this step's sums:
        each counted window is a reading at its end less one at its start."""
        self.cpu_ns += sign * reading[0]
        self.delay_ns += sign * reading[1]

    def asking(self) -> None:
        """The loop asks the loader for the next batch: a new step starts."""
        self._start_at = time()
        self._asked = perf_counter()
        self.delays.here()
        self.cpu_ns = self.delay_ns = 0
        self.add(self.delays.own(), -1)
        # Loader workers as the last finish() saw them (they load ahead, between steps too);
        # after an epoch's end, read afresh.
        if self._workers_seen is None:
            self._workers_seen = self.delays.children()
        self._workers, self._workers_seen = self._workers_seen, None

    def got(self) -> None:
        """The loader returned the batch; what follows until :meth:`finish` is the loop's."""
        self._got = perf_counter()
        self.add(self.delays.own())  # the recorder's own work is no part of the step
        self.compute_s = self.collective_s = 0.0
        self.compute_marked = False
        self.entered_at = None

    def handed(self) -> None:
        """The batch goes to the loop now: the recorder's own work since :meth:`got` is done.

        The recorder hashes and publishes between :meth:`got` and this call;
        that time is its own, counted in no part of the step.
        """
        self._handed = perf_counter()
        self.add(self.delays.own(), -1)

    def ended(self) -> float:
        """The loader said the epoch is over: seconds since :meth:`asking`."""
        self._workers_seen = None
        return perf_counter() - self._asked

    def finish(self) -> StepTimes:
        """The loop came back for the next batch: the step's times."""
        body = perf_counter() - self._handed
        data = self._got - self._asked
        self.add(self.delays.own())
        # Workers born this step (an epoch's first) count from 0: all their delay is this step's.
        self._workers_seen = self.delays.children()
        workers = [ns - self._workers.get(pid, 0) for pid, ns in self._workers_seen.items()]
        if self.compute_marked:
            compute, other = self.compute_s, max(0.0, body - self.collective_s - self.compute_s)
        else:
            compute, other = max(0.0, body - self.collective_s), 0.0
        # The kernel charges a wait when the thread next runs, on a clock up to a tick
        # behind: bounded by what the wall clock leaves after the thread's time on a CPU.
        busy = data + compute + other
        own = min(max(0, self.delay_ns), max(0, 1e9 * busy - self.cpu_ns)) / 1e9
        delay = min(busy, own + min(max([0, *workers]) / 1e9, data))
        return StepTimes(
            data_s=data,
            compute_s=compute,
            collective_s=self.collective_s,
            other_s=other,
            start_at=self._start_at,
            entered_at=self.entered_at,
            delay_s=delay,
        )
