"""Notebook 16's evaluation set, served from the checker's process, and each rank's side of it.

The losses never enter a rank: :class:`LossServer` (in the notebook's process, on
127.0.0.1) answers each read, logs it under the rank that asked, takes each rank's record of
collectives (:mod:`.sent_log`'s lines) and its asks for the byte readings
(:mod:`.wire_bytes`). In the rank, :class:`ServedLosses` is the dataset the learner's
function gets (each ``dataset[i]`` one logged request) and :func:`record_note` the record's
own connection. Both connections are claimed before the learner's code runs. Standard
library only in what a rank runs (:mod:`.sent_log` for the record's lines).
"""

from __future__ import annotations

import operator
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from ezpz_nb.launcher.settings import LOOPBACK
from ezpz_nb.workshop.sent_log import Sent
from ezpz_nb.workshop.wire_bytes import WireCounter

__all__ = ["LossServer", "ServedLosses", "record_note"]


class LossServer:
    """The evaluation set, served from the checker's process: the losses and the read log.

    Each rank's job opens two connections and claims its rank on each before the learner's
    function runs: ``hello <r>`` for the dataset's reads, ``record <r>`` for
    :func:`~.sent_log.recording`'s stream. A second claim, or any later connection, is
    refused and counted in :attr:`refused`. On the read connection only a request ``<i>`` is
    taken (logged under the rank, answered with the loss): a ``sent`` line written there, as
    the learner holds that connection, is answered ``bad`` and recorded nowhere. Nothing of
    this lives in a rank, so no frame, closure or ``gc`` scan there finds the losses or
    rewrites the log. Use as a context manager: on exit the listener and every connection
    are closed and their threads joined.
    """

    def __init__(self, losses: list[float], dp: int) -> None:
        self.losses, self.dp = losses, dp
        self.reads: dict[int, list[int]] = {}  # rank -> every index it asked for, in order
        self.sent: dict[int, Sent] = {}  # rank -> what it sent its peers (sent_log's stream)
        self.refused = 0
        self._claimed: set[tuple[str, int]] = set()  # (hello or record, rank)
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._conns: list[socket.socket] = []
        self._listener = socket.create_server((LOOPBACK, 0))
        self._listener.settimeout(0.05)  # accept() wakes to see the stop: close() never waits long
        self.port: int = self._listener.getsockname()[1]
        # The bytes between the ranks, read when they ask (``snap`` lines on the record).
        self.counter = WireCounter(dp, self.port)
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> LossServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, close every connection, join every thread."""
        self._stop.set()
        self.counter.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its rank
        for t in list(self._threads):
            t.join(timeout=5.0)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            t = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    def _claim(self, line: str) -> tuple[str, int | None]:
        word = line.split()
        ok = len(word) == 2 and word[0] in ("hello", "record") and _digits(word[1])
        kind, rank = (word[0], int(word[1])) if ok else ("", -1)
        with self._lock:
            if 0 <= rank < self.dp and (kind, rank) not in self._claimed:
                self._claimed.add((kind, rank))
                self.reads.setdefault(rank, [])
                self.sent.setdefault(rank, Sent())
                return kind, rank
            self.refused += 1
            return kind, None

    def _answer(self, conn: socket.socket) -> None:
        # The whole block: closing the file flushes, and a rank killed meanwhile (a hang
        # stopped) breaks that flush too.
        try:
            with conn, conn.makefile("rw", encoding="ascii", newline="\n") as f:
                self._serve(f)
        except (OSError, ValueError, UnicodeError):
            return  # the rank went away (or sent what no job sends): its log stays

    def _serve(self, f: Any) -> None:
        kind, rank = self._claim(f.readline())
        f.write("no\n" if rank is None else "ok\n")
        f.flush()
        while rank is not None and (line := f.readline()):
            i = int(line) if kind == "hello" and _digits(line.strip()) else -1
            if kind == "record" and line.startswith("snap "):
                f.write(f"{self.counter.ask(rank, line)}\n")
            elif kind == "record":
                with self._lock:
                    noted = self.sent[rank].take(line)
                # Answered, so the rank's next call waits until it is logged.
                f.write("ok\n" if noted else "bad\n")
            elif 0 <= i < len(self.losses):
                with self._lock:
                    self.reads[rank].append(i)
                f.write(f"{self.losses[i]!r}\n")
            else:
                f.write("bad\n")
            f.flush()


def _digits(word: str) -> bool:
    return word.isascii() and word.isdigit()


class ServedLosses:
    """``len(dataset)`` samples; ``dataset[i]`` is ``{"index": i, "loss": ...}``, asked of
    the checker over this rank's one connection (each read a logged request)."""

    __slots__ = ("_file", "_lock", "_n", "_pid")

    def __init__(self, n: int, port: int, rank: int) -> None:
        self._n, self._pid, self._lock = n, os.getpid(), threading.Lock()
        self._file = _claimed(port, f"hello {rank}")

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> dict[str, Any]:
        try:
            i = operator.index(i)
        except TypeError:
            raise IndexError(f"index {i!r} is not an integer") from None
        if not 0 <= i < self._n:
            raise IndexError(f"index {i!r} outside 0..{self._n - 1}")
        if os.getpid() != self._pid:
            raise RuntimeError(
                "read dataset[i] in the rank's own process (a DataLoader with num_workers=0): "
                "each rank's reads go over its one connection to the checker"
            )
        return {"index": i, "loss": float(self._ask(f"{i}"))}

    def _ask(self, line: str) -> str:
        return _ask(self._file, self._lock, line)

    def __repr__(self) -> str:
        return f"<evaluation set of {self._n} samples>"


def _claimed(port: int, hello: str) -> Any:
    """A connection to the checker's server that has claimed ``hello`` (``hello <rank>`` or
    ``record <rank>``), as a text file; raise if another connection claimed it first."""
    f = socket.create_connection((LOOPBACK, port)).makefile("rw", encoding="ascii", newline="\n")
    f.write(f"{hello}\n")
    f.flush()
    if f.readline().strip() != "ok":
        raise RuntimeError(
            f"the checker's evaluation set refused {hello!r}: another connection claimed it "
            "first. Read the evaluation set only through dataset[i]."
        )
    return f


def _ask(f: Any, lock: threading.Lock, line: str) -> str:
    with lock:  # one line out, its answer back: threads never interleave
        f.write(f"{line}\n")
        f.flush()
        return str(f.readline())


def record_note(port: int, rank: int) -> Callable[[str], str | None]:
    """The ``note`` of :func:`~.sent_log.recording`: each line over this rank's own record
    connection, claimed before the learner's code runs and not on the dataset (whose
    connection takes reads only), so a line written through the dataset records nothing."""
    f, lock, pid = _claimed(port, f"record {rank}"), threading.Lock(), os.getpid()

    def note(line: str) -> str | None:
        if os.getpid() == pid:  # a forked DataLoader worker's calls are not this rank's
            return _ask(f, lock, line).strip()
        return None

    return note
