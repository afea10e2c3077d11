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
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ezpz_nb.errors import EzpzError

__all__ = ["AgentError", "AgentRun", "free_port", "run_agents", "torchrun", "torchrun_argv"]

#: How long agents get to stop their ranks after SIGTERM before SIGKILL.
GRACE_S = 5.0
_LOCAL_HOSTS = ("127.0.0.1", "localhost")
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


class AgentError(EzpzError):
    """A torchrun job started from the notebook was refused, failed, or was stopped.

    Attributes:
        run: What the agents did (output, exit statuses), or ``None`` when the job
            was refused before any process started.
    """

    def __init__(self, message: str, run: AgentRun | None = None) -> None:
        super().__init__(message)
        self.run = run


@dataclass
class AgentRun:
    """What a set of torchrun agents did.

    Attributes:
        commands: Each agent's command line.
        returncodes: Each agent's exit status (negative: killed by that signal).
        output: Each agent's stdout and stderr, interleaved as written.
        elapsed_s: Seconds from the first start to the last exit.
        stopped: Why the agents were stopped early ("deadline", "interrupt"), or "".
    """

    commands: list[list[str]]
    returncodes: list[int | None] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    stopped: str = ""

    @property
    def ok(self) -> bool:
        """True when every agent exited 0 on its own."""
        return not self.stopped and all(rc == 0 for rc in self.returncodes)

    def diagnosis(self) -> str:
        """One plain paragraph: how the job ended and what to do about it."""
        text = "\n".join(self.output)
        if self.stopped:
            return f"stopped ({self.stopped}) after {self.elapsed_s:.1f} s; every agent and rank killed"
        if self.ok:
            return f"every agent exited 0 ({len(self.commands)} node(s), {self.elapsed_s:.1f} s)"
        if "RendezvousTimeoutError" in text:
            return (
                "the rendezvous gave up: not every node joined within --rdzv-conf join_timeout, "
                "so the agents that came exited without starting any rank. Start every node "
                "(same --nnodes, --rdzv-endpoint and --rdzv-id), or raise join_timeout when "
                "nodes start far apart (a queue that starts them one by one)."
            )
        if "RendezvousConnectionError" in text or "DistNetworkError" in text:
            return (
                "an agent could not talk to the rendezvous store at --rdzv-endpoint: check that "
                "the endpoint host runs an agent and that its port is free and reachable."
            )
        cause = self.root_cause()
        if cause:
            return "a rank failed, so torchrun stopped the job; its report:\n" + cause
        return f"agents exited with {self.returncodes}; see their output"

    def root_cause(self) -> str:
        """torchrun's "Root Cause" block for a failed rank (rank, exit code, traceback), or ""."""
        for out in self.output:
            head, found, tail = out.partition("Root Cause (first observed failure):")
            if found:
                block = tail.split("=" * 20)[0] if "=" * 20 in tail else tail
                return "Root Cause (first observed failure):" + block.rstrip()
        return ""

    def raise_for_status(self) -> AgentRun:
        """Return this run if it went well, else raise :class:`AgentError` saying why."""
        if not self.ok:
            raise AgentError(self.diagnosis(), self)
        return self

    def lines(self, pattern: str = "") -> list[str]:
        """Every agent's output lines that match the regular expression ``pattern``."""
        return [ln for out in self.output for ln in out.splitlines() if re.search(pattern, ln)]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def torchrun_argv(
    script: str | Path,
    *script_args: str,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    endpoint: str | None = None,
    rdzv_id: str = "ezpz-nb",
    node_rank: int | None = None,
    max_restarts: int = 0,
    join_timeout_s: float = 10,
    read_timeout_s: float = 10,
    log_dir: str | Path | None = None,
    tee: str | None = None,
    local_ranks_filter: str | None = None,
) -> list[str]:
    """One torchrun agent's command line: ``python -m torch.distributed.run ... script``.

    With ``nnodes == 1`` and no ``endpoint`` it is ``--standalone`` (torchrun
    picks a free port itself); otherwise a c10d rendezvous at ``endpoint``, the
    command every node of a job runs. ``--rdzv-conf`` bounds the rendezvous:
    ``join_timeout`` is how long an agent waits for the others to join,
    ``read_timeout`` how long a call to the rendezvous store may take.
    """
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and endpoint is None:
        argv.append("--standalone")
    else:
        argv += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint or f'127.0.0.1:{free_port()}'}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf=join_timeout={join_timeout_s:g},read_timeout={read_timeout_s:g}",
        ]
    if node_rank is not None:
        argv.append(f"--node-rank={node_rank}")
    # A short monitor interval: torchrun notices a dead rank within 0.5 s, not 5.
    argv += [f"--max-restarts={max_restarts}", "--monitor-interval=0.5"]
    if log_dir is not None:
        argv.append(f"--log-dir={log_dir}")
    if tee is not None:
        argv.append(f"--tee={tee}")
    if local_ranks_filter is not None:
        argv.append(f"--local-ranks-filter={local_ranks_filter}")
    return [*argv, str(script), *script_args]


