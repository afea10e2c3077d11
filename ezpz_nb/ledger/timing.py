"""Where each rank's steps went, across ranks: the wait for the slowest, and a verdict.

A rank's recorder measures only its own side (:class:`~ezpz_nb.ledger.StepTimes`).
Who waited for whom needs every rank's records: in each step, the last rank to
enter the collective is the one the others waited for, and each rank's wait
is the time from its own entry to that last entry. The time after it (the
transfer) is not waiting, so a big all-reduce does not look like a straggler.

The verdict judges from counts over many steps, not from one step's order of entry.
Which rank entered last is a race: under load a fast rank preempted just before the
collective enters after a rank with three times its work, and in each epoch's first
step the order is set by when each rank started (a rank scheduled late after the
launch), not by its loader. Measured on 2 cores with two busy processes beside 2
ranks (notebook 12's straggler, 8 steps): the slow rank entered last in 62-88% of
the steps, its entries lost mostly at step 0, while it was the busier rank (data
wait plus work since the last collective, which every rank left together) in every
step after the first. So a rank counts as waited for in a step when it was the
busiest since the collective they all left, counted over the steps after each
epoch's first; the straggler must be waited for in more of them than any other
rank, and its median time before the collective (over the same steps) must be
:data:`STRAGGLER_RATIO` times the others'.

A rank is judged by its own time: what it took less the time the kernel kept it ready to
run but off a CPU (``StepTimes.delay_s``). On a machine busy with other programs every rank's
steps stretch by whatever the scheduler took from it: in CI (three ranks on 2 cores, test
workers and a Slurm cluster beside them) one balanced rank measured 1.5x the others' median
over 16 steps and the busiest in 60% of them, and was named a straggler. Its time less its delay is its loader's and its model's work, the same on a
quiet machine; a loader that waits on storage still counts (asleep is not delayed).

The marked collective is taken to join every rank of the step (the gradient
all-reduce of data parallelism). Times come from wall clocks: on one machine
they are the same clock; across nodes NTP keeps them within about a
millisecond, and a wait is never counted longer than the rank's own time in
the collective.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ezpz_nb.ledger.records import StepRecord
from ezpz_nb.wrapping import wrap_message

__all__ = [
    "STRAGGLER_RATIO",
    "Diagnosis",
    "StepTiming",
    "diagnose",
    "epoch_start",
    "step_timings",
]

#: A rank is named the straggler when its median time before the collective
#: (data wait plus its own work, less the time the machine kept it off a CPU) is at
#: least this many times the median of the other ranks'. Wide on purpose: noise on a
#: laptop moves medians by tens of percent, a real straggler by integer factors.
STRAGGLER_RATIO = 1.5
#: ... and, when the loop marks its collective, it is the rank the others waited for
#: (the busiest since the collective they all left) in more steps than any other rank.


@dataclass(frozen=True)
class StepTiming:
    """One rank's step, its wait for the others worked out (seconds).

    Attributes:
        rank: Global rank.
        epoch: Epoch label.
        step: Step within the epoch.
        data_s: Waiting for the batch.
        compute_s: The step's own work.
        wait_s: In the collective, waiting for the last rank to enter it.
        transfer_s: In the collective after the last rank entered.
        other_s: The loop's unmarked rest (see ``StepTimes.other_s``).
        end_s: The epoch's end, on its last step (see ``StepTimes.end_s``).
        start_at: Wall-clock time when the rank asked for the batch.
        entered_last: This rank was the last to enter the step's collective.
        delay_s: Outside the collective, kept ready to run but off a CPU (see
            ``StepTimes.delay_s``).
    """

    rank: int
    epoch: int
    step: int
    data_s: float
    compute_s: float
    wait_s: float
    transfer_s: float
    other_s: float
    end_s: float
    start_at: float
    entered_last: bool
    delay_s: float = 0.0

    @property
    def busy_s(self) -> float:
        """Time outside the collective: what a faster rank would have saved the others."""
        return self.data_s + self.compute_s + self.other_s + self.end_s

    @property
    def own_s(self) -> float:
        """Busy time less the time the machine kept the rank off a CPU: its own slowness."""
        return max(0.0, self.busy_s - self.delay_s)

    @property
    def loader_s(self) -> float:
        """Waiting on the loader: for the batch, and at the epoch's end."""
        return self.data_s + self.end_s

    @property
    def total_s(self) -> float:
        """The whole step."""
        return self.busy_s + self.wait_s + self.transfer_s


