"""The verdict of an evaluation or steps check: each rule passed, failed, or was not judged.

A rule passes on evidence (it says what it saw), fails at the first place at
fault (rank, step, sample), or is "not judged" with why (the batches lacked a
field it reads, or the run was too short to show it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ezpz_nb.errors import EzpzError

__all__ = ["OUTCOMES", "EvalReport", "EvalViolation", "RuleOutcome"]

#: The three answers of a rule.
OUTCOMES = ("pass", "fail", "not judged")

#: rule -> what it promises.
PROMISES = {
    "counted_once": "every sample counted exactly once (weights summed)",
    "equal_steps": "every rank takes as many steps",
    "steps": "every rank yields the steps asked for",
    "balanced_coverage": "each epoch deals every sample once, shares within one",
}


@dataclass
class RuleOutcome:
    """One rule's answer.

    Attributes:
        rule: A key of ``PROMISES``.
        outcome: ``"pass"``, ``"fail"`` or ``"not judged"``.
        detail: The evidence (pass), what went wrong (fail) or why it was not judged.
        rank: The first rank at fault (fail only).
        step: The first step at fault.
        sample: The first sample at fault (its index or key).
    """

    rule: str
    outcome: str
    detail: str
    rank: int | None = None
    step: int | None = None
    sample: str | None = None

    def where(self) -> str:
        """``rank 2, step 3, sample 17``: what applies, or an empty string."""
        parts = [
            f"{name} {value}"
            for name, value in (("rank", self.rank), ("step", self.step), ("sample", self.sample))
            if value is not None
        ]
        return ", ".join(parts)


class EvalViolation(EzpzError, AssertionError):
    """An evaluation or stepped loader broke a rule (``EvalReport.raise_for_violations``).

    Attributes:
        report: The :class:`EvalReport` that says how.
    """

    def __init__(self, report: EvalReport) -> None:
        self.report = report
        super().__init__(report.table())


@dataclass
class EvalReport:
    """What :func:`~ezpz_nb.verify.check_eval` or :func:`~ezpz_nb.verify.check_steps` found.

    Attributes:
        what: What was checked (``make_loader on dp=3, eval``).
        layout: ``{"dp": 3, "tp": 1, "cp": 1}``.
        purpose: ``"eval"`` or ``"steps"``.
        rules: One :class:`RuleOutcome` per rule, in the order judged.
        steps: ``{rank: steps it took}``.
    """

    what: str
    layout: dict[str, int]
    purpose: str
    rules: list[RuleOutcome] = field(default_factory=list)
    steps: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no rule failed ("not judged" is not a failure; read why)."""
        return all(r.outcome != "fail" for r in self.rules)

    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"fail"``."""
        return "pass" if self.ok else "fail"

    def outcome(self, rule: str) -> str:
        """The outcome of ``rule``.

        Raises:
            KeyError: The check did not cover ``rule``.
        """
        return next(r.outcome for r in self.rules if r.rule == rule)

    def table(self) -> str:
        """The verdict, then one line per rule: outcome, where, and what it saw or why."""
        lines = [f"{self.what}: {self.verdict.upper()}"]
        for r in self.rules:
            where = f" at {r.where()}" if r.where() else ""
            lines.append(f"  {PROMISES[r.rule]:<54}{r.outcome:<11}{where}")
            lines.append(f"      {r.detail}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the table
        p.text(self.table())

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (for a CI log)."""
        d = asdict(self)
        d["verdict"] = self.verdict
        d["steps"] = {str(k): v for k, v in self.steps.items()}
        return json.dumps(d, indent=indent)

    def raise_for_violations(self) -> EvalReport:
        """Raise :class:`EvalViolation` if a rule failed; else return the report."""
        if not self.ok:
            raise EvalViolation(self)
        return self
