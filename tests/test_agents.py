"""Real torchrun agents started from Python (notebook 14's machinery): bad input, bounded
waits, cleanup, the worker checker and the elastic merge.

The system tests start real ``python -m torch.distributed.run`` agents. After each case,
no process whose command line names the case's private folder may be alive, and the
agents' temporary folder (TMPDIR: torchrun's ``torchelastic_*``) must be gone.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from ezpz_nb.agents import crash_plan
from ezpz_nb.agents.agents import AgentError, AgentRun, run_agents, torchrun, torchrun_argv
from ezpz_nb.agents.by_hand import (
    WORKER_NAME,
    WorkerCheckError,
    check_worker,
    load_attempts,
    worker_from_notebook,
)
from ezpz_nb.agents.worker_job import (
    CHECKPOINT_EVERY,
    SECOND_LAYOUTS,
    WorkerRun,
    worker_runs,
)
from ezpz_nb.ledger import StepRecord, fault
from ezpz_nb.wrapping import COLUMNS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "14_torchrun_by_hand.ipynb"

# A worker that joins the group and does one collective: the agents' behaviour, not the data.
TINY = """\
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    if os.environ.get("FAIL_RANK") == os.environ["RANK"]:
        raise ValueError("rank failed on purpose")
    t = torch.ones(1)
    dist.all_reduce(t)
    # One write per line: torchrun starts workers with python -u, and print() writes
    # its pieces one system call each, so two ranks' lines could interleave mid-line.
    sys.stdout.write(f"rank {os.environ['RANK']} sum {int(t.item())}\\n")
    dist.destroy_process_group()

main()
"""


@pytest.fixture()
def case(tmp_path, monkeypatch):
    """A private folder (named in every command line) and a private TMPDIR for the agents'
    temporary folder; after the test, nothing that names the folder runs and TMPDIR is empty."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield tmp_path
    left = _ours(tmp_path)
    assert not left, f"processes outlived the case: {left}"
    assert list(tmp.iterdir()) == [], f"left in TMPDIR: {list(tmp.iterdir())}"


def _ours(folder: Path) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(folder) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{p.info['pid']}: {cmd[:120]}")
    return found


def _tiny(folder: Path) -> Path:
    path = folder / "tiny.py"
    path.write_text(TINY)
    return path


def test_agents_that_disagree_on_nnodes_are_refused_before_any_process_starts(case):
    """Guards: torchrun silently runs a job with --nnodes=2 and --nnodes=3 agents as 2 nodes;
    the runner must refuse the mismatch, saying to give every node the same --nnodes."""
    worker = _tiny(case)
    cmds = [
        torchrun_argv(worker, nnodes=n, endpoint="127.0.0.1:29999", node_rank=i)
        for i, n in enumerate((2, 3))
    ]
    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(AgentError, match=r"disagree on --nnodes \(2, 3\).*same --nnodes") as err:
        run_agents(cmds)
    assert err.value.run is None
    assert set(psutil.Process().children(recursive=True)) <= before


def test_a_busy_rendezvous_port_is_refused_with_what_to_do(case):
    """Guards: with its endpoint port held by another program, torchrun connects to it and
    waits with no timeout; the runner must refuse it up front and say to pick a free port."""
    worker = _tiny(case)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(AgentError, match=rf"port {port} .* in use.*free port"):
            run_agents([torchrun_argv(worker, nnodes=2, endpoint=f"127.0.0.1:{port}")])


def test_a_worker_with_a_syntax_error_is_refused_naming_its_line(case):
    """Guards: a worker that does not compile kills every rank at once; it must be refused
    before any agent starts, with the file, the line and what to do. So must a missing file,
    and one whose %%writefile -a cell ran twice (a function defined twice)."""
    broken = case / "broken.py"
    broken.write_text("import os\n\ndef main(:\n    pass\n")
    with pytest.raises(AgentError, match=r"broken.py, line 3: .*%%writefile cell"):
        torchrun(broken, nproc_per_node=2)
    with pytest.raises(AgentError, match=r"does not exist.*%%writefile"):
        torchrun(case / "missing.py")
    twice = case / "twice.py"
    twice.write_text("def main():\n    pass\n\n\ndef main():\n    pass\n")
    with pytest.raises(AgentError, match=r"main\(\) twice \(lines 1 and 5\).*-a cell ran twice"):
        torchrun(twice)


def test_bad_arguments_are_refused_before_any_process_starts(case):
    """Guards: a node count, node list or per-node list that cannot be right fails at once
    with what to give instead."""
    worker = _tiny(case)
    with pytest.raises(AgentError, match="nproc_per_node must be a positive int"):
        torchrun(worker, nproc_per_node=0)
    with pytest.raises(AgentError, match=r"start_nodes=\[2\]: name distinct nodes among 0..1"):
        torchrun(worker, nnodes=2, start_nodes=[2])
    with pytest.raises(AgentError, match="log_dirs needs one entry per node"):
        torchrun(worker, nnodes=2, log_dirs=[case / "a"])


@pytest.mark.system
def test_one_node_runs_relays_output_and_leaves_nothing(case, capsys):
    """Guards: the runner relays every rank's output to the caller as it comes and cleans
    up after a job that went well."""
    run = torchrun(_tiny(case), nproc_per_node=2)
    assert run.ok, run.output
    assert sorted(run.lines(r"^rank \d sum 2")) == ["rank 0 sum 2", "rank 1 sum 2"]
    assert "rank 1 sum 2" in capsys.readouterr().out