def step_timings(records: Iterable[StepRecord]) -> list[StepTiming]:
    """Each timed record with its wait for the last rank, by epoch, step and rank."""
    by_step: dict[tuple[int, int], list[StepRecord]] = defaultdict(list)
    for r in records:
        if r.times is not None:
            by_step[(r.epoch, r.step)].append(r)
    out = []
    for (epoch, step), recs in sorted(by_step.items()):
        entries = [r.times.entered_at for r in recs if r.times and r.times.entered_at is not None]
        last = max(entries, default=None)
        # The last rank: with equal stamps, the lowest rank (any choice is honest: no one waited).
        last_rank = min(
            (r.rank for r in recs if r.times and r.times.entered_at == last), default=None
        )
        for r in sorted(recs, key=lambda x: x.rank):
            t = r.times
            assert t is not None
            wait = 0.0
            if last is not None and t.entered_at is not None:
                wait = min(max(0.0, last - t.entered_at), t.collective_s)
            out.append(
                StepTiming(
                    r.rank,
                    epoch,
                    step,
                    t.data_s,
                    t.compute_s,
                    wait,
                    t.collective_s - wait,
                    t.other_s,
                    t.end_s,
                    t.start_at,
                    last is not None and r.rank == last_rank and len(recs) > 1,
                    t.delay_s,
                )
            )
    return out


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on a run's timings.

    Attributes:
        straggler: The rank the others wait for, or None.
        ratio: The slowest rank's median time before the collective over the
            other ranks' median (1.0 with one rank), each less the time the machine
            kept it off a CPU (``StepTiming.own_s``).
        data_share: ``{rank: share of its step time spent waiting for data}``,
            over the steps after each epoch's first (which also holds the
            loader's start: see :func:`epoch_start`).
        wait_share: ``{rank: share of its step time spent waiting in the collective}``,
            over the same steps.
        waited_share: ``{rank: share of the steps after each epoch's first in which it was
            the busiest rank (data wait and work since the collective they all left), the
            one the others waited for}``.
        text: The verdict in words.
    """

    straggler: int | None
    ratio: float
    data_share: dict[int, float]
    wait_share: dict[int, float]
    waited_share: dict[int, float]
    text: str

    def __str__(self) -> str:
        # Printed in notebooks: broken between words to fit the output column.
        return wrap_message(self.text)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def diagnose(records: Iterable[StepRecord]) -> Diagnosis:
    """Name the straggler, each rank's data-wait share, and whether the others wait for it."""
    timings = step_timings(records)
    if not timings:
        return Diagnosis(
            None,
            1.0,
            {},
            {},
            {},
            "No timings recorded: record(...) with timings=True (the default).",
        )
    per: dict[int, list[StepTiming]] = defaultdict(list)
    for t in timings:
        per[t.rank].append(t)
    ranks = sorted(per)
    # Shares of the steady state: the first step of an epoch also holds the ranks'
    # start-up skew and the loader's workers starting (see epoch_start()).
    steady = {r: [t for t in per[r] if t.step > 0] or per[r] for r in ranks}
    total = {r: sum(t.total_s for t in steady[r]) or 1e-12 for r in ranks}
    data_share = {r: sum(t.loader_s for t in steady[r]) / total[r] for r in ranks}
    wait_share = {r: sum(t.wait_s for t in steady[r]) / total[r] for r in ranks}
    waited_share = _waited_share(steady)
    busy = {r: statistics.median(t.own_s for t in steady[r]) for r in ranks}
    slow = max(ranks, key=lambda r: busy[r])
    others = [busy[r] for r in ranks if r != slow]
    ratio = busy[slow] / max(statistics.median(others), 1e-12) if others else 1.0
    marked = any(t.entered_last for t in timings)
    # A straggler is one the others wait for: with the collective marked, it must also be
    # the busiest in more steady steps than any other rank (counted, so a preempted step
    # moves one count, not the verdict).
    waits = [wait_share[r] for r in ranks if r != slow]
    waited_for = not marked or all(waited_share[slow] > waited_share[r] for r in ranks if r != slow)
    straggler = slow if others and ratio >= STRAGGLER_RATIO and waited_for else None
    shares = ", ".join(f"rank {r} {_pct(data_share[r])}" for r in ranks)
    lines = []
    if not others:
        lines.append("One rank: no other rank to wait for it.")
    elif straggler is None:
        lines.append(
            f"No straggler: no rank takes {STRAGGLER_RATIO}x the others' time before the "
            f"collective while they wait for it (slowest, rank {slow}: {ratio:.1f}x the "
            f"others' median, the one waited for in {_pct(waited_share[slow])} of the steps"
            + (
                f", the others waiting {_pct(statistics.mean(waits))} of theirs)."
                if waits
                else ")."
            )
        )
    else:
        mine = per[slow]
        lines.append(
            f"Rank {slow} is the straggler: before the collective it takes {ratio:.1f}x the "
            "other ranks' median, not counting time the machine kept it off a CPU "
            f"({1e3 * statistics.median(t.data_s for t in mine):.1f} ms "
            f"waiting for data, {1e3 * statistics.median(t.compute_s for t in mine):.1f} ms "
            "of compute per step, medians)."
        )
        if marked:
            lines.append(
                f"The others wait for it: {_pct(statistics.mean(waits))} of their step time "
                f"is waiting in the collective; rank {slow} was the one waited for in "
                f"{_pct(waited_share[slow])} of the steps after each epoch's first."
            )
        else:
            lines.append(
                "Whether the others wait for it is not measured: mark the step's collective "
                "with `with rec.collective():`."
            )
    lines.append(f"Data wait, share of each rank's step (after each epoch's first): {shares}.")
    return Diagnosis(straggler, ratio, data_share, wait_share, waited_share, "\n".join(lines))


