"""ezpz_nb.viz.widgets driven from code: controls start real runs, outputs redraw, progress counts."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
from _plot_workers import stop_early

import ezpz_nb as ez
from ezpz_nb.examples.explore import explore_rank
from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.progress import _widget_frontend
from ezpz_nb.viz.widgets import Explorer, ExplorerClosed, Progress


def images(explorer: Explorer) -> list[str]:
    return [
        o["data"]["image/png"] for o in explorer.output.outputs if "image/png" in o.get("data", {})
    ]


def texts(explorer: Explorer) -> str:
    """What the outputs say in plain text: streams, and the one line of a folded error."""
    return "".join(
        o.get("text", "") or o.get("data", {}).get("text/plain", "")
        for o in explorer.output.outputs
    )


@pytest.fixture(scope="module")
def explorer():
    ex = Explorer(world_size=4, tp_size=2, num_samples=10, batch_size=2, debounce=0)
    yield ex
    ex.close()


def test_explorer_runs_on_creation_and_draws(explorer):
    assert explorer.runs >= 1 and explorer.error is None
    assert len(images(explorer)) == 2  # heatmap and coverage
    assert "All checks passed" in texts(explorer)
    assert explorer.ledger.ranks() == [0, 1, 2, 3]
    assert "run" in explorer.status.value


def test_moving_a_control_reruns_and_redraws(explorer):
    before_runs, before_imgs = explorer.runs, images(explorer)
    explorer.controls["num_samples"].value = 11  # 11 over 2 replicas: one padded sample
    assert explorer.runs == before_runs + 1
    assert images(explorer) != before_imgs
    assert explorer.ledger.num_samples == 11
    assert "dp_duplicate" in texts(explorer)
    explorer.controls["drop_last"].value = True
    assert explorer.runs == before_runs + 2
    assert "never_seen" in texts(explorer) and "dp_duplicate" not in texts(explorer)


def test_dp_group_off_shows_tp_mismatch(explorer):
    explorer.controls["broadcast"].value = False
    explorer.controls["dp_group"].value = False
    assert "tp_mismatch" in texts(explorer)
    ids = {r.rank: r.sample_ids for r in explorer.ledger.records if r.step == 0 and r.epoch == 0}
    assert ids[0] != ids[1]  # TP peers sharded over the whole world
    explorer.controls["dp_group"].value = True
    assert "tp_mismatch" not in texts(explorer)


def test_world_size_change_restarts_ranks_and_limits_tp(explorer):
    explorer.controls["world_size"].value = 3
    assert explorer.controls["tp_size"].options == (1, 3)
    assert explorer.controls["tp_size"].value == 1
    assert explorer.ledger.ranks() == [0, 1, 2]
    explorer.controls["tp_size"].value = 3
    assert {r.tp_size for r in explorer.ledger.records} == {3}


def test_a_failing_setting_is_shown_then_recovered(explorer):
    explorer.controls["drop_last"].value = True
    explorer.controls["batch_size"].value = 16
    assert isinstance(explorer.error, ez.RankError) and explorer.ledger is None
    assert "larger than a DP shard" in texts(explorer) and not images(explorer)
    explorer.controls["batch_size"].value = 2
    assert explorer.error is None and len(images(explorer)) == 2


def test_the_same_error_on_every_rank_is_one_line_with_the_details_folded(explorer):
    """Guards: the explorer printing one rank's ValueError 8 times in a paragraph, then 8
    tracebacks, after a bad setting. The details hold one traceback: the ranks' identical
    failures are folded there too ("ranks 0-7 failed")."""
    explorer.set(world_size=8, tp_size=1, drop_last=True, batch_size=16, num_samples=10)
    assert isinstance(explorer.error, ez.RankError) and len(explorer.error.ranks) == 8
    (out,) = [o for o in explorer.output.outputs if "text/html" in o.get("data", {})]
    line = out["data"]["text/plain"]
    assert "\n" not in line and line.startswith("ranks 0, 1, 2, 3, 4, 5, 6, 7: ")
    assert line.count("larger than a DP shard") == 1
    html = out["data"]["text/html"]
    bold, folded = html.split("<details>")
    assert "Traceback" not in bold and folded.count("Traceback") == 1
    assert "ranks 0-7 failed" in folded
    explorer.set(world_size=4, tp_size=2, drop_last=False, batch_size=2)
    assert explorer.error is None


def test_closed_means_closed():
    """Guards: a control changed after ``explorer.close()`` starting new ranks."""
    ex = Explorer(world_size=2, tp_size=1, num_samples=4, batch_size=1, debounce=0)
    runs = ex.runs
    ex.close()
    ex.controls["num_samples"].value = 6
    assert ex.runs == runs and ex._cluster is None
    assert all(w.disabled for w in ex.controls.values()) and "closed" in ex.status.value
    assert ex.refresh() is None and ex.runs == runs
    with pytest.raises(ExplorerClosed, match="run its cell again"):
        ex.set(num_samples=8)


def test_a_burst_of_changes_is_one_run():
    # The debounce is long so that a scheduling stall between two assignments
    # (a busy CI runner) cannot split the burst into two runs.
    debounce = 2.0
    with Explorer(world_size=2, tp_size=1, debounce=debounce, run=False) as ex:
        for n in range(5, 10):
            ex.controls["num_samples"].value = n
        ex.controls["shuffle"].value = False
        deadline = time.monotonic() + 60
        while ex.runs == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(debounce + 0.5)  # a second run would have started by now
        assert ex.runs == 1
        assert ex.ledger.num_samples == 9
        assert ex.ledger.sample_ids(0, 0) == [0, 2, 4, 6, 8]  # the last shuffle=False won


def test_progress_counts_steps_live_in_text_mode():
    assert not _widget_frontend()  # not in a Jupyter kernel: plain text
    out = io.StringIO()
    with ez.Cluster(2) as c:
        with Progress(c, total=5, interval=0, stream=out) as prog:
            results = c.run(explore_rank, num_samples=10, batch_size=1, epochs=1, broadcast=False)
        ledger = Ledger.from_results(results)
        assert prog.steps == {0: 5, 1: 5} == {r: len(ledger.steps(r, 0)) for r in ledger.ranks()}
        assert c.on_event is None  # detached
        lines = out.getvalue().splitlines()
        assert len(lines) >= 10  # one per step with interval=0, then the final line
        assert lines[-1] == "steps: r0 (dp0,tp0) 5/5  r1 (dp1,tp0) 5/5"
        assert prog.behind() == []

        out = io.StringIO()
        with Progress(c, stream=out, interval=60) as prog, pytest.raises(ez.RankError):
            c.run(stop_early, 1, 2)
        assert prog.steps == {0: 12, 1: 2} and prog.behind() == [1]
        assert "r1 (dp1,tp0) stopped after 2 of 12 steps" in out.getvalue()


def test_progress_widget_bars_follow_the_steps():
    pytest.importorskip("ipywidgets")
    with ez.Cluster(2) as c:
        prog = Progress(c, mode="widget", interval=0)
        with prog, pytest.raises(ez.RankError):
            c.run(stop_early, 0, 3)
    assert [b.value for b in prog._bars] == [3, 12]
    assert [b.bar_style for b in prog._bars] == ["danger", "info"]
    assert prog._labels[1].value == "r1 (dp1,tp0)"
    assert np.all([b.max == 12 for b in prog._bars])


def test_set_changes_several_controls_with_one_run(explorer):
    runs = explorer.runs
    ledger = explorer.set(world_size=4, tp_size=2, num_samples=12, drop_last=False)
    assert explorer.runs == runs + 1
    assert ledger.num_samples == 12 and {r.tp_size for r in ledger.records} == {2}
    assert explorer.controls["tp_size"].options == (1, 2, 4)
    with pytest.raises(KeyError, match="unknown control"):
        explorer.set(colour="red")
