"""What a run's outcome means for the cluster: keep the ranks, kill them, which error.

A pure function over a :class:`~.run.RunResult`: no process, pipe or clock, so unit
tests call it with results they make by hand (``tests/test_policy.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ezpz_nb.launcher.failures import RankFailure, stopped
from ezpz_nb.launcher.run import RunResult

__all__ = ["KEPT_NOTE", "Decision", "decide"]

#: Told with a RankError when the ranks survive it.
KEPT_NOTE = "The ranks are still up; their state is kept."

#: ``"return"`` the replies, or raise a ``RankError``, a ``HangError`` (with where
#: each rank was) or a ``RunInterrupted`` (the same report, after an interrupt).
Outcome = Literal["return", "rank_error", "hang", "interrupt"]


@dataclass(frozen=True)
class Decision:
    """What to do after a run.

    Attributes:
        outcome: See :data:`Outcome`.
        kill: Stop every rank now (after reading where the pending ones are).
        failures: For a RankError: every failure, ranks still running marked stopped.
        note: For a RankError: what became of the ranks.
    """

    outcome: Outcome
    kill: bool
    failures: dict[int, RankFailure]
    note: str = ""


def decide(result: RunResult, *, starting: bool = False, one_shot: bool = False) -> Decision:
    """Decide what ``result`` means.

    Args:
        result: What :func:`~.run.collect` gathered.
        starting: The ranks were starting (a failure then leaves no usable group).
        one_shot: The ranks go away after this run anyway (``launch``).

    The ranks are kept after a RankError only when every rank answered (none is
    stuck in a collective), none died, they had started, and they are not one-shot.
    """
    if result.interrupted:
        return Decision("interrupt", kill=True, failures=dict(result.failures))
    if result.failures:
        died = any(f.kind in ("signal", "exit") for f in result.failures.values())
        failures = dict(result.failures)
        failures.update({r: stopped(r) for r in result.pending})
        kill = bool(result.pending) or died or starting
        keep = not kill and not one_shot
        return Decision("rank_error", kill, failures, KEPT_NOTE if keep else "")
    if result.pending:
        return Decision("hang", kill=True, failures={})
    return Decision("return", kill=False, failures={})