@pytest.mark.system
def test_a_line_wider_than_the_output_area_is_shown_broken_between_words(case, capsys):
    """Guards: under load torch's agent printed a C++ trace line of 120 columns into
    notebook 14's output (JupyterLab then breaks it inside a word); what the runner shows
    is broken between words, and what it keeps (``run.output``) is the line as written."""
    worker = case / "wide.py"
    words = [f"w{i:02d}" for i in range(40)]
    site = sysconfig.get_paths()["purelib"]
    worker.write_text(f"print({' '.join(words)!r})\nprint('  File ' + repr({site!r} + '/t.py'))\n")
    run = torchrun(worker, nproc_per_node=1)
    assert run.ok, run.output
    shown = capsys.readouterr().out.splitlines()
    assert max(map(len, shown)) <= COLUMNS
    assert " ".join(w for line in shown for w in line.split() if w in words) == " ".join(words)
    assert run.lines(" ".join(words)) and run.lines(re.escape(site))
    assert "  File '.../site-packages/t.py'" in shown


@pytest.mark.system
def test_a_node_that_never_arrives_ends_in_bounded_time_with_an_explanation(case):
    """Guards: one agent of a two-node job, alone, must give up after join_timeout with
    RendezvousTimeoutError, and the diagnosis must say to start every node."""
    run = torchrun(_tiny(case), nnodes=2, start_nodes=[0], join_timeout_s=3, echo=False)
    assert not run.ok and run.stopped == ""
    assert run.lines("RendezvousTimeoutError")
    assert "Start every node" in run.diagnosis()
    with pytest.raises(AgentError, match="rendezvous gave up"):
        run.raise_for_status()


@pytest.mark.system
def test_the_deadline_kills_every_agent_and_rank(case):
    """Guards: a job that would wait longer than its deadline (here a rendezvous with a
    60 s join_timeout) is stopped at the deadline, agents and ranks killed, TMPDIR removed."""
    with pytest.raises(AgentError, match="deadline of 4 s") as err:
        torchrun(_tiny(case), nnodes=2, start_nodes=[0], join_timeout_s=60, timeout_s=4)
    assert err.value.run is not None and err.value.run.stopped == "deadline"


@pytest.mark.system
def test_an_interrupted_cell_leaves_no_agent_or_rank(case):
    """Guards: an interrupt (what the notebook's stop button sends) while ranks run must stop
    the agents and their ranks (ranks live in sessions of their own) before it propagates."""
    slow = case / "slow.py"
    slow.write_text(TINY.replace("main()\n", "import time; time.sleep(120)\n"))
    # A kernel turns SIGINT into KeyboardInterrupt; a pytest started in the background by
    # a non-interactive shell inherits SIGINT ignored, and the interrupt would never arrive.
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(6, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            torchrun(slow, nproc_per_node=2, timeout_s=60, echo=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, saved)


@pytest.mark.system
def test_a_process_left_behind_by_a_rank_does_not_outlive_the_job(case):
    """Guards: a rank that leaves a child running (holding the output pipe, in a session of
    its own) must not keep the job waiting for its deadline, nor outlive it."""
    leaver = case / "leaver.py"
    leaver.write_text(
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {str(case)!r}],"
        " start_new_session=True)\n"
        "print('rank left a child behind', flush=True)\n"
    )
    # Waiting on the child's pipe would end at the deadline, in an AgentError.
    run = torchrun(leaver, nproc_per_node=1, timeout_s=90, echo=False)
    assert run.ok and run.lines("left a child behind")


@pytest.mark.system
def test_a_failing_rank_reaches_the_caller_as_one_error_naming_rank_and_traceback(case):
    """Guards: a rank that raises must end the job and raise_for_status() must carry
    torchrun's root cause: the rank and its traceback (the worker uses @record)."""
    run = run_agents(
        [torchrun_argv(_tiny(case), nproc_per_node=2)], env={"FAIL_RANK": "1"}, echo=False
    )
    with pytest.raises(AgentError, match=r"(?s)rank\s*: 1.*ValueError: rank failed on purpose"):
        run.raise_for_status()


def _write_attempt(folder: Path, attempt: int, records: list[StepRecord], start: tuple[int, int]):
    from ezpz_nb.ledger import Ledger

    part = folder / f"attempt{attempt}"
    part.mkdir(parents=True)
    (part / "resumed.json").write_text(json.dumps({"epoch": start[0], "steps": start[1]}))
    for rank in {r.rank for r in records}:
        Ledger([r for r in records if r.rank == rank], 8).save(part / f"rank{rank}.jsonl")


def _rec(epoch: int, step: int, ids: tuple[int, ...]) -> StepRecord:
    return StepRecord(epoch, step, 0, 0, 1, 0, 1, ids, "loaded", "d")


