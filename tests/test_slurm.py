"""``ez.submit`` on a real two-node Slurm cluster started on this machine (Debian's packages).

Each test submits to the module's one local cluster (munged, slurmctld, two slurmd in a
temporary folder, stopped by PID) and checks that the job left nothing behind: no job
in ``squeue`` and no process of it. Skipped, saying what to install, where the packages
are missing. The time-limit case takes minutes: marked ``slurm_long`` (``make slurm-long``).
"""

from __future__ import annotations

import _thread
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.examples import tp_broadcast
from ezpz_nb.ledger import Ledger
from ezpz_nb.slurm import (
    LocalSlurm,
    SlurmError,
    SlurmInterrupted,
    SlurmJob,
    SlurmJobError,
    submit,
)
from ezpz_nb.slurm.local import missing_tools
from ezpz_nb.slurm.outcome import sample_hash
from ezpz_nb.slurm.pids import processes_of

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """The local cluster, found by ez.submit as `ezpz-nb slurm up`'s is: by its pointer file."""
    why = missing_tools()
    if why:
        pytest.skip(f"no local Slurm cluster: {why}")
    pointer = tmp_path_factory.mktemp("slurm") / "pointer.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EZPZ_NB_SLURM_POINTER", str(pointer))
        mp.delenv("SLURM_CONF", raising=False)
        local = LocalSlurm.start()
        try:
            local.save_pointer()
            yield local
        finally:
            local.stop()
    assert not local.folder.exists()
    assert not processes_of(local.conf)


@pytest.fixture()
def jobs(cluster: LocalSlurm, tmp_path: Path):
    """Where the test's job folders go; afterwards nothing of the jobs may be left."""
    yield tmp_path
    squeue = subprocess.run(["squeue", "-h"], env={**os.environ, **cluster.env()}, text=True,
                            capture_output=True, check=True)  # fmt: skip
    assert squeue.stdout.strip() == "", f"jobs left in squeue: {squeue.stdout}"
    # slurmstepd ends its step's last processes just after squeue lets go of the job.
    deadline = time.monotonic() + 15.0
    while cluster.job_processes() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not cluster.job_processes(), "processes of the jobs left"


def one_epoch():
    """Notebook 03's DP x TP loader (the walkthrough's), one epoch; one line printed per rank."""
    ledger = tp_broadcast.run(num_samples=16, batch_size=2, epochs=1)
    print(f"rank {dist.get_rank()}: {len(ledger)} steps")
    return ledger


def test_results_and_ledger_match_launch_and_a_hand_submitted_script(jobs, cluster, capsys):
    """Guards: the function's results, output and merged ledger come back from 2 nodes x 2
    ranks with the sample-id stream of ez.launch at the same layout; the saved script,
    submitted by hand, gives the same merged ledger."""
    job = submit(one_epoch, nodes=2, ranks_per_node=2, job_root=jobs)
    results = job.result()
    assert len(results) == 4
    merged = job.ledger()
    launched = Ledger.from_results(ez.launch(one_epoch, world_size=4))
    assert merged.ok, merged.summary()
    assert sample_hash(merged) == sample_hash(launched) == sample_hash(Ledger.from_results(results))
    nodes = {
        r: json.loads((job.dir / "ranks" / f"rank-{r}.json").read_text())["node"] for r in range(4)
    }
    assert sorted(nodes.values()) == ["n1", "n1", "n2", "n2"]
    assert f"[{nodes[2]} rank 2] rank 2: 4 steps" in job.output
    assert f"[{nodes[2]} rank 2] rank 2: 4 steps" in capsys.readouterr().out  # in the cell
    with pytest.raises(
        IndexError, match=f"rank 4 is not in job {job.job_id}: its ranks are 0 to 3"
    ):
        job.result(4)

    # By hand, in the same folder emptied of what the ranks wrote (sbatch --wait polls Slurm
    # with growing pauses: tens of seconds; a handle on the job id waits as ez.submit does).
    for sub in ("ledger", "replies", "ranks"):
        for f in (job.dir / sub).iterdir():
            f.unlink()
    by_hand = subprocess.run(["sbatch", "--parsable", str(job.script)], text=True,
                             env={**os.environ, **cluster.env()}, capture_output=True,
                             check=True)  # fmt: skip
    again = SlurmJob(job.slurm, job.spec, by_hand.stdout.strip(), echo=io.StringIO())
    assert again.job_id != job.job_id
    assert sample_hash(again.ledger()) == sample_hash(merged)


def fails_on_rank_one():
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        return 1 / 0
    dist.barrier()
    return t.item()


