"""The resume gauntlet: each published class of resume bug caught where it first diverges,
and its correct twin passing. The loaders are in ``_verify_gauntlet.py``.

Every part of every scenario runs on warm ranks (``check_resume(cluster=...)``): each
part still builds a fresh loader and loads the saved state, as a restarted job does.
"""

from __future__ import annotations

from collections.abc import Iterator

import _verify_gauntlet as G
import _verify_loaders as L
import pytest

import ezpz_nb as ez
from ezpz_nb.verify import SCENARIOS, Report, check_resume

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[int, ez.Cluster]]:
    """Warm ranks for every check of the module, by world size."""
    with ez.Cluster(2) as two, ez.Cluster(4) as four:
        yield {2: two, 4: four}


def _where(scenario: str, steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, step) where a run resumed along ``scenario``'s chain of stops first resumes."""
    epoch = step = 0
    for de, ds in SCENARIOS[scenario](steps_per_epoch):
        epoch, step = (epoch + de, ds) if de else (epoch, step + ds)
    return epoch, step


def _divergences(report: Report, scenario: str) -> list:
    return [f for f in report.violations if f.kind == "divergence" and f"[{scenario}]" in f.message]


@pytest.mark.parametrize("bug", list(G.BUGS))
def test_each_resume_bug_is_caught_at_its_first_divergence(bug, clusters):
    """A stateful loader with one published resume bug fails the resume rule in the
    scenario that exposes it, at the (epoch, step) where the resumed part begins,
    naming the rank and the sample.

    Guards: a resume check that misses a class of bug (no stop after steps taken
    since a resume: prime-rl #3332 passed every older scenario), or that reports
    a divergence somewhere other than where the resumed run first left the straight one.
    """
    report = check_resume(G.make(bug), "dp=2", epochs=2, cluster=clusters[2])
    assert report.rule_verdicts()["resume"] == "fail", report.table()
    scenario = G.BUGS[bug][1]
    found = _divergences(report, scenario)
    assert found, report.table()
    first = min(found, key=lambda f: (f.epoch, f.step))
    n = min(s[0] for s in report.steps.values())
    assert (first.epoch, first.step) == _where(scenario, n), report.table()
    assert first.rank is not None and first.sample is not None


def test_the_correct_twin_passes_every_scenario(clusters):
    """``Resumable`` without a bug (the twin of every gauntlet loader) passes every rule
    in every scenario, the resume chain included.

    Guards: a false failure on a right stateful loader (a chain that loads state into
    the wrong epoch, or compares a resumed part with the wrong straight steps).
    """
    report = check_resume(G.make(""), "dp=2", epochs=2, cluster=clusters[2])
    assert not report.failed and report.rule_verdicts()["resume"] == "pass", report.table()
    assert report.scenarios == list(SCENARIOS)


@pytest.mark.parametrize(
    ("options", "resume_options", "verdict"),
    [({"num_workers": 2}, {"num_workers": 1}, "fail"), ({"num_workers": 2}, None, "pass")],
)
def test_workers_resume_and_a_changed_worker_count_is_caught(
    options, resume_options, verdict, clusters
):
    """torchdata's StatefulDataLoader with two workers resumes exactly; resumed with one
    worker (its state is per worker) it does not, and the report says the count changed.

    Guards: a workers scenario that passes without workers, or that misses the change.
    """
    report = check_resume(
        L.stateful, "dp=2", epochs=1, scenarios=["mid-epoch"], options=options,
        resume_options=resume_options, cluster=clusters[2],
    )  # fmt: skip
    assert report.rule_verdicts()["resume"] == verdict, report.table()
    if verdict == "fail":
        assert (
            "worker count" in report.first("resume").hint
            or "options" in report.first("resume").hint
        )


@pytest.mark.parametrize(
    ("factory", "verdict"), [(L.elastic_per_rank, "fail"), (L.elastic, "expected")]
)
def test_a_smaller_world_keeps_or_drops_the_missing_ranks_state(factory, verdict, clusters):
    """Resumed at dp=2 from dp=4: a position kept per rank loses what ranks 2 and 3 read
    (torchtitan #816's class); a position in the job's samples re-cuts the rest exactly once.

    Guards: states of the missing ranks silently dropped at a smaller world size.
    """
    report = check_resume(
        factory, "dp=4", epochs=1, scenarios=["mid-epoch"], resume_layout="dp=2",
        cluster=clusters[4],
    )  # fmt: skip
    assert report.rule_verdicts()["resume"] == verdict, report.table()