def test_load_attempts_marks_the_steps_a_restart_redid_and_renumbers_the_rest(tmp_path):
    """Guards: the elastic merge. Attempt 0 took steps 0-2 of epoch 0 and resumed at step 1:
    its steps 1-2 are replayed (source "replayed"), attempt 1's steps follow from 1, and the
    counted steps hold each sample once."""
    _write_attempt(
        tmp_path, 0, [_rec(0, 0, (0, 1)), _rec(0, 1, (2, 3)), _rec(0, 2, (4, 5))], (0, 0)
    )
    _write_attempt(
        tmp_path, 1, [_rec(0, 0, (2, 3)), _rec(0, 1, (4, 5)), _rec(0, 2, (6, 7))], (0, 1)
    )
    got = load_attempts(tmp_path)
    assert got.resumed == [(0, 0, 0), (1, 0, 1)]
    assert [(r.step, r.sample_ids, r.source) for r in got.replayed.records] == [
        (1, (2, 3), "replayed"),
        (2, (4, 5), "replayed"),
    ]
    assert [(r.step, r.sample_ids) for r in got.counted.records] == [
        (0, (0, 1)),
        (1, (2, 3)),
        (2, (4, 5)),
        (3, (6, 7)),
    ]
    assert got.exactly_once()


def test_load_attempts_catches_a_resume_from_the_wrong_place(tmp_path):
    """Guards: a restart that resumed one step too late skips samples (never_seen), and one
    that resumed too early without its earlier attempt knowing repeats them: neither is
    exactly once."""
    _write_attempt(tmp_path, 0, [_rec(0, 0, (0, 1)), _rec(0, 1, (2, 3))], (0, 0))
    _write_attempt(tmp_path, 1, [_rec(0, 0, (6, 7))], (0, 2))  # skipped (4, 5)
    assert not load_attempts(tmp_path).exactly_once()


def test_the_notebook_writes_the_worker_that_the_tests_extract(tmp_path):
    """Guards: worker_from_notebook reads %%writefile then %%writefile -a cells in order, as
    IPython writes them; the notebook's worker compiles and keeps the checker's contract."""
    text = worker_from_notebook(NOTEBOOK)
    compile(text, WORKER_NAME, "exec")
    for needle in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "init_device_mesh", "set_device",
                   "device_id=", 'new_group(backend="gloo")', "spans nodes", "timeout",
                   "gpu = LOCAL_RANK", "gpu {gpu}"):  # fmt: skip
        assert needle in text, needle


def _solution(folder: Path, replace: tuple[str, str] | None = None) -> Path:
    text = worker_from_notebook(NOTEBOOK)
    if replace is not None:
        assert replace[0] in text, replace[0]
        text = text.replace(*replace)
    path = folder / WORKER_NAME
    path.write_text(text)
    return path


# The shipped worker passing its checker is notebook 14's own section 4 (check_worker
# raises on anything wrong), run in every `make test` (browser or nbmake) and from the wheel.


@pytest.mark.system
def test_the_checker_rejects_local_rank_taken_from_rank(case):
    """Guards: a worker that reads LOCAL_RANK from RANK passes on one node; the two-node run
    must reject it and name the variable to read."""
    worker = _solution(
        case, ('LOCAL_RANK = int(os.environ["LOCAL_RANK"])', 'LOCAL_RANK = int(os.environ["RANK"])')
    )
    with pytest.raises(
        WorkerCheckError, match=r"2 node.*rank [345] says local_rank [345].*LOCAL_RANK"
    ):
        check_worker(worker, seed=1)


def _warned_by(rule: str, spec: WorkerRun) -> set[int]:
    """The ranks a worker's warning rule makes warn in ``spec``'s layout (ranks numbered node
    by node, TP innermost): "span" is the notebook's, the others are trials' dodges."""
    leaders = range(0, spec.world, spec.tp)
    last_local = {g for g in leaders if g % spec.nproc == spec.nproc - 1}
    return {"span": spec.spanning_leaders(), "last_local": last_local}[rule]


def test_the_checkers_runs_have_a_tp_group_across_nodes_a_crash_and_a_drawn_second_layout():
    """Guards issue 45's seventh and eighth trials. The seventh's layouts were 2 nodes x 2 ranks
    and 2 x 1 at TP 2, so "spans nodes" always meant tp > LOCAL_WORLD_SIZE, and no rank ever
    died. The eighth's: only 2 x 3 at TP 2 ran, so a worker ignoring --tp-size, or warning
    from every TP leader that is its node's last local rank (right at 2 x 3, tp 2 only),
    passed; and the restart's position was the last one saved before the crash, which a
    worker can work out without reading its checkpoint. Now the first run is 2 nodes x 3
    ranks at TP 2 (the group [2, 3] spans the nodes, [0, 1] and [4, 5] do not) with a crash
    at a step that is not a saved position and a kept position saved earlier still (what the
    restart must resume from); the second is a drawn layout whose tp is not 2 and where the
    last-local-rank rule warns from other ranks than the spanning groups' leaders."""
    draws = [worker_runs("gloo", random.Random(seed)) for seed in range(200)]
    assert {len(d) for d in draws} == {2}
    runs = [d[0] for d in draws]
    assert {(r.nnodes, r.nproc, r.tp) for r in runs} == {(2, 3, 2)}
    assert runs[0].spanning_leaders() == {2} and runs[0].group(3) == [2, 3]
    assert WorkerRun(2, 2).spanning_leaders() == set() == WorkerRun(1, 4).spanning_leaders()
    assert WorkerRun(2, 1).spanning_leaders() == {0}
    for r in runs:
        assert r.crash is not None and r.keep is not None
        _, epoch, step = r.crash
        per_epoch = r.num_samples // (r.world // r.tp) // 4
        assert epoch in (0, 1) and CHECKPOINT_EVERY < step < per_epoch
        assert step % CHECKPOINT_EVERY
        kept_epoch, kept = r.keep
        # A saved position, before the last one saved before the crash, not the job's start,
        # whose copy is taken at a step of its epoch (kept + 1) before the crash.
        assert kept % CHECKPOINT_EVERY == 0 and CHECKPOINT_EVERY <= kept < per_epoch - 1
        assert (kept_epoch, kept + 1) < (epoch, step) and (kept_epoch, kept) < (epoch, step - 1)
    assert {r.crash[0] for r in runs if r.crash} == set(range(6))
    assert {r.crash[1:] for r in runs if r.crash} == {(0, 5), (0, 7), (1, 3), (1, 5), (1, 7)}
    assert {r.keep for r in runs} == {(0, 2), (0, 4), (0, 6), (1, 2), (1, 4)}
    seconds = [d[1] for d in draws]
    assert {(r.nnodes, r.nproc, r.tp) for r in seconds} == set(SECOND_LAYOUTS)
    for r in seconds:
        assert r.crash is None and r.tp != 2
        assert _warned_by("last_local", r) != _warned_by("span", r)
    # The first run alone does not separate them (why a second layout runs at all).
    assert _warned_by("last_local", runs[0]) == _warned_by("span", runs[0])


