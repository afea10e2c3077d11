"""A rank process loads only the rank side: which of our modules a real rank has loaded.

The sides are listed in test_import_graph.py (and in docs/architecture.md); this starts
ranks as a notebook does (the forkserver, the default on Linux) and asks them.
"""

from __future__ import annotations

import sys

import pytest
from test_import_graph import BOTH_SIDES, NOTEBOOK_SIDE, RANK_SIDE

import ezpz_nb as ez
from ezpz_nb.magic import cell_job

pytestmark = pytest.mark.timeout(120)


def _ours() -> list[str]:
    return sorted(m for m in sys.modules if m == "ezpz_nb" or m.startswith("ezpz_nb."))


def test_a_rank_loads_none_of_the_notebook_side():
    """Guards issue 47 item 1: a rank imported the whole package (clusters, the session,
    the pool, data, ledger: 50 modules) because ezpz_nb/__init__.py imported everything;
    now a rank serving a run, and then a %%ranks cell that names ``ez``, has loaded the
    rank side and what both sides share, and nothing of the notebook side."""
    job, _ = cell_job(
        "ez.publish(rank)\nsorted(m for m in __import__('sys').modules if m.startswith('ezpz_nb'))",
        {},
        None,
        1,
    )
    with ez.Cluster(2, start_method="forkserver") as c:
        served = c.run(_ours)
        after_cell = c.run_job(job)
    for loaded in (*served, *after_cell):
        assert not set(loaded) & NOTEBOOK_SIDE, sorted(set(loaded) & NOTEBOOK_SIDE)
        # Beyond the launcher: only what both sides share (the package, errors, events).
        assert set(loaded) <= RANK_SIDE | BOTH_SIDES, sorted(set(loaded) - RANK_SIDE - BOTH_SIDES)
    # The rank's own loop is there, the cell's runner only once a cell ran.
    assert "ezpz_nb.launcher.rank" in served[0] and "ezpz_nb.launcher.cells" not in served[0]
    assert "ezpz_nb.launcher.cells" in after_cell[0] and "ezpz_nb.events" in after_cell[0]
