"""The benchmark scripts that guard robustness: the soak (short) and launch's time limits.

The runs of whole scripts are marked ``system``: `make system` (and `make test`) runs them,
the default ``pytest`` run leaves them out.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _procs import new_tag, run_limited, tagged, tagged_env  # noqa: E402
from smoke import RUN_ELSEWHERE, SMOKE, scripts  # noqa: E402
from soak import EXAMPLES, leftovers  # noqa: E402

#: The examples the short soak runs here; tests/test_torchrun.py runs the others
#: README-form with the soak's checks (leaves_nothing=True).
SOAKED_HERE = ("dp_sharding", "step_alignment")
RUN_BY_TEST_TORCHRUN = ("tp_broadcast", "capstone")


def test_every_benchmark_has_a_smoke_run_or_says_where_it_runs():
    """Guards issue 47 item 4: a benchmark that no longer runs (an ImportError while a doc
    quoted its numbers) is found by `make bench-smoke`, which runs each script of
    SMOKE once; so a new script must be there, or say where its one run happens."""
    found = scripts()
    assert "dcp_state.py" in found and "broadcast_ranks.py" not in found  # helpers: no main
    assert not set(found) - set(SMOKE) - set(RUN_ELSEWHERE), "add it to benchmarks/smoke.py"
    assert not set(SMOKE) & set(RUN_ELSEWHERE)


def test_every_example_is_soaked_in_make_system_once():
    """A new example in the soak must be run by one of the two, not silently by neither;
    and test_torchrun.py does run its two with the soak's checks."""
    assert sorted(SOAKED_HERE + RUN_BY_TEST_TORCHRUN) == sorted(EXAMPLES)
    tree = ast.parse((ROOT / "tests" / "test_torchrun.py").read_text())
    checked = {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "torchrun"
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and any(
            k.arg == "leaves_nothing" and getattr(k.value, "value", None) is True
            for k in node.keywords
        )
    }
    assert set(RUN_BY_TEST_TORCHRUN) <= checked, checked


@pytest.mark.system
@pytest.mark.timeout(1200)
def test_short_soak_every_run_exits_zero_and_leaves_nothing():
    """Guards the exit-time abort (a rank's gloo thread outlived the interpreter: SIGABRT,
    torchrun said FAILED after the work was done) and leftovers: a README-form torchrun
    run of dp_sharding and step_alignment and of the README's ez.launch snippet, a launch
    and a Cluster lifecycle in one process; any non-zero exit, leftover process or
    temporary entry, or teardown warning that a gloo group outlived it fails. The other
    two examples, tp_broadcast and the FSDP2 x TP capstone (whose DTensor run left a gloo
    group behind until destroy_distributed freed what DTensor holds), run in
    tests/test_torchrun.py with these same checks (``leaves_nothing``), so they are not
    run twice. One round: `make soak` repeats every example 15 times, for what fails one
    run in many."""
    tag = new_tag()
    status, out, _ = run_limited(
        [
            sys.executable,
            "benchmarks/soak.py",
            "--runs",
            "1",
            "--tp-sizes",
            "2",
            "--examples",
            *SOAKED_HERE,
        ],
        tag=tag,
        limit_s=1100,
        cwd=str(ROOT),
    )
    assert status == 0, out[-6000:]
    rows = [
        line
        for line in out.splitlines()
        if line.startswith(("| torchrun", "| ez.", "| Cluster", "| notebook"))
    ]
    assert len(rows) == len(SOAKED_HERE) + 1 + 3, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2:3] == ["0"] and cells[4:6] == ["0", "0"], row  # failures, leftovers
        # runs whose teardown warned of an outliving group ("-": ranks that os._exit)
        assert cells[-1] == ("-" if row.startswith(("| ez.", "| Cluster")) else "0"), row
    assert f"torchrun examples: 0 failures in {len(SOAKED_HERE)} runs" in out
    assert not tagged(tag)