def _waited_share(steady: dict[int, list[StepTiming]]) -> dict[int, float]:
    """``{rank: share of steps in which it was the busiest}``: the one the others waited for.

    Busy time runs from the collective every rank left together to the rank's next entry,
    so a late start (an epoch's first step) or a preempted entry does not decide it.
    """
    steps: dict[tuple[int, int], list[StepTiming]] = defaultdict(list)
    for timings in steady.values():
        for t in timings:
            steps[(t.epoch, t.step)].append(t)
    shared = [ts for ts in steps.values() if len(ts) > 1]
    count = dict.fromkeys(steady, 0)
    for ts in shared:
        count[max(ts, key=lambda t: (t.own_s, -t.rank)).rank] += 1
    return {r: count[r] / max(len(shared), 1) for r in steady}


def epoch_start(records: Iterable[StepRecord]) -> dict[int, dict[int, float]]:
    """``{epoch: {rank: data wait of its first step}}``: what starting each epoch costs.

    With ``num_workers > 0`` the first batch of an epoch waits for the workers
    to start (fork, import, first batches); ``persistent_workers=True`` keeps
    them, so from the second epoch on the first step waits like any other.
    """
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in records:
        if r.step == 0 and r.times is not None:
            out[r.epoch][r.rank] = r.times.data_s
    return {e: dict(sorted(v.items())) for e, v in sorted(out.items())}
