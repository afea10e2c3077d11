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
the learner started) is refused and noted in :attr:`Witness.faults`. The asks come in
the order of ``asks``, each once, and each names how many new children the rank must
have by then (its loader's workers, or none); each later ask reads only children no
earlier ask read, so each label's readings are the workers of one loader. The children
that rank already had at ``"start"`` (left from earlier runs) are never read.

What the learner's code could do instead of reading the storage in the workers is
counted from ``/proc`` here too, and noted as a fault: the rank running a thread it did
not have at its first ask (one that serves the rows to the workers), or catching a
signal it did not catch then; a worker with children of its own, alive or reaped (a
worker's child shares the pages the worker copied, and a throwaway child per read takes
the reads' writes with it: reaped, its faults add to the worker's ``cminflt``), or one
that ignores ``SIGCHLD`` (its children then go unaccounted). This module imports only
the standard library, the ledger's reader and :mod:`.flat_pages` (the pages a worker wrote,
standard library only): a rank imports it.
"""

from __future__ import annotations

import _socket
import contextlib
import glob
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

from ezpz_nb.ledger.memory import ProcMemory, read_memory
from ezpz_nb.workshop.flat_pages import written

__all__ = ["Witness", "ask_witness", "children", "descendants", "group", "peer_pid"]


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


def descendants(pid: int) -> set[int]:
    """Every live (or unreaped) process below ``pid``: its children, theirs, and so on."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        below = children(todo.pop()) - found
        found |= below
        todo.extend(below)
    return found


def _proc(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:  # gone, or not Linux: nothing to count
        return ""


def _reaped_faults(pid: int) -> int:
    """The page faults of ``pid``'s reaped children (``cminflt`` + ``cmajflt``), 0 if unknown."""
    fields = _proc(pid, "stat").rpartition(")")[2].split()
    return int(fields[8]) + int(fields[10]) if len(fields) > 10 else 0


def _mask(pid: int, key: str) -> int:
    """A signal mask of ``/proc/<pid>/status`` (``SigCgt``, ``SigIgn``), 0 if unknown."""
    for line in _proc(pid, "status").splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1], 16)
    return 0


def _threads(pid: int) -> set[int]:
    try:
        return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}
    except OSError:
        return set()


