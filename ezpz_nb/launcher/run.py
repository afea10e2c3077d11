"""Gather one run: every rank's reply, failure or silence, while showing their output live.

:func:`collect` only watches and records; it never kills a rank, and an interrupt
is recorded, not raised (what ``on_event`` raises still propagates: it is the caller's). What to do with what it saw is
decided by :func:`ezpz_nb.launcher.policy.decide`, over the :class:`RunResult`.
The run's ``timeout`` is counted by :class:`~.runclock.RunClock`: the time a busy machine
kept the ranks waiting for a CPU does not count, so a slow machine never turns a run that
works into a hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from ezpz_nb.events import RelayedWarning
from ezpz_nb.launcher import wire
from ezpz_nb.launcher.failures import RankFailure, decode
from ezpz_nb.launcher.plain import loads_reply
from ezpz_nb.launcher.procs import RankProcesses
from ezpz_nb.launcher.runclock import RunClock
from ezpz_nb.launcher.wire import RankEvent

__all__ = ["GRACE_S", "RunResult", "collect"]

#: How long the other ranks get to finish after one rank failed.
GRACE_S = 1.0
#: Once the deadline moved later (:mod:`.runclock`), the soonest it is read again.
_REREAD_S = 0.25


@dataclass
class RunResult:
    """What one run (or the start) gave.

    Attributes:
        replies: ``{rank: value}`` of the ranks that returned.
        failures: ``{rank: RankFailure}`` of the ranks that raised or died.
        pending: Ranks that neither replied nor failed by the deadline (or the grace
            after the first failure, or the interrupt).
        events: Items the ranks published, in arrival order.
        warnings: ``(rank, RelayedWarning)`` in arrival order: our own warnings the
            ranks issued, for the notebook to reissue (:func:`ezpz_nb.events.reissue`).
        interrupted: True when a ``KeyboardInterrupt`` ended the wait.
    """

    replies: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)
    events: list[RankEvent] = field(default_factory=list)
    warnings: list[tuple[int, RelayedWarning]] = field(default_factory=list)
    interrupted: bool = False

    def settle(self, r: int, outcome: Any) -> None:
        """Record rank ``r``'s outcome: a value, or a :class:`RankFailure`."""
        self.pending.discard(r)
        if isinstance(outcome, RankFailure):
            self.failures[r] = outcome
        else:
            self.replies[r] = outcome


class _Closed:
    """What :func:`_receive` returns when a rank's end of the pipe is closed."""


class _Event:
    """What :func:`_receive` returns after an event: the run goes on."""


def collect(
    procs: RankProcesses,
    timeout: float,
    *,
    on_event: Callable[[RankEvent], None] | None = None,
    events: list[RankEvent] | None = None,
    grace_s: float = GRACE_S,
) -> RunResult:
    """Wait for one reply per rank for ``timeout`` seconds of the run's own time.

    Those seconds are the wall clock's less the time the ranks were kept waiting for a
    CPU (:class:`~.runclock.RunClock`). After the first failure the others get
    ``grace_s`` more to finish. Output is relayed as it comes; events are appended to
    ``events`` (the caller's list, so it fills while the run goes on) and passed to
    ``on_event`` as they arrive.
    """
    result = RunResult(
        pending=set(range(procs.spec.world_size)), events=[] if events is None else events
    )
    clock = RunClock(lambda: [p.pid for p in procs.procs if p.pid is not None])
    try:
        _gather(procs, result, clock, timeout, on_event, grace_s)
    except KeyboardInterrupt:
        # Recorded, not raised: the caller stops the ranks and says where they were.
        result.interrupted = True
        try:
            _take_waiting(procs, result)
        except KeyboardInterrupt:
            pass
    try:
        procs.output.drain()
    except KeyboardInterrupt:  # a second press while draining: still only recorded
        result.interrupted = True
    return result


def _take_waiting(procs: RankProcesses, result: RunResult) -> None:
    """Settle the ranks whose answer already waits in the pipe, without waiting for more.

    After an interrupt, a rank that replied just before it must read as finished,
    not as blocked.
    """
    for r in sorted(result.pending):
        conn = procs.conns[r]
        while r in result.pending and conn.poll(0):
            outcome = _receive(conn, r, result, None)
            if isinstance(outcome, _Closed):
                break
            if not isinstance(outcome, _Event):
                result.settle(r, outcome)


def _gather(
    procs: RankProcesses,
    result: RunResult,
    clock: RunClock,
    timeout: float,
    on_event: Callable[[RankEvent], None] | None,
    grace_s: float,
) -> None:
    pending = result.pending
    grace_end: float | None = None
    # Read again only once reached (the kernel's counters cost a read of /proc): the
    # time the ranks were kept waiting for a CPU so far moves it later.
    deadline = clock.start + timeout
    sentinels = procs.sentinels()
    by_conn = {id(c): r for r, c in enumerate(procs.conns)}
    output = procs.output

    def receive(r: int) -> Any:
        outcome = _receive(procs.conns[r], r, result, on_event)
        if not isinstance(outcome, (_Closed, _Event)):
            result.settle(r, outcome)
        return outcome

    while pending:
        now = time.monotonic()
        if grace_end is None and now >= deadline:
            later = clock.deadline(timeout)
            # Moved later: read again a poll from now at the soonest, not at every turn
            # of this loop as the ranks' waits creep up.
            deadline = later if later <= now else max(later, now + _REREAD_S)
        limit = grace_end if grace_end is not None else deadline
        if now >= limit:
            break
        watch = (
            [procs.conns[r] for r in pending]
            + [s for s, r in sentinels.items() if r in pending]
            + output.fds
        )
        ready = wait(watch, timeout=min(0.1, limit - now))
        for obj in ready:
            if isinstance(obj, int) and output.owns(obj):
                output.read(obj)
        for obj in ready:
            if not isinstance(obj, int) and id(obj) in by_conn:
                receive(by_conn[id(obj)])
        for obj in ready:
            dead = sentinels.get(obj) if isinstance(obj, int) else None
            if dead is not None and dead in pending:
                # It may have replied, then died: read what it sent before EOF.
                while dead in pending and procs.conns[dead].poll():
                    if isinstance(receive(dead), _Closed):
                        break
                if dead in pending:
                    result.settle(dead, procs.death(dead))
        if result.failures and grace_end is None:
            grace_end = time.monotonic() + grace_s


def _receive(
    conn: Any, r: int, result: RunResult, on_event: Callable[[RankEvent], None] | None
) -> Any:
    """Take one message from rank ``r``: its value, a RankFailure, _Event or _Closed."""
    try:
        msg = loads_reply(conn.recv_bytes())
    except (EOFError, OSError):
        return _Closed()
    if isinstance(msg, wire.Event) and isinstance(msg.item, RelayedWarning):
        result.warnings.append((r, msg.item))
        return _Event()
    if isinstance(msg, wire.Event):
        ev = RankEvent(r, msg.item, time.monotonic())
        result.events.append(ev)
        if on_event is not None:
            on_event(ev)
        return _Event()
    if isinstance(msg, wire.Ok):
        return msg.value
    if isinstance(msg, wire.Ready):
        return msg.pid
    if isinstance(msg, (wire.Error, wire.Unpicklable)):
        return decode(r, msg)
    raise TypeError(f"unexpected message from rank {r}: {msg!r}")
