"""The verdict of a loader check: findings per rule, a table, JSON for CI logs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.wrapping import wrap_message

__all__ = ["RULES", "ContractViolation", "Finding", "Report", "VerifyError"]

#: rule -> (what it promises, the ledger check kinds that break it).
RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp_identical": ("TP/CP peers get identical bytes", ("tp_mismatch",)),
    "dp_disjoint": ("DP replicas get disjoint samples", ("dp_duplicate",)),
    "exactly_once": ("every sample exactly once an epoch", ("never_seen", "rank_duplicate")),
    "equal_steps": ("every rank takes as many steps", ("step_mismatch", "hang", "timeout")),
    "global_batch": ("the global batch keeps its size", ("batch_size",)),
    "reshuffle": ("the order changes between epochs", ("order_unchanged",)),
    "resume": ("a resumed run matches the straight one", ("divergence", "resume_error")),
}


class VerifyError(EzpzError, ValueError):
    """The check could not run: bad arguments, or the loader factory failed on a rank.

    Attributes:
        rank: The first rank where the factory failed, or None (bad arguments).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        self.rank = rank
        super().__init__(message)


class ContractViolation(EzpzError, AssertionError):
    """A loader broke its distributed contract (``Report.raise_for_violations``).

    Attributes:
        report: The :class:`Report` that says how.
    """

    def __init__(self, report: Report) -> None:
        self.report = report
        super().__init__(report.table())


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
    ledger: Any = field(default=None, repr=False, compare=False)

    @property
    def violations(self) -> list[Finding]:
        """The findings that break a rule."""
        return [f for f in self.findings if f.violation]

    @property
    def ok(self) -> bool:
        """True when no rule is broken (expected findings allowed)."""
        return not self.violations

    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"fail"``."""
        return "pass" if self.ok else "fail"

    def rule_verdicts(self) -> dict[str, str]:
        """``{rule: "pass" | "fail" | "expected"}`` for each rule the check covers."""
        out = {}
        for rule in RULES:
            found = [f for f in self.findings if f.rule == rule]
            if rule == "resume" and not self.scenarios:
                continue
            out[rule] = (
                "fail" if any(f.violation for f in found) else "expected" if found else "pass"
            )
        return out

    def first(self, rule: str) -> Finding | None:
        """The first finding of ``rule`` (violations before expected ones), or None."""
        found = [f for f in self.findings if f.rule == rule]
        found.sort(key=lambda f: (not f.violation, f.epoch))
        return found[0] if found else None

    def table(self) -> str:
        """The verdict, one line per rule, then what each finding means."""
        lines = [
            f"{self.what}, {self.epochs} epoch(s), samples by {self.key!r}: {self.verdict.upper()}"
        ]
        lines.append(f"  {'rule':<44}{'verdict':<10}first offence")
        for rule, verdict in self.rule_verdicts().items():
            first = self.first(rule)
            where = first.where() if first is not None and verdict != "pass" else ""
            lines.append(f"  {RULES[rule][0]:<44}{verdict:<10}{where}")
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
        d["findings"] = [Finding(**f) for f in d["findings"]]
        d["steps"] = {int(k): v for k, v in d["steps"].items()}
        return cls(**d)

    def raise_for_violations(self) -> Report:
        """Raise :class:`ContractViolation` if a rule is broken; else return the report.

        Raises:
            ContractViolation: carrying this report; its message is :meth:`table`.
        """
        if not self.ok:
            raise ContractViolation(self)
        return self

    def figure(self) -> Any:
        """The rank mesh coloured by the rule each rank broke first (matplotlib Figure)."""
        from ezpz_nb.verify.figure import mesh_figure

        return mesh_figure(self)
