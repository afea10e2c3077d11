"""pytest plugin of ezpz_nb: check a project's data loaders on real ranks in its own tests.

Installing ezpz_nb registers it (the ``pytest11`` entry point ``ezpz_nb``). Loading it
imports nothing heavy: torch and the launcher are imported, and ranks started, only
when a test asks for one of its fixtures::

    # tests/test_data.py of your project
    from myproject.data import make_loader     # make_loader(layout) -> DataLoader

    def test_loader_contract(loader_contract):
        loader_contract(make_loader, "dp=2,tp=2", epochs=2)

    def test_loader_resumes(loader_resume):
        loader_resume(make_loader, "dp=2", scenarios=["mid-epoch"])

A broken rule fails the test with the report's table (``ContractViolation``,
an ``AssertionError``); a factory that fails on a rank fails it with a
``VerifyError`` naming the rank. A rule the run could not judge (one epoch: no
order to compare; a loader that asked for no shuffle) is neither: the test passes
with a :class:`RulesNotJudged` warning naming each rule and why, or fails with
``strict=True``. A rule the test turned off (``shuffle=False``: the order is meant to
repeat) is "not asked": no warning, and ``strict=True`` passes. Each fixture returns the
:class:`ezpz_nb.verify.Report`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["RulesNotJudged", "loader_contract", "loader_resume"]


class RulesNotJudged(UserWarning):
    """A check passed without judging every rule (pytest shows it in its warnings summary)."""


def _verdict(report: Any, strict: bool) -> Any:
    """Raise on a violation (or, ``strict``, on a rule not judged); warn on one not judged."""
    __tracebackhide__ = True
    report.raise_for_violations(strict=strict)
    unjudged = [j for j in report.judgements() if j.verdict == "not judged"]  # not "not asked"
    if unjudged:  # the report's outcome is NOT_JUDGED: say so, never a silent pass
        why = "; ".join(f"{j.rule}: {j.reason}" for j in unjudged)
        warnings.warn(RulesNotJudged(f"{report.what}: not judged: {why}"), stacklevel=3)
    return report


@pytest.fixture
def loader_contract() -> Callable[..., Any]:
    """``check(make_loader, layout="dp=2", strict=False, **kwargs)``:
    ``ezpz_nb.verify.check_contract`` that raises on a violation (kwargs as there:
    ``epochs``, ``key``, ``timeout``...) and warns (``strict``: raises) on a rule not judged."""

    def check(
        make_loader: Callable[..., Any], layout: Any = "dp=2", strict: bool = False, **kwargs: Any
    ) -> Any:
        from ezpz_nb.verify import check_contract

        __tracebackhide__ = True  # the failure is the report, not this frame
        return _verdict(check_contract(make_loader, layout, **kwargs), strict)

    return check


@pytest.fixture
def loader_resume() -> Callable[..., Any]:
    """``check(make_loader, layout="dp=2", strict=False, **kwargs)``:
    ``ezpz_nb.verify.check_resume`` that raises on a violation (kwargs as there:
    ``scenarios``, ``resume_layout``...) and warns (``strict``: raises) on a rule not judged."""

    def check(
        make_loader: Callable[..., Any], layout: Any = "dp=2", strict: bool = False, **kwargs: Any
    ) -> Any:
        from ezpz_nb.verify import check_resume

        __tracebackhide__ = True
        return _verdict(check_resume(make_loader, layout, **kwargs), strict)

    return check
