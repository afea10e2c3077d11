"""Loader workers' memory read from outside the rank: by the notebook's process, when a rank asks.

A checker that measures a learner's dataset cannot trust what it keeps in the rank:
the learner's code runs there (``make_flat`` builds the dataset in the rank, and the
workers fork from it), so it can reach the checker's frames, shared slots and module
globals, down to the memory reader itself. So the reading is done by the notebook's
process, which the learner's code never runs in: a :class:`Witness` there listens on a
Unix socket, and when a rank asks (:func:`ask_witness`), reads
``/proc/<pid>/smaps_rollup`` of that rank's child processes (its DataLoader workers)
with :func:`~ezpz_nb.ledger.memory.read_memory`, keeps the readings, and answers only
once it has them (the workers are alive and idle while it reads); a refused ask is
answered too (the checker's verdict names it, the rank does not hang on it).

Who asks is known from the socket's peer credentials (``SO_PEERCRED``), not from what
the asker says: a rank's first ask (``"start"``, before the learner's code runs in the
job) ties the rank to its pid, and an ask from any other process (a worker, a process
the learner started) is refused and noted in :attr:`Witness.faults`, and so is a
process in the rank's group that is not its child (a worker's own child shares the
pages the worker copied, so neither shows them as private). The children
that rank already had at ``"start"`` (left from earlier runs) are never read, and each
later ask reads only children no earlier ask read, so each label's readings are the
workers of one loader. This module imports only the standard library and the ledger's
reader: a rank imports it.
"""

from __future__ import annotations

import _socket
import contextlib
import glob
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from ezpz_nb.ledger.memory import ProcMemory, read_memory

__all__ = ["Witness", "ask_witness", "children", "group"]


def children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (of any of its threads); empty if it is gone."""
    if sys.platform.startswith("linux"):
        found: set[int] = set()
        for path in glob.glob(f"/proc/{pid}/task/*/children"):
            with contextlib.suppress(OSError):
                with open(path, encoding="ascii") as fh:
                    found.update(int(p) for p in fh.read().split())
        return found
    try:
        import psutil

        return {c.pid for c in psutil.Process(pid).children()}
    except Exception:  # noqa: BLE001  (psutil absent, or the process gone)
        return set()


def group(pid: int) -> set[int]:
    """The processes of ``pid``'s process group when ``pid`` leads one, else empty (Linux).

    A rank leads its own group (the launcher's ``setpgrp``): its workers, and any process
    they forked, double-forked ones included, stay in it unless they leave on purpose.
    """
    found: set[int] = set()
    for path in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(path, encoding="ascii", errors="replace") as fh:
                fields = fh.read().rpartition(")")[2].split()
            if int(fields[2]) == pid:  # pgrp, the fifth field: after ``pid (comm) state ppid``
                found.add(int(path.split("/")[2]))
    return found


def ask_witness(address: str, rank: int) -> Callable[[str], None]:
    """On a rank: a function ``ask(label)`` that has the witness read this rank's new children.

    Each ask opens its own connection and closes it before returning, so workers forked
    later hold no connection of the rank's; it returns once the witness has read.
    """

    # The C socket type, taken now: its methods cannot be rebound later in the process
    # (``socket.socket``'s, a Python class, can), so an ask made after the learner's code
    # ran in the rank still reaches the witness.
    make, family, kind = _socket.socket, _socket.AF_UNIX, _socket.SOCK_STREAM

    def ask(label: str) -> None:
        sock = make(family, kind)
        try:
            sock.connect(address)
            sock.sendall(f"{rank} {label}\n".encode())
            if sock.recv(3) != b"ok\n":
                raise RuntimeError(f"the notebook's memory witness did not answer {label!r}")
        finally:
            sock.close()

    return ask


class Witness:
    """In the notebook's process: read ranks' loader workers when the ranks ask.

    Use as a context manager around the run; :attr:`address` goes to the rank job.

    Args:
        labels: The asks a rank makes after ``"start"``, each once (others are refused).

    Attributes:
        address: The Unix socket's path (in a private temporary folder).
        pids: Each rank's process, from the credentials of its ``"start"`` ask.
        faults: Asks refused: from another process than the rank's, a label twice or
            one not in ``labels``.
    """

    def __init__(self, labels: tuple[str, ...]) -> None:
        self.labels = labels
        self._folder = tempfile.mkdtemp(prefix="ezpz-witness-")
        self.address = os.path.join(self._folder, "socket")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(16)
        self.pids: dict[int, int] = {}
        self.faults: list[str] = []
        self._read: dict[tuple[int, str], dict[int, ProcMemory]] = {}
        self._known: dict[int, set[int]] = {}  # per rank: children not to read again
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="ezpz-witness", daemon=True)
        self._thread.start()

    def __enter__(self) -> Witness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and remove the socket's folder."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5.0)
        shutil.rmtree(self._folder, ignore_errors=True)

    def readings(self, rank: int, label: str) -> dict[int, ProcMemory]:
        """``{child pid: memory}`` read at ``rank``'s ask ``label`` (empty if it never asked)."""
        with self._lock:
            return dict(self._read.get((rank, label), {}))

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                peer = _peer_pid(conn)
                rank_s, _, label = conn.makefile("rb").readline().decode().strip().partition(" ")
                rank = int(rank_s)
                self._note(rank, label, peer)
                conn.sendall(b"ok\n")  # refused too: the verdict names the fault, not a hang
            except (OSError, ValueError, UnicodeDecodeError):
                return

    def _note(self, rank: int, label: str, peer: int) -> None:
        """Read ``rank``'s new children for ``label``, or note why that ask is refused."""
        with self._lock:
            if label == "start" and rank not in self.pids:
                self.pids[rank] = peer
                self._known[rank] = children(peer) | group(peer)
                return
            if self.pids.get(rank) != peer:
                self.faults.append(f"process {peer} asked as rank {rank} ({label!r})")
                return
            if (rank, label) in self._read or label not in self.labels:
                self.faults.append(f"rank {rank} asked {label!r} twice, or out of turn")
                return
            new = children(peer) - self._known[rank]
            # Processes of the rank's group other than its children (a worker's own child,
            # with which it would share the pages it copied, and look small): refused.
            stray = group(peer) - self._known[rank] - new - {peer}
            self._known[rank] |= new | stray
            if stray:
                self.faults.append(
                    f"rank {rank}'s workers started processes of their own (pids "
                    f"{', '.join(map(str, sorted(stray)))}) by its ask {label!r}"
                )
            got = {pid: read_memory(pid) for pid in sorted(new)}
            self._read[rank, label] = {pid: mem for pid, mem in got.items() if mem is not None}


def _peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket, from the kernel."""
    if hasattr(socket, "SO_PEERCRED"):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    return _peer_pid_elsewhere(conn)


def _peer_pid_elsewhere(conn: Any) -> int:
    # macOS names it LOCAL_PEERPID (level SOL_LOCAL = 0); no other platform runs these ranks.
    return int(struct.unpack("i", conn.getsockopt(0, 0x002, struct.calcsize("i")))[0])
