"""ezpz_nb.verify.check_resume on real gloo ranks: stopped, resumed in fresh ranks, compared.

Most checks run their parts on two warm clusters (2 and 4 ranks, ``check_resume(cluster=...)``):
each part still builds a fresh loader and loads the saved state, as a restarted job does.
A part at another world size than its cluster's, and the stateless loader's error, start
ranks of their own, so the fresh-ranks path stays tested here too. The outcomes below are what torchdata 0.11 does with torch 2.13 (the versions
``make test`` installs); the tests pin them so a change upstream is noticed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import _verify_loaders as L
import pytest

import ezpz_nb as ez
from ezpz_nb.verify import SCENARIOS, Report, VerifyError, check_resume

pytestmark = pytest.mark.timeout(240)
pytest.importorskip("torchdata")


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[int, ez.Cluster]]:
    """Warm ranks shared by the module's checks, by world size."""
    with ez.Cluster(2) as two, ez.Cluster(4) as four:
        yield {2: two, 4: four}


def _failed(report, kind: str) -> set[str]:
    """Scenarios with a violation of ``kind``."""
    return {f.message.split("]")[0][1:] for f in report.violations if f.kind == kind}


def test_stateful_dataloader_resumes_exactly_once_in_every_scenario(clusters):
    """StatefulDataLoader + DistributedSampler: mid-epoch, boundary, right after a resume.

    Guards: a resume check that flags a loader which really does resume (steps
    joined in the wrong place, epochs mislabelled after a restart).
    """
    report = check_resume(L.stateful, "dp=2", epochs=2, cluster=clusters[2])
    assert not report.failed, report.table()
    assert report.scenarios == list(SCENARIOS)
    assert report.rule_verdicts()["resume"] == "pass"


def test_a_loader_whose_state_forgets_the_position_is_caught_with_a_hint(clusters):
    """state_dict() that says nothing: each resume repeats the epoch's start.

    Guards: repeated samples after a restart (verl #7401, prime-rl #3332 class)
    passing unnoticed, or a divergence reported without rank, step and cause.
    """
    report = check_resume(
        L.forgetful, "dp=2", epochs=2, scenarios=["mid-epoch"], cluster=clusters[2]
    )  # fmt: skip
    assert report.failed
    div = next(f for f in report.violations if f.kind == "divergence")
    assert (div.rank, div.step, div.epoch) == (0, 2, 0)
    assert "started the epoch over" in div.hint
    assert "mid-epoch" in _failed(report, "rank_duplicate")


def test_stateful_distributed_sampler_loses_its_place_at_the_boundary_and_after_a_resume(
    clusters,
):
    """torchdata's StatefulDistributedSampler: fine mid-epoch, wrong in the other two.

    Guards: the two cases people report against it (an empty epoch after a state
    saved at the epoch's end; an offset cleared once used) going unnoticed.
    """
    report = check_resume(L.stateful_sampler, "dp=2", epochs=2, cluster=clusters[2])
    failed = _failed(report, "divergence")
    assert "mid-epoch" not in failed, report.table()
    assert {"epoch boundary", "right after a resume"} <= failed, report.table()
    hints = {
        f.message.split("]")[0][1:]: f.hint for f in report.violations if f.kind == "divergence"
    }
    assert "ended the epoch early" in hints["epoch boundary"]
    assert "forgets a loaded offset" in hints["right after a resume"]


def test_resuming_with_workers_and_at_another_world_size(clusters):
    """Two workers resume exactly once; a DP 2 state loaded at DP 4, or with 1 worker
    instead of 2, is reported (with its cause), not raised.

    Guards: worker state lost on resume, and a loader's own exception at another
    world size escaping as a crash of the checker.
    """
    two = clusters[2]
    workers = check_resume(
        L.stateful, "dp=2", options={"num_workers": 2}, scenarios=["mid-epoch"], cluster=two
    )  # fmt: skip
    assert not workers.failed, workers.table()
    moved = check_resume(
        L.stateful, "dp=2", resume_layout="dp=4", scenarios=["mid-epoch"], cluster=two
    )  # fmt: skip
    f = next(f for f in moved.violations if f.rule == "resume")
    assert "another layout" in f.hint and "dp=4" in moved.what
    # torchdata 0.11 refuses a state saved with 2 workers in a loader with 1 (an assert).
    fewer = check_resume(
        L.stateful, "dp=2", options={"num_workers": 2}, resume_options={"num_workers": 1},
        scenarios=["mid-epoch"], cluster=two,
    )  # fmt: skip
    f = next(f for f in fewer.violations if f.rule == "resume")
    assert f.kind == "resume_error" and "worker count" in f.hint, fewer.table()


