"""The three outcomes of a rule, the rules of every judge, and how a set of them reads.

A judge says "pass" only on evidence. When the evidence is missing (one epoch, so no
order to compare; no TP peers, so nothing to hold identical; a hung run, so only the
records that arrived), the rule is "not judged", with why: never a pass it did not
earn. Every judge of :mod:`ezpz_nb.verify` (contract, resume, eval, steps, mixture,
layout invariance, dcp) answers each of its rules with one :class:`Judgement`, and
every report reads them the same way (:func:`overall`, :func:`not_all_judged`):
PASS only when every rule passed, NOT ALL JUDGED when none failed but some were not
judged, FAIL otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from ezpz_nb.errors import EzpzError

__all__ = [
    "PROMISES",
    "RULES",
    "ContractViolation",
    "Judgement",
    "Verdict",
    "not_all_judged",
    "overall",
]

#: The contract's rule -> (what it promises, the ledger check kinds that break it).
RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp_identical": ("TP/CP peers get identical bytes", ("tp_mismatch",)),
    "dp_disjoint": ("DP replicas get disjoint samples", ("dp_duplicate",)),
    "exactly_once": ("every sample exactly once an epoch", ("never_seen", "rank_duplicate")),
    "equal_steps": (
        "every rank takes as many steps",
        ("step_mismatch", "no_data", "hang", "timeout"),
    ),
    "global_batch": ("the global batch keeps its size", ("batch_size",)),
    "reshuffle": ("the order changes between epochs", ("order_unchanged",)),
    "resume": ("a resumed run matches the straight one", ("divergence", "resume_error")),
}

#: Every judge's rule -> what it promises (the contract's, eval's, steps' and the mixture's).
PROMISES: dict[str, str] = {
    **{rule: promise for rule, (promise, _) in RULES.items()},
    "counted_once": "every sample counted exactly once (weights summed)",
    "steps": "every rank yields the steps asked for",
    "balanced_coverage": "each epoch deals every sample once, shares within one",
    "mixture": "every source's share within the bound of its weight",
    "layout_invariance": "the same (source, index) stream at both runs",
}


class Verdict(str, Enum):
    """One rule's outcome: passed on evidence, failed, or not judged (the evidence was missing)."""

    PASS = "pass"
    FAIL = "fail"
    NOT_JUDGED = "not judged"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Judgement:
    """A rule's verdict and why: what every judge returns per rule.

    Attributes:
        rule: A key of :data:`PROMISES`.
        verdict: :class:`Verdict`.
        reason: For a fail, what went wrong; for "not judged", why; for a pass, the
            evidence (or, in a contract report, ``expected: ...``: what the loader's
            settings explain, ``drop_last``...), possibly empty.
        rank: The first rank at fault, when one is to blame.
        step: The first step (or global batch) at fault.
        sample: The first sample at fault (its index, key or digest).
        position: The first position in a stream at fault (layout invariance).
    """

    rule: str
    verdict: Verdict
    reason: str = ""
    rank: int | None = None
    step: int | None = None
    sample: str | None = None
    position: int | None = None

    @property
    def passed(self) -> bool:
        """True only on a pass: a rule not judged has not passed."""
        return self.verdict is Verdict.PASS

    def where(self) -> str:
        """``rank 2, step 3, sample 17``: what applies, or an empty string."""
        parts = [
            f"{name} {value}"
            for name, value in (
                ("rank", self.rank),
                ("step", self.step),
                ("sample", self.sample),
                ("position", self.position),
            )
            if value is not None
        ]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values, the verdict as its string; unset places left out."""
        d: dict[str, Any] = {"rule": self.rule, "verdict": self.verdict.value}
        d["reason"] = self.reason
        for name in ("rank", "step", "sample", "position"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return d

    def __str__(self) -> str:
        where = f" at {self.where()}" if self.where() else ""
        return f"{self.rule}: {self.verdict}{where}. {self.reason}".rstrip(". ")


def overall(judgements: Sequence[Judgement]) -> Verdict:
    """FAIL if any rule failed; else PASS only when every rule passed; else NOT_JUDGED."""
    verdicts = {j.verdict for j in judgements}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.NOT_JUDGED if Verdict.NOT_JUDGED in verdicts else Verdict.PASS


def not_all_judged(judgements: Sequence[Judgement]) -> str:
    """The headline of a report with no failure and some rule not judged (the same everywhere)."""
    unjudged = [j.rule for j in judgements if j.verdict is Verdict.NOT_JUDGED]
    return (
        f"NOT ALL JUDGED: no violation in {len(judgements) - len(unjudged)} rule(s); "
        f"not judged: {', '.join(unjudged)}"
    )


class _Tabled(Protocol):
    def table(self) -> str: ...


class ContractViolation(EzpzError, AssertionError):
    """A report's rule failed, or (strict) was not judged: ``raise_for_violations``.

    Raised by :meth:`~ezpz_nb.verify.Report.raise_for_violations` and
    :meth:`~ezpz_nb.verify.EvalReport.raise_for_violations` alike.

    Attributes:
        report: The report that says how (its table is the message).
    """

    def __init__(self, report: _Tabled) -> None:
        self.report: Any = report
        super().__init__(report.table())
