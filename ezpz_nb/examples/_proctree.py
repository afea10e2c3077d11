"""The process tree under torchrun agents, and how to stop all of it.

torchrun starts each rank in a session of its own (``start_new_session=True``), so
killing an agent's process group does not reach its ranks, and a rank whose agent
was killed lives on. :func:`descendants` records every process below the agents
while they run (with its start time, so that a reused pid is never mistaken for a
rank); :func:`stop` asks the agents to stop their ranks (SIGTERM), then kills
whatever of that record is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence

__all__ = ["GRACE_S", "descendants", "stop"]

#: How long agents get to stop their ranks after SIGTERM before SIGKILL.
GRACE_S = 5.0


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


def descendants(roots: Sequence[int]) -> dict[int, int]:
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


def stop(procs: Sequence[subprocess.Popen[str]], seen: dict[int, int]) -> None:
    """Stop agents politely (SIGTERM: torchrun stops its ranks), then kill what is left."""
    running = [p for p in procs if p.poll() is None]
    seen.update(descendants([p.pid for p in procs]))
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
