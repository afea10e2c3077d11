"""The outcomes of a rule, the rules of every judge, and how a set of them reads.

One vocabulary for every "did it pass" of the package (verify's checks and the
workshop's checkers). A judge says "pass" only on evidence. When the evidence is
missing (one epoch, so no order to compare; a hung run, so only the records that
arrived), the rule is "not judged", with why: never a pass it did not earn. A rule
the user turned off (``shuffle=False``: the order is meant to repeat) is "not asked":
it was never a promise, so it does not stop a PASS. Every judge answers each of its
rules with one :class:`Judgement`, and every report (a :class:`BaseReport`) reads them
the same way (:func:`overall`): FAIL when a rule failed, NOT ALL JUDGED when none
failed but some were not judged, PASS otherwise; ``report.ok`` is True on PASS only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ezpz_nb.errors import EzpzError

__all__ = [
    "PROMISES",
    "RULES",
    "BaseReport",
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
    "exactly_once": (
        "every sample exactly once an epoch",
        ("never_seen", "rank_duplicate", "outside_universe"),  # outside: verify.universe
    ),
    "equal_steps": (
        "every rank takes as many steps",
        ("step_mismatch", "no_data", "hang", "timeout"),
    ),
    # replica_batch: the replicas' batches differ at a step (verify.shares), though the sum keeps.
    "global_batch": ("the global batch keeps its size", ("batch_size", "replica_batch")),
    "reshuffle": ("the order changes between epochs", ("order_unchanged",)),
    "resume": ("a resumed run matches the straight one", ("divergence", "resume_error")),
    # Judged by check_contract only when given a bound (max_worker_growth_mib).
    "worker_memory": ("workers' private memory stays in bound", ("worker_growth",)),
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
    """One rule's outcome, the one outcome type of verify and the workshop.

    ``PASS``: passed on evidence. ``FAIL``: broken, at the first place at fault.
    ``NOT_JUDGED``: the rule applies but the evidence was missing (stops a PASS).
    ``NOT_ASKED``: the user turned the rule off (``shuffle=False``); not a promise,
    so it does not stop a PASS.
    """

    PASS = "pass"
    FAIL = "fail"
    NOT_JUDGED = "not judged"
    NOT_ASKED = "not asked"

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
    """FAIL if any rule failed; else NOT_JUDGED if any was not judged; else PASS.

    A rule "not asked" (turned off by the user) does not stop a PASS.
    """
    verdicts = {j.verdict for j in judgements}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.NOT_JUDGED if Verdict.NOT_JUDGED in verdicts else Verdict.PASS


def not_all_judged(judgements: Sequence[Judgement]) -> str:
    """The headline of a report with no failure and some rule not judged (the same everywhere)."""
    unjudged = [j.rule for j in judgements if j.verdict is Verdict.NOT_JUDGED]
    judged = [j for j in judgements if j.verdict in (Verdict.PASS, Verdict.FAIL)]
    return (
        f"NOT ALL JUDGED: no violation in {len(judged)} rule(s); not judged: {', '.join(unjudged)}"
    )


def not_asked(judgements: Sequence[Judgement]) -> str:
    """``"not asked: reshuffle"``: the rules the user turned off, or ``""`` (the table says why)."""
    off = [j.rule for j in judgements if j.verdict is Verdict.NOT_ASKED]
    return f"not asked: {', '.join(off)}" if off else ""


class BaseReport:
    """What every report of the package shares: its rules' judgements read one way.

    A subclass gives :meth:`judgements` (one :class:`Judgement` per rule it covers)
    and :meth:`table` (how it prints); the rest follows from them, the same for
    ``check_contract``'s :class:`~ezpz_nb.verify.Report`, the eval and steps
    :class:`~ezpz_nb.verify.EvalReport` and the workshop's results:

    * :attr:`outcome`: :func:`overall` of the judgements (PASS, FAIL or NOT_JUDGED);
    * :attr:`ok`: True on PASS only (a rule not judged is not a pass; one not asked is);
    * :attr:`failed`: True when some rule failed (what a CI without ``strict`` stops on);
    * :meth:`raise_for_violations`: raise :class:`ContractViolation` on a failure
      (``strict``: also when not all was judged).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # IPython shows the first class in the MRO with a _repr_pretty_ or a __repr__ of its
        # own; a dataclass writes a __repr__ into its class, which would hide the table.
        if "_repr_pretty_" not in cls.__dict__:
            cls._repr_pretty_ = BaseReport._repr_pretty_  # type: ignore[method-assign]

    def judgements(self) -> list[Judgement]:
        """One :class:`Judgement` per rule the report covers (the subclass's)."""
        raise NotImplementedError(f"{type(self).__name__} must define judgements()")

    def table(self) -> str:
        """The report in plain text (the subclass's)."""
        raise NotImplementedError(f"{type(self).__name__} must define table()")

    @property
    def outcome(self) -> Verdict:
        """FAIL if a rule failed; NOT_JUDGED if one was not judged; else PASS."""
        return overall(self.judgements())

    @property
    def ok(self) -> bool:
        """True only on PASS: every rule asked passed on evidence."""
        return self.outcome is Verdict.PASS

    @property
    def failed(self) -> bool:
        """True when some rule failed (a report not all judged has not failed)."""
        return self.outcome is Verdict.FAIL

    @property
    def verdict(self) -> str:
        """``"pass"``, ``"fail"`` or ``"not judged"``: :attr:`outcome` as a string."""
        return self.outcome.value

    def judgement(self, rule: str) -> Judgement:
        """The judgement of ``rule``.

        Raises:
            KeyError: The report does not cover ``rule``.
        """
        found = [j for j in self.judgements() if j.rule == rule]
        if not found:
            raise KeyError(f"{rule!r}: this report covers {[j.rule for j in self.judgements()]}")
        return found[0]

    def headline(self) -> str:
        """``PASS``, ``FAIL`` or ``NOT ALL JUDGED: ...``, then ``; not asked: ...`` if any."""
        judged = self.judgements()
        head = (
            not_all_judged(judged) if self.outcome is Verdict.NOT_JUDGED else self.verdict.upper()
        )
        off = not_asked(judged)
        return f"{head}; {off}" if off else head

    def raise_for_violations(self, strict: bool = False) -> Any:
        """Raise :class:`ContractViolation` if a rule failed; else return the report.

        Args:
            strict: Also raise when a rule was not judged (a CI that must judge all).

        Raises:
            ContractViolation: carrying this report; its message is :meth:`table`.
        """
        if self.failed or (strict and not self.ok):
            raise ContractViolation(self)
        return self

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython shows the table
        p.text(self.table())


class ContractViolation(EzpzError, AssertionError):
    """A report's rule failed, or (strict) was not judged: ``raise_for_violations``.

    Raised by :meth:`~ezpz_nb.verify.Report.raise_for_violations` and
    :meth:`~ezpz_nb.verify.EvalReport.raise_for_violations` alike.

    Attributes:
        report: The report that says how (its table is the message).
    """

    def __init__(self, report: BaseReport) -> None:
        self.report: Any = report
        super().__init__(report.table())
