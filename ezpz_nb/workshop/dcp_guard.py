"""Notebook 15's checker around the learner's saves: only the checkpoint may hold the state.

:func:`savers` picks the ranks the saves run on (ranks of the check's own, sealed; a warm
cluster passed in, a confined thread) and makes each a child subreaper;
:func:`confined_save` and :func:`confined_load` say why a refusal stopped a save or a load; :func:`left_behind` finds what
a save left running or shared (processes, System V objects), ends it and says so.
:class:`Folders` makes the checkpoints' folders where no other process can find them, and
:func:`only_dcp_files` stops at anything a save left beside DCP's own files (what was
written and taken away before: :mod:`.dcp_watch`).

Why (issue 45's seventh trial): a save wrote the state beside its checkpoint, where it may
write, and a process the notebook started in an earlier cell (outside every rank the check
confines) found it by listing ``/tmp`` and copied it out before the checker removed the
folder; the load read the copy. Now the folders sit under a parent no process may list
(mode ``0o300`` from the start; changing that changes its ``ctime``, which is checked),
each named by 128 random bits; the save ranks are not dumpable (their ``/proc/<pid>/fd``
would name the folder); and before anything else reads a checkpoint, its folder must hold
DCP's files alone, each file the size its metadata says.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop import confine
from ezpz_nb.workshop.dcp_watch import DCP_FILE, IN_THE_CHECKPOINT
from ezpz_nb.workshop.stops import wrong

__all__ = [
    "Folders",
    "confined_load",
    "confined_save",
    "left_behind",
    "only_dcp_files",
    "savers",
]


def savers(
    cluster: Any, world: int, timeout: float, own: contextlib.ExitStack
) -> tuple[Any, list[int], bool]:
    """The ranks the saves run on, their pids, and whether they are sealed (:mod:`.seal`).

    By default a cluster of the checker's own, closed by ``own`` (its ranks sealed for the
    saves, so ended with the check). A warm ``cluster`` passed in (tests: the verdicts
    that need no seal) runs them in a confined thread, unless it is gone or runs a thread
    the learner started earlier (it could write what the saves leave in memory).
    """
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import run_job

    live = cluster if cluster is not None and not cluster.closed else None
    if live is not None:
        ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=live)
        if not any(threads for _, threads in ranks):
            return live, [pid for pid, _ in ranks], False
    fresh = own.enter_context(Cluster(world_size=world, timeout=timeout))
    ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=fresh)
    return fresh, [pid for pid, _ in ranks], True


#: Said after a save that raised where writes are refused (the learner's message first).
_ONLY_THE_CHECKPOINT = (
    "loader_state ran where it may write only inside its checkpoint: a file of its own "
    "(in /tmp, /dev/shm, the notebook's folder), a socket (TCP, UDP or unix) or a program "
    "is refused, from the save and from any code it leaves the rank to run later. The "
    "state must be in the checkpoint: return it from loader_state"
)


def confined_save() -> contextlib.AbstractContextManager[None]:
    """Add what was refused, and why, to a save that raised on a refused write."""
    return confine.refusals_explained(_ONLY_THE_CHECKPOINT)


#: Said after a load that raised where files and sockets are refused.
_ONLY_FROM_THE_CHECKPOINT = (
    "load_loader_state ran where it may write nothing and open no socket (TCP, UDP or unix): "
    "a state kept outside the checkpoint cannot be fetched. The state must be in the "
    "checkpoint: restore it from the state dcp.load hands you"
)


def confined_load() -> contextlib.AbstractContextManager[None]:
    """Add what was refused, and why, to a load that raised on a refused file or socket."""
    return confine.refusals_explained(_ONLY_FROM_THE_CHECKPOINT)


def left_behind(
    pids: list[int],
    before: tuple[dict[int, str], dict[Any, int]],
    reap: Callable[[list[int]], Any],
) -> None:
    """Stop at what the saves left below the save ranks (processes, System V shared memory
    or message queues, which Landlock does not cover); end it first, and ``reap`` (on the
    ranks) the processes ended and those that had exited."""
    left = confine.end_below(pids, set(before[0]))
    dead = [p for p in confine.processes_below(pids, zombies=True) if p not in before[0]]
    if dead:
        reap(dead)
    ours = {*pids, *left}
    ipc = [k for k, pid in confine.ipc_objects().items() if k not in before[1] and pid in ours]
    for kind, ident in ipc:
        confine.remove_ipc(kind, ident)
    named = [f"pid {p}: {c[:60]}" for p, c in sorted(left.items())[:3]]
    named += [f"System V {kind} {ident}" for kind, ident in ipc[:3]]
    if named:
        raise wrong(
            f"the saves left {'; '.join(named)} behind (ended now). What outlives the save "
            "holds the state outside the checkpoint: the state must be in the checkpoint, "
            "and loader_state must start nothing and share nothing"
        )


class Folders:
    """The check's checkpoint folders: each named by 128 random bits, under one parent that
    no process may list from the moment it exists (``0o300``: the checker, which knows the
    names, goes in without listing). A process outside the check finds no folder unless it
    changes the parent's mode, which changes the parent's ``ctime``: :meth:`check` stops at
    that (each :meth:`make` checks first, then notes the parent's state anew)."""

    def __init__(self) -> None:
        self.root = os.path.join(tempfile.gettempdir(), f"ezpz-nb15-{secrets.token_hex(8)}")
        os.mkdir(self.root, 0o300)  # never listable, not even for a moment
        os.chmod(self.root, 0o300)  # whatever the umask
        self.made: list[str] = []
        self.stamp = self._now()

    def make(self) -> str:
        """A fresh folder (``0o700``); the path of a checkpoint inside it."""
        self.check()
        path = os.path.join(self.root, secrets.token_hex(16))
        os.mkdir(path, 0o700)
        os.mkdir(os.path.join(path, "checkpoint"), 0o700)  # watched before any save
        self.made.append(path)
        self.stamp = self._now()
        return os.path.join(path, "checkpoint")

    def check(self) -> None:
        """Stop if the parent's mode or entries changed since the last :meth:`make`."""
        if self._now() != self.stamp:
            raise wrong(
                "the checkpoints' folder was listed or changed by a process outside the "
                "check's ranks while the check ran (its mode or entries changed). "
                + IN_THE_CHECKPOINT
            )

    def close(self) -> None:
        """Remove every folder, by name: the parent never becomes listable (what is left
        of a check could serve a later one). Something else in it: listable, then removed."""
        for path in self.made:
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rmdir(self.root)
        except OSError:
            with contextlib.suppress(OSError):
                os.chmod(self.root, 0o700)
            shutil.rmtree(self.root, ignore_errors=True)

    def _now(self) -> tuple[int, int]:
        st = os.stat(self.root)
        return stat.S_IMODE(st.st_mode), st.st_ctime_ns


def only_dcp_files(path: str) -> None:
    """Stop unless ``path``'s folder holds the checkpoint alone: ``.metadata`` and the data
    files it names, each as long as its items (an empty one of a rank with none), and
    nothing else beside it or inside it."""
    from torch.distributed.checkpoint import FileSystemReader

    folder, name = os.path.split(path)
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise wrong(
            f"dcp.save left no checkpoint at {path}: return the state from loader_state and "
            "let dcp.save write it"
        )
    ends: dict[str, int] = {}
    for item in FileSystemReader(path).read_metadata().storage_data.values():
        ends[item.relative_path] = max(ends.get(item.relative_path, 0), item.offset + item.length)
    extra = [f for f in os.listdir(folder) if f != name]
    for f in sorted(os.listdir(path)):
        where = os.path.join(path, f)
        size = os.path.getsize(where) if os.path.isfile(where) else -1
        if f == ".metadata" or size == ends.get(f, 0 if DCP_FILE.fullmatch(f) else -2):
            continue
        extra.append(f"{name}/{f}" + (f" ({size} bytes)" if f in ends else ""))
    if extra:
        raise wrong(
            f"the saves left {', '.join(sorted(extra)[:3])} beside DCP's own files in the "
            "checkpoint's folder: what a save writes there besides dcp.save's files holds "
            "the state outside the checkpoint. " + IN_THE_CHECKPOINT
        )
