"""The corpus: 40 loaders whose verdicts are known by construction, asserted rule by rule.

The cases are in ``_verify_corpus.py``. Two warm clusters (2 and 4 ranks) serve
every case, so the corpus costs a few seconds, not a launch per loader.
"""

from __future__ import annotations

from collections.abc import Iterator

import _verify_corpus as C
import pytest

import ezpz_nb as ez
from ezpz_nb.verify import Report, check_contract, parse_layout

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[int, ez.Cluster]]:
    """Warm ranks shared by every case of the module, by world size."""
    with ez.Cluster(2) as two, ez.Cluster(4) as four:
        yield {2: two, 4: four}


def _check(case: C.Case, clusters: dict[int, ez.Cluster]) -> Report:
    grid = parse_layout(case.layout)
    return check_contract(
        case.factory, grid, epochs=2, timeout=60, cluster=clusters[grid.world_size]
    )


@pytest.mark.parametrize("name", list(C.CASES))
def test_corpus_verdicts_rule_by_rule(name, clusters):
    """Every rule of every corpus loader gives the verdict its construction implies.

    Guards: a false pass (a rule that says "pass" where it did not look, or on a
    loader built wrong), a false failure (a right loader flagged), and a "not
    judged" that turned into a pass or a fail without evidence.
    """
    case = C.CASES[name]
    report = _check(case, clusters)
    got = report.rule_verdicts()
    false_pass = sorted(r for r, v in case.verdicts.items() if v != "pass" and got[r] == "pass")
    false_fail = sorted(r for r, v in case.verdicts.items() if v != "fail" and got[r] == "fail")
    assert (false_pass, false_fail) == ([], []), report.table()
    assert got == case.verdicts, report.table()
    # A report never reads as a clean pass while a rule went unjudged.
    assert (report.verdict == "pass") == (set(got.values()) <= {"pass", "expected"})
