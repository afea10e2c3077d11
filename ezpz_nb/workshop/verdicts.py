"""The machinery behind the workshop's checkers: verdicts, and running on ranks.

Kept apart from the exercises themselves so each checker there reads as the
behaviour it expects, not as plumbing. Every checker module builds on the same
few names: :func:`judge` runs a checker's body and prints its verdict once,
:func:`run_job` runs a job on real ranks (a warm cluster or fresh ranks) and
:func:`stopped_by` words what a failed or hung run says about the learner's code,
:func:`run_learner` is :func:`run_job` for the learner's function. What stops a
check (:func:`wrong`, :func:`not_done`: a :class:`CheckStopped`), :data:`CHECK_TIMEOUT`
and the small helpers (:func:`fresh_seed`, :func:`each_returned`, :func:`as_text`) live
in :mod:`.stops`, which a rank may import; they are re-exported here, so one import
serves a checker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ezpz_nb.launcher import Cluster
from ezpz_nb.launcher.errors import HangError, RankError, WorldSizeError
from ezpz_nb.launcher.failures import RankFailure, describe_location, fill_line
from ezpz_nb.launcher.kernel import shell
from ezpz_nb.launcher.on_ranks import run_on_ranks as on_ranks
from ezpz_nb.launcher.plain import plain_replies
from ezpz_nb.verify.verdict import BaseReport, Judgement, Verdict
from ezpz_nb.workshop.send_time import Refused, sending
from ezpz_nb.workshop.stops import (
    CHECK_TIMEOUT,
    CheckStopped,
    as_text,
    each_returned,
    fresh_seed,
    not_done,
    wrong,
)
from ezpz_nb.wrapping import wrap_message

__all__ = [
    "CHECK_TIMEOUT",
    "OUTCOMES",
    "CheckResult",
    "CheckStopped",
    "as_text",
    "each_returned",
    "fresh_seed",
    "judge",
    "not_done",
    "raising_rank",
    "run_job",
    "run_learner",
    "stopped_by",
    "wrong",
]

#: A checker's words for the package's one outcome type. "refused": the check could not
#: be trusted (the learner's code changed the checker in the notebook: see :func:`judge`).
#: The interpreter's frame lookup, taken when the checkers are imported: a later cell that
#: swaps ``sys._getframe`` does not change it (and rebinding this name is refused with every
#: other change to the checkers' code, see :mod:`.send_time`).
_FRAME = sys._getframe
#: Whether that lookup is the interpreter's own (a cell run before the import could swap it).
_FRAME_IS_THE_INTERPRETERS = (
    type(_FRAME) is type(len) and _FRAME.__module__ == "sys" and _FRAME.__name__ == "_getframe"
)

OUTCOMES = {
    "correct": Verdict.PASS,
    "wrong": Verdict.FAIL,
    "not done": Verdict.NOT_JUDGED,
    "refused": Verdict.NOT_JUDGED,
}


@dataclass(frozen=True)
class CheckResult(BaseReport):
    """The verdict of one checker: a report of one rule, the exercise.

    Reads like every report of the package (``.outcome``, ``.ok``, ``.failed``,
    :class:`~ezpz_nb.verify.verdict.BaseReport`): "correct" is PASS, "wrong" is FAIL,
    "not done" and "refused" are NOT_JUDGED.

    Attributes:
        exercise: Name of the exercise (the function the learner writes).
        status: ``"correct"``, ``"wrong"``, ``"not done"`` or ``"refused"``, the words the
            learner reads.
        message: What the ranks showed, in plain words.
    """

    exercise: str
    status: str
    message: str
    # The IPython cell (execution count) whose output already holds the printed verdict.
    printed_in: int | None = field(default=None, repr=False, compare=False)

    def judgements(self) -> list[Judgement]:
        """The one rule this result covers: the exercise, with the message as its reason."""
        return [Judgement(self.exercise, OUTCOMES[self.status], self.message)]

    def table(self) -> str:
        """The message, as the checker printed it."""
        return self.message

    @property
    def passed(self) -> bool:
        """True when the learner's code behaved right on every rank (``ok``: a PASS)."""
        return self.ok

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        # Short on purpose: the checker already printed the full message.
        return f"CheckResult({self.exercise!r}, {self.status!r})"

    def _ipython_display_(self) -> None:
        # A checker cell ends with the check call: IPython would echo the result as
        # Out[n] under the verdict just printed. Shown once; in a later cell, shown again.
        if self.printed_in is None or self.printed_in != _cell_count():
            print(wrap_message(self.message))


