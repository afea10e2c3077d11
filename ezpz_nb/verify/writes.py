"""Which files a learner's loader writes on a rank, seen through Python's audit hooks.

A resume check judges what a loader's state carries. A loader that writes a file (its
position, under a name its state holds) and reads it back on load resumes well on one
machine and nowhere else: the check cannot tell a state from a side file, so such a
resume is "not judged", never passed. A command the loader runs (a shell child) may
write what no hook here sees: it counts as a write, named by its command. :func:`run_rank_watched` runs
:func:`~ezpz_nb.verify.observe.run_rank` with the watch armed from the factory call to
the end, and puts the paths written in ``Outcome.writes``.

An audit hook cannot be removed once added (``sys.addaudithook``), so later code in the
rank cannot unhook it; one hook a process, armed only while a check's loader runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["COMMANDS", "WRITES", "run_rank_watched"]

#: Audit events that write, move or remove files (``open`` only with a writing mode).
WRITES = frozenset({
    "os.rename", "os.remove", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.truncate",
    "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.copytree",
    "shutil.move", "shutil.rmtree", "shutil.make_archive", "shutil.unpack_archive",
})  # fmt: skip

#: Audit events that run a command, whose own writes no hook here can see (a shell child
#: writing the position): named like a write. DataLoader workers fork without them.
COMMANDS = frozenset({"os.system", "subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec"})

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_KEEP = 5  # paths kept a run: the first ones name the habit


class _Watch:
    """The process's one hook and what it saw while armed."""

    def __init__(self) -> None:
        self.armed = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            return
        if event == "open":
            mode, flags = (args[1], args[2]) if len(args) >= 3 else (None, 0)
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else False
            if not writing and not (isinstance(flags, int) and flags & _WRITE_FLAGS):
                return
        elif event in COMMANDS:
            cmd = args[0] if event == "os.system" else args[1]
            cmd = cmd.decode(errors="replace") if isinstance(cmd, bytes) else cmd
            args = (f"{event}({str(cmd)[:80]!r})",)
        elif event not in WRITES:
            return
        path = str(args[0]) if args else event
        # Python's own byte-code cache of a module imported meanwhile: not the loader's.
        if "__pycache__" in path or path.endswith((".pyc", ".pyc.tmp")):
            return
        if len(self.paths) < _KEEP and path not in self.paths:
            self.paths.append(path)


_watch: _Watch | None = None


def run_rank_watched(*args: Any, **kwargs: Any) -> Any:
    """:func:`~ezpz_nb.verify.observe.run_rank` with the files it writes in ``Outcome.writes``."""
    from ezpz_nb.verify.observe import run_rank

    global _watch
    if _watch is None:
        _watch = _Watch()
    _watch.paths, _watch.armed = [], True
    try:
        out = run_rank(*args, **kwargs)
    finally:
        _watch.armed = False
    out.writes = list(_watch.paths)
    return out
