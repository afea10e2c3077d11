"""Relay the ranks' stdout and stderr into the notebook, whole lines, ``[rank r]``-prefixed.

The notebook thread that waits for a run reads these pipes itself (no background
thread): whatever it writes lands in the cell that is running, never in another.

Progress bars (tqdm, ``print(..., end="\r")``) redraw one line with carriage
returns. In a Jupyter kernel each rank's redrawn line is shown live as one display
that is updated in place; elsewhere only what a terminal would finally show (the
text after the last ``\r``) is written, once the line ends.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from ezpz_nb.launcher.kernel import in_jupyter_kernel


class OutputRelay:
    """The read ends of every rank's output pipes, and the partial lines in flight."""

    def __init__(self) -> None:
        self._streams: dict[int, tuple[int, int]] = {}  # fd -> (rank, 1 stdout | 2 stderr)
        self._partial: dict[int, bytes] = {}
        self._readers: list[Any] = []  # the Connection objects that own the fds
        self._live: dict[int, Any] = {}  # fd -> display handle of its redrawn line
        self._in_kernel: bool | None = None

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
                self._end_line(fd, rank, stream, self._partial.pop(fd, b""), final=True)
                del self._streams[fd]
                return
            *lines, rest = (self._partial.get(fd, b"") + chunk).split(b"\n")
            self._partial[fd] = rest
            for line in lines:
                self._end_line(fd, rank, stream, line)
            if b"\r" in rest:
                self._redraw(fd, rank, rest)

    def drain(self, final: bool = False) -> None:
        """Show what is waiting now; with ``final``, also unterminated last lines."""
        for fd in self.fds:
            self.read(fd)
        if final:
            for fd, (rank, stream) in list(self._streams.items()):
                self._end_line(fd, rank, stream, self._partial.pop(fd, b""), final=True)
        # A bar still being redrawn when the run ends continues in a new display in the
        # cell of the next run, not in this cell's.
        self._live.clear()
        sys.stdout.flush()
        sys.stderr.flush()

    def close(self) -> None:
        """Close every pipe."""
        for reader in self._readers:
            reader.close()
        self._streams, self._partial, self._readers, self._live = {}, {}, [], {}

    def _end_line(self, fd: int, rank: int, stream: int, line: bytes, final: bool = False) -> None:
        text = _on_screen(line)
        handle = self._live.pop(fd, None)
        if handle is not None:  # the redrawn line is done: its display keeps the last text
            handle.update({"text/plain": _prefixed(rank, text)}, raw=True)
            return
        self._emit(rank, stream, text, final)

    def _redraw(self, fd: int, rank: int, partial: bytes) -> None:
        if self._in_kernel is None:
            self._in_kernel = in_jupyter_kernel()
        if not self._in_kernel:
            return  # written once the line ends, as a terminal would finally show it
        data = {"text/plain": _prefixed(rank, _on_screen(partial))}
        handle = self._live.get(fd)
        if handle is None:
            from IPython.display import display

            sys.stdout.flush()  # lines written before the bar stay above it
            sys.stderr.flush()
            self._live[fd] = display(data, raw=True, display_id=True)
        else:
            handle.update(data, raw=True)

    @staticmethod
    def _emit(rank: int, stream: int, line: bytes, final: bool = False) -> None:
        if final and not line:
            return
        out = sys.stdout if stream == 1 else sys.stderr
        out.write(_prefixed(rank, line) + "\n")


def _on_screen(line: bytes) -> bytes:
    """What a terminal shows of a line redrawn with carriage returns: its last version."""
    return line.rstrip(b"\r").rsplit(b"\r", 1)[-1]


def _prefixed(rank: int, line: bytes) -> str:
    return f"[rank {rank}] {line.decode('utf-8', 'replace')}"