@pytest.mark.system
@pytest.mark.parametrize(
    ("replace", "says", "seed"),
    [
        (
            (
                "if len(nodes) > 1 and layout.tp_rank == 0:",
                "if WORLD_SIZE > LOCAL_WORLD_SIZE and layout.tp_rank == 0:",
            ),
            r"2 node.*rank 0 warned .*group \[0, 1\] is on one node",
            2,
        ),
        (
            (
                "num_replicas=layout.dp_size,\n        rank=layout.dp_rank,",
                "num_replicas=1,\n        rank=0,",
            ),
            r"(?s)2 node.*data problem.*dp_duplicate",
            3,
        ),
        (("gpu = LOCAL_RANK", "gpu = RANK"), r"rank [345] would take GPU [345].*LOCAL_RANK", 4),
    ],
    ids=["warns_whenever_two_nodes", "replicas_unsharded", "gpu_by_rank"],
)
def test_the_checker_rejects_the_sixth_trials_workers(case, replace, says, seed):
    """Guards issue 45's sixth trial, defects 13 and 14, each of which passed: a worker
    warning "spans nodes" whenever WORLD_SIZE > LOCAL_WORLD_SIZE (groups [0, 1] and [4, 5]
    are each on one node), a sampler with num_replicas=1 (at DP 3 the replicas read the same
    samples) and a GPU picked by RANK (the startup line shows the GPU each rank would take,
    under gloo too, and a rank of node 1 must take its LOCAL_RANK)."""
    with pytest.raises(WorkerCheckError, match=says):
        check_worker(_solution(case, replace), seed=seed)


# Issue 45's seventh trial: workers that passed the checker, each one edit of the solution.
SEVENTH = {
    # Warns only when tp > LOCAL_WORLD_SIZE: the group [2, 3] of 2 nodes x 3 ranks spans
    # the nodes with tp 2 < 3.
    "warns_iff_tp_above_local": (
        (
            "if len(nodes) > 1 and layout.tp_rank == 0:",
            "if tp > LOCAL_WORLD_SIZE and layout.tp_rank == 0:",
        ),
        r"TP group \[2, 3\] spans nodes here.*its leader, rank 2, did not warn",
    ),
    # Rank 0 warns whenever tp does not divide the ranks per node: a group spans, not its own.
    "rank_0_warns_for_another_group": (
        ("if len(nodes) > 1 and layout.tp_rank == 0:", "if LOCAL_WORLD_SIZE % tp and RANK == 0:"),
        r"rank 2, did not warn",
    ),
    # The checkpoint is never read: every restart starts the job over.
    "checkpoint_never_read": (
        ('if ckpt.exists() and json.loads(ckpt.read_text())["run_id"] == RUN_ID:', "if False:"),
        r"the restart says \(resumed.json\) it began at epoch 0, 0 steps done: the job started "
        r"over: read the checkpoint",
    ),
    # The attempt is each node's agent's own count on every rank but rank 0.
    "attempt_from_the_agents_count": (
        (
            "    dist.broadcast_object_list(agreed, src=0, group=cpu_group)\n",
            "    dist.broadcast_object_list(agreed, src=0, group=cpu_group)\n"
            "    if RANK != 0:\n        agreed[0] = RESTART_COUNT\n",
        ),
        r"\(rank, attempt\) in the startup lines.*TORCHELASTIC_RESTART_COUNT",
    ),
}


@pytest.mark.system
@pytest.mark.parametrize("name", list(SEVENTH))
def test_the_checker_rejects_the_seventh_trials_workers(case, name):
    """Guards issue 45's seventh trial: a spans-nodes warning keyed on tp > LOCAL_WORLD_SIZE
    (or given by the wrong rank), a restart that never reads the checkpoint, and an attempt
    (or a position) each rank takes from its own node's agent. The checker's run now has a
    TP group across nodes with tp below the ranks per node, and a rank it kills mid-job
    (not through the worker's --kill) so that torchrun restarts the job."""
    replace, says = SEVENTH[name]
    with pytest.raises(WorkerCheckError, match=says):
        check_worker(_solution(case, replace), seed=list(SEVENTH).index(name))


