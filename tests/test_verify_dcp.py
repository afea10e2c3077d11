"""check_resume(..., via="dcp"): the loader's state saved and loaded by torch.distributed.checkpoint."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

import ezpz_nb as ez
from ezpz_nb.data.resumable import GlobalOrderLoader
from ezpz_nb.examples.capstone import RuleTokenDataset
from ezpz_nb.verify import VerifyError, check_resume

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def four():
    """Warm ranks for the dp 2 x tp 2 checks: each part still builds a fresh loader and
    loads the saved state, and a fresh rank would import torch.distributed.checkpoint
    again (1.5 s each on 2 cores, 44 times per check). The dp 2 checks below run in fresh
    ranks, as a notebook's first check does."""
    with ez.Cluster(4, timeout=60) as c:
        yield c


def masked(layout: Any) -> GlobalOrderLoader:
    """48 rule sequences, 2 per DP rank a step, a quarter of the tokens masked by a per-rank RNG."""
    ds = RuleTokenDataset(num_samples=48)
    return GlobalOrderLoader(ds, 2, layout.dp_rank, layout.dp_size, seed=1, mask_rate=0.25)


def test_a_sound_loader_resumes_through_dcp_on_dp2_tp2_in_every_scenario(
    four, tmp_path, monkeypatch
):
    """Per-DP-rank keys in a real dcp.save / dcp.load, on 4 ranks, and the folder is removed.

    Guards: the DCP path losing a rank's place (one key for all: every rank would
    replay one rank's shard) and checkpoint folders outliving the check. The check's
    temporary folder goes in this test's own (another run's checks, in the shared /tmp
    at the same moment, made a before/after comparison there fail).
    """
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = check_resume(masked, "dp=2,tp=2", epochs=2, via="dcp", cluster=four)
    assert not report.failed, report.table()
    assert report.rule_verdicts()["resume"] == "pass"
    assert not list(tmp_path.glob("ezpz-dcp-*"))


def test_another_dp_size_through_dcp_is_the_checkpoints_refusal():
    """Saved at dp 2, resumed at dp 4: the report carries the refusal saying what differs.

    Guards: a resume at another DP size that loads some ranks' keys and silently
    drops or invents the rest.
    """
    report = check_resume(
        masked, "dp=2", epochs=1, scenarios=["mid-epoch"], resume_layout="dp=4", via="dcp"
    )
    errors = [f for f in report.violations if f.kind == "resume_error"]
    assert errors, report.table()
    assert "saved at dp=2, tp=1 (refuse); this run is dp=4, tp=1" in errors[0].message


def test_an_unknown_via_is_refused_before_any_rank_starts():
    """Guards: a typo in via silently running the default path."""
    with pytest.raises(VerifyError, match="via must be one of"):
        check_resume(masked, "dp=2", via="disk")


@pytest.mark.system  # a torchrun job, as on a cluster: `make system`
def test_under_torchrun_the_parts_run_in_place_through_one_shared_folder(tmp_path):
    """torchrun --nproc_per_node=2: dcp.save and dcp.load in torchrun's own processes.

    Guards: ranks of one node writing to different folders (each its own temporary
    name), a folder left behind, and another world size tried in place.
    """
    import subprocess
    from pathlib import Path

    from test_torchrun import torchrun_cmd

    from ezpz_nb.verify import Report

    out = tmp_path / "report.json"
    script = str(Path(__file__).parent / "_verify_dcp_torchrun.py")
    cmd, env = torchrun_cmd(2, script, str(out))
    proc = subprocess.run(
        cmd, env=dict(env, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=200
    )
    assert out.exists(), proc.stderr[-3000:]
    report_json, refused = out.read_text().rsplit("\n", 1)
    report = Report.from_json(report_json)
    assert report.rule_verdicts()["resume"] == "pass", report.table()
    assert "under torchrun the parts run in torchrun's 2 processes" in refused
    assert not list(tmp_path.glob("ezpz-dcp-*"))


def broadcast(layout: Any) -> Any:
    """Only the TP leader loads ``masked``; its TP peers receive (their "loader" state is None)."""
    from ezpz_nb.data.distributed import TPBroadcastDataLoader

    return TPBroadcastDataLoader(masked(layout), layout.tp_group)


def test_a_tp_broadcast_loader_resumes_through_dcp_at_dp2_tp2(four):
    """TPBroadcastDataLoader: the leader's state, saved once per TP group, resumes both peers.

    Guards: the TP-agreement check refusing a correct broadcast loader (its peers
    hold ``"loader": None`` by design), and a peer that does not resume at its
    leader's step (it would wait for batches the leader never sends, or stop early).
    """
    report = check_resume(broadcast, "dp=2,tp=2", epochs=2, via="dcp", cluster=four)
    assert not report.failed, report.table()
    assert report.rule_verdicts()["resume"] == "pass"


class ForgetfulLoader(GlobalOrderLoader):
    """Saves its place but not its generator: resumed, it draws the epoch's first masks again."""

    def state_dict(self) -> dict[str, Any]:
        """The place only (the dodge)."""
        return {k: v for k, v in super().state_dict().items() if k != "generator"}


def forgetful(layout: Any) -> ForgetfulLoader:
    """``masked`` with the RNG left out of its state."""
    ds = RuleTokenDataset(num_samples=48)
    return ForgetfulLoader(ds, 2, layout.dp_rank, layout.dp_size, seed=1, mask_rate=0.25)


def test_a_forgotten_rng_fails_at_the_first_step_with_other_masks():
    """The right samples after the resume, other masked tokens: a divergence, not a pass.

    Guards: the dcp path comparing sample ids only (a forgotten RNG passed it);
    the finding names the epoch, rank and step and says the contents differ.
    """
    report = check_resume(forgetful, "dp=2", epochs=1, scenarios=["mid-epoch"], via="dcp")
    assert report.rule_verdicts()["resume"] == "fail", report.table()
    found = [f for f in report.violations if f.kind == "divergence"]
    assert found, report.table()
    first = found[0]
    assert (first.epoch, first.rank, first.step) == (0, 0, 6), first
    assert "with other values in /input_ids" in first.message and "RNG" in first.hint


def forgetful_broadcast(layout: Any) -> Any:
    """A TP leader whose loader forgets its RNG, broadcasting to its peer."""
    from ezpz_nb.data.distributed import TPBroadcastDataLoader

    return TPBroadcastDataLoader(forgetful(layout), layout.tp_group)


def test_a_tp_broadcast_leader_that_forgets_its_rng_still_fails_at_dp2_tp2(four):
    """The agreement check lets broadcast peers through, not a leader's forgotten RNG.

    Guards: the TP fix hiding a real trap (peers compare only their step; the
    leader's draws must still match the straight run's on every rank).
    """
    report = check_resume(
        forgetful_broadcast, "dp=2,tp=2", epochs=1, scenarios=["mid-epoch"], via="dcp",
        cluster=four,
    )  # fmt: skip
    assert report.rule_verdicts()["resume"] == "fail", report.table()
    first = next(f for f in report.violations if f.kind == "divergence")
    assert (first.epoch, first.step) == (
        0,
        6,
    ) and "with other values in /input_ids" in first.message