def test_a_position_in_samples_of_the_job_resumes_at_another_world_size(clusters):
    """A loader that re-cuts the rest of the epoch over the new replicas (MosaicML
    streaming's way) passes at DP 2 -> DP 4: exactly once, and each rank's batches
    differing from the straight run's is expected there. One that counts only its own
    rank's samples re-reads the other replicas' samples, and fails.

    Guards: check_resume failing every elastic loader at another world size (a
    rank's batches must change there) and, the other way, excusing a real repeat.
    """
    moved = check_resume(
        L.elastic, "dp=2,tp=2", resume_layout="dp=4", scenarios=["mid-epoch"], cluster=clusters[4]
    )  # fmt: skip
    assert not moved.failed, moved.table()
    assert moved.rule_verdicts()["resume"] == "expected", moved.table()
    assert all("another layout" in f.expected for f in moved.findings if f.rule == "resume")
    # every scenario, same layout
    assert check_resume(L.elastic, "dp=2", epochs=2, cluster=clusters[2]).failed is False
    wrong = check_resume(
        L.elastic_per_rank, "dp=2", resume_layout="dp=4", scenarios=["mid-epoch"],
        cluster=clusters[2],
    )  # fmt: skip
    assert wrong.rule_verdicts()["resume"] == "fail", wrong.table()
    assert {"dp_duplicate", "rank_duplicate"} & {f.kind for f in wrong.violations}, wrong.table()


def test_bad_resume_arguments_and_stateless_loaders_are_clear_errors():
    """Unknown scenarios, and loaders without state_dict, fail with what to do.

    Guards: an AttributeError from deep inside a rank instead of advice.
    """
    with pytest.raises(VerifyError, match="scenarios must be"):
        check_resume(L.stateful, "dp=2", scenarios=["sometimes"])
    with pytest.raises(VerifyError, match="state_dict") as info:
        check_resume(L.right, "dp=2", scenarios=["mid-epoch"])
    assert info.value.rank == 0


IN_PLACE = [("stateful", "pass"), ("forgetful", "fail")]


@pytest.fixture(scope="module")
def in_place_reports(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One torchrun job (2 ranks) that checks the resume of every factory of IN_PLACE."""
    from _verify_torchrun import run_job

    out = tmp_path_factory.mktemp("in_place")
    return out, run_job(2, "dp=2", out, [f"{f}:resume" for f, _ in IN_PLACE])


@pytest.mark.system  # a torchrun job, as on a cluster: `make system`
@pytest.mark.parametrize(("factory", "verdict"), IN_PLACE)
def test_under_torchrun_the_parts_run_in_place(in_place_reports, factory, verdict):
    """torchrun --nproc_per_node=2: each part builds a fresh loader in the same processes.

    Guards: a resume check that only works where it can start ranks of its own.
    """
    folder, proc = in_place_reports
    out = folder / f"{factory}-resume.json"
    assert out.exists(), proc.stderr[-3000:]
    report = Report.from_json(out.read_text())
    assert report.verdict == verdict, report.table()
    assert report.rule_verdicts()["resume"] == verdict


class _OwnLoader:
    """The tenth trial's loader of its own (no ``.dataset``): each epoch's order from
    ``default_rng([0, epoch])``, this replica's part by slicing; its state the samples of
    the epoch taken."""

    def __init__(self, layout, n: int = 24, batch: int = 4) -> None:
        self.r, self.d, self.n, self.b = layout.dp_rank, layout.dp_size, n, batch
        self.epoch = self.consumed = 0

    def set_epoch(self, e: int) -> None:
        if e != self.epoch:
            self.epoch, self.consumed = e, 0

    def __len__(self) -> int:
        return -(-len(range(self.r, self.n, self.d)) // self.b)

    def __iter__(self):
        import numpy as np
        import torch

        mine = np.random.default_rng([0, self.epoch]).permutation(self.n)[self.r :: self.d]
        rest = mine[self.consumed :].tolist()
        for k in range(0, len(rest), self.b):
            batch = rest[k : k + self.b]
            self.consumed += len(batch)
            yield {"input_ids": torch.tensor(batch).unsqueeze(1) * 7, "index": torch.tensor(batch)}
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.consumed = int(s["epoch"]), int(s["consumed"])


def test_the_report_asks_for_num_samples_and_check_resume_takes_it(clusters):
    """Guards the tenth trial's note: check_resume's report said "pass num_samples=", which
    check_resume did not take."""
    asked = check_resume(_OwnLoader, "dp=2", epochs=2, shuffle=True, cluster=clusters[2])
    assert "num_samples=" in asked.table(), asked.table()
    given = check_resume(
        _OwnLoader, "dp=2", epochs=2, shuffle=True, num_samples=24, cluster=clusters[2]
    )
    assert not given.failed and given.rule_verdicts()["exactly_once"] == "pass", given.table()