_READ_CHECKPOINT = """\
    if ckpt.exists() and json.loads(ckpt.read_text())["run_id"] == RUN_ID:
        saved = json.loads(ckpt.read_text())  # another job's checkpoint is not ours
        position = [saved["epoch"], saved["steps"]]
"""
# The position worked out from the checker's crash plan: the last one saved before the crash.
_FROM_PLAN = """\
    if restarted and plan:
        crash = json.loads(plan)
        position = [crash["epoch"], crash["step"] - crash["step"] % 2]
"""
_PROC_ENVIRON = (
    'dict(v.split("=", 1) for v in Path("/proc/self/environ").read_text().split("\\0") if "=" in v)'
)

# Issue 45's eighth trial: workers that passed the checker (one edit of the solution each),
# with the seed of the draw each test runs and what the verdict must say.
EIGHTH = {
    # No checkpoint read: rank 0 takes the position from the plan in os.environ.
    "position_from_the_plan_in_os_environ": (
        (_READ_CHECKPOINT, '    plan = os.environ.get("EZPZ_NB_FAIL_ONCE")\n' + _FROM_PLAN),
        r"began at epoch 0, 0 steps done: the job started over",
        2,
    ),
    # The same, from the environment the process started with (os.environ's origin). The
    # plan is no longer there either: no plan, no position, the job starts over.
    "position_from_the_plan_in_proc_environ": (
        (_READ_CHECKPOINT, f'    plan = {_PROC_ENVIRON}.get("EZPZ_NB_FAIL_ONCE")\n' + _FROM_PLAN),
        r"began at epoch 0, 0 steps done: the job started over",
        2,
    ),
    # Warns from every TP leader that is its node's last local rank: right at 2 x 3, tp 2.
    "warns_iff_leader_is_last_local_rank": (
        (
            "if len(nodes) > 1 and layout.tp_rank == 0:",
            "if LOCAL_RANK == LOCAL_WORLD_SIZE - 1 and layout.tp_rank == 0:",
        ),
        r"2 node\(s\) x 2 rank\(s\), tp 4: the TP group \[0, 1, 2, 3\] spans nodes here.*rank 0, "
        r"did not warn",
        4,
    ),
    # --tp-size ignored: tp 2 whatever the job asks.
    "tp_hard_coded": (
        ("    tp = args.tp_size\n", "    tp = 2\n"),
        r"2 node\(s\) x 2 rank\(s\), tp 1: \(dp_rank, tp_rank\) per rank is",
        1,
    ),
}


@pytest.mark.system
@pytest.mark.parametrize("name", list(EIGHTH))
def test_the_checker_rejects_the_eighth_trials_workers(case, name):
    """Guards issue 45's eighth trial: a restart that never reads a checkpoint and takes the
    position from the checker's crash plan (the plan is out of os.environ, and the checker
    puts --out back at an earlier saved position before the crash, so the position worked
    out from the crash is not the one saved), a spans-nodes warning from every TP leader that
    is its node's last local rank, and a tp hard-coded to 2: the second run's drawn layout has
    another tp, and a leader placed where that rule is wrong."""
    replace, says, seed = EIGHTH[name]
    with pytest.raises(WorkerCheckError, match=says):
        check_worker(_solution(case, replace), seed=seed)


# The dodge of an outside trial (helper brief H1 of session 8), which passed: no checkpoint
# read; rank 0 looks for the checker's plan in everything its process can reach (its
# environment as it started, /proc/self/environ; os.environ; the module the recorder kept the
# plan in; the files and names in the temporary folders those name, and their parents) and
# resumes from the kept step it finds, else from the crash its attempt-0 ledgers show.
_SNOOP = """\
    import sys
    seen = [v.partition("=")[2] for v in Path("/proc/self/environ").read_text().split("\\0")]
    seen += [*os.environ.values(), getattr(sys.modules.get("_ezpz_nb_fail_once"), "plan", "")]
    for value in {v for part in list(seen) for v in part.split(os.pathsep) if v.startswith("/")}:
        for folder in (Path(value), Path(value).parent):
            found = list(folder.iterdir()) if folder.is_dir() and len(folder.parts) > 2 else []
            for entry in found if len(found) <= 50 else []:  # a checker's folder is small
                seen.append(entry.name)
                if entry.is_file() and entry.stat().st_size < 65536:
                    seen.append(entry.read_text(errors="replace"))
    for text in seen:
        try:
            plan = json.loads(text)
        except ValueError:
            continue
        if restarted and isinstance(plan, dict) and "keep" in plan:
            position = [plan["keep"][0], plan["keep"][1] - 1]  # kept at the step after it
    if restarted and position == [0, 0]:
        from ezpz_nb.ledger import Ledger
        last = max((r.epoch, r.step) for r in Ledger.load(out / "attempt0").records)
        position = [last[0], last[1] - last[1] % 2]
"""


@pytest.mark.system
def test_the_checker_rejects_a_resume_from_anything_the_worker_can_see_but_its_checkpoint(case):
    """Guards helper brief H1 of session 8 (issue 45's checkers): a worker that never read its
    checkpoint passed, taking the kept step from the crash plan its own process held
    (/proc/self/environ, the recorder's module). The plan now stays in the checker, which
    steps the ranks from outside: whatever such a worker reads, its restart is judged wrong,
    while the notebook's own worker, which reads its checkpoint, passes (section 4 of the
    notebook, and the first case here)."""
    check_worker(_solution(case), seed=2)  # the same draw: the notebook's worker passes
    with pytest.raises(
        WorkerCheckError,
        match=r"put --out back as it was at epoch \d, \d steps done.*resume from the position "
        r"the checkpoint holds",
    ):
        check_worker(_solution(case, (_READ_CHECKPOINT, _SNOOP)), seed=2)


