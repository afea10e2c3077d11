"""A crash the checker injects into a torchrun job, stepping its ranks from outside.

Notebook 14's checker (:func:`ezpz_nb.agents.by_hand.check_worker`) must see the learner's
worker survive a rank that dies mid-job, without relying on the worker's own ``--kill``
option (a worker that ignores it would never be restarted), and must see that the restart
resumes from what the worker saved, not from where the checker made it die. The plan (which
rank dies at which step; the earlier step at which the output folder is kept) lives only in
this object, in the checker's process. A worker can read whatever its own process holds
(its environment as it started, in ``/proc/self/environ``; its modules; the folders it can
name), so the ranks get nothing of it: the recorder's hook (:func:`ezpz_nb.ledger.fault.
at_step`) says "rank R reached step s" on a Unix socket and waits for one byte back, the
same go at every step, and the socket's folder holds the socket alone.

At every step, once every rank is there (each past the save before it, none at the next),
the checker reads the output folder's files that changed since the step before (ledger
files aside), then lets every rank go on. It reads at every step, not only at the kept one,
so that nothing a worker can watch (file access times, inotify, how long a step waits)
tells the kept step from another. At the kept step it keeps what it read, in its own
memory (no file a worker could find). At the crash step, once every rank is there, it puts
the output folder back as it was kept (as if the later saves never reached the disk), then
kills the chosen rank with SIGKILL, as the out-of-memory killer would; every other rank is
held there, as ranks blocked in a collective with a dead peer are, until its agent stops it
(torchrun's restart), so no rank saves a position past the crash. Ranks started after the
crash are told they are free and stop asking. It happens once per job.

Before the crash each rank's steps must come one after the other from epoch 0 step 0, from
one process (the first that stepped that rank): a step claimed out of turn is refused, and
the rank stops saying why. A worker probing ahead (skipping steps, or stepping its rank from
another thread or process) could otherwise reach the crash step, and learn it by dying
there, with the kept step never having every rank, so that nothing would be put back.

A restart that resumes from the position it reads in its checkpoint resumes from the kept
one; one that works the position out from the crash (or from the ledgers) does not.

Bounded waits: when not every rank reaches a step within :data:`~ezpz_nb.ledger.fault.
WAIT_S`, the ones there go on (the folder is not kept there), or, at the crash step, the
chosen rank is killed without putting anything back (:attr:`CrashPlan.restored` stays
False: the checker then expects the last position saved). A rank whose checker stopped
answering kills itself (:mod:`ezpz_nb.ledger.fault`, after ``RANK_WAIT_S``); leaving the
``with`` block closes the socket, so a rank still waiting then stops at once.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from ezpz_nb.agents.proctree import descendants
from ezpz_nb.ledger.fault import ENV, FREE, GO, REFUSED, WAIT_S

__all__ = ["CrashPlan"]

Step = tuple[int, int]  # (epoch label, step in that pass), as the recorder counts them
_Stamp = tuple[int, int, int]  # a file's (inode, size, mtime): read again when it changes


class CrashPlan:
    """Step a job's ranks from outside; kill ``crash``'s rank at its step, once.

    Use it as a context manager around the job, started with :attr:`env` in the ranks'
    environment. With ``crash`` None it is inert (no socket, :attr:`env` empty).

    Args:
        crash: ``(rank, epoch, step)``: who dies, and at which step of which epoch label.
        out: The job's output folder (``--out``): ledgers and the worker's checkpoint.
        keep: ``(epoch, step)`` before the crash where the output folder is kept; it is put
            back before the crash. None: nothing is put back.
        world: Ranks in the job (the ones each step waits for).

    Attributes:
        crashed: The chosen rank was killed at its step.
        restored: The output folder was put back as kept before the kill.
    """

    def __init__(
        self,
        crash: tuple[int, int, int] | None,
        out: str | Path,
        *,
        keep: Step | None = None,
        world: int = 1,
    ) -> None:
        self._crash, self._out, self._keep, self._world = crash, Path(out), keep, world
        self.crashed = self.restored = False
        self._folder: str | None = None
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._sel = selectors.DefaultSelector()
        self._pid: dict[socket.socket, int] = {}  # each rank's connection: its process
        self._at: dict[Step, dict[int, socket.socket]] = {}  # ranks waiting at each step
        self._since: dict[Step, float] = {}  # when the first rank came to a step
        self._passed: set[Step] = set()  # steps whose wait is over (late ranks go on)
        self._read: dict[str, tuple[_Stamp, bytes]] = {}  # the folder's files, last read
        self._kept: dict[str, bytes] | None = None
        self._before: dict[int, int] = {}  # processes alive at the crash (pid: start): held
        self._owner: dict[int, int] = {}  # rank: the one process whose steps are that rank's
        self._ranks: dict[int, int] = {}  # process: the one rank it steps
        self._last: dict[int, Step] = {}  # rank: the step it last came to

    @property
    def env(self) -> dict[str, str]:
        """What the ranks' environment needs: where the checker's socket is."""
        return {ENV: str(Path(self._folder or "", "s"))} if self._folder else {}

    def __enter__(self) -> CrashPlan:
        if self._crash is None:
            return self
        # A folder of its own, out of --out and out of the job's: it holds the socket only.
        self._folder = tempfile.mkdtemp(prefix="ezpz-gate-")
        if len(os.fsencode(self._folder)) > 100:  # a socket's path holds 107 bytes at most
            os.rmdir(self._folder)
            self._folder = tempfile.mkdtemp(prefix="ezpz-gate-", dir="/tmp")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.env[ENV])
        self._server.listen(64)
        self._sel.register(self._server, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="crash-plan", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        for sock in [*self._pid, *filter(None, [self._server])]:
            sock.close()  # a rank still waiting reads the end: it stops
        self._sel.close()
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
        if self._error is not None and kind is None:
            raise RuntimeError(f"the checker's crash plan failed: {self._error}") from self._error

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=0.2):
                    if key.fileobj is self._server:
                        self._accept()
                    else:
                        self._heard(key.fileobj)  # type: ignore[arg-type]
                self._late()
        except BaseException as exc:  # noqa: BLE001 - raised again by __exit__, in the checker
            self._error = exc
            for sock in list(self._pid):
                sock.close()  # the ranks stop at once rather than at their own deadline

    def _accept(self) -> None:
        assert self._server is not None
        sock, _ = self._server.accept()
        sock.settimeout(1.0)  # a rank's line comes whole at once: never stall on a part
        self._pid[sock] = _peer_pid(sock)
        self._sel.register(sock, selectors.EVENT_READ)

    def _heard(self, sock: socket.socket) -> None:
        """One message of a rank (``rank epoch step pid``; it waits for the answer)."""
        line = b""
        try:
            while not line.endswith(b"\n"):  # a line split on the way: the rest follows
                more = sock.recv(256)
                if not more:  # the rank's process ended
                    line = b""
                    break
                line += more
        except OSError:
            line = b""
        try:
            rank, epoch, step, pid = (int(x) for x in line.split())
        except ValueError:
            line = b""
        if not line:  # not a line of fault.at_step's: that end stops
            self._sel.unregister(sock)
            self._pid.pop(sock, None)
            sock.close()
            return
        self._pid[sock] = self._pid[sock] or pid
        if self.crashed:
            pid = self._pid[sock]
            if pid not in self._before or descendants([os.getpid()]).get(pid) != self._before[pid]:
                _send(sock, FREE)  # started after the crash (a reused pid too): it goes on
            return  # a rank of the crashed attempt: held until its agent stops it
        where = (epoch, step)
        if not self._in_turn(rank, self._pid[sock], where):
            _send(sock, REFUSED)
            return
        if where in self._passed:
            _send(sock, GO)  # came after its step's wait was over
            return
        self._since.setdefault(where, time.monotonic())
        self._at.setdefault(where, {})[rank] = sock
        self._decide(where)

    def _in_turn(self, rank: int, pid: int, where: Step) -> bool:
        """Each rank's steps come from one process, one after the other from (0, 0): a step
        claimed ahead (a worker probing for the crash, or skipping steps so that the kept
        one never has every rank) is out of turn."""
        if self._owner.setdefault(rank, pid) != pid or self._ranks.setdefault(pid, rank) != rank:
            return False
        last = self._last.get(rank)
        if where not in (((0, 0),) if last is None else _next(last)):
            return False
        self._last[rank] = where
        return True

    def _late(self) -> None:
        """Steps where a rank has waited :data:`WAIT_S` for the others: decide without them."""
        for where in list(self._since):
            self._decide(where)

    def _decide(self, where: Step) -> None:
        """Go on, or crash, once every rank is at ``where`` or the wait for them is over."""
        everyone = len(self._at.get(where, {})) >= self._world
        if not everyone and time.monotonic() - self._since[where] <= WAIT_S:
            return
        if self._crash is None or where != self._crash[1:]:
            self._release(where, everyone=everyone)
        elif self._crash[0] in self._at[where]:
            self._kill(self._at[where][self._crash[0]], everyone=everyone)
        # else the rank that dies is not there yet: the others stay held for it

    def _release(self, where: Step, *, everyone: bool) -> None:
        """Read the folder (keep it, at the kept step), then let the ranks there go on."""
        self._passed.add(where)
        del self._since[where]
        files = self._read_out()
        if where == self._keep and everyone:
            self._kept = files
        for sock in self._at.pop(where, {}).values():
            _send(sock, GO)

    def _read_out(self) -> dict[str, bytes]:
        """The output folder's files (ledgers aside), reading only the ones that changed."""
        now: dict[str, tuple[_Stamp, bytes]] = {}
        for path in _files(self._out):
            rel = str(path.relative_to(self._out))
            try:
                st = path.stat()
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                old = self._read.get(rel)
                now[rel] = old if old and old[0] == stamp else (stamp, path.read_bytes())
            except FileNotFoundError:
                continue  # removed meanwhile (a worker's own thread): not there now
        self._read = now
        return {rel: data for rel, (_, data) in now.items()}

    def _kill(self, chosen: socket.socket, *, everyone: bool) -> None:
        """Put the kept folder back (every rank here), then SIGKILL the chosen rank."""
        self._since.clear()  # every step from now on: the crash's attempt is over
        self._before = descendants([os.getpid()])
        pid = self._pid[chosen]
        if not pid or (self._before and pid not in self._before):
            raise RuntimeError(f"process {pid}, said to be the rank to kill, is not the job's")
        if everyone and self._kept is not None:
            _put_back(self._kept, self._out)
            self.restored = True
        os.kill(pid, signal.SIGKILL)
        self.crashed = True


def _next(step: Step) -> tuple[Step, Step]:
    """The steps that may follow ``step``: the next of its epoch, the first of the next."""
    return (step[0], step[1] + 1), (step[0] + 1, 0)


def _send(sock: socket.socket, answer: bytes) -> None:
    try:
        sock.sendall(answer)
    except OSError:
        pass  # the rank ended meanwhile: its end is read next


def _peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end (Linux), 0 where the system does not say."""
    if not hasattr(socket, "SO_PEERCRED"):
        return 0
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def _ledger(rel: Path) -> bool:
    """The recorder's files (``attempt*/*.jsonl``): they go on as they are, never put back."""
    return rel.suffix == ".jsonl" and rel.parent.name.startswith("attempt")


def _files(out: Path) -> list[Path]:
    if not out.is_dir():
        return []
    return [p for p in out.rglob("*") if p.is_file() and not _ledger(p.relative_to(out))]


def _put_back(kept: dict[str, bytes], out: Path) -> None:
    """Make ``out`` hold what ``kept`` holds, ledger files aside."""
    for path in _files(out):
        if str(path.relative_to(out)) not in kept:
            path.unlink()  # saved after the copy: as if it never reached the disk
    for rel, data in kept.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