def test_a_rank_error_names_node_rank_and_line(jobs):
    """Guards: a rank's exception is ez.launch's folded RankError, with its node named and
    the learner's line; the ranks left waiting are told as stopped."""
    job = submit(fails_on_rank_one, nodes=2, job_root=jobs, echo=io.StringIO())
    with pytest.raises(ez.RankError) as err:
        job.result()
    assert err.value.ranks == [1]
    assert err.value.failures[0].kind == "stopped"
    text = str(err.value)
    assert "rank 1 failed: ZeroDivisionError: division by zero" in text
    node = json.loads((job.dir / "ranks" / "rank-1.json").read_text())["node"]
    assert node in ("n1", "n2") and f"rank 1 on {node}" in text
    assert "return 1 / 0" in "\n".join(err.value._render_traceback_())
    # str(err) (print(err), a log) shows the learner's frame, not the rank loop's under
    # srun + torchrun, as ez.launch's str leaves out its own rank loop.
    assert "in fails_on_rank_one" in text
    assert "slurm/rank.py" not in text and "torchrun.py" not in text


def returns_a_lock_on_rank_one():
    return threading.Lock() if dist.get_rank() == 1 else 1


def test_a_return_value_that_cannot_travel_says_return_plain_data(jobs):
    """Guards: a value that cannot be pickled is told in ez.launch's words (one shared
    wording: "return plain data"), naming the rank, on every rank (none waits in a gather
    its peer left), not torch's bare "cannot pickle" from inside all_gather_object."""
    job = submit(returns_a_lock_on_rank_one, nodes=2, job_root=jobs, echo=io.StringIO())
    with pytest.raises(ez.RankError) as err:
        job.result()
    assert err.value.ranks == [0, 1]
    text = _one_line(err.value)
    assert (
        "rank 1's return value (a lock) could not be sent back to the notebook (TypeError: "
        "cannot pickle '_thread.lock' object); return plain data (numbers, lists, dicts, "
        "tensors) instead"
    ) in text, text
    assert "all_gather_object" not in text


def dies_on_rank_one():
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        os._exit(3)  # a crash: no exception, no reply
    dist.barrier()


def test_a_rank_that_dies_is_named_not_the_peer_it_left(jobs):
    """Guards: a rank whose process dies (no reply) is the failure, named with its node and
    exit code; the rank that saw it go ('Connection closed by peer') is told as stopped."""
    job = submit(dies_on_rank_one, nodes=2, timeout=60, job_root=jobs, echo=io.StringIO())
    with pytest.raises(ez.RankError) as err:
        job.result()
    assert err.value.ranks == [1]
    assert err.value.failures[0].kind == "stopped"
    text = _one_line(err.value)
    assert "rank 1 exited with code 3 without replying" in text  # torchrun's report, read
    node = json.loads((job.dir / "ranks" / "rank-1.json").read_text())["node"]
    assert f"rank 1 on {node}" in text


def hangs_on_rank_zero():
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never comes
    else:
        time.sleep(600)


def test_a_hang_gives_every_ranks_stack(jobs):
    """Guards: ranks that outlive the timeout give a HangError saying where each one was
    (faulthandler's dump on the node), and the job is cancelled."""
    job = submit(hangs_on_rank_zero, nodes=2, timeout=3, job_root=jobs, echo=io.StringIO())
    with pytest.raises(ez.HangError) as err:
        job.result()
    stacks = err.value.stacks
    assert stacks[0].call == "barrier" and "dist.barrier()" in stacks[0].source
    assert stacks[1].call == "sleep"


def test_an_unknown_partition_quotes_slurm(jobs):
    """Guards: sbatch's refusal reaches the cell in Slurm's words, before any job exists."""
    with pytest.raises(SlurmError) as err:
        submit(fails_on_rank_one, partition="nosuch", job_root=jobs)
    assert "Invalid partition name specified" in _one_line(err.value)


def test_pending_past_the_start_deadline_is_cancelled_with_squeues_reason(jobs):
    """Guards: a job still pending at the caller's deadline is cancelled, squeue's reason quoted."""
    job = submit(fails_on_rank_one, slurm_args=["--begin=now+600"], job_root=jobs,
                 echo=io.StringIO())  # fmt: skip
    with pytest.raises(SlurmJobError) as err:
        job.result(start_deadline=1.0)
    assert err.value.state == "PENDING" and err.value.reason == "BeginTime"
    assert "squeue's reason: 'BeginTime'; it was cancelled" in _one_line(err.value)


