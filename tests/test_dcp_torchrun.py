"""The DCP resume example under real torchrun: saved on 4 ranks, killed, resumed on 2."""

from __future__ import annotations

import pytest
from test_torchrun import output, torchrun

from ezpz_nb.examples.dcp_resume import join

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def test_killed_after_a_dcp_save_resumes_on_fewer_ranks_with_nothing_repeated_or_skipped(tmp_path):
    """4 ranks save model, optimizer and loader at step 3, rank 0 is SIGKILLed; 2 ranks resume.

    Guards: the loader's place lost or split wrong when the world size changes (the
    model's DTensors re-shard through DCP; the loader through its global counter):
    the two ledgers must join with 0 samples repeated and 0 never seen.
    """
    a, b, ckpt = tmp_path / "a", tmp_path / "b", tmp_path / "ckpt"
    killed = torchrun(
        4, "dcp_resume", "--out", str(a), "--checkpoint", str(ckpt), "--save-at", "3", "--kill"
    )
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr + killed.stdout, output(killed)
    resumed = torchrun(2, "dcp_resume", "--out", str(b), "--resume-from", str(ckpt))
    assert resumed.returncode == 0, output(resumed)
    assert join(str(a), str(b)) == (0, 0)


def test_the_refuse_design_stops_a_resume_on_fewer_ranks_saying_what_differs(tmp_path):
    """Per-DP-rank places saved on 4 ranks; a resume on 2 ends with the layout error.

    Guards: the silent drop of the old ranks 2 and 3 (torchtitan PR #816).
    """
    ckpt = tmp_path / "ckpt"
    saved = torchrun(
        4, "dcp_resume", "--design", "refuse", "--checkpoint", str(ckpt), "--save-at", "3"
    )
    assert saved.returncode == 0, output(saved)
    resumed = torchrun(2, "dcp_resume", "--design", "refuse", "--resume-from", str(ckpt))
    assert resumed.returncode != 0
    assert "saved at dp=4, tp=1 (refuse); this run is dp=2, tp=1" in resumed.stdout + resumed.stderr


def test_options_that_cannot_work_exit_2_before_any_process_group_starts():
    """``--save-at`` without ``--checkpoint``, under torchrun and alone: a usage error, status 2.

    Guards: the check raised inside the ranks after their group started (a
    ValueError traceback per rank, exit status 1), and other combinations that
    would run and save nothing (``--kill`` without ``--save-at``).
    """
    import subprocess
    import sys

    proc = torchrun(2, "dcp_resume", "--save-at", "3")
    said = proc.stdout + proc.stderr
    assert "dcp_resume.py: error: --save-at needs --checkpoint DIR" in said, output(proc)
    assert "exitcode  : 2" in said and "ValueError" not in said, output(proc)
    alone = subprocess.run(
        [sys.executable, "-m", "ezpz_nb.examples.dcp_resume", "--kill"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert alone.returncode == 2, output(alone)
    assert "error: --kill needs --save-at N" in alone.stderr