def _option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``--name=V`` / ``--name V`` (either spelling, - or _)."""
    names = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _script(argv: Sequence[str]) -> Path | None:
    """The worker file of a torchrun command: the first ``*.py`` after the launcher."""
    for arg in (
        argv[argv.index("torch.distributed.run") + 1 :]
        if "torch.distributed.run" in argv
        else argv[1:]
    ):
        if arg.endswith(".py") and not arg.startswith("-"):
            return Path(arg)
    return None


def check_worker_file(path: str | Path) -> None:
    """Refuse a worker file that is missing or does not compile, naming the line.

    Raises:
        AgentError: The file is missing or has a syntax error.
    """
    path = Path(path)
    if not path.is_file():
        raise AgentError(
            f"worker file {path} does not exist: run the %%writefile cells above first "
            "(they write it beside the notebook)"
        )
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except SyntaxError as exc:
        raise AgentError(
            f"{path}, line {exc.lineno}: {exc.msg}: {(exc.text or '').strip()!r}. Every rank would "
            "die on it at once; fix that line in the %%writefile cell that writes it, run the "
            "cell again, then this one. No process was started."
        ) from None


def _refuse_bad_input(commands: Sequence[Sequence[str]]) -> None:
    """Check what torchrun itself does not, before any process starts."""
    if not commands:
        raise AgentError("no agent to start: give at least one torchrun command")
    scripts = {_script(c) for c in commands}
    for script in scripts:
        if script is not None:
            check_worker_file(script)
    nnodes = [_option(c, "nnodes") or "1" for c in commands]
    if len(set(nnodes)) > 1:
        # Measured with torch 2.13: agents started with --nnodes=2 and --nnodes=3 at
        # one endpoint ran the job with 2 nodes and no warning.
        raise AgentError(
            f"the agents disagree on --nnodes ({', '.join(nnodes)}): torchrun does not check "
            "this; whichever agent completes the rendezvous first decides how many nodes run. "
            "Give every node the same --nnodes. No process was started."
        )
    endpoints = {_option(c, "rdzv-endpoint") for c in commands} - {None}
    if len(endpoints) > 1:
        raise AgentError(f"the agents name different rendezvous endpoints {sorted(endpoints)}")
    for ep in endpoints:
        host, _, port = str(ep).rpartition(":")
        if host in _LOCAL_HOSTS and port.isdigit() and _port_in_use(host, int(port)):
            # Measured: torchrun then connects to whatever listens there as a client and
            # waits; join_timeout and read_timeout do not end that wait.
            raise AgentError(
                f"port {port} on {host} is already in use, so torchrun could not serve the "
                "rendezvous there (it would connect to whatever listens and wait, with no "
                "timeout). Pick a free port (ezpz_nb.examples.agents.free_port()) or stop the "
                "program that holds it. No process was started."
            )


def _stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, start time)`` of ``pid`` from /proc, or None if it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(")")[2].split()
        if fields[0] == "Z":  # exited, waiting to be reaped: nothing left to stop
            return None
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(roots: Sequence[int]) -> dict[int, int]:
    """``{pid: start time}`` of every process below ``roots`` (empty without /proc)."""
    tree: dict[int, list[tuple[int, int]]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        st = _stat(pid)
        if st is not None:
            tree.setdefault(st[0], []).append((pid, st[1]))
    found: dict[int, int] = {}
    todo = list(roots)
    while todo:
        for child, started in tree.get(todo.pop(), []):
            if child not in found:
                found[child] = started
                todo.append(child)
    return found


def _alive(pid: int, started: int) -> bool:
    """True while the process ``pid`` that started at ``started`` runs (a reused pid is not it)."""
    st = _stat(pid)
    return st is not None and st[1] == started


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _relay(node: int, stream: object, out: queue.Queue[tuple[int, str | None]]) -> None:
    for line in iter(stream.readline, ""):  # type: ignore[attr-defined]
        out.put((node, line))
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
    gets SIGTERM, which makes torchrun stop its ranks; after :data:`GRACE_S`
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
    _refuse_bad_input(commands)
    run = AgentRun([list(c) for c in commands])
    tmp = tempfile.mkdtemp(prefix="ezpz-agents-")
    child_env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    child_env.update(TMPDIR=tmp, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **(env or {}))
    lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
    procs: list[subprocess.Popen[str]] = []
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
                text=True,
                env={**child_env, **own},
                cwd=cwd,
                start_new_session=True,  # an interrupt of the kernel is not sent to them
            )
            procs.append(proc)
            threading.Thread(target=_relay, args=(i, proc.stdout, lines), daemon=True).start()
        open_streams = len(procs)
        while open_streams:
            left = start + timeout_s - time.monotonic()
            if left <= 0:
                run.stopped = "deadline"
                break
            if time.monotonic() - scanned > 0.25:
                seen.update(_descendants([p.pid for p in procs]))
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
                print(f"[node {node}] {line}" if len(commands) > 1 else line, end="", flush=True)
    except KeyboardInterrupt:
        run.stopped = "interrupt"
        raise
    finally:
        _stop(procs, seen)
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


def _stop(procs: Sequence[subprocess.Popen[str]], seen: dict[int, int]) -> None:
    """Stop agents politely (SIGTERM: torchrun stops its ranks), then kill what is left."""
    running = [p for p in procs if p.poll() is None]
    seen.update(_descendants([p.pid for p in procs]))
    _signal([p.pid for p in running], signal.SIGTERM)
    end = time.monotonic() + GRACE_S
    for p in running:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    left = [pid for pid, started in seen.items() if _alive(pid, started)]
    _signal([p.pid for p in procs if p.poll() is None] + left, signal.SIGKILL)
    for p in procs:
        p.wait()
        if p.stdout is not None:
            p.stdout.close()
    # Ranks are not our children: wait (briefly) until the kernel has removed them.
    deadline = time.monotonic() + GRACE_S
    while any(_alive(pid, seen[pid]) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)


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
    """
    nodes = list(range(nnodes)) if start_nodes is None else list(start_nodes)
    endpoint = None if nnodes == 1 else f"127.0.0.1:{free_port()}"
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
    return run_agents(commands, timeout_s=timeout_s, echo=echo, node_envs=envs)