@pytest.mark.system
def test_launch_benchmark_reports_a_hung_and_a_failed_peer_and_finishes():
    """Guards the benchmark that once hung for minutes on a stalled peer: a peer whose
    child stalls reads "hung", one that fails reads "failed", the other cells are
    measured, the table is printed, and nothing of the stalled child is left."""
    tag = new_tag()
    status, out, _ = run_limited(
        [
            sys.executable,
            "benchmarks/launch.py",
            "--reps",
            "1",
            "--sizes",
            "2",
            "--peers",
            "bare",
            "spawn",
            "--limit",
            "20",  # the hung cell waits it out; the others take about 4 s here
            "--scale",
            "--kernel-reps",
            "0",
        ],
        tag=tag,
        limit_s=300,
        cwd=str(ROOT),
        env=dict(os.environ, EZPZ_NB_BENCH_FAULT="spawn=hang,bare=fail"),
    )
    assert status == 0, out
    row = next(line for line in out.splitlines() if line.startswith("| 2 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = next(line for line in out.splitlines() if line.startswith("| ranks |"))
    head = [c.strip() for c in header.strip("|").split("|")]
    got = dict(zip(head, cells, strict=True))
    assert got["bare fork"] == "failed" and got["torch spawn"] == "hung", row
    assert got["notebook_launcher"] == "n/a"
    assert re.fullmatch(r"[\d.]+ ms", got["ezpz launch"]), row
    assert not tagged(tag)


@pytest.mark.system
def test_compare_measures_two_trees_side_by_side_and_removes_its_export():
    """Guards the before/after tool: each tree's ranks import that tree's ezpz_nb (a
    rank importing the checkout for both would compare it with itself), every figure
    gets a before, an after, a ratio and no failed round, and the exported tree does not
    outlive the run. Comparing HEAD with the checkout measures the same package twice:
    one pair's ratio is noise, so a "worse" flag (exit 1) is allowed, a failure is not."""
    tag = new_tag()
    tmp = Path(tempfile.gettempdir())
    exports = {p.name for p in tmp.glob("ezpz_nb-compare-*")}
    status, out, _ = run_limited(
        [
            sys.executable,
            "benchmarks/compare.py",
            "--base",
            "HEAD",
            "--rounds",
            "1",
            "--only",
            "launch",
            "--sizes",
            "2",
        ],
        tag=tag,
        limit_s=300,
        cwd=str(ROOT),
    )
    assert status in (0, 1), out
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {
        cells[0]: dict(zip(head, cells, strict=True))
        for line in lines[1:]
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {
        "launch 2 first (ms)",
        "launch 2 later (ms)",
        "Cluster.run 2 warm (ms)",
        "PSS per rank 2 (MiB)",
    }, out
    before, after = (h for h in head if h.startswith(("before (", "after (")))
    for row in rows.values():
        assert float(row[before]) > 0 and float(row[after]) > 0, out
        assert re.fullmatch(r"[\d.]+x", row["after/before"]), out
        assert row["failed (before / after)"] == "0 / 0 of 1", out
    assert "fails more after" not in out
    assert status == 0 or "% worse" in out, out
    assert {p.name for p in tmp.glob("ezpz_nb-compare-*")} == exports
    assert not tagged(tag)


def test_compare_rejects_an_unknown_base_before_measuring():
    status, out, _ = run_limited(
        [sys.executable, "benchmarks/compare.py", "--base", "no-such-commit"],
        tag=new_tag(),
        limit_s=60,
        cwd=str(ROOT),
    )
    assert status != 0 and "--base 'no-such-commit' is not a commit" in out, out


def test_compare_table_shows_each_side_and_flags_what_got_worse_or_fails_only_after(capsys):
    """The table's judgement, on given rounds: a side that failed shows why while the
    other side shows its median; failing more often after, or a ratio above 1.10, is
    flagged (and makes the run exit 1); failing only before (a module the older tree
    lacked) is not."""
    import compare

    bad = compare._table(
        {
            "steady": {"before": [10.0, 12.0], "after": [10.5, 12.0]},
            "slower": {"before": [1.0, 1.0], "after": [1.2, 1.3]},
            "after hangs": {"before": [100.0, 110.0], "after": ["hung", "hung"]},
            "new in after": {"before": ["failed", "failed"], "after": [3.0, 3.0]},
        },
        {"before": "old", "after": "new"},
    )
    rows = {
        cells[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()[2:]
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows["steady"] == ["11.0", "11.2", "1.02x", "0 / 0 of 2", ""]
    assert rows["slower"] == ["1", "1.25", "1.25x", "0 / 0 of 2", "**25% worse**"]
    assert rows["after hangs"] == ["105", "hung", "n/a", "0 / 2 of 2", "**fails more after**"]
    assert rows["new in after"] == ["failed", "3", "n/a", "2 / 0 of 2", ""]
    assert bad
    assert not compare._table(
        {"steady": {"before": [1.0], "after": [1.0]}}, {"before": "a", "after": "b"}
    )


def test_a_process_still_working_its_way_out_is_not_left_but_a_sleeping_one_is(tmp_path):
    """Guards the soak's leftover count on a busy machine (a soak failed under load 26:
    something of a notebook-like process outlived it by 5 s): a process that still uses
    CPU after the grace period is exiting, judged from its CPU ticks, and may finish; one
    asleep is left behind, named in the report, and killed."""
    import subprocess

    tag = new_tag()
    busy = "import time\nend = time.time() + 2.5\nwhile time.time() < end: pass"
    procs = [
        subprocess.Popen(["sleep", "60"], env=tagged_env(tag)),
        subprocess.Popen([sys.executable, "-c", busy], env=tagged_env(tag)),
    ]
    try:
        exiting, left, temp, _ = leftovers(str(tmp_path), tag, grace_s=0.5)
        assert (exiting, left, temp) == (1, 1, 0)
        assert procs[0].wait(5) == -9 and procs[1].wait(5) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
