"""Start real torchrun agents from a notebook cell, bounded in time, and leave nothing behind.

Notebook 14 runs the learner's worker file the way a cluster does: one torchrun
agent per node, each starting its ranks. Here the "nodes" are agents on this
machine that meet in a c10d rendezvous on 127.0.0.1, so every torchrun option
(``--nnodes``, ``--rdzv-conf``, ``--max-restarts``, ``--log-dir``, ``--tee``...) is
exercised for real.

* :func:`torchrun_argv`: one agent's command line, as a learner would type it.
* :func:`run_agents`: start agents, relay their output to the cell line by line,
  stop them at a deadline or on an interrupt, and remove the temporary folder they
  use (torchrun's ``torchelastic_*`` files). Bad input is refused before any
  process starts.
* :func:`torchrun`: both together for one job of ``nnodes`` simulated nodes.

Cleanup matters because torchrun starts each rank in a session of its own
(``start_new_session=True``): killing an agent's process group does not reach
its ranks. An agent stopped with SIGTERM stops its ranks itself; whatever is
still alive a few seconds later (an agent that hung, its ranks) is found through
the process tree recorded while the job ran and killed with SIGKILL.
"""

from __future__ import annotations

import os
import queue
import select
import shutil
import subprocess
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from ezpz_nb.agents.proctree import TOKEN_VAR, descendants, stop
from ezpz_nb.agents.result import AgentError, AgentRun
from ezpz_nb.agents.torchrun_args import (
    check_worker_file,
    free_port,  # re-exported: notebook 14 imports it from here
    local_endpoint,
    refuse_bad_input,
    torchrun_argv,
)
from ezpz_nb.wrapping import wrap_message

_SITE = sysconfig.get_paths()["purelib"]

__all__ = [
    "AgentError",
    "ROUND_STORE",
    "AgentRun",
    "check_worker_file",
    "free_port",
    "run_agents",
    "torchrun",
    "torchrun_argv",
]

#: What :func:`torchrun` sets for its agents: every rendezvous round gives its ranks
#: a new store (MASTER_PORT), served by global rank 0. torchrun's default, one store
#: kept by the agents for the whole job, still holds the last round's keys after a
#: restart (pytorch issue 135712).
ROUND_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

# Variables a launcher sets per process: inherited from a notebook started under
# torchrun (or left by an earlier cell), they would misdirect the agents' ranks.
_RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
)


def _fit(line: str) -> str:
    """``line`` as a cell shows it: within the output area, broken between words.

    torch's agents print lines wider than a notebook's output (a C++ trace, or a Python
    traceback of its own, when a rendezvous store closes as the other agent leaves), and
    a traceback's file path is one word longer than a line: the site-packages folder is
    shown as ``.../site-packages`` (``run.output`` keeps the line as written).
    """
    return wrap_message(line.rstrip("\n").replace(_SITE, ".../site-packages"))


def _relay(
    node: int, fd: int, out: queue.Queue[tuple[int, str | None]], done: threading.Event
) -> None:
    """Put each line read from ``fd`` on ``out``; ``None`` at the end of the stream.

    Reads with a poll so that ``done`` ends it even while something that outlived its
    agent still holds the pipe open (a blocking read would wait for that process).
    """
    pending = b""
    while not done.is_set():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *complete, pending = (pending + chunk).split(b"\n")
        for line in complete:
            out.put((node, line.decode(errors="replace") + "\n"))
    if pending:
        out.put((node, pending.decode(errors="replace")))
    out.put((node, None))


