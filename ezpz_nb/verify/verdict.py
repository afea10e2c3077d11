"""The three outcomes of a rule, and the rules themselves (shared by the report and its figure).

A judge says "pass" only on evidence. When the evidence is missing (one epoch, so no
order to compare; no TP peers, so nothing to hold identical), the rule is "not
judged", with why: never a pass it did not earn.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["RULES", "Judgement", "Verdict"]

#: rule -> (what it promises, the ledger check kinds that break it).
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


class Verdict(str, Enum):
    """One rule's outcome: passed on evidence, failed, or not judged (the evidence was missing)."""

    PASS = "pass"
    FAIL = "fail"
    NOT_JUDGED = "not judged"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Judgement:
    """A rule's verdict and why.

    Attributes:
        rule: A key of :data:`RULES`.
        verdict: :class:`Verdict`.
        reason: Why it was not judged; for a pass, what the loader's settings
            explain (``drop_last``...) if anything; empty otherwise.
    """

    rule: str
    verdict: Verdict
    reason: str = ""
