"""What stops a check, and the plain helpers both halves of an exercise module use.

A checker stops at the first fault it finds by raising a :class:`CheckStopped`
(made by :func:`wrong` or :func:`not_done`); :func:`~ezpz_nb.workshop.verdicts.judge`
turns it into the verdict it prints. Kept apart from :mod:`.verdicts` because a rank
imports each exercise module to run its jobs: this module needs nothing (not even torch:
notebook 17's new Python process imports it through :mod:`.confine`), while
``verdicts`` brings the launcher's notebook side (clusters, the pool) and the report
vocabulary of ``verify`` with it. :mod:`.verdicts` re-exports every name here, so a
checker may take them from either.
"""

from __future__ import annotations

import random
import sys
from typing import Any

__all__ = [
    "CouldNotJudge",
    "CHECK_TIMEOUT",
    "CheckStopped",
    "as_text",
    "each_returned",
    "fresh_seed",
    "not_done",
    "wrong",
]

#: Seconds a learner's code may run before the checker calls it a hang. A right
#: answer takes well under a second; the margin is for first imports (a rank's first
#: functional collective loads torch's compiler stack). Time a busy machine keeps the
#: ranks waiting for a CPU is not counted (``launcher/runclock.py``).
CHECK_TIMEOUT = 15.0


class CheckStopped(Exception):
    """Raised inside a checker to stop it at the first thing found (``status``, ``message``).

    Not a verdict itself: :func:`~ezpz_nb.workshop.verdicts.judge` turns it into the
    :class:`~ezpz_nb.workshop.verdicts.CheckResult` it prints.
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class CouldNotJudge(RuntimeError):
    """Raised on a rank by the check's own machinery (not the learner's code) when it could
    not set the check up this time: the verdict is "not done, run it again", never "wrong"
    (issue 45's tenth trial: sealing a rank's threads missed one on a busy machine)."""


def wrong(message: str) -> CheckStopped:
    """A "wrong" :class:`CheckStopped` saying ``message``, to raise."""
    return CheckStopped("wrong", message)


def not_done(message: str) -> CheckStopped:
    """A "not done" :class:`CheckStopped` saying ``message``, to raise."""
    return CheckStopped("not done", message)


def each_returned(got: list[Any], what: str) -> None:
    """Raise unless every rank's job got something back from the learner's function."""
    for r, out in enumerate(got):
        if out is None:
            raise wrong(
                f"rank {r} returned None (the others did not): return {what} on every rank."
            )


def fresh_seed() -> int:
    """A seed drawn anew for each check, so a learner cannot fit a fixed answer to it.

    Drawn from a private generator: a notebook's ``random.seed(...)`` does not fix it.
    """
    return random.Random().randrange(1, 2**31)


def as_text(t: Any) -> str:
    """A tensor as its list of values, anything else as its repr: how verdicts quote values."""
    # Where torch was never imported, ``t`` is no tensor: not imported here for that.
    torch = sys.modules.get("torch")
    return str(t.tolist()) if torch is not None and isinstance(t, torch.Tensor) else repr(t)
