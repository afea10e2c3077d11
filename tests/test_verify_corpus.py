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


_REPORTS: dict[str, Report] = {}


def _check(name: str, clusters: dict[int, ez.Cluster]) -> Report:
    """The report of corpus case ``name`` (checked once per module run)."""
    if name not in _REPORTS:
        case = C.CASES[name]
        grid = parse_layout(case.layout)
        _REPORTS[name] = check_contract(
            case.factory, grid, epochs=2, timeout=60, cluster=clusters[grid.world_size]
        )
    return _REPORTS[name]


@pytest.mark.parametrize("name", list(C.CASES))
def test_corpus_verdicts_rule_by_rule(name, clusters):
    """Every rule of every corpus loader gives the verdict its construction implies.

    Guards: a false pass (a rule that says "pass" where it did not look, or on a
    loader built wrong), a false failure (a right loader flagged), and a "not
    judged" that turned into a pass or a fail without evidence.
    """
    case = C.CASES[name]
    report = _check(name, clusters)
    got = report.rule_verdicts()
    false_pass = sorted(r for r, v in case.verdicts.items() if v != "pass" and got[r] == "pass")
    false_fail = sorted(r for r, v in case.verdicts.items() if v != "fail" and got[r] == "fail")
    assert (false_pass, false_fail) == ([], []), report.table()
    assert got == case.verdicts, report.table()
    # A report never reads as a clean pass while a rule went unjudged.
    assert (report.verdict == "pass") == (set(got.values()) <= {"pass", "expected"})


@pytest.mark.parametrize(
    ("name", "rule", "words"),
    [
        ("unsharded", "dp_disjoint", "no sharding at all"),
        ("HF map unsharded", "dp_disjoint", "no sharding at all"),
        ("overlapping stream", "dp_disjoint", "shards overlap"),
        ("world sharded", "tp_identical", "global world"),
        ("TP ids seeded by rank", "tp_identical", "seeded per global rank"),
        ("seeded by rank", "tp_identical", "same sample ids with other bytes"),
        ("too many shards", "exactly_once", "drop_last is not set"),
        ("iter(DataLoader)", "equal_steps", "one-pass iterator"),
        ("empty Subset", "equal_steps", "len(loader) is 0"),
        ("smaller than a batch", "equal_steps", "DataLoader(drop_last=True) with batches of 4"),
        ("hidden set_epoch", "reshuffle", "DistributedSampler at loader._loader.sampler"),
        ("fixed shuffle", "reshuffle", "_FixedShuffle at loader.sampler (it has no set_epoch)"),
    ],
)
def test_hints_follow_the_evidence(name, rule, words, clusters):
    """Each likely cause is the one the records show, with no general advice that
    contradicts them (no drop_last blamed where it is not set, no sharding advice for
    peers seeded by rank).

    Guards: hints picked by finding kind alone, which told a loader without any
    sharding about "samplers that disagree" and TP peers seeded by rank to "shard
    over dp_group".
    """
    f = _check(name, clusters).first(rule)
    assert f is not None and f.violation and words in f.hint, _check(name, clusters).table()
    assert "dp_group, not the whole world" not in f.message + f.hint or "global world" in words
    if "drop_last is not set" in words:
        assert "drop_last=True drops" not in f.message
