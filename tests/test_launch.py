"""The launcher with real processes and real gloo: results, output, failures, cleanup."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.launcher import live_clusters

pytestmark = pytest.mark.timeout(120)


def _helpers() -> set[int]:
    """Long-lived helpers of the parent (forkserver, resource tracker) are not leaks."""
    keep = set()
    for p in psutil.Process().children():
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "forkserver" in cmd or "resource_tracker" in cmd:
            keep.add(p.pid)
    return keep


def _ranks_alive() -> list[psutil.Process]:
    helpers = _helpers()
    out = []
    for p in psutil.Process().children(recursive=True):
        if p.pid in helpers:
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _tmpdirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ezpz_nb-*")))


@pytest.fixture(scope="module", autouse=True)
def _private_tmp(tmp_path_factory):
    """Count only this module's temporary folders, whatever else runs on the machine."""
    import multiprocessing.util

    multiprocessing.util.get_temp_dir()  # multiprocessing's own folder stays where it was
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("launcher-tmp"))
    yield
    tempfile.tempdir = saved


@pytest.fixture(autouse=True)
def _no_leaks(_private_tmp):
    """Every test must leave no rank process, temp folder or live cluster behind."""
    before = _tmpdirs()
    yield
    deadline = time.monotonic() + 5
    while _ranks_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ranks_alive() == []
    assert _tmpdirs() - before == set()
    assert live_clusters() == []


def _rank_and_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_results_in_rank_order(n):
    """Guards: results come back in rank order and every rank is in one real gloo group."""
    out = ez.launch(_rank_and_sum, world_size=n)
    assert out == [(r, n, float(sum(range(n)))) for r in range(n)]


def test_closures_lambdas_and_kwargs():
    """Guards: functions are sent by value (closures, lambdas), with args and kwargs."""
    base = 10

    def add(x, *, y):
        return base + x + y + dist.get_rank()

    assert ez.launch(add, 1, y=2, world_size=2) == [13, 14]
    assert ez.launch(lambda: dist.get_backend(), world_size=2) == ["gloo", "gloo"]


