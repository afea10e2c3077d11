"""The benchmark scripts that guard robustness: the soak (short) and launch's time limits."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _procs import new_tag, run_limited, tagged  # noqa: E402


@pytest.mark.timeout(1200)
def test_short_soak_every_run_exits_zero_and_leaves_nothing():
    """Guards the exit-time abort (a rank's gloo thread outlived the interpreter: SIGABRT,
    torchrun said FAILED after the work was done) and leftovers: 3 README-form torchrun
    runs per example (the FSDP2 x TP capstone included) and of the README's ez.launch
    snippet, 3 launches and 3 Cluster lifecycles in one process; any non-zero exit,
    leftover process or temporary entry, or teardown warning that a gloo group outlived
    it (the capstone's DTensor run did, until destroy_distributed freed what DTensor
    holds) fails."""
    tag = new_tag()
    status, out, _ = run_limited(
        [sys.executable, "benchmarks/soak.py", "--runs", "3", "--tp-sizes", "2"],
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
    assert len(rows) == 4 + 1 + 3, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2:3] == ["0"] and cells[4:6] == ["0", "0"], row  # failures, leftovers
        assert cells[-1] == "0", row  # runs whose teardown warned of an outliving group
    assert "torchrun examples: 0 failures in 12 runs" in out
    assert not tagged(tag)


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
            "40",
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


def test_compare_measures_two_trees_side_by_side_and_removes_its_export():
    """Guards the before/after tool: each tree's ranks import that tree's ezpz_nb (a
    rank importing the checkout for both would compare it with itself), every figure
    gets a before, an after and a ratio, and the exported tree does not outlive the run.
    Comparing HEAD with the checkout measures the same package twice: the ratio is
    noise, so only its presence is checked."""
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
    assert status == 0, out
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| figure")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {
        "launch 2 first (ms)",
        "launch 2 later (ms)",
        "Cluster.run 2 warm (ms)",
        "PSS per rank 2 (MiB)",
    }, out
    for before, after, ratio, _ in rows.values():
        assert float(before) > 0 and float(after) > 0 and re.fullmatch(r"[\d.]+x", ratio), out
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