def test_a_request_no_partition_can_hold_says_what_to_do(jobs):
    """Guards: a job that can never start as asked (3 nodes on a 2-node partition) is shown
    pending with squeue's reason and what to do about it, not only left waiting."""
    echo = io.StringIO()
    job = submit(fails_on_rank_one, nodes=3, job_root=jobs, echo=echo)
    with pytest.raises(SlurmJobError) as err:
        job.result(start_deadline=2.0)
    assert err.value.reason in ("PartitionNodeLimit", "PartitionConfig")
    shown = " ".join(echo.getvalue().split())
    assert f"(squeue's reason: {err.value.reason}): the request exceeds" in shown
    assert "stop the cell to cancel the job, and ask for fewer nodes" in shown


def one_rank_job(label):
    return label


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"nodes": "2"}, TypeError, "nodes must be an int, got str '2'"),
        ({"ranks_per_node": 0}, ValueError, "ranks_per_node must be at least 1, got 0"),
        ({"slurm_args": "--account=abc"}, TypeError, "write slurm_args=['--account=abc']"),
        ({"setup": "module load x"}, TypeError, "write setup=['module load x']"),
        ({"world_size": 4}, TypeError, "ez.submit has no world_size: it runs nodes x"),
        ({"label": 1, "extra": 2}, TypeError, "unexpected keyword argument 'extra'"),
        ({"time": 5}, ValueError, "time=5 is not a Slurm time limit: pass it as a string"),
    ],
)
def test_a_wrong_request_fails_before_anything_is_submitted(tmp_path, kwargs, error, says):
    """Guards: what a learner plausibly types wrong fails at once, in ez.submit's words
    (not world_size's, not a queued job's TypeError on every rank), and leaves no job folder."""
    with pytest.raises(error) as err:
        submit(one_rank_job, **{"label": 0, **kwargs}, job_root=tmp_path)
    assert says in _one_line(err.value)
    assert not any(tmp_path.iterdir())


def test_a_job_may_ask_for_more_ranks_than_one_machine_starts(tmp_path, monkeypatch):
    """Guards: ez.submit does not inherit ez.launch's one-machine cap (MAX_WORLD_SIZE, "2-8
    ranks show everything"): 16 nodes x 8 ranks passes every check of ours and reaches sbatch
    (here a configuration with no cluster behind it: Slurm's refusal, not ours), while
    ez.launch on this machine still refuses 128 ranks before starting any."""
    if shutil.which("sbatch") is None:
        pytest.skip("no Slurm client here (sbatch)")
    assert 16 * 8 > ez.MAX_WORLD_SIZE
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))  # never a running cluster: nothing queues
    with pytest.raises(SlurmError) as err:
        submit(one_rank_job, 0, nodes=16, ranks_per_node=8, job_root=tmp_path / "jobs")
    assert "no Slurm cluster answers here" in _one_line(err.value)
    with pytest.raises(ValueError, match="world_size must be between 1 and"):
        ez.launch(one_rank_job, 0, world_size=128)


