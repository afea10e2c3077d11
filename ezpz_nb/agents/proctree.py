"""The processes under torchrun agents, and how to stop all of them.

torchrun starts each rank in a session of its own (``start_new_session=True``), so
killing an agent's process group does not reach its ranks, and a rank whose agent
was killed lives on, reparented away from the agent. Two records find them all:

* a token in the environment (:data:`TOKEN_VAR`): every process the agents start
  inherits it, however deep and wherever it was reparented (:func:`marked`);
* the process tree below the agents, sampled while they run
  (:func:`descendants`), for a process that replaced its environment.

Both keep each process's start time, so a pid the system reused for another
process is never signalled. :func:`stop` asks the agents to stop their ranks
(SIGTERM), then kills whatever is still alive. Both records read ``/proc``
(Linux); elsewhere only the agents themselves are signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence

__all__ = ["GRACE_S", "TOKEN_VAR", "descendants", "marked", "stop"]

#: How long agents get to stop their ranks after SIGTERM before SIGKILL.
GRACE_S = 5.0
#: The environment variable that carries one job's token to all its processes.
TOKEN_VAR = "EZPZ_NB_AGENTS_TOKEN"


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


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc: not Linux
        return []


def marked(token: str, var: str = TOKEN_VAR) -> dict[int, int]:
    """``{pid: start time}`` of every live process whose environment holds ``var=token``.

    Zombies are not live. ``var`` lets another tool mark its own process trees the same
    way (benchmarks/_procs.py tags each measurement).
    """
    needle = f"{var}={token}".encode()
    found = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        st = _stat(pid)
        if needle in env and st is not None:
            found[pid] = st[1]
    return found


def descendants(roots: Sequence[int]) -> dict[int, int]:
    """``{pid: start time}`` of every process below ``roots`` (empty without /proc)."""
    tree: dict[int, list[tuple[int, int]]] = {}
    for pid in _pids():
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


def stop(procs: Sequence[subprocess.Popen[bytes]], seen: dict[int, int], token: str) -> None:
    """Stop agents politely (SIGTERM: torchrun stops its ranks), then kill what is left.

    Args:
        procs: The agents.
        seen: Processes seen below them while they ran (pid: start time).
        token: The job's :data:`TOKEN_VAR` value.
    """
    running = [p for p in procs if p.poll() is None]
    seen.update(descendants([p.pid for p in procs]))
    _signal([p.pid for p in running], signal.SIGTERM)
    end = time.monotonic() + GRACE_S
    for p in running:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    left = {pid: t for pid, t in seen.items() if _alive(pid, t)} | marked(token)
    left = {pid: t for pid, t in left.items() if pid != os.getpid()}
    _signal([p.pid for p in procs if p.poll() is None] + list(left), signal.SIGKILL)
    for p in procs:
        p.wait()
    # Ranks are not our children: wait (briefly) until the kernel has removed them.
    deadline = time.monotonic() + GRACE_S
    while any(_alive(pid, t) for pid, t in left.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