def _switches(pid: int, tid: int) -> int:
    """How many times thread ``tid`` of ``pid`` was switched out (woke and slept, or was
    preempted): a count of its work, not of time; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
    except (OSError, ValueError, IndexError):
        return 0


#: A thread seen before the epoch that was switched out more often than this during it did
#: work there. A library's pool asleep on a condition (pyarrow starts two threads at import,
#: the datasets library one) is switched out 0 to 1 times in seconds (measured).
_WOKE = 2


def _signals(mask: int) -> str:
    return ", ".join(_signal_name(n) for n in range(1, 65) if mask >> (n - 1) & 1)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _unlike_a_loader(rank: int, label: str, workers: set[int], want: int) -> list[str]:
    """Why the rank's new children at ask ``label`` are not ``want`` plain loader workers."""
    why = []
    if len(workers) != want:
        why.append(
            f"rank {rank} had {len(workers)} new processes at its ask {label!r}, where the "
            f"checker's loader has {want}: your code started processes of its own"
        )
    for pid in sorted(workers):
        below, reaped = descendants(pid), _reaped_faults(pid)
        if below or reaped or _mask(pid, "SigIgn") >> (signal.SIGCHLD - 1) & 1:
            why.append(
                f"rank {rank}'s worker {pid} started processes of their own by its ask "
                f"{label!r} ({len(below)} alive, {reaped} page faults of reaped ones, or "
                "SIGCHLD ignored): a child that reads for the worker takes its writes with it"
            )
    return why


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
        asks: The asks a rank makes after ``"start"``, in order, each once (others are
            refused), each with the number of new children the rank has by then (the
            workers of the loader it asks about; 0 where it runs none).

    Attributes:
        address: The Unix socket's path (in a private temporary folder).
        pids: Each rank's process, from the credentials of its ``"start"`` ask.
        faults: Asks refused (from another process than the rank's, a label twice or out
            of turn), and what the counts above say the learner's code did instead.
    """

    def __init__(self, asks: dict[str, int]) -> None:
        self.asks = dict(asks)
        self._folder = tempfile.mkdtemp(prefix="ezpz-witness-")
        self.address = os.path.join(self._folder, "socket")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(16)
        self.pids: dict[int, int] = {}
        self.faults: list[str] = []
        self._read: dict[tuple[int, str], dict[int, ProcMemory]] = {}
        self._pages: dict[tuple[int, str], dict[int, Any]] = {}  # pages each wrote
        self._known: dict[int, set[int]] = {}  # per rank: children not to read again
        self._done: dict[int, list[str]] = {}  # per rank: the asks answered, in order
        self._first: dict[int, tuple[set[int], int]] = {}  # per rank: threads, caught signals
        self._seen: dict[int, dict[int, int]] = {}  # per rank: new thread -> switches when seen
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

    def pages(self, rank: int, label: str) -> dict[int, Any]:
        """``{child pid: page numbers it holds alone}`` read at ``rank``'s ask ``label``
        (:func:`.flat_pages.written`; ``None`` for a child whose pages cannot be read)."""
        with self._lock:
            return dict(self._pages.get((rank, label), {}))

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
                peer = peer_pid(conn)
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
                self._done[rank] = []
                return
            if self.pids.get(rank) != peer:
                self.faults.append(
                    f"the checker's memory readings were asked for by another process than "
                    f"the rank: process {peer} asked as rank {rank} ({label!r})"
                )
                return
            done = self._done[rank]
            if len(done) == len(self.asks) or label != list(self.asks)[len(done)]:
                self.faults.append(f"rank {rank} asked {label!r} twice, or out of turn")
                return
            done.append(label)
            new = children(peer) - self._known[rank]
            # Processes of the rank's group other than its children (a worker's own child,
            # double-forked, with which it would share the pages it copied): refused.
            stray = group(peer) - self._known[rank] - new - {peer}
            self._known[rank] |= new | stray
            if stray:
                self.faults.append(
                    f"rank {rank}'s workers started processes of their own (pids "
                    f"{', '.join(map(str, sorted(stray)))}) by its ask {label!r}"
                )
            self.faults.extend(_unlike_a_loader(rank, label, new, self.asks[label]))
            if peer != os.getpid():  # under torchrun the rank is this process, its threads ours
                self._same_rank(rank, label, peer, self.asks[label])
            got = {pid: read_memory(pid) for pid in sorted(new)}
            self._read[rank, label] = {pid: mem for pid, mem in got.items() if mem is not None}
            self._pages[rank, label] = {pid: written(pid) for pid in got}

    def _same_rank(self, rank: int, label: str, peer: int, workers: int) -> None:
        """Note threads and caught signals the rank has now and had not at its first ask.

        Between its asks the rank runs the learner's code (``make_flat``) and the
        checker's loader, which starts one thread per worker there (the feeder of that
        worker's index queue; the last loader's have ended): any other new thread, or a
        new signal handler, is the learner's, doing the workers' reading for them.
        """
        now = (_threads(peer), _mask(peer, "SigCgt"))
        first = self._first.setdefault(rank, now)
        seen = self._seen.setdefault(rank, {})
        new = now[0] - first[0]
        # A thread first seen before the loader runs (make_flat's) is judged by what it does
        # while the workers read: one a library started at import sleeps through the epoch
        # (issue 45's seventh trial: pyarrow's and the datasets library's, a right answer
        # rejected); one that serves the rows wakes for them. Threads first seen at this
        # ask count whatever they did, and so does one seen before that has ended since.
        working = {t for t in new if t not in seen or _switches(peer, t) - seen[t] > _WOKE}
        working |= seen.keys() - now[0]
        for t in new - seen.keys():
            seen[t] = _switches(peer, t)
        threads, caught = len(working), now[1] & ~first[1]
        if workers == 0:
            threads = 0  # before the loader (make_flat's threads): judged at the loader's ask
        if threads > workers:
            self.faults.append(
                f"rank {rank} ran {threads - workers} thread(s) at its ask {label!r} that "
                "neither it nor its loader ran at its first: a thread in the rank that serves "
                "the rows reads them for the workers"
            )
        if caught:
            self.faults.append(
                f"rank {rank} caught signals at its ask {label!r} that it did not catch at "
                f"its first ({_signals(caught)}): a handler in the rank that serves the rows "
                "reads them for the workers"
            )


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket, from the kernel."""
    if hasattr(socket, "SO_PEERCRED"):
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    return _peer_pid_elsewhere(conn)


def _peer_pid_elsewhere(conn: Any) -> int:
    # macOS names it LOCAL_PEERPID (level SOL_LOCAL = 0); no other platform runs these ranks.
    return int(struct.unpack("i", conn.getsockopt(0, 0x002, struct.calcsize("i")))[0])