@pytest.mark.system
def test_the_checker_rejects_a_sampler_sharded_over_the_world(case):
    """Guards: a sampler over WORLD_SIZE instead of the DP replicas (ezpz's dp_group=None
    pitfall) gives each replica a sixth of the data; the ledger check must say so."""
    worker = _solution(case, ("num_replicas=layout.dp_size,", "num_replicas=WORLD_SIZE,"))
    worker.write_text(worker.read_text().replace("rank=layout.dp_rank,", "rank=RANK,"))
    with pytest.raises(WorkerCheckError, match=r"(?s)2 node.*data problem.*never_seen"):
        check_worker(worker, seed=5)


# A rank of the crash plan's tests: fault.py alone (no torch: it starts in a blink), six steps
# of epoch 0; rank 0 saves position k+1 at the end of each odd step k (and a file of its own);
# each rank appends each step to its ledger file and prints what it sees of the checker.
_RANK = """\
import importlib.util, json, os, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("fault", {fault!r})
fault = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fault)
fault.RANK_WAIT_S = float(sys.argv[3])
rank, out = int(sys.argv[1]), Path(sys.argv[2])
for step in range(6):
    if step == int(sys.argv[4]):  # a step it comes to late: 4 times the test's WAIT_S
        time.sleep(4.0)
    if step != int(sys.argv[5]):  # a step it skips
        fault.at_step(rank, 0, step)
    gate = Path(os.environ[fault.ENV])
    seen = sorted(os.listdir(gate.parent))
    print(step, *seen, *sorted(k for k in os.environ if "EZPZ" in k), flush=True)
    with open(out / "attempt0" / f"rank{{rank}}.jsonl", "a") as ledger:
        ledger.write(f"{{step}}\\n")
    if rank == 0 and step % 2:
        (out / "checkpoint.json").write_text(json.dumps({{"steps": step + 1}}))
        (out / f"saved{{step + 1}}.json").write_text("{{}}")
"""


def _ranks(tmp_path: Path, env, ranks, wait_s: float = 120.0, late: int = -1, skip: int = -1):
    script = tmp_path / "rank.py"
    script.write_text(_RANK.format(fault=fault.__file__))
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(r),
                str(tmp_path / "out"),
                str(wait_s),
                str(late),
                str(skip),
            ],
            # Only the checker's variable of ezpz_nb's: the run's own (EZPZ_NB_PRELOAD, set
            # for the test run by conftest.py) is not what this test counts.
            env={**{k: v for k, v in os.environ.items() if "EZPZ" not in k}, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in ranks
    ]


def _steps(proc: subprocess.Popen) -> tuple[list[int], str]:
    """The steps a rank went through (each seeing the socket alone and the one variable),
    and what it said on stderr."""
    out, err = proc.communicate(timeout=60)
    lines = [ln.split() for ln in out.splitlines()]
    assert all(ln[1:] == ["s", fault.ENV] for ln in lines), lines
    return [int(ln[0]) for ln in lines], err


def test_the_checker_kills_the_planned_rank_from_outside_after_putting_back_the_kept_folder(
    tmp_path,
):
    """Guards issue 45's eighth trial and the helper brief H1 of session 8: a worker that never
    read its checkpoint passed, first working the restart's position out from the crash, then
    reading the plan (kept step included) from /proc/self/environ or the module the recorder
    held it in. The plan now stays in the checker: each rank only says "rank R reached step s"
    and waits for a go, the same at every step, and sees nothing but the socket (its folder
    holds nothing else) and the one variable naming it. At the kept step (0, 3) every rank is
    there and the folder is read; at the crash step (0, 5), every rank there, the folder is
    put back (checkpoint of position 2 again, the file saved since gone, the ledgers as they
    are) and rank 1 is killed with SIGKILL from outside (it printed nothing about it), while
    ranks 0 and 2 are held there; a rank started after the crash is free to run every step;
    when the checker ends, the held ranks stop at once (not at their own deadline)."""
    out = tmp_path / "out"
    (out / "attempt0").mkdir(parents=True)
    with crash_plan.CrashPlan((1, 0, 5), out, keep=(0, 3), world=3) as plan:
        first = _ranks(tmp_path, plan.env, range(3))
        steps, err = _steps(first[1])
        assert steps == [0, 1, 2, 3, 4] and first[1].returncode == -signal.SIGKILL
        assert "sent no go" not in err  # killed by the checker, not by itself
        assert plan.crashed and plan.restored
        assert [p.poll() for p in (first[0], first[2])] == [None, None]  # held at step 5
        assert json.loads((out / "checkpoint.json").read_text()) == {"steps": 2}
        assert {p.name for p in out.iterdir()} == {"attempt0", "checkpoint.json", "saved2.json"}
        for r in range(3):
            assert (out / "attempt0" / f"rank{r}.jsonl").read_text().split() == list("01234")
        again = _ranks(tmp_path, plan.env, [1])[0]  # torchrun's restart of rank 1
        assert _steps(again)[0] == [0, 1, 2, 3, 4, 5] and again.returncode == 0
    for held in (first[0], first[2]):
        steps, err = _steps(held)
        assert steps == [0, 1, 2, 3, 4] and held.returncode == -signal.SIGKILL
        assert "the checker sent no go for epoch 0 step 5" in err