def run_agents(
    commands: Sequence[Sequence[str]],
    *,
    timeout_s: float = 60,
    echo: bool = True,
    env: dict[str, str] | None = None,
    node_envs: Sequence[dict[str, str]] | None = None,
    cwd: str | Path | None = None,
) -> AgentRun:
    """Start torchrun agents (one per simulated node), relay their output, clean up.

    Each output line is printed as it comes, as ``[node i] ...``, so a cell shows
    the job live. At ``timeout_s`` (or on an interrupt of the cell) every agent
    gets SIGTERM, which makes torchrun stop its ranks; after 5 s (``GRACE_S``)
    every agent and rank still alive is killed. The agents' temporary folder
    (``TMPDIR``: torchrun's ``torchelastic_*`` files) is removed in every case.

    Args:
        commands: One torchrun command line per agent (see :func:`torchrun_argv`).
        timeout_s: Deadline for the whole job, in seconds.
        echo: Print each output line as it arrives.
        env: Extra environment variables for the agents and their ranks.
        node_envs: More variables, one dict per agent (e.g. each simulated node's
            ``CUDA_VISIBLE_DEVICES``).
        cwd: Working folder of the agents (default: the current one).

    Returns:
        The :class:`AgentRun`; check :attr:`AgentRun.ok` (a failed job is returned,
        not raised: its output is what the notebook looks at).

    Raises:
        AgentError: Bad input (agents that disagree on ``--nnodes``, a worker file
            that does not compile, a rendezvous port in use), before any process
            starts; or the job ran past ``timeout_s`` (after cleanup).
        KeyboardInterrupt: The cell was interrupted (after cleanup).
    """
    refuse_bad_input(commands)
    run = AgentRun([list(c) for c in commands])
    tmp = tempfile.mkdtemp(prefix="ezpz-agents-")
    child_env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    token = uuid.uuid4().hex  # inherited by every process of the job: see proctree
    child_env.update(TMPDIR=tmp, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    child_env[TOKEN_VAR] = token
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen[bytes]] = []
    done = threading.Event()
    relays: list[threading.Thread] = []
    # Every process seen below an agent, with its start time: killed at the end if
    # still alive (ranks live in sessions of their own, and outlive a killed agent).
    seen: dict[int, int] = {}
    scanned = 0.0
    outputs: list[list[str]] = [[] for _ in commands]
    start = time.monotonic()
    try:
        for i, argv in enumerate(commands):
            own = node_envs[i] if node_envs is not None else {}
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**child_env, **own},
                cwd=cwd,
                start_new_session=True,  # an interrupt of the kernel is not sent to them
            )
            procs.append(proc)
            assert proc.stdout is not None
            relays.append(
                threading.Thread(
                    target=_relay, args=(i, proc.stdout.fileno(), lines, done), daemon=True
                )
            )
            relays[-1].start()
        open_streams = len(procs)
        exited_at = None
        while open_streams:
            now = time.monotonic()
            left = start + timeout_s - now
            if left <= 0:
                run.stopped = "deadline"
                break
            # A rank that outlives its agent keeps the agent's output pipe open: once
            # every agent has exited, read what is left for a moment, then stop (the
            # orphan is killed below) rather than wait for the deadline.
            if exited_at is None and all(p.poll() is not None for p in procs):
                exited_at = now
            if exited_at is not None and now - exited_at > 2.0 and lines.empty():
                break
            if time.monotonic() - scanned > 0.25:
                seen.update(descendants([p.pid for p in procs]))
                scanned = time.monotonic()
            try:
                node, line = lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                open_streams -= 1
                continue
            outputs[node].append(line)
            if echo:
                # torch's own lines can be wider than the output area: see _fit.
                shown = f"[node {node}] {line}" if len(commands) > 1 else line
                print(_fit(shown), flush=True)
    except KeyboardInterrupt:
        run.stopped = "interrupt"
        raise
    finally:
        stop(procs, seen, token)
        done.set()  # the relay threads end within 0.2 s; then their pipes are closed
        for thread in relays:
            thread.join(timeout=2)
        while not lines.empty():  # what the agents wrote while they were being stopped
            node, line = lines.get()
            if line is not None:
                outputs[node].append(line)
        for p in procs:
            if p.stdout is not None:
                p.stdout.close()
        run.returncodes = [p.returncode for p in procs]
        run.output = ["".join(o) for o in outputs]
        run.elapsed_s = time.monotonic() - start
        shutil.rmtree(tmp, ignore_errors=True)
    if run.stopped == "deadline":
        raise AgentError(
            f"the job ran past its deadline of {timeout_s:g} s and was stopped (every agent "
            "and rank killed). Look at the last lines above: a rendezvous still waiting for "
            "a node (lower --rdzv-conf join_timeout), or ranks stuck in a collective (lower "
            "the worker's --timeout).",
            run,
        )
    return run


def torchrun(
    script: str | Path,
    *script_args: str,
    nnodes: int = 1,
    nproc_per_node: int = 1,
    start_nodes: Sequence[int] | None = None,
    timeout_s: float = 60,
    echo: bool = True,
    log_dirs: Sequence[str | Path] | None = None,
    node_envs: Sequence[dict[str, str]] | None = None,
    **options: object,
) -> AgentRun:
    """Run ``script`` as ``nnodes`` simulated nodes of ``nproc_per_node`` ranks each.

    One node is ``--standalone``; more nodes are one agent each, meeting in a c10d
    rendezvous on 127.0.0.1 at a free port, each with its own ``--node-rank`` and,
    with ``log_dirs``, its own ``--log-dir``.

    Args:
        script: The worker file.
        script_args: Its own arguments.
        nnodes: Nodes in the job (``--nnodes``).
        nproc_per_node: Ranks per node.
        start_nodes: Which nodes to start (default all): leave one out to see a node
            that never arrives.
        timeout_s: Deadline of the whole job (see :func:`run_agents`).
        echo: Relay the output to the cell.
        log_dirs: One ``--log-dir`` per node.
        node_envs: Extra environment variables, one dict per node.
        options: More keywords of :func:`torchrun_argv` (``max_restarts``, ``tee``,
            ``local_ranks_filter``, ``join_timeout_s``, ``read_timeout_s``).

    Raises:
        AgentError: Bad arguments or bad input (see :func:`run_agents`), before any
            process starts; or the deadline passed.
    """
    nodes = list(range(nnodes)) if start_nodes is None else list(start_nodes)
    for name, value in (("nnodes", nnodes), ("nproc_per_node", nproc_per_node)):
        if not isinstance(value, int) or value < 1:
            raise AgentError(f"{name} must be a positive int, got {value!r}")
    if not nodes or any(n not in range(nnodes) for n in nodes) or len(set(nodes)) < len(nodes):
        raise AgentError(
            f"start_nodes={start_nodes!r}: name distinct nodes among 0..{nnodes - 1} "
            "(leave one out to see a node that never arrives)"
        )
    for name, per_node in (("log_dirs", log_dirs), ("node_envs", node_envs)):
        if per_node is not None and len(per_node) != nnodes:
            raise AgentError(f"{name} needs one entry per node ({nnodes}), got {len(per_node)}")
    endpoint = None if nnodes == 1 else local_endpoint()
    rdzv_id = f"ezpz-nb-{os.getpid()}-{time.monotonic_ns()}"
    commands = [
        torchrun_argv(
            script,
            *script_args,
            nproc_per_node=nproc_per_node,
            nnodes=nnodes,
            endpoint=endpoint,
            rdzv_id=rdzv_id,
            node_rank=n if nnodes > 1 else None,
            log_dir=None if log_dirs is None else log_dirs[n],
            **options,  # type: ignore[arg-type]
        )
        for n in nodes
    ]
    envs = None if node_envs is None else [node_envs[n] for n in nodes]
    return run_agents(commands, timeout_s=timeout_s, echo=echo, env=ROUND_STORE, node_envs=envs)
