"""What ``ezpz-nb doctor`` reports: one :class:`Check` a line, and the :class:`Report` of all.

Both the doctor's probes and its traps (:mod:`~ezpz_nb.cli.traps`) return checks;
keeping the two types here lets each of them import this module and neither the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ezpz_nb.wrapping import wrap_message

__all__ = ["Check", "Report"]


@dataclass
class Check:
    """One line of the doctor's report.

    Attributes:
        name: What was checked (``"torch"``, ``"4-rank launch"``...).
        ok: True passed, False failed, None could not tell (a warning, not a failure).
        detail: What was found.
        fix: What to do about it (set when ``ok`` is not True).
    """

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "warn"}[self.ok]
        line = f"  {mark}  {self.name:<17} {self.detail}"
        return line + (f"\n        what to do: {self.fix}" if self.fix else "")


@dataclass
class Report:
    """Every check, and how long they took together.

    Attributes:
        checks: In the order they are printed.
        seconds: Wall time from the start of the checks to the verdict.
    """

    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return all(c.ok is not False for c in self.checks)

    @property
    def verdict(self) -> str:
        """The one line that answers "is this machine ready?"."""
        failed = [c.name for c in self.checks if c.ok is False]
        warned = [c.name for c in self.checks if c.ok is None]
        took = f"{self.seconds:.1f} s"
        if failed:
            return (
                f"ezpz-nb doctor: NOT READY: {len(failed)} of {len(self.checks)} checks "
                f"failed ({', '.join(failed)}); do what each FAIL line says, then run "
                f"ezpz-nb doctor again ({took})"
            )
        note = f", {len(warned)} warning(s) ({', '.join(warned)})" if warned else ""
        return f"ezpz-nb doctor: READY: {len(self.checks)} checks passed{note} ({took})"

    def __str__(self) -> str:
        # What a notebook prints (00): broken between words to fit its output column. The
        # command line prints each check as it finishes, and the verdict as one line.
        return wrap_message("\n".join([*(str(c) for c in self.checks), self.verdict]))