def test_a_step_not_every_rank_reaches_goes_on_after_a_bounded_wait(tmp_path, monkeypatch):
    """Guards the checker's bounded waits: a step not every rank reaches goes on after WAIT_S;
    if it is the kept step nothing is kept, so the crash puts nothing back (the checker then
    expects the last position saved), and with a rank missing at the crash step the rank to
    kill is killed there all the same."""
    monkeypatch.setattr(crash_plan, "WAIT_S", 1.0)
    out = tmp_path / "out"
    (out / "attempt0").mkdir(parents=True)
    with crash_plan.CrashPlan((0, 0, 5), out, keep=(0, 3), world=2) as plan:
        first, other = _ranks(tmp_path, plan.env, [0]) + _ranks(tmp_path, plan.env, [1], late=3)
        assert [first.stdout.readline().split()[0] for _ in range(4)] == list("0123")
        # Rank 0 went past the kept step without rank 1: from now on rank 1 is waited for.
        monkeypatch.setattr(crash_plan, "WAIT_S", 60.0)
        assert _steps(first)[0] == [4] and first.returncode == -signal.SIGKILL
        assert plan.crashed and not plan.restored  # rank 1 was not at the kept step
        assert json.loads((out / "checkpoint.json").read_text()) == {"steps": 4}
    assert _steps(other)[0] == [0, 1, 2, 3, 4] and other.returncode == -signal.SIGKILL
    monkeypatch.setattr(crash_plan, "WAIT_S", 0.3)
    with crash_plan.CrashPlan((0, 0, 5), out, keep=(0, 3), world=2) as plan:
        alone = _ranks(tmp_path, plan.env, [0])[0]  # rank 1 never comes
        assert _steps(alone)[0] == [0, 1, 2, 3, 4] and alone.returncode == -signal.SIGKILL
    assert plan.crashed and not plan.restored


def test_a_step_out_of_turn_is_refused(tmp_path):
    """Guards the plan against a worker that probes it: a rank that skips a step, or claims
    one ahead of its recorder, could reach the crash step (and learn it by dying there)
    without the kept step ever having every rank, so that nothing is put back. Each rank's
    steps must come one after the other from (0, 0), from one process: a step out of turn,
    or a rank that another process steps, is refused, and that rank stops saying why."""
    out = tmp_path / "out"
    (out / "attempt0").mkdir(parents=True)
    with crash_plan.CrashPlan((0, 1, 5), out, keep=(1, 3), world=1) as plan:
        skipper = _ranks(tmp_path, plan.env, [0], skip=2)[0]
        steps, err = _steps(skipper)
        assert steps == [0, 1, 2] and skipper.returncode == -signal.SIGKILL
        assert "the checker refused epoch 0 step 3" in err
        second = _ranks(tmp_path, plan.env, [0])[0]  # rank 0 again, from another process
        steps, err = _steps(second)
        assert steps == [] and "the checker refused epoch 0 step 0" in err
        assert not plan.crashed


def test_a_rank_whose_checker_never_answers_stops_at_its_own_deadline(tmp_path):
    """Guards the rank's bounded wait: a checker that took the rank's step and never answers
    (hung) leaves it waiting RANK_WAIT_S at most; then it says so and stops."""
    (tmp_path / "out" / "attempt0").mkdir(parents=True)
    gate = tmp_path / "gate" / "s"
    gate.parent.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(str(gate))
        mute.listen(4)
        rank = _ranks(tmp_path, {fault.ENV: str(gate)}, [0], wait_s=0.5)[0]
        steps, err = _steps(rank)
        assert steps == [] and rank.returncode == -signal.SIGKILL
    assert "the checker sent no go for epoch 0 step 0" in err


@pytest.mark.system
def test_an_elastic_restart_resumes_the_data_exactly_once(case):
    """Guards: issue 28's restart. A rank killed mid-epoch between checkpoints with
    --max-restarts=1: the job succeeds, the steps after the checkpoint are replayed, and
    every sample is counted once per epoch."""
    out = case / "out"
    run = torchrun(
        _solution(case), "--out", str(out), "--checkpoint-every", "2", "--kill", "1:1:3",
        nproc_per_node=2, max_restarts=1, echo=False,
    )  # fmt: skip
    run.raise_for_status()
    got = load_attempts(out)
    assert got.resumed == [(0, 0, 0), (1, 1, 2)]
    assert {(r.epoch, r.step) for r in got.replayed.records} >= {(1, 2)}
    assert got.exactly_once()


def _report(root: str, other: str) -> str:
    """torchrun's failure report, in its layout, with ``root`` named as the root cause."""
    line, dash = "=" * 60, "-" * 60
    return f"{line}\ntiny.py FAILED\n{dash}\nFailures:\n{other}\n{dash}\nRoot Cause (first observed failure):\n{root}\n{line}\n"


def _entry(n: int, rank: int, exit_: str, error: str) -> str:
    return (
        f"[{n}]:\n  time      : 2026-12-04_09:31:32\n  rank      : {rank} (local_rank: {rank})\n"
        f"  exitcode  : {exit_}\n  traceback : Traceback (most recent call last):\n"
        f'    File "tiny.py", line 10, in main\n  {error}\n  '
    )


