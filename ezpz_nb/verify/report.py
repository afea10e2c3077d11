"""The verdict of a loader check: findings per rule, a table, JSON for CI logs."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.verify.verdict import (
    RULES,
    BaseReport,
    ContractViolation,
    Judgement,
    Verdict,
    not_asked,
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
class Report(BaseReport):
    """What a check found, rule by rule (``.ok``: PASS; see :class:`~ezpz_nb.verify.BaseReport`).

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
        not_asked: ``{rule: why}`` for each rule the user turned off
            (``shuffle=False``): shown, and no obstacle to a PASS.
        universe: Which samples an epoch must cover, said in the table's first
            line (``the Subset's 12 indices``, ``range(16)``...).
        memory: One row per process a contract check sampled (``rank``, ``worker``:
            -1 for the rank itself, ``epoch``, ``start_mib``, ``peak_mib``,
            ``growth_mib``, ``samples``), judged by the ``worker_memory`` rule;
            None where memory was not sampled (that rule is then not covered).
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
    not_asked: dict[str, str] = field(default_factory=dict)
    universe: str = ""
    memory: list[dict[str, Any]] | None = None
    ledger: Any = field(default=None, repr=False, compare=False)

    @property
    def violations(self) -> list[Finding]:
        """The findings that break a rule."""
        return [f for f in self.findings if f.violation]

    @property
    def outcome(self) -> Verdict:
        """FAIL on a violation; else NOT_JUDGED when a rule was not judged; else PASS.

        A PASS promises: every rule the layout covers and the user asked for was judged
        on this run's records and none was broken (findings the loader's settings
        explain allowed). It says nothing of the rules the layout cannot show
        (:meth:`not_applicable`) or the user turned off (:attr:`not_asked`).
        """
        if self.violations:
            return Verdict.FAIL
        return overall(self.judgements())

    def not_applicable(self) -> list[str]:
        """Rules the layout has nothing for (no TP/CP peers, one DP replica): not covered."""
        out = ["tp_identical"] if self.layout["tp"] * self.layout.get("cp", 1) == 1 else []
        return out + (["dp_disjoint"] if self.layout["dp"] == 1 else [])

    def _rules(self) -> list[str]:
        skip = self.not_applicable()
        if not self.scenarios and "resume" not in self.not_judged:
            skip.append("resume")
        if self.memory is None:
            skip.append("worker_memory")
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
            elif rule in self.not_asked:
                out.append(Judgement(rule, Verdict.NOT_ASKED, self.not_asked[rule]))
            elif rule in self.not_judged:
                out.append(Judgement(rule, Verdict.NOT_JUDGED, self.not_judged[rule]))
            else:
                why = "; ".join(dict.fromkeys(f.expected for f in found))
                out.append(Judgement(rule, Verdict.PASS, f"expected: {why}" if why else ""))
        return out

    def rule_verdicts(self) -> dict[str, str]:
        """``{rule: "pass" | "fail" | "expected" | "not judged" | "not asked"}`` per rule covered.

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
        if self.outcome is Verdict.NOT_JUDGED:
            return super().headline()
        skip = self.not_applicable()
        grid = ",".join(f"{k}={v}" for k, v in self.layout.items() if v > 1) or "1 rank"
        notes = [f"{len(self._rules())} rules"] if skip or self.not_asked else []
        if skip:
            notes.append(f"{' and '.join(skip)} not covered: nothing to compare on {grid}")
        notes += [not_asked(self.judgements())] if self.not_asked else []
        return self.verdict.upper() + (f" ({'; '.join(notes)})" if notes else "")

    def first(self, rule: str) -> Finding | None:
        """The first finding of ``rule`` (violations before expected ones), or None."""
        found = [f for f in self.findings if f.rule == rule]
        found.sort(key=lambda f: (not f.violation, f.epoch))
        return found[0] if found else None

    def table(self) -> str:
        """The verdict, one line per rule, then what each finding means."""
        over = f", over {self.universe}" if self.universe else ""
        lines = [
            f"{self.what}, {self.epochs} epoch(s), samples by {self.key!r}{over}: {self.headline()}"
        ]
        lines.append(f"  {'rule':<44}{'verdict':<12}first offence, or why not judged")
        for rule, verdict in self.rule_verdicts().items():
            first = self.first(rule)
            where = first.where() if first is not None and verdict in ("fail", "expected") else ""
            why = self.not_judged.get(rule, "") or self.not_asked.get(rule, "")
            lines.append(f"  {RULES[rule][0]:<44}{verdict:<12}{where or why}")
        for row in self.memory or []:  # what the worker_memory rule judged (or would)
            # A worker lives one epoch (unless persistent); the rank, every epoch from its first.
            name = f"rank {row['rank']}" + (
                f" worker {row['worker']}, epoch" if row["worker"] >= 0 else ", from epoch"
            )
            lines.append(
                f"    {name} {row['epoch']}: private memory peak {row['peak_mib']:.1f} "
                f"MiB, growth {row['growth_mib']:+.1f} MiB ({row['samples']} reading(s))"
            )
        for f in sorted(self.findings, key=lambda f: (not f.violation, f.epoch)):
            tag = "VIOLATION" if f.violation else "expected"
            lines.append(f"- {tag} [{f.kind}] {f.message}")
            if f.expected:
                lines.append(f"    why expected: {f.expected}")
            if f.hint:
                lines.append(f"    likely cause: {f.hint}")
        return wrap_message("\n".join(lines))  # between words, to fit a notebook's output

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

    def figure(self) -> Any:
        """The rank mesh coloured by the rule each rank broke first (matplotlib Figure)."""
        from ezpz_nb.verify.figure import mesh_figure

        return mesh_figure(self)