def _cell_count() -> int | None:
    """The execution count of the IPython cell running now, or None outside IPython."""
    return getattr(shell(), "execution_count", None)


def judge(exercise: str, body: Callable[[], str]) -> CheckResult:
    """Run a checker body, print its verdict (wrapped between words), and return a CheckResult.

    The learner's answers are the positional arguments of the checker that calls this
    (``check_pack(fn, *, timeout)``: ``fn``; every ``check_*`` takes its answers so, and
    the rest by keyword). They are pickled for the ranks here, once, before ``body``
    draws anything, and the verdict is "refused" when the checker's code was changed in
    this process, or a thread started while they were pickled (:mod:`.send_time`).
    """
    caller = _FRAME(1)  # the check_* function: its positional parameters
    code = caller.f_code
    answers = [caller.f_locals.get(name) for name in code.co_varnames[: code.co_argcount]]
    called_by_a_checker = code.co_name.startswith("check_") and str(
        caller.f_globals.get("__name__")
    ).startswith("ezpz_nb.")
    del caller  # a frame kept here would keep the check's locals alive
    try:
        if not (called_by_a_checker and _FRAME_IS_THE_INTERPRETERS):
            # Seen in issue 45's seventh trial: sys._getframe swapped in an earlier cell, so
            # that no answer was pickled here and the learner's code ran after the draw.
            raise Refused(
                "the check could not find the answers it was given: sys._getframe is not "
                "Python's own in this notebook, or the checker was called another way. "
                "Restart the kernel, run the notebook's cells again, and call the check_* "
                "function as the notebook does."
            )
        with sending(answers) as unchanged:
            result = _verdict(exercise, body)
            unchanged()
    except Refused as r:
        result = CheckResult(exercise, "refused", f"{exercise}: refused. {r.message}")
    print(wrap_message(result.message))
    return replace(result, printed_in=_cell_count())


def _verdict(exercise: str, body: Callable[[], str]) -> CheckResult:
    try:
        return CheckResult(exercise, "correct", f"{exercise}: correct. {body()}")
    except CheckStopped as v:
        prefix = "not done yet" if v.status == "not done" else "not right yet"
        return CheckResult(exercise, v.status, f"{exercise}: {prefix}. {v.message}")


def _user_frames(failure: RankFailure) -> str:
    """The learner's own frames of a rank's failure, innermost last.

    Library frames (torch, ezpz_nb, the stdlib) say little to a learner; the
    line of their own code that failed says most.
    """
    own = [
        f"    {describe_location(f.filename, f.lineno)}: " + fill_line(f.filename, f.lineno, f.line)
        for f in failure.user_frames()
    ]
    return "\n".join(own[-3:]) or "    (inside library code)"


def _why_hung(err: HangError) -> str:
    """Why the run never finished, from where the ranks were: a collective, or their own code."""
    stacks = list(err.stacks.values())
    busy = [s.rank for s in stacks if s.state == "blocked" and not s.in_collective]
    if not busy:
        return "they did not all make the same collective calls"
    who = f"rank {busy[0]}" if len(busy) == 1 else "ranks " + ", ".join(map(str, busy))
    if all(err.stacks[r].where is None for r in busy):
        # No line of the learner's below the rank loop: the check's own work (starting,
        # importing, reading its inputs) had not reached their function when the time ran
        # out. Not a busy machine: the time it kept the ranks off a CPU is not counted
        # (launcher/runclock.py).
        return (
            f"{who} had not reached your function yet, still in the checker's own code "
            "(starting, importing) when the time ran out. Run this cell again; if it "
            "says so again, restart the kernel"
        )
    waiting = any(s.in_collective for s in stacks)
    return (
        f"{who} never reached a collective: still in its own code (a loop that never ends, "
        "or a stream read to an end it does not have)"
        + (", while the others waited for it in one" if waiting else "")
    )


