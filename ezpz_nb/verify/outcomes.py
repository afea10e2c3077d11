"""The report of an evaluation or steps check: each rule a :class:`Judgement`.

A rule passes on evidence (its reason says what it saw), fails at the first place
at fault (rank, step, sample), or is "not judged" with why (the batches lacked a
field it reads, or the run was too short to show it). The headline reads them as
every report does (:func:`~ezpz_nb.verify.verdict.overall`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.verify.verdict import (
    PROMISES,
    ContractViolation,
    Judgement,
    Verdict,
    not_all_judged,
    overall,
)

__all__ = ["EvalReport"]


@dataclass
class EvalReport:
    """What :func:`~ezpz_nb.verify.check_eval` or :func:`~ezpz_nb.verify.check_steps` found.

    Attributes:
        what: What was checked (``make_loader on dp=3, eval``).
        layout: ``{"dp": 3, "tp": 1, "cp": 1}``.
        purpose: ``"eval"`` or ``"steps"``.
        rules: One :class:`~ezpz_nb.verify.Judgement` per rule, in the order judged.
        steps: ``{rank: steps it took}``.
    """

    what: str
    layout: dict[str, int]
    purpose: str
    rules: list[Judgement] = field(default_factory=list)
    steps: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when no rule failed ("not judged" is not a failure: see :attr:`outcome`)."""
        return all(r.verdict is not Verdict.FAIL for r in self.rules)

    @property
    def outcome(self) -> Verdict:
        """FAIL if a rule failed; PASS only when every rule passed; else NOT_JUDGED."""
        return overall(self.rules)

    @property
    def verdict(self) -> str:
        """``"pass"``, ``"fail"`` or ``"not judged"`` (no failure, but some rule unjudged)."""
        return self.outcome.value

    def judgements(self) -> list[Judgement]:
        """One :class:`~ezpz_nb.verify.Judgement` per rule, as a contract report gives them."""
        return list(self.rules)

    def judgement(self, rule: str) -> Judgement:
        """The judgement of ``rule``.

        Raises:
            KeyError: The check did not cover ``rule``.
        """
        found = [r for r in self.rules if r.rule == rule]
        if not found:
            raise KeyError(f"{rule!r}: this check judged {[r.rule for r in self.rules]}")
        return found[0]

    def headline(self) -> str:
        """``PASS``, ``FAIL`` or ``NOT ALL JUDGED: ...`` (worded as a contract report's)."""
        if self.outcome is Verdict.NOT_JUDGED:
            return not_all_judged(self.rules)
        return self.verdict.upper()

    def table(self) -> str:
        """The headline, then one line per rule: verdict, where, and what it saw or why."""
        lines = [f"{self.what}: {self.headline()}"]
        for r in self.rules:
            where = f" at {r.where()}" if r.where() else ""
            lines.append(f"  {PROMISES[r.rule]:<54}{r.verdict.value:<11}{where}")
            lines.append(f"      {r.reason}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the table
        p.text(self.table())

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (for a CI log): ``verdict`` and one entry per rule."""
        d = {
            "what": self.what,
            "layout": self.layout,
            "purpose": self.purpose,
            "verdict": self.verdict,
            "rules": [r.to_dict() for r in self.rules],
            "steps": {str(k): v for k, v in self.steps.items()},
        }
        return json.dumps(d, indent=indent)

    def raise_for_violations(self, strict: bool = False) -> EvalReport:
        """Raise :class:`~ezpz_nb.verify.ContractViolation` if a rule failed; else return self.

        Args:
            strict: Also raise when a rule was not judged (a CI that must judge all).
        """
        if not self.ok or (strict and self.outcome is not Verdict.PASS):
            raise ContractViolation(self)
        return self
