"""Notebook 15's exercise checker on real ranks: its corpus of right answers and dodges."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ezpz_nb as ez
from ezpz_nb.workshop.dcp_state import CORPUS, check_loader_state

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ez.Cluster]:
    """Four warm ranks for the whole corpus."""
    with ez.Cluster(world_size=4, timeout=120) as c:
        yield c


@pytest.mark.parametrize("name", list(CORPUS))
def test_the_checker_judges_its_corpus(cluster, name):
    """Each entry: right answers (one unusual: keyed by global rank, RNG as a list) pass,
    and the three dodges fail with their own diagnosis.

    Guards: a false pass of a dodge that loses data in real jobs (one key for every
    rank, only rank 0 saving, the RNG forgotten), and a false failure of a right
    answer written differently.
    """
    save, load, expected = CORPUS[name]
    result = check_loader_state(save, load, cluster=cluster)
    assert result.status == expected, result.message
    said = {
        "one key for every rank": "DCP kept one copy",
        "only rank 0 saves": "started its shard over",
        "RNG forgotten": "RNG",
    }
    if name in said:
        assert said[name] in result.message


def test_not_done_before_any_rank_starts():
    """Guards: an unfinished exercise reported as wrong (or started on ranks)."""
    assert check_loader_state(None, None).status == "not done"
    assert "must be functions" in check_loader_state({}, print).message  # type: ignore[arg-type]