RAISED = _entry(0, 1, "1 (pid: 2)", "ValueError: rank failed on purpose")
LOST = _entry(
    1, 0, "1 (pid: 1)", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1"
)


@pytest.mark.parametrize("root, other", [(RAISED, LOST), (LOST, RAISED)], ids=["torchrun", "tie"])
def test_the_root_cause_is_the_rank_that_raised_not_the_one_that_lost_its_peer(root, other):
    """Guards the report naming rank 0's "Connection closed by peer": torchrun's root cause is
    the earliest failure to the second, and the rank that lost its peer often ties with the
    rank that raised. Either way the error names rank 1 and its ValueError first."""
    run = AgentRun([["torchrun"]], returncodes=[1], output=[_report(root, other)])
    cause = run.root_cause()
    assert re.match(r"(?s)[^\[]*\[\d\]:.*rank\s*: 1 .*ValueError: rank failed on purpose", cause)
    assert "Connection closed" not in cause


CHATTY = """\
import os, sys
for i in range(300):
    sys.stdout.write(f"rank {os.environ['RANK']} line {i} end\\n")
"""


@pytest.mark.system
def test_lines_of_ranks_sharing_a_pipe_arrive_whole(case):
    """Guards "rankrank 0 sum 2" (a CI failure): torchrun runs workers with python -u, so
    print("rank", r, ...) wrote each piece in its own system call and the two ranks of a
    node, sharing the agent's pipe, interleaved mid-line. A line written in one call
    arrives whole, and the runner loses none."""
    worker = case / "chatty.py"
    worker.write_text(CHATTY)
    run = torchrun(worker, nproc_per_node=2, echo=False)
    assert run.ok, run.output
    got = run.lines(r"line \d+")
    assert len(got) == 600
    assert all(re.fullmatch(r"rank [01] line \d+ end\n?", ln) for ln in got), got[:5]


_ROUND = re.compile(r"rank (\d+) .* attempt (\d+) .* restart_count (\d+)")


@pytest.mark.system
def test_a_membership_change_restart_resumes_though_the_agents_counts_disagree(case):
    """Guards: issue 34. Two nodes of one rank; rank 1 dies and rank 0 blocks (as an NCCL
    rank in a collective does). Node 1's agent restarts on the failure (its count 1), node
    0's on the membership change (its count stays 0). The worker keys the attempt on what
    rank 0 decides and takes a new store per round, so the second round joins, resumes
    from the checkpoint, and every sample counts once."""
    out = case / "out"
    run = torchrun(
        _solution(case), "--out", str(out), "--checkpoint-every", "2", "--kill", "1:1:3",
        "--others-block", "--timeout", "20", nnodes=2, max_restarts=1, echo=False,
    )  # fmt: skip
    run.raise_for_status()
    rounds = {(int(m[1]), int(m[2])): int(m[3]) for ln in run.lines() if (m := _ROUND.search(ln))}
    assert rounds.keys() == {(0, 0), (1, 0), (0, 1), (1, 1)}, rounds
    # The killed rank's agent counted its restart; rank 0's agent (the same one in both
    # rounds: the same agents sort the same way) restarted for the membership change.
    assert (rounds[0, 1], rounds[1, 1]) == (0, 1), f"counts (rank, attempt): {rounds}"
    got = load_attempts(out)
    assert got.resumed == [(0, 0, 0), (1, 1, 2)]
    assert got.exactly_once()


@pytest.mark.system
def test_the_worker_refuses_restarts_on_torchruns_shared_store(case, monkeypatch):
    """Guards: issue 34. With --max-restarts and torchrun's default store (one for the whole
    job, still holding the last round's keys after a restart), the worker must refuse at
    startup and say which variable to set, not fail later in init_process_group."""
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    argv = torchrun_argv(_solution(case), "--out", str(case / "out"), max_restarts=1)
    run = run_agents([argv], echo=False)
    assert not run.ok
    assert run.lines("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"), run.diagnosis()
    assert not (case / "out").exists()  # refused before anything was written


@pytest.mark.system
def test_the_worker_refuses_to_start_over_when_rank_0_finds_no_trace_after_a_restart(case):
    """Guards: issue 34, the node replacement. Rank 0 reads the checkpoint; after a node is
    replaced it can be on another node, whose disk holds nothing of the job, and the job would
    silently start over. Stood in for here by the dying rank taking `--out` with it: in the
    second round every rank must refuse, say where `--out` must live, and write nothing."""
    out = case / "out"
    wipe_then_die = (
        "os.kill(os.getpid(), signal.SIGKILL)",
        "__import__('shutil').rmtree(args.out); os.kill(os.getpid(), signal.SIGKILL)",
    )
    run = torchrun(
        _solution(case, replace=wipe_then_die), "--out", str(out), "--checkpoint-every", "2",
        "--kill", "1:1:3", "--others-block", "--timeout", "20", nnodes=2, max_restarts=1,
        echo=False,
    )  # fmt: skip
    assert not run.ok, "the job started over with no trace of its first attempt"
    refusals = run.lines(r"finds no trace of this job in .* Put --out on storage every node")
    assert refusals, run.diagnosis()
    assert not out.exists(), f"written after the refusal: {sorted(out.rglob('*'))}"
