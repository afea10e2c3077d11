"""What notebook 15's saves wrote in their checkpoints' folders, told by the kernel (inotify).

A file a save makes beside DCP's own can be taken away before the checker looks, by a
process outside the check (issue 45's seventh trial: one the notebook started in an
earlier cell), even one whose user may list any folder (root, where folder modes do not
hold): the kernel's record of what was made, written, removed and renamed while the saves
ran still names it. The checker (:mod:`.dcp_state`) watches each checkpoint with
:class:`Watch` and judges the record before anything reads a checkpoint.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import sys

from ezpz_nb.workshop.stops import wrong

__all__ = ["DCP_FILE", "IN_THE_CHECKPOINT", "Watch"]

#: Said when a save left something beside DCP's own files, or a folder was reached.
IN_THE_CHECKPOINT = (
    "The state must be in the checkpoint: return it from loader_state and let dcp.save "
    "write it; loader_state writes no file of its own"
)


#: A data file DCP's file system writer names (rank, file index): one a rank, even empty.
DCP_FILE = re.compile(r"__\d+_\d+\.distcp")


# inotify's event bits (linux/inotify.h).
_CLOSE_WRITE, _MOVED_FROM, _MOVED_TO, _CREATE, _DELETE = 0x8, 0x40, 0x80, 0x100, 0x200
_DELETE_SELF, _MOVE_SELF, _OVERFLOW, _ISDIR = 0x400, 0x800, 0x4000, 0x40000000
_CHANGES = _CLOSE_WRITE | _MOVED_FROM | _MOVED_TO | _CREATE | _DELETE | _DELETE_SELF | _MOVE_SELF


class Watch:
    """What was written in the checkpoints' folders while the saves ran, told by the kernel
    (inotify) as it happened: a file made beside DCP's own and taken away before the checker
    looks (by a process outside the check, even one whose user may list any folder) is
    seen. DCP writes each data file once, ``.metadata.tmp`` once, renamed ``.metadata``;
    anything else made, written again, removed or renamed stops the check (:meth:`judge`).
    Not Linux: nothing watched (and Landlock, which this completes, is missing too)."""

    def __init__(self, checkpoints: list[str]) -> None:
        self.fd, self.wds = -1, {}
        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        for path in checkpoints:
            for where in (os.path.dirname(path), path):
                wd = libc.inotify_add_watch(self.fd, os.fsencode(where), _CHANGES)
                if wd < 0:
                    raise OSError(ctypes.get_errno(), f"inotify_add_watch failed for {where}")
                self.wds[wd] = where

    def judge(self) -> None:
        """Stop at the first change that is not DCP's own; then stop watching."""
        if self.fd < 0:
            return
        try:
            odd = list(dict.fromkeys(_not_dcps(self._events())))  # each said once
        finally:
            self.close()
        if odd:
            raise wrong(
                f"while the saves ran, {', '.join(odd[:3])} in a checkpoint's folder, beside "
                "DCP's own files: what a save writes there besides dcp.save's files holds the "
                "state outside the checkpoint. " + IN_THE_CHECKPOINT
            )

    def close(self) -> None:
        """Stop watching."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _events(self) -> list[tuple[str, int, str]]:
        """Every event so far: (the folder or checkpoint watched, mask, name)."""
        out: list[tuple[str, int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return out
            at = 0
            while at < len(buf):
                wd, mask, _, size = struct.unpack_from("iIII", buf, at)
                name = os.fsdecode(buf[at + 16 : at + 16 + size].rstrip(b"\0"))
                at += 16 + size
                out.append((self.wds.get(wd, ""), mask, name))


def _not_dcps(events: list[tuple[str, int, str]]) -> list[str]:
    """What in ``events`` a save through DCP does not do, each said in a few words."""
    odd: list[str] = []
    writes: dict[str, int] = {}
    for where, mask, name in events:
        key = os.path.join(where, name)
        if mask & _OVERFLOW:
            odd.append("more files were changed than the kernel kept count of")
        elif not where.endswith("/checkpoint") or mask & (_ISDIR | _DELETE_SELF | _MOVE_SELF):
            odd.append(f"{name or 'a folder'} was written or changed")
        elif mask & _CREATE and not (DCP_FILE.fullmatch(name) or name == ".metadata.tmp"):
            odd.append(f"{name} was written")
        elif mask & _CLOSE_WRITE and writes.get(key, 0):
            odd.append(f"{name} was written twice")
        elif mask & _DELETE:
            odd.append(f"{name} was written and removed")
        elif (
            mask & _MOVED_FROM
            and name != ".metadata.tmp"
            or mask & _MOVED_TO
            and name != ".metadata"
        ):
            odd.append(f"{name} was renamed")
        if mask & _CLOSE_WRITE:
            writes[key] = writes.get(key, 0) + 1
    return odd
