"""Relay the ranks' stdout and stderr into the notebook, whole lines, ``[rank r]``-prefixed.

The notebook thread that waits for a run reads these pipes itself (no background
thread): whatever it writes lands in the cell that is running, never in another.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any


class OutputRelay:
    """The read ends of every rank's output pipes, and the partial lines in flight."""

    def __init__(self) -> None:
        self._streams: dict[int, tuple[int, int]] = {}  # fd -> (rank, 1 stdout | 2 stderr)
        self._partial: dict[int, bytes] = {}
        self._readers: list[Any] = []  # the Connection objects that own the fds

    def add(self, reader: Any, rank: int, stream: int) -> None:
        """Watch ``reader`` (a read-only Connection) for rank ``rank``'s ``stream``."""
        fd = reader.fileno()
        os.set_blocking(fd, False)
        self._streams[fd] = (rank, stream)
        self._readers.append(reader)

    @property
    def fds(self) -> list[int]:
        """File descriptors still open, for ``multiprocessing.connection.wait``."""
        return list(self._streams)

    def owns(self, fd: Any) -> bool:
        """True when ``fd`` is one of ours."""
        return isinstance(fd, int) and fd in self._streams

    def read(self, fd: int) -> None:
        """Show every complete line waiting in ``fd``; keep the rest for later."""
        rank, stream = self._streams[fd]
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    return
                raise
            if not chunk:  # EOF: the rank closed its end (it exited)
                self._emit(rank, stream, self._partial.pop(fd, b""), final=True)
                del self._streams[fd]
                return
            *lines, rest = (self._partial.get(fd, b"") + chunk).split(b"\n")
            self._partial[fd] = rest
            for line in lines:
                self._emit(rank, stream, line)

    def drain(self, final: bool = False) -> None:
        """Show what is waiting now; with ``final``, also unterminated last lines."""
        for fd in self.fds:
            self.read(fd)
        if final:
            for fd, (rank, stream) in list(self._streams.items()):
                self._emit(rank, stream, self._partial.pop(fd, b""), final=True)
        sys.stdout.flush()
        sys.stderr.flush()

    def close(self) -> None:
        """Close every pipe."""
        for reader in self._readers:
            reader.close()
        self._streams, self._partial, self._readers = {}, {}, []

    @staticmethod
    def _emit(rank: int, stream: int, line: bytes, final: bool = False) -> None:
        if final and not line:
            return
        out = sys.stdout if stream == 1 else sys.stderr
        out.write(f"[rank {rank}] {line.decode('utf-8', 'replace')}\n")
