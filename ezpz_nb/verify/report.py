"""The verdict of a loader check: findings per rule, a table, JSON for CI logs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.verify.verdict import (
    RULES,
    ContractViolation,
    Judgement,
    Verdict,
    not_all_judged,
    overall,
)
from ezpz_nb.wrapping import wrap_message

__all__ = ["RULES", "ContractViolation", "Finding", "Report", "VerifyError"]


class VerifyError(EzpzError, ValueError):
    """The check could not run: bad arguments, or the loader factory failed on a rank.

    Attributes:
        rank: The first rank where the factory failed, or None (bad arguments).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        self.rank = rank
        super().__init__(message)


@dataclass
class Finding:
    """One rule broken (or bent for a stated reason) in one epoch.

    Attributes:
        rule: A key of :data:`RULES`.
        kind: The ledger check that found it (``dp_duplicate``...).
        epoch: The epoch.
        message: What happened, in plain words.
        expected: Empty for a violation; else why the loader's settings make it expected.
        rank: The first offending rank, when one is to blame.
        step: The first offending step.
        sample: The first offending sample (its index, ``__key__`` or digest).
        worker: The DataLoader worker that produced it, when known.
        hint: A likely cause, when one is known.
        ranks: Every rank involved (the figure colours them).
    """

    rule: str
    kind: str
    epoch: int
    message: str
    expected: str = ""
    rank: int | None = None
    step: int | None = None
    sample: str | None = None
    worker: int | None = None
    hint: str = ""
    ranks: list[int] = field(default_factory=list)

    @property
    def violation(self) -> bool:
        """True unless the loader's own settings explain it."""
        return not self.expected

    def where(self) -> str:
        """``epoch 0: rank 2, step 3, sample 17``, with what applies."""
        parts = [
            f"{name} {value}"
            for name, value in (
                ("rank", self.rank),
                ("worker", self.worker),
                ("step", self.step),
                ("sample", self.sample),
            )
            if value is not None
        ]
        return f"epoch {self.epoch}: " + (", ".join(parts) or "-")


