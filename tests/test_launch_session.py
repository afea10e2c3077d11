"""The notebook's session is handed down (issue 47 item 7): a cluster registers with the
session it is given and takes standby ranks from that session's pool, and the %%ranks
magic keeps its cluster and its cells' count there, not in module globals."""

from __future__ import annotations

import pytest

import ezpz_nb as ez
from ezpz_nb.launcher.cluster import live_clusters
from ezpz_nb.launcher.kernel import ipython_cell_name, ranks_cell_file
from ezpz_nb.launcher.pool import StandbyPool
from ezpz_nb.launcher.session import Session
from ezpz_nb.magic import get_cluster

pytestmark = pytest.mark.timeout(120)


def test_a_cluster_lives_in_the_session_it_is_handed():
    own = Session(StandbyPool())
    with ez.Cluster(2, session=own) as c:
        assert live_clusters(own) == [c]
        assert c not in live_clusters()  # not in the process's own SESSION
        assert c._procs.pool is own.pool
    assert live_clusters(own) == []


def test_the_ranks_magic_keeps_its_state_in_the_session():
    """Guards: %%ranks' own cluster and its cell numbers belong to one session; a new
    cluster of another size closes the one the magic started before."""
    own = Session(StandbyPool())
    assert [own.ranks.next_serial() for _ in range(3)] == [1, 2, 3]
    assert Session(StandbyPool()).ranks.next_serial() == 1
    first = get_cluster(2, None, session=own)
    try:
        assert own.ranks.cluster is first and live_clusters(own) == [first]
        assert get_cluster(None, 5.0, session=own) is first and first.timeout == 5.0
        second = get_cluster(1, None, session=own)
        assert own.ranks.cluster is second and first.closed
    finally:
        own.close_all()
    assert live_clusters(own) == []


def test_a_ranks_cell_file_name_carries_its_cell():
    """Guards: frames of a %%ranks cell are named as IPython names the cell from their file
    name alone (no table of cells kept in the notebook)."""
    assert ipython_cell_name(ranks_cell_file(4, 12)) == (12, 0)
    assert ipython_cell_name(ranks_cell_file(4, None)) is None
    assert ipython_cell_name("<ranks-cell-4 In[x]>") is None