def raising_rank(err: RankError) -> RankFailure:
    """The failure to show: a rank that raised in the learner's own code, the lowest first.

    Rank 0 is often only a bystander: stopped while it waited in a collective for the
    rank that raised (a typo on the TP peers' path), or failed in torch's code after it.
    """
    failed = [f for f in err.failures.values() if f.kind != "stopped"]
    return min(failed or err.failures.values(), key=lambda f: (not f.user_frames(), f.rank))


def stopped_by(err: RankError | HangError) -> CheckStopped:
    """What a rank's failure or a hang says about the learner's code, as a stop to raise."""
    if isinstance(err, HangError):
        where = "\n".join("  " + s.describe() for s in err.stacks.values())
        return wrong(
            f"the ranks hung (nothing finished within {err.timeout:g} s): {_why_hung(err)}. "
            f"Where each rank was:\n{where}"
        )
    if any(f.exc_type.endswith("NotImplementedError") for f in err.failures.values()):
        return not_done(
            "The function still raises NotImplementedError: replace "
            "that line with your code, run its cell, then this one."
        )
    mine = [f for f in err.failures.values() if f.exc_type.endswith("CouldNotJudge")]
    if mine:  # the check's own set-up, not the learner's code
        return not_done(
            f"The check could not be set up this time on rank {mine[0].rank} "
            f"({mine[0].message}): your code was not judged. Run the check again."
        )
    first = raising_rank(err)
    return wrong(
        f"rank {first.rank} raised {first.message}\n  in your code:\n{_user_frames(first)}"
    )


def run_job(
    job: Callable[..., Any],
    *args: Any,
    world_size: int,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> list[Any]:
    """``job(*args)`` on every rank: the warm ``cluster`` if given, else fresh ranks.

    Runs through the launcher's one :func:`~ezpz_nb.launcher.on_ranks.run_on_ranks`, so
    ``timeout`` holds for this run on a cluster too. A failure or a hang becomes a
    :class:`CheckStopped` (the raising rank's exception, its message and the learner's
    line). A cluster closed since (Run All ran the notebook's last cell) is not restarted
    with a warning: the check runs on fresh ranks, silently.
    """
    if cluster is not None and cluster.world_size != world_size:
        raise wrong(f"pass a cluster of {world_size} ranks (ez.Cluster({world_size})), or none")
    live = cluster if cluster is not None and not cluster.closed else None
    try:
        # Replies as plain data only: a value the learner's code returns (or slips into
        # the job's reply) must not run code in the notebook, where the verdict is made.
        with plain_replies():
            return on_ranks(job, args, world_size=world_size, timeout=timeout, cluster=live)
    except (RankError, HangError) as err:
        raise stopped_by(err) from None
    except WorldSizeError as err:  # under torchrun, with another number of ranks
        raise wrong(str(err)) from None
    except TypeError as err:  # the function (or something it uses) cannot be sent
        raise wrong(str(err)) from None


def run_learner(
    job: Callable[..., Any],
    *args: Any,
    world_size: int = 4,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> list[Any]:
    """:func:`run_job` for a job whose first argument is the learner's function.

    Also stops, before anything starts, when that is not a function, and says
    "not done" when it returned None on every rank.
    """
    if not callable(args[0]):
        raise wrong(
            f"expected a function, got {type(args[0]).__name__}: pass the function "
            "itself, e.g. check(my_function), not check(my_function())."
        )
    results = run_job(job, *args, world_size=world_size, timeout=timeout, cluster=cluster)
    if all(r is None for r in results):
        raise not_done(
            "The function returned None on every rank: fill in its body "
            "(and return the result), run its cell, then this one."
        )
    return results