@dataclass
class Report:
    """What a check found, rule by rule.

    Attributes:
        what: What was checked (``make_loader on dp=2,tp=2``).
        layout: ``{"dp": 2, "tp": 2, "cp": 1}``.
        epochs: Epochs run.
        key: How samples were told apart.
        findings: Every finding, violations and expected ones.
        steps: ``{rank: [steps in epoch 0, epoch 1, ...]}``.
        seconds: ``{"wall": ..., "loader": ..., "observe": ...}``: the check's own
            wall time and, summed over ranks, time inside the loader and time observing.
        scenarios: The stops a resume check tried (empty for a contract check).
        not_judged: ``{rule: why}`` for each rule the evidence could not judge
            (one epoch: no order to compare; no TP peers...). Such a rule is
            neither a pass nor a fail, and the headline says so.
        ledger: The records behind the verdict (not serialised).
    """

    what: str
    layout: dict[str, int]
    epochs: int
    key: str
    findings: list[Finding] = field(default_factory=list)
    steps: dict[int, list[int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    scenarios: list[str] = field(default_factory=list)
    not_judged: dict[str, str] = field(default_factory=dict)
    ledger: Any = field(default=None, repr=False, compare=False)

    @property
    def violations(self) -> list[Finding]:
        """The findings that break a rule."""
        return [f for f in self.findings if f.violation]

    @property
    def ok(self) -> bool:
        """True when no rule is broken (expected findings allowed).

        Kept for callers that ask "any violation?": a rule not judged does not make it
        False. Whether everything was judged is :attr:`outcome` (PASS, FAIL or
        NOT_JUDGED), which the headline, the JSON's ``verdict`` and
        ``raise_for_violations(strict=True)`` read.
        """
        return not self.violations

    @property
    def outcome(self) -> Verdict:
        """FAIL on a violation; else PASS only when every rule was judged, NOT_JUDGED otherwise.

        A PASS promises: every rule the layout covers was judged on this run's records
        and none was broken (findings the loader's settings explain allowed). It says
        nothing of the rules the layout cannot show (:meth:`not_applicable`).
        """
        if not self.ok:
            return Verdict.FAIL
        return overall(self.judgements())

    @property
    def verdict(self) -> str:
        """``"pass"``, ``"fail"`` or ``"not judged"`` (no violation, but some rule unjudged)."""
        return self.outcome.value

    def not_applicable(self) -> list[str]:
        """Rules the layout has nothing for (no TP/CP peers, one DP replica): not covered."""
        out = ["tp_identical"] if self.layout["tp"] * self.layout.get("cp", 1) == 1 else []
        return out + (["dp_disjoint"] if self.layout["dp"] == 1 else [])

    def _rules(self) -> list[str]:
        skip = self.not_applicable()
        if not self.scenarios and "resume" not in self.not_judged:
            skip.append("resume")
        return [r for r in RULES if r not in skip]

    def judgements(self) -> list[Judgement]:
        """One :class:`~ezpz_nb.verify.verdict.Judgement` per rule the check covers."""
        out = []
        for rule in self._rules():
            found = [f for f in self.findings if f.rule == rule]
            bad = next((f for f in found if f.violation), None)
            if bad is not None:
                at = (bad.rank, bad.step, bad.sample)
                out.append(Judgement(rule, Verdict.FAIL, f"epoch {bad.epoch}: {bad.message}", *at))
            elif rule in self.not_judged:
                out.append(Judgement(rule, Verdict.NOT_JUDGED, self.not_judged[rule]))
            else:
                why = "; ".join(dict.fromkeys(f.expected for f in found))
                out.append(Judgement(rule, Verdict.PASS, f"expected: {why}" if why else ""))
        return out

    def rule_verdicts(self) -> dict[str, str]:
        """``{rule: "pass" | "fail" | "expected" | "not judged"}`` for each rule covered.

        ``"expected"`` is a pass whose findings the loader's settings explain
        (``drop_last``, padding); see :meth:`judgements` for the reasons.
        """
        return {
            j.rule: "expected"
            if j.verdict is Verdict.PASS and j.reason.startswith("expected")
            else j.verdict.value
            for j in self.judgements()
        }

    def headline(self) -> str:
        """``PASS``, ``FAIL`` or ``NOT ALL JUDGED`` with what was and was not judged."""
        if self.outcome is not Verdict.NOT_JUDGED:
            skip = self.not_applicable()
            grid = ",".join(f"{k}={v}" for k, v in self.layout.items() if v > 1) or "1 rank"
            return self.verdict.upper() + (
                f" ({len(self._rules())} rules; {' and '.join(skip)} not covered: "
                f"nothing to compare on {grid})"
                if skip
                else ""
            )
        return not_all_judged(self.judgements())

    def first(self, rule: str) -> Finding | None:
        """The first finding of ``rule`` (violations before expected ones), or None."""
        found = [f for f in self.findings if f.rule == rule]
        found.sort(key=lambda f: (not f.violation, f.epoch))
        return found[0] if found else None

    def table(self) -> str:
        """The verdict, one line per rule, then what each finding means."""
        lines = [f"{self.what}, {self.epochs} epoch(s), samples by {self.key!r}: {self.headline()}"]
        lines.append(f"  {'rule':<44}{'verdict':<12}first offence, or why not judged")
        for rule, verdict in self.rule_verdicts().items():
            first = self.first(rule)
            where = first.where() if first is not None and verdict in ("fail", "expected") else ""
            lines.append(
                f"  {RULES[rule][0]:<44}{verdict:<12}{where or self.not_judged.get(rule, '')}"
            )
        for f in sorted(self.findings, key=lambda f: (not f.violation, f.epoch)):
            tag = "VIOLATION" if f.violation else "expected"
            lines.append(f"- {tag} [{f.kind}] {f.message}")
            if f.expected:
                lines.append(f"    why expected: {f.expected}")
            if f.hint:
                lines.append(f"    likely cause: {f.hint}")
        return wrap_message("\n".join(lines))  # between words, to fit a notebook's output

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the table
        p.text(self.table())

    def to_dict(self) -> dict[str, Any]:
        """Everything but the ledger, as plain JSON-ready values."""
        d = asdict(self)
        d.pop("ledger")
        d["verdict"] = self.verdict
        d["rules"] = self.rule_verdicts()
        d["judgements"] = [j.to_dict() for j in self.judgements()]
        d["steps"] = {str(k): v for k, v in self.steps.items()}
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """The report as JSON (for a CI log); :meth:`from_json` reads it back."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str) -> Report:
        """Read a report written by :meth:`to_json` (without its ledger)."""
        d = json.loads(text)
        d.pop("verdict", None)
        d.pop("rules", None)
        d.pop("judgements", None)
        d["findings"] = [Finding(**f) for f in d["findings"]]
        d["steps"] = {int(k): v for k, v in d["steps"].items()}
        return cls(**d)

    def raise_for_violations(self, strict: bool = False) -> Report:
        """Raise :class:`ContractViolation` if a rule is broken; else return the report.

        Args:
            strict: Also raise when a rule was not judged (a CI that must judge all).

        Raises:
            ContractViolation: carrying this report; its message is :meth:`table`.
        """
        if not self.ok or (strict and self.outcome is not Verdict.PASS):
            raise ContractViolation(self)
        return self

    def figure(self) -> Any:
        """The rank mesh coloured by the rule each rank broke first (matplotlib Figure)."""
        from ezpz_nb.verify.figure import mesh_figure

        return mesh_figure(self)