def test_threads_default_and_override():
    """Guards: ranks split the cores instead of oversubscribing them."""
    cores = len(os.sched_getaffinity(0))
    assert ez.launch(torch.get_num_threads, world_size=2) == [max(1, cores // 2)] * 2
    assert ez.launch(torch.get_num_threads, world_size=2, threads=3) == [3, 3]


def test_output_is_prefixed_whole_lines(capfd):
    """Guards: rank output reaches the caller, per rank in order, never mid-line mixed."""

    def chatty():
        r = dist.get_rank()
        for i in range(50):
            print(f"line {i} from {r}", end="" if i % 2 else "\n", flush=True)
            if i % 2:
                print(" (joined)")
        print("to stderr", file=sys.stderr)
        os.write(2, b"raw fd write\n")  # what C++ code in torch would do

    ez.launch(chatty, world_size=2)
    out, err = capfd.readouterr()
    for r in (0, 1):
        mine = [ln for ln in out.splitlines() if ln.startswith(f"[rank {r}] ")]
        assert len(mine) == 50
        assert all(f"from {r}" in ln for ln in mine)
        nums = [int(ln.split()[3]) for ln in mine]
        assert nums == sorted(nums)
        assert f"[rank {r}] to stderr" in err
        assert f"[rank {r}] raw fd write" in err


def test_rank_error_names_rank_and_traceback_and_next_launch_works():
    """Guards: one rank raising ends the run quickly with its traceback, others stopped."""

    def boom():
        if dist.get_rank() == 1:
            raise ValueError("bad shard on purpose")
        dist.barrier()  # rank 0 would wait here forever

    timeout = 60
    t0 = time.monotonic()
    with pytest.raises(ez.RankError) as info:
        ez.launch(boom, world_size=2, timeout=timeout)
    # A relation, not a time: waiting for rank 0 would have taken the whole timeout.
    assert time.monotonic() - t0 < timeout
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.ranks == [1]
    assert "rank 1" in str(err) and "ValueError: bad shard on purpose" in str(err)
    assert 'raise ValueError("bad shard on purpose")' in err.failures[1].traceback
    assert err.failures[0].kind == "stopped"
    assert ez.launch(_rank_and_sum, world_size=2)[1][2] == 1.0


def test_hang_reports_where_each_rank_is():
    """Guards: mismatched collectives raise HangError naming each rank's call and line."""

    def mismatched():
        if dist.get_rank() == 0:
            dist.barrier()
        else:
            dist.broadcast(torch.zeros(1), src=0)

    timeout = 2
    t0 = time.monotonic()
    with pytest.raises(ez.HangError) as info:
        ez.launch(mismatched, world_size=2, timeout=timeout)
    # Reported (stacks included) before gloo's own collective timeout, timeout + 60 s,
    # would have ended the ranks with an error that says nothing of the mismatch.
    assert time.monotonic() - t0 < timeout + 60
    err = info.value
    assert isinstance(err, TimeoutError)
    assert err.stacks[0].call == "barrier"
    assert err.stacks[1].call == "broadcast"
    assert "dist.barrier()" in err.stacks[0].source
    assert "rank 0: barrier()" in str(err) and "rank 1: broadcast()" in str(err)


def test_fewer_steps_on_one_rank_is_reported_as_finished():
    """Guards: the classic uneven-steps hang shows which rank left early."""

    def uneven():
        steps = 3 if dist.get_rank() == 0 else 2
        for _ in range(steps):
            dist.all_reduce(torch.ones(1))

    with pytest.raises(ez.HangError) as info:
        ez.launch(uneven, world_size=2, timeout=2)
    assert info.value.stacks[1].state == "finished"
    assert info.value.stacks[0].call == "all_reduce"


def test_killed_rank_is_reported_with_signal():
    """Guards: a rank killed from outside (OOM killer) is detected, not waited for."""

    def die():
        if dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    timeout = 60
    t0 = time.monotonic()
    with pytest.raises(ez.RankError) as info:
        ez.launch(die, world_size=2, timeout=timeout)
    # Rank 0 waits in the barrier: had the death gone unseen, the run would take the timeout.
    assert time.monotonic() - t0 < timeout
    assert info.value.failures[1].signal == signal.SIGKILL
    assert "SIGKILL" in str(info.value)


def test_unpicklable_argument_fails_before_start():
    """Guards: an argument that cannot travel is a clear TypeError, not a hang."""
    lock = threading.Lock()
    with pytest.raises(TypeError, match="argument 0 .*lock"):
        ez.launch(lambda x: 1, lock, world_size=2)


def test_unpicklable_return_names_rank_and_type():
    """Guards: a return value that cannot travel back names the rank and the type."""
    with pytest.raises(ez.RankError, match=r"rank 0: its return value \(a _thread.lock\)") as info:
        ez.launch(threading.Lock, world_size=1)
    assert info.value.failures[0].kind == "unpicklable"


@pytest.mark.parametrize(
    "kwargs,exc,msg",
    [
        (dict(world_size=0), ValueError, "between 1 and"),
        (dict(world_size=10_000), ValueError, "between 1 and"),
        (dict(world_size=2.0), TypeError, "must be an int"),
        (dict(world_size=True), TypeError, "must be an int"),
        (dict(world_size=2, timeout=0), ValueError, "timeout"),
        (dict(world_size=2, timeout=-1), ValueError, "timeout"),
        (dict(world_size=2, start_method="thread"), ValueError, "start_method"),
        (dict(world_size=2, backend="mpi"), ValueError, "backend"),
    ],
)
def test_bad_input_is_rejected_before_start(kwargs, exc, msg):
    """Guards: bad input gets a clear error and no process starts."""
    with pytest.raises(exc, match=msg):
        ez.launch(_rank_and_sum, **kwargs)
    assert _ranks_alive() == []


def test_not_callable():
    """Guards: passing a function's result instead of the function."""
    with pytest.raises(TypeError, match="must be callable"):
        ez.launch(42, world_size=2)


class _CountsPickles:
    """An argument that counts how often the notebook pickles it."""

    pickled = 0

    def __reduce__(self):
        type(self).pickled += 1
        return (_CountsPickles, ())


def test_a_launch_pickles_its_job_once():
    """Guards the launch path against packing the job twice (once to check it, once
    to send it): the checked, packed job is what the ranks get."""
    _CountsPickles.pickled = 0
    assert (
        ez.launch(lambda x: type(x).__name__, _CountsPickles(), world_size=2)
        == ["_CountsPickles"] * 2
    )
    assert _CountsPickles.pickled == 1


def test_a_ranks_cell_naming_a_function_that_cannot_travel_is_refused_before_start():
    """Guards %%ranks' check of the notebook names a cell uses (the culprit search it
    shares with ez.launch): the function that cannot travel is named, data is only
    noted, no rank starts, and a cell's names are pickled once (issue 47: the magic
    pickled them, then the cluster again)."""
    import functools

    from ezpz_nb.launcher.errors import LaunchTypeError
    from ezpz_nb.magic import cell_job, notebook_names

    lock = threading.Lock()

    def holds_lock():
        return lock

    def fine():
        return 1

    shipped, data = notebook_names("fine()\nsteps", {"fine": fine, "steps": 3})
    assert shipped == {"fine": fine} and data == {"steps"}
    with pytest.raises(LaunchTypeError, match="uses 'holds_lock' from the notebook.*lock"):
        cell_job("fine()\nholds_lock()", {"fine": fine, "holds_lock": holds_lock}, None, 1)
    assert _ranks_alive() == []
    _CountsPickles.pickled = 0
    counted = functools.partial(type, _CountsPickles())
    job, _ = cell_job("kind = counted()", {"counted": counted}, None, 2)
    assert _CountsPickles.pickled == 1
    with ez.Cluster(2) as c:
        assert c.run_job(job) == [None, None]
    assert _CountsPickles.pickled == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_nccl_without_gpu_is_clear():
    """Guards: asking for nccl on a CPU machine says what to do."""
    with pytest.raises(ValueError, match="one CUDA GPU per rank"):
        ez.launch(_rank_and_sum, world_size=2, backend="nccl")


# Its own limit: on a loaded 2-core machine a launch took up to 2.4 s (0.1 s idle).
@pytest.mark.timeout(600)
def test_fifty_launches_leak_nothing():
    """Guards: no process, file or descriptor survives a run, even many in a row."""

    def job():  # by value: a module-level function here would make every rank import
        # this test module (and pytest): seconds per launch on a busy machine
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item()

    ez.launch(job, world_size=2)  # start the forkserver first
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        ez.launch(job, world_size=2)
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert _ranks_alive() == []


def test_cluster_keeps_state_and_two_run_at_once():
    """Guards: state survives between runs; two clusters never collide (no fixed ports)."""

    def step():
        g = globals()
        g["n"] = g.get("n", 0) + 1
        t = torch.ones(1)
        dist.all_reduce(t)
        return g["n"], t.item()

    with ez.Cluster(2) as a, ez.Cluster(3) as b:
        assert a.run(step) == [(1, 2.0)] * 2
        assert b.run(step) == [(1, 3.0)] * 3
        assert a.run(step) == [(2, 2.0)] * 2
    a.close()  # twice is harmless
    assert a.closed and b.closed


def test_cluster_survives_an_error_everyone_returned_from():
    """Guards: a typo on every rank does not throw away the learner's state."""
    with ez.Cluster(2) as c:
        c.run(lambda: globals().__setitem__("kept", 7))
        with pytest.raises(ez.RankError, match="NameError"):
            c.run(lambda: undefined_name)  # noqa: F821
        assert not c.closed
        assert c.run(lambda: globals()["kept"]) == [7, 7]


def test_cluster_restarts_after_a_hang(capfd):
    """Guards: after a hang the next run starts fresh ranks and says so."""
    with ez.Cluster(2, timeout=2) as c:
        with pytest.raises(ez.HangError):
            c.run(lambda: dist.barrier() if dist.get_rank() == 0 else None)
        assert c.closed
        assert c.run(dist.get_rank) == [0, 1]
    assert "starting 2 fresh ranks" in capfd.readouterr().err


def test_events_arrive_live_and_survive_a_hang():
    """Guards: published items reach the notebook while ranks run, also on failure."""
    seen = []

    def work():
        for i in range(3):
            ez.publish(("step", dist.get_rank(), i))
        if dist.get_rank() == 0:
            dist.barrier()

    with ez.Cluster(2, timeout=2) as c:
        c.on_event = seen.append
        with pytest.raises(ez.HangError) as info:
            c.run(work)
    items = [e.item for e in info.value.events]
    for r in (0, 1):
        assert [i for i in items if i[1] == r] == [("step", r, i) for i in range(3)]
    assert [e.item for e in seen] == items


def test_interrupt_stops_every_rank():
    """Guards: Ctrl-C (SIGINT in the kernel) while waiting ends all ranks quickly."""
    c = ez.Cluster(2)
    pids = c.run(os.getpid)
    nap = 30
    # What a kernel does; a test run started in the background by a non-interactive
    # shell inherits SIGINT ignored, and the interrupt would never arrive.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            # Started inside the block: a stalled machine must not deliver it elsewhere.
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            c.run(time.sleep, nap)
    finally:
        signal.signal(signal.SIGINT, saved)
    # A relation, not a time: the ranks were stopped, not waited for to finish their nap.
    assert time.monotonic() - t0 < nap
    assert c.closed
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    import ezpz_nb as ez
    # No __main__ guard on purpose: ranks must not re-run this file.
    c = ez.Cluster(2)
    print(" ".join(str(p) for p in c.run(os.getpid)), flush=True)
    if sys.argv[1] == "die":
        os._exit(3)  # the kernel dies without cleaning up
    c.close()
    print("clean", ez.launch(lambda: dist.get_rank(), world_size=2))
""")


def _script(tmp_path, short_tmp, mode):
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    return subprocess.run(
        [sys.executable, str(path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TMPDIR=short_tmp),
    )


@pytest.mark.system  # a script in a process of its own (~7 s quiet): `make system`
def test_plain_script_without_main_guard(tmp_path, short_tmp):
    """Guards: the API works from a plain script; ranks never re-run the script."""
    proc = _script(tmp_path, short_tmp, "ok")
    assert proc.returncode == 0, proc.stderr
    assert "clean [0, 1]" in proc.stdout


@pytest.mark.system  # a script of its own, killed (~7 s quiet): `make system`
def test_ranks_exit_when_the_kernel_dies(tmp_path, short_tmp):
    """Guards: no orphans (and no folders) when the notebook process dies abruptly."""
    proc = _script(tmp_path, short_tmp, "die")
    assert proc.returncode == 3, proc.stderr
    pids = [int(p) for p in proc.stdout.split()[:2]]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in pids)
    # The ranks removed our folder and multiprocessing's (the forkserver's).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.listdir(short_tmp):
        time.sleep(0.1)
    assert os.listdir(short_tmp) == []


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods(method):
    """Guards: every start method runs local functions (spawn is macOS/Windows' default)."""
    offset = 5
    out = ez.launch(
        lambda: dist.get_rank() + offset, world_size=2, start_method=method, timeout=120
    )
    assert out == [5, 6]


@pytest.mark.system
def test_launch_under_torchrun_uses_its_ranks(tmp_path, short_tmp):
    """Guards: notebook code calling ez.launch runs unchanged under torchrun."""
    path = tmp_path / "job.py"
    # One write per rank: two ranks share the pipe, and print() may write in pieces.
    path.write_text(
        "import sys, torch.distributed as dist, ezpz_nb as ez\n"
        "r = ez.launch(lambda: dist.get_rank() * 2, world_size=2)\n"
        "sys.stdout.write(f'result {r}\\n')\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TMPDIR=short_tmp),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("result [0, 2]") == 2


def _loader_then_hang():
    from torch.utils.data import DataLoader

    it = iter(DataLoader(list(range(64)), batch_size=4, num_workers=2))
    next(it)
    ez.publish([w.pid for w in it._workers])
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never comes: a hang with loader workers alive


def test_no_orphaned_loader_workers_after_a_hang():
    """Guards: stopping a rank also stops its DataLoader worker processes."""
    with pytest.raises(ez.HangError) as info:
        # The timeout starts once the ranks are up: it covers two loader workers forking
        # and one batch, milliseconds of work even on a busy machine.
        ez.launch(_loader_then_hang, world_size=2, timeout=3)
    pids = [pid for e in info.value.events for pid in e.item]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_one_gpu_per_rank():
    """Guards: backend='nccl' gives each rank its own device and a working collective."""
    n = min(torch.cuda.device_count(), 2)

    def on_gpu():
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        return dist.get_backend(), torch.cuda.current_device(), t.item()

    assert ez.launch(on_gpu, world_size=n, backend="nccl") == [
        ("nccl", r, float(n)) for r in range(n)
    ]
