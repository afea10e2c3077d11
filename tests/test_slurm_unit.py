"""The Slurm path's pure parts, without Slurm: the script, the Kubernetes manifest, the outcome.

tests/test_slurm.py runs the same code on a real local cluster.
"""

from __future__ import annotations

import pytest

import ezpz_nb as ez
from ezpz_nb.launcher.failures import encode
from ezpz_nb.launcher.wire import Ok
from ezpz_nb.ledger import Ledger, StepRecord
from ezpz_nb.slurm.k8s import _seconds, manifest, to_yaml
from ezpz_nb.slurm.outcome import only_peers_gone, rank_error, sample_hash
from ezpz_nb.slurm.script import JobSpec, check_time, render


def _error(exc: BaseException):
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - a real traceback to encode
        return encode(caught)


def test_script_runs_torchrun_under_srun_with_the_layout():
    """Guards: the generated script asks Slurm for one torchrun per node and gives torchrun
    the layout, the rendezvous on the first node's address, and the job folder."""
    spec = JobSpec("/shared/job 1", nodes=3, ranks_per_node=4, port=1234, partition="gpu",
                   slurm_args=("--account=abc",), setup=("module load cuda",))  # fmt: skip
    text = render(spec)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--nodes=3", "--ntasks-per-node=1", "--partition=gpu", "--account=abc",
                   "--time=00:10:00", "--output=/shared/job 1/slurm-%j.out",
                   "--no-requeue"):  # fmt: skip
        assert f"#SBATCH {option}" in lines
    # The caller's options come after ours: a --requeue of theirs wins over --no-requeue.
    assert lines.index("#SBATCH --no-requeue") < lines.index("#SBATCH --account=abc")
    assert lines.index("module load cuda") < next(
        i for i, x in enumerate(lines) if x.startswith("srun")
    )
    assert "--nnodes=3 --nproc-per-node=4" in text
    assert '--rdzv-endpoint="$addr:1234"' in text
    assert "-m ezpz_nb.slurm.rank '/shared/job 1'" in text  # quoted for the shell
    assert spec.world_size == 12


@pytest.mark.parametrize("bad", ["10 minutes", "1:2:3:4", ""])
def test_a_time_limit_slurm_cannot_read_is_refused(bad):
    """Guards: a malformed time limit fails in the notebook, saying the format."""
    with pytest.raises(ValueError, match="HH:MM:SS"):
        check_time(bad)


def test_kubernetes_manifest_has_one_master_and_a_worker_per_other_node():
    """Guards: the PyTorchJob made from the same spec: Master + nodes-1 Workers, the same
    torchrun command, the job folder as a shared volume, Slurm's time limit as a deadline."""
    spec = JobSpec("/jobs/x", nodes=3, ranks_per_node=2, time="01:30:00")
    doc = manifest(spec, image="me/ezpz:1")
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    pod = replicas["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "pytorch" and container["image"] == "me/ezpz:1"
    assert container["command"][-2:] == ["ezpz_nb.slurm.rank", "/jobs/x"]
    assert "--nproc-per-node=2" in container["command"]
    assert container["volumeMounts"][0]["mountPath"] == "/jobs/x"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "ezpz-nb-jobs"
    assert doc["spec"]["runPolicy"]["activeDeadlineSeconds"] == 5400
    assert "kind: PyTorchJob" in to_yaml(doc)
    assert (
        "Worker" not in manifest(JobSpec("/j", nodes=1), image="i")["spec"]["pytorchReplicaSpecs"]
    )


@pytest.mark.parametrize(
    ("limit", "seconds"), [("30", 1800), ("05:30", 330), ("1-02", 93600), ("1-00:00:10", 86410)]
)
def test_slurm_time_limits_in_seconds(limit, seconds):
    """Guards: every form of Slurm's time limit becomes the right deadline on Kubernetes."""
    assert _seconds(limit) == seconds


def test_a_rank_error_names_the_node_and_tells_peers_as_stopped():
    """Guards: a job's replies fold as ez.launch's do: the rank that raised, its node; a peer
    that only saw the failed rank leave, and a rank with no reply, told as stopped."""
    replies = {
        0: _error(RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:5000")),
        1: _error(ZeroDivisionError("division by zero")),
        2: Ok(3),
    }
    ranks = {r: {"node": "n1" if r < 2 else "n2"} for r in range(4)}
    err = rank_error("7", 4, replies, ranks)
    assert isinstance(err, ez.RankError)
    assert err.ranks == [1]
    assert {r for r, f in err.failures.items() if f.kind == "stopped"} == {0, 3}
    assert "Slurm job 7: rank 1 on n1." in str(err)
    assert rank_error("7", 2, {0: Ok(1), 1: Ok(2)}, ranks) is None


def test_a_peer_error_alone_is_still_told():
    """Guards: when every failure is a lost peer, none is hidden as 'stopped', and the job
    knows the cause is elsewhere (Slurm ended a node: its reason is told instead)."""
    replies = {r: _error(RuntimeError("Connection reset by peer")) for r in range(2)}
    err = rank_error("8", 2, replies, {})
    assert err is not None and err.ranks == [0, 1]
    assert only_peers_gone({**replies, 2: Ok(1)})
    assert not only_peers_gone({**replies, 2: _error(ValueError("mine"))})


def test_sample_hash_sees_the_stream_not_the_order():
    """Guards: the hash compares the sample-id stream per (epoch, step, rank): record order
    does not matter, one id moved does."""

    def rec(rank, step, ids):
        return StepRecord(epoch=0, step=step, rank=rank, dp_rank=rank, dp_size=2, tp_rank=0,
                          tp_size=1, sample_ids=ids, source="loaded", digest="")  # fmt: skip

    a = Ledger([rec(0, 0, [1, 2]), rec(1, 0, [3, 4])])
    b = Ledger([rec(1, 0, [3, 4]), rec(0, 0, [1, 2])])
    c = Ledger([rec(0, 0, [1, 3]), rec(1, 0, [2, 4])])
    assert sample_hash(a) == sample_hash(b) != sample_hash(c)


def test_submit_is_public():
    """Guards: ez.submit is the function of ezpz_nb.slurm."""
    from ezpz_nb.slurm import submit

    assert ez.submit is submit
