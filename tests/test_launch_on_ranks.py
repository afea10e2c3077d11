"""One way to run a job on ranks: a cluster's per-run deadline (``Cluster.run_within``) and
``run_on_ranks`` (the caller's cluster, else torchrun's ranks in place, else fresh ranks),
with real gloo ranks."""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.launcher import live_clusters, run_on_ranks
from ezpz_nb.launcher.errors import WorldSizeError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(2, timeout=30) as c:
        yield c
    assert live_clusters() == []


def _named(fn=None, timeout=None, world_size=None, cluster=None):
    # Keywords that are also the names of the launcher's own parameters.
    return (dist.get_rank(), fn, timeout, world_size, cluster)


def _sleep(seconds: float) -> int:
    time.sleep(seconds)
    return dist.get_rank()


def _remember(value: int) -> None:
    globals()["remembered"] = value


def _recall() -> object:
    return globals().get("remembered")


def test_run_within_passes_every_keyword_to_the_function(cluster):
    """Guards: the per-run deadline takes no name from the learner's keywords, and leaves
    ``cluster.timeout`` as it was."""
    got = cluster.run_within(10, _named, fn="f", timeout=3, world_size=9, cluster="c")
    assert got == [(0, "f", 3, 9, "c"), (1, "f", 3, 9, "c")]
    assert cluster.run(_named, fn="f", timeout=4) == [
        (0, "f", 4, None, None),
        (1, "f", 4, None, None),
    ]
    assert cluster.timeout == 30


def test_run_within_deadline_is_the_runs_own(cluster):
    """Guards: a run's deadline is the one given for it, longer or shorter than the
    cluster's, and the cluster keeps its own for the next run."""
    cluster.timeout = 0.5
    try:
        # 1.5 s of sleep passes a 60 s run deadline: the cluster's 0.5 s is not used.
        assert cluster.run_within(60, _sleep, 1.5) == [0, 1]
    finally:
        cluster.timeout = 30
    with pytest.raises(ez.HangError) as info:
        cluster.run_within(0.5, _sleep, 60)
    assert info.value.timeout == 0.5
    assert cluster.timeout == 30
    assert cluster.run(_sleep, 0) == [0, 1]  # fresh ranks after the hang, the same deadline


def test_run_within_refuses_a_bad_deadline(cluster):
    with pytest.raises(ValueError, match="timeout"):
        cluster.run_within(0, _sleep, 0)
    with pytest.raises(TypeError, match="timeout"):
        cluster.run_within("5", _sleep, 0)


def test_run_on_ranks_uses_the_given_cluster(cluster):
    """Guards: with a cluster, the job runs on its ranks (state kept between runs)."""
    run_on_ranks(_remember, (7,), world_size=2, timeout=10, cluster=cluster)
    assert run_on_ranks(_recall, world_size=2, timeout=10, cluster=cluster) == [7, 7]
    assert cluster.run(_recall) == [7, 7]
    assert cluster.timeout == 30


def test_run_on_ranks_refuses_a_cluster_of_another_size(cluster):
    """Guards: a cluster of the wrong size is refused before anything runs there."""
    cluster.run(_remember, 1)
    with pytest.raises(WorldSizeError, match=r"layout dp 2 x tp 2 needs 4 ranks .* has 2") as info:
        run_on_ranks(
            _remember, (2,), world_size=4, timeout=10, cluster=cluster, what="layout dp 2 x tp 2"
        )
    assert (info.value.needed, info.value.got) == (4, 2)
    assert cluster.run(_recall) == [1, 1]


def test_run_on_ranks_without_a_cluster_starts_fresh_ranks():
    """Guards: no cluster, fresh ranks (closed after); keywords named like ours reach the
    function."""
    before = live_clusters()
    got = run_on_ranks(
        _named, kwargs={"fn": 1, "timeout": 2, "world_size": 3, "cluster": 4},
        world_size=3, timeout=30,
    )  # fmt: skip
    assert got == [(r, 1, 2, 3, 4) for r in range(3)]
    assert live_clusters() == before


def _under_torchrun(size: int) -> object:
    # What torchrun sets; the group exists already (these are launcher ranks), so the
    # job runs in place and gathers over it, as under torchrun.
    saved = dict(os.environ)
    os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1")
    try:
        return run_on_ranks(_named, kwargs={"timeout": 5}, world_size=2, timeout=10)
    except WorldSizeError as exc:
        return (exc.needed, exc.got, str(exc))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_run_on_ranks_under_torchrun_runs_in_place_and_checks_the_size(cluster):
    """Guards: under torchrun the job runs in place and gathers every rank's value, and a
    torchrun of another size is refused (as launch only warns, a check must not judge
    other ranks than it was made for)."""
    assert (
        cluster.run(_under_torchrun, 2)
        == [[(0, None, 5, None, None), (1, None, 5, None, None)]] * 2
    )
    refused = cluster.run(_under_torchrun, 3)
    assert [r[:2] for r in refused] == [(2, 3), (2, 3)]
    assert "torchrun started 3" in refused[0][2]
