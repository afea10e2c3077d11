"""Processes by PID under /proc: alive, parent, signal, and those of one Slurm cluster.

The local cluster stops what it started by PID, never by name: other Slurm daemons or
jobs on the machine are not its own. Its job steps are found by the ``SLURM_CONF`` they
inherited (:func:`processes_of`).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["alive", "parent", "processes_of", "send"]


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, is not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def parent(pid: int) -> int:
    """``pid``'s parent, or 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def send(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid`` if it still exists."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def processes_of(conf: Path) -> list[int]:
    """PIDs whose environment names ``conf`` as SLURM_CONF: a job's steps and ranks, daemons."""
    needle = f"SLURM_CONF={conf}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return [p for p in found if alive(p)]
