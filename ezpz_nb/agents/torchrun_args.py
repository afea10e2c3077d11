"""A torchrun agent's command line: built as a learner would type it, checked before it runs.

* :func:`torchrun_argv`: one agent's command (``python -m torch.distributed.run ...``).
* :func:`refuse_bad_input`: what torchrun itself does not check, checked before any
  process starts: agents that disagree on ``--nnodes``, a worker file that does not
  compile, a rendezvous port that something else holds.
"""

from __future__ import annotations

import ast
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from ezpz_nb.agents.result import AgentError

__all__ = [
    "RDZV_HOST",
    "AgentError",
    "check_worker_file",
    "free_port",
    "local_endpoint",
    "refuse_bad_input",
    "torchrun_argv",
]

#: Where the agents on this machine meet (the c10d rendezvous): the loopback address,
#: which every platform has whatever it names its interfaces.
RDZV_HOST = "127.0.0.1"
_LOCAL_HOSTS = (RDZV_HOST, "localhost")


def local_endpoint() -> str:
    """``host:port`` of a rendezvous on this machine, at a port free right now."""
    return f"{RDZV_HOST}:{free_port()}"


def free_port(host: str = RDZV_HOST) -> int:
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
            f"--rdzv-endpoint={endpoint or local_endpoint()}",
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
    """Refuse a worker file that is missing, does not compile, or defines a function twice.

    A function defined twice at the top level is what running one ``%%writefile -a``
    cell twice leaves (the cell appends again); the later copy would silently win.

    Raises:
        AgentError: What is wrong, naming the line, and what to do.
    """
    path = Path(path)
    if not path.is_file():
        raise AgentError(
            f"worker file {path} does not exist: run the %%writefile cells above first "
            "(they write it beside the notebook)"
        )
    text = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(text, str(path))
    except SyntaxError as exc:
        raise AgentError(
            f"{path}, line {exc.lineno}: {exc.msg}: {(exc.text or '').strip()!r}. Every rank would "
            "die on it at once; fix that line in the %%writefile cell that writes it, run the "
            "cell again, then this one. No process was started."
        ) from None
    first: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in first:
                raise AgentError(
                    f"{path} defines {node.name}() twice (lines {first[node.name]} and "
                    f"{node.lineno}): a %%writefile -a cell ran twice and appended again. Run "
                    "the %%writefile cells once more from the first one (it starts the file "
                    "anew), in order. No process was started."
                )
            first[node.name] = node.lineno


def refuse_bad_input(commands: Sequence[Sequence[str]]) -> None:
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
    endpoints = {ep for c in commands if (ep := _option(c, "rdzv-endpoint")) is not None}
    if len(endpoints) > 1:
        raise AgentError(
            f"the agents name different rendezvous endpoints {sorted(endpoints)}: every node "
            "must name the same --rdzv-endpoint (the first node's host and a free port)"
        )
    for ep in endpoints:
        host, _, port = ep.rpartition(":")
        if host in _LOCAL_HOSTS and port.isdigit() and _port_in_use(host, int(port)):
            # Measured: torchrun then connects to whatever listens there as a client and
            # waits; join_timeout and read_timeout do not end that wait.
            raise AgentError(
                f"port {port} on {host} is already in use, so torchrun could not serve the "
                "rendezvous there (it would connect to whatever listens and wait, with no "
                "timeout). Pick a free port (ezpz_nb.agents.free_port()) or stop the "
                "program that holds it. No process was started."
            )