def test_no_cluster_answering_says_how_to_start_one(tmp_path):
    """Guards: sbatch without a usable configuration (no cluster up) says to start one,
    not to check the partition."""
    from ezpz_nb.slurm.commands import Slurm

    if shutil.which("sbatch") is None:
        pytest.skip("no Slurm client here (sbatch)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(SlurmError) as err:
        Slurm(str(conf)).sbatch(str(script))
    assert "no Slurm cluster answers here" in _one_line(err.value)
    assert "`ezpz-nb slurm up`" in _one_line(err.value)


def test_an_interrupt_cancels_the_job(jobs):
    """Guards: interrupting the waiting cell cancels the running job with scancel and says
    so; its ranks' processes end (the fixture checks squeue and the processes)."""
    job = submit(hangs_on_rank_zero, nodes=2, timeout=300, job_root=jobs, echo=io.StringIO())

    def press_stop_once_running() -> None:  # as a learner would: the ranks are in the function
        while len(list((job.dir / "ranks").glob("rank-*.json"))) < 2:
            time.sleep(0.1)
        _thread.interrupt_main()

    # A pytest started in the background by a non-interactive shell inherits SIGINT ignored,
    # and the interrupt would never arrive; a kernel turns SIGINT into KeyboardInterrupt.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=press_stop_once_running, daemon=True).start()
        with pytest.raises(SlurmInterrupted) as err:
            job.result()
    finally:
        signal.signal(signal.SIGINT, saved)
    assert f"job {job.job_id} was cancelled (scancel {job.job_id})" in _one_line(err.value)


@pytest.mark.slurm_long
def test_a_time_limit_ends_the_wait_with_slurms_reason(jobs):
    """Guards: Slurm's time limit (whole minutes) ends the wait as TIMEOUT, reason quoted."""
    job = submit(hangs_on_rank_zero, nodes=2, time="00:01:00", timeout=600, job_root=jobs,
                 echo=io.StringIO())  # fmt: skip
    with pytest.raises(SlurmJobError) as err:
        job.result()
    assert (err.value.state, err.value.reason) == ("TIMEOUT", "TimeLimit")
    assert "time limit 00:01:00" in _one_line(err.value)


@pytest.mark.slurm_long
def test_a_node_failure_ends_the_wait_with_slurms_reason(cluster, jobs):
    """Guards: a node that stops answering (its slurmd and the job's processes there frozen)
    ends the wait as NODE_FAIL with Slurm's reason, once slurmctld gives up on it (about
    SlurmdTimeout, 30 s); thawed, the node returns and nothing of the job is left."""
    job = submit(hangs_on_rank_zero, nodes=2, timeout=600, job_root=jobs, echo=io.StringIO())
    while len(list((job.dir / "ranks").glob("rank-*.json"))) < 2:
        time.sleep(0.1)
    on_n2 = [p for p in cluster.job_processes() if _environ(p).get("SLURMD_NODENAME") == "n2"]
    frozen = [cluster.pids["slurmd-n2"], *on_n2]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(SlurmJobError) as err:
            job.result()
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert (err.value.state, err.value.reason) == ("NODE_FAIL", "NodeDown")
    assert "Slurm ended job" in _one_line(err.value)
    assert "as NODE_FAIL (reason: NodeDown)" in _one_line(err.value)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _one_line(err: BaseException) -> str:
    """The message with its wrapping undone."""
    return " ".join(str(err).split())


def test_cli_up_env_status_down_leave_nothing(cluster, tmp_path, monkeypatch, capsys):
    """Guards: `ezpz-nb slurm up` starts a cluster ez.submit can find (its pointer), `env`
    prints the line for a shell, `status` shows both nodes, `down` stops it by PID and
    removes its folder and pointer."""
    from ezpz_nb.cli import main
    from ezpz_nb.slurm.commands import find_conf

    monkeypatch.setenv("EZPZ_NB_SLURM_POINTER", str(tmp_path / "pointer.json"))
    assert main(["slurm", "up"]) == 0
    found = LocalSlurm.from_pointer()
    assert found is not None and find_conf() == str(found.conf) != str(cluster.conf)
    assert main(["slurm", "env"]) == 0
    assert main(["slurm", "status"]) == 0
    out = capsys.readouterr().out
    assert f"export SLURM_CONF={found.conf}" in out
    assert "n1 debug* idle" in out and "n2 debug* idle" in out
    assert main(["slurm", "down"]) == 0
    assert not found.folder.exists() and not (tmp_path / "pointer.json").exists()
    assert not processes_of(found.conf)
    assert main(["slurm", "status"]) == 1


def test_the_rank_side_under_plain_torchrun_fills_the_job_folder(tmp_path):
    """Guards: without Slurm (where the cluster tests skip), the job folder ez.submit writes
    runs under torchrun alone: every rank's reply, output and ledger file land in it, and
    the ledger's sample-id stream equals ez.launch's at the same layout."""
    from ezpz_nb.launcher.startup import pack_job
    from ezpz_nb.launcher.wire import Ok
    from ezpz_nb.slurm.outcome import read_ranks, read_replies
    from ezpz_nb.slurm.script import JobSpec
    from ezpz_nb.slurm.submission import write_job

    spec = JobSpec(str(tmp_path / "job"), nodes=1, ranks_per_node=2, timeout=60)
    write_job(spec, pack_job(one_epoch, (), {}))
    # --log-dir: torchrun's logs in tmp_path, not a torchelastic_* folder left in /tmp.
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--log-dir", str(tmp_path / "torchrun"), "-m", "ezpz_nb.slurm.rank", spec.job_dir],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    job_dir = Path(spec.job_dir)
    replies = read_replies(job_dir)
    assert sorted(replies) == [0, 1] and all(isinstance(m, Ok) for m in replies.values())
    assert sorted(read_ranks(job_dir)) == [0, 1]
    assert "rank 1: " in (job_dir / "out" / "rank-1.log").read_text()
    ledger = Ledger.load(job_dir / "ledger")
    assert ledger.complete == {0: True, 1: True}
    launched = Ledger.from_results(ez.launch(one_epoch, world_size=2))
    assert sample_hash(ledger) == sample_hash(launched)
