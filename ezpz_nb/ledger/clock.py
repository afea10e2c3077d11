"""A rank's step clock: where each step's time went (data, compute, collective).

The recorder (:class:`~ezpz_nb.ledger.RecordingLoader`) owns one and stamps the
loader's side (asking for a batch, getting it, the loop coming back); the loop
marks its own side with ``rec.compute()`` and ``rec.collective()`` blocks. The
clock reads ``time.perf_counter()`` for durations and ``time.time()`` only for
the two stamps that are compared across ranks (a step's start and its entry
into the collective): on one machine every process reads the same wall clock;
across nodes it is as close as NTP keeps them (about a millisecond), and the
ledger never counts more wait than the rank spent in the collective.
"""

from __future__ import annotations

from time import perf_counter, time

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
        if self._collective and clock.entered_at is None:
            clock.entered_at = time()
        self._t0 = perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        dt = perf_counter() - self._t0
        clock = self._clock
        if self._collective:
            clock.collective_s += dt
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
        self._start_at = 0.0
        self._asked = 0.0
        self._got = 0.0
        self._handed = 0.0

    def asking(self) -> None:
        """The loop asks the loader for the next batch: a new step starts."""
        self._start_at = time()
        self._asked = perf_counter()

    def got(self) -> None:
        """The loader returned the batch; what follows until :meth:`finish` is the loop's."""
        self._got = perf_counter()
        self.compute_s = self.collective_s = 0.0
        self.compute_marked = False
        self.entered_at = None

    def handed(self) -> None:
        """The batch goes to the loop now: the recorder's own work since :meth:`got` is done.

        The recorder hashes and publishes between :meth:`got` and this call;
        that time is its own, counted in no part of the step.
        """
        self._handed = perf_counter()

    def ended(self) -> float:
        """The loader said the epoch is over: seconds since :meth:`asking`."""
        return perf_counter() - self._asked

    def finish(self) -> StepTimes:
        """The loop came back for the next batch: the step's times."""
        body = perf_counter() - self._handed
        if self.compute_marked:
            compute, other = self.compute_s, max(0.0, body - self.compute_s - self.collective_s)
        else:
            compute, other = max(0.0, body - self.collective_s), 0.0
        return StepTimes(
            data_s=self._got - self._asked,
            compute_s=compute,
            collective_s=self.collective_s,
            other_s=other,
            start_at=self._start_at,
            entered_at=self.entered_at,
        )
