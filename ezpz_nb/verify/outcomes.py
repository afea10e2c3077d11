"""The report of an evaluation or steps check: each rule a :class:`Judgement`.

A rule passes on evidence (its reason says what it saw), fails at the first place
at fault (rank, step, sample), or is "not judged" with why (the batches lacked a
field it reads, or the run was too short to show it). The headline reads them as
every report does (:class:`~ezpz_nb.verify.verdict.BaseReport`); a rule the user
turned off (``collective_step=False``) is "not asked" and does not stop a PASS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ezpz_nb.verify.verdict import PROMISES, BaseReport, Judgement
from ezpz_nb.wrapping import wrap_message

__all__ = ["EvalReport"]


@dataclass
class EvalReport(BaseReport):
    """What :func:`~ezpz_nb.verify.check_eval` or :func:`~ezpz_nb.verify.check_steps` found.

    ``.ok`` is True on PASS only, ``.failed`` when a rule failed, as on every
    :class:`~ezpz_nb.verify.BaseReport`.

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

    def judgements(self) -> list[Judgement]:
        """One :class:`~ezpz_nb.verify.Judgement` per rule, as a contract report gives them."""
        return list(self.rules)

    def table(self) -> str:
        """The headline, then one line per rule: verdict, where, and what it saw or why."""
        lines = [f"{self.what}: {self.headline()}"]
        for r in self.rules:
            where = f" at {r.where()}" if r.where() else ""
            lines.append(f"  {PROMISES.get(r.rule, r.rule):<54}{r.verdict.value:<11}{where}")
            lines.append(f"      {r.reason}")
        return wrap_message("\n".join(lines))  # between words, to fit a notebook's output

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
