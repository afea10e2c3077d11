"""Run a learner's function where it can write nothing but its own output: notebook 15's rule.

A right ``loader_state`` puts the loader's place in the checkpoint and writes nothing else.
A dodge keeps the place somewhere else (a file in ``/tmp``, ``/dev/shm`` or the notebook's
folder, a socket, a process it leaves running) and puts only a name of it in the checkpoint.
Looking for such places afterwards cannot tell the learner's writes from everyone else's
(Jupyter's autosave, another program's temp files), so the rank *prevents* them instead:

* :func:`call_confined` (rank side) runs the function in a thread that Linux's Landlock
  restricts: files may be written only under the folders named (the checkpoint's), no TCP
  socket may be bound or connected, no program started, and no abstract unix socket made
  outside the thread's own restriction reached; and no new socket of any family made
  (:mod:`.no_sockets`, a seccomp filter: UDP, raw, packet, netlink, unix; nor System V
  IPC or the keyring). Landlock
  restricts the calling thread and what it starts, never the rest of the rank, so a warm
  cluster's rank is unchanged after. The learner's function arrives pickled and is
  unpickled inside that thread, so code that runs at unpickling is confined too.
* :func:`processes_below` and :func:`ipc_objects` (notebook side, from ``/proc``) find what
  outlives the call in a process: a child it started (the rank is made a child subreaper
  first, so a child that forks again stays below it) and System V shared memory or message
  queues, which Landlock does not cover.

Where Landlock is missing (not Linux, a kernel before 5.13, or turned off) or older than a
rule needs, :func:`confinement` says which rules do not run, for the verdict to say "not
judged". Not covered by a confined thread: the rank's other threads. A thread the learner
started earlier in a warm rank runs unconfined (:func:`learner_threads` names it), and so
does code the learner's rebinds put in the rank's main thread (the reply it sends after the
job, issue 45's fifth trial) or hands gloo's worker threads (a future's callback); Landlock
has no thread sync before its ABI 8. The checks therefore run the learner's code on ranks of
their own whose every thread is confined first (:mod:`.seal`), ended after; a warm cluster
passed in (tests) gets the confined thread only, and the verdict says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ezpz_nb.workshop.no_sockets import available, refuse_sockets
from ezpz_nb.workshop.stops import CheckStopped, wrong

__all__ = [
    "call_confined",
    "confinement",
    "ipc_objects",
    "learner_threads",
    "end_below",
    "processes_below",
    "reap",
    "remove_ipc",
    "restrict_this_thread",
    "subreaper",
    "undumpable",
]

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446  # the same on every Linux architecture
_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER, _PR_SET_DUMPABLE = 38, 36, 4
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_DIR_WRITES = sum(1 << b for b in (4, 5, 6, 7, 8, 9, 10, 11, 12))  # remove, make each kind
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # Landlock ABI 2, 3
_TCP = (1 << 0) | (1 << 1)  # bind, connect: ABI 4
_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals: ABI 6
#: The rank's own Python threads; any other was started by the learner's code.
RANK_THREADS = frozenset({"MainThread", "ezpz_nb-lifeline"})


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        got = _libc().syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError):
        return 0
    return max(0, int(got))


def confinement(abi: int) -> list[str]:
    """The rules that do not run at Landlock ABI ``abi``, each with why; [] when all do."""
    missing = [] if os.path.isdir("/proc") else ["processes left running (no /proc)"]
    if abi < 1:
        why = "not Linux" if not sys.platform.startswith("linux") else "Landlock is off"
        return [f"writes outside the checkpoint ({why})", *missing]
    if abi < 4:
        missing.append(f"TCP sockets (Landlock ABI {abi} < 4)")
    if abi < 6:
        missing.append(f"abstract unix sockets (Landlock ABI {abi} < 6)")
    seccomp = available()
    if seccomp is not None:
        missing.append(
            f"sockets other than TCP (UDP, unix, raw), System V IPC, keyring ({seccomp})"
        )
    return missing


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict_this_thread(writable: list[str], abi: int, readable: list[str] | None = None) -> None:
    """Landlock on the calling thread: writes only under ``writable`` (and ``/dev/null``);
    with ``readable``, reads only under those paths (folders or files) too."""
    libc = _libc()
    writes = _WRITE_FILE | _DIR_WRITES | (_REFER if abi >= 2 else 0)
    writes |= _TRUNCATE if abi >= 3 else 0
    reads = 0 if readable is None else _READ_FILE | _READ_DIR
    attr = _Ruleset(writes | reads | _EXECUTE, _TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(p, writes) for p in writable] + [(os.devnull, _WRITE_FILE | reads & _READ_FILE)]
        # A file takes file rights only (listing a folder is not one of them).
        rules += [(p, reads if os.path.isdir(p) else _READ_FILE) for p in readable or ()]
        for path, allowed in rules:
            where = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _Beneath(allowed, where)
                if libc.syscall(_ADD_RULE, fd, _PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(where)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_RESTRICT, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(fd)


def call_confined(
    job: Callable[..., Any], learners: bytes | None, writable: list[str], *args: Any
) -> Any:
    """``job(*pickle.loads(learners), *args)`` in a Landlock-restricted thread (rank side);
    ``job(*args)`` when ``learners`` is None.

    ``learners`` is pickled by the launcher's ``wire.dumps`` (source file names kept, so a
    traceback shows the learner's line).

    Its exception, if any, is raised here with its traceback (the learner's line). Where
    Landlock is missing the call runs unrestricted: :func:`confinement` names what was
    not judged.
    """
    abi, out, err = landlock_abi(), [], []

    def body() -> None:
        try:
            if abi >= 1:
                restrict_this_thread(writable, abi)
                if available() is None:
                    refuse_sockets()
            head = pickle.loads(learners) if learners is not None else ()
            out.append(job(*head, *args))
        except BaseException as e:  # noqa: BLE001 - raised again in the calling thread, as it was
            err.append(e)

    t = threading.Thread(target=body, name="ezpz_nb-confined")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def subreaper() -> tuple[int, list[str]]:
    """Rank side, before the learner's code: make this rank a child subreaper (a child that
    forks and exits leaves its child below the rank, not below init); return the rank's pid
    and the names of the Python threads it runs besides its own."""
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    return os.getpid(), learner_threads()


def undumpable() -> None:
    """Rank side, before the learner's code: make this rank not dumpable, so that no other
    process of the user reads its ``/proc/<pid>/fd``, ``cwd`` or ``root`` (an open file there
    is a path into a folder no one else can list, and a way to open it)."""
    if sys.platform.startswith("linux"):
        _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def learner_threads() -> list[str]:
    """Names of this process's Python threads that the rank did not start."""
    return sorted(t.name for t in threading.enumerate() if t.name not in RANK_THREADS)


def _parents(zombies: bool = False) -> dict[int, tuple[str, str]]:
    """``{pid: (parent pid, command line)}`` of every process ``/proc`` shows; exited ones
    that their parent has not reaped (zombies, which hold nothing) only if ``zombies``."""
    out = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state in "ZX" and not zombies:
            continue
        out[int(name)] = (ppid, cmd or stat[stat.find("(") : stat.rfind(")") + 1])
    return out


def processes_below(pids: list[int], zombies: bool = False) -> dict[int, str]:
    """``{pid: command line}`` of every process below ``pids`` (notebook side); exited
    ones not yet reaped only if ``zombies``."""
    table = _parents(zombies)
    found: dict[int, str] = {}
    for pid, (ppid, cmd) in table.items():
        seen, up = set(), int(ppid)
        while up > 1 and up not in seen:
            if up in pids:
                found[pid] = cmd
                break
            seen.add(up)
            up = int(table.get(up, ("0", ""))[0])
    return found


def end_below(pids: list[int], before: set[int], rounds: int = 100) -> dict[int, str]:
    """Stop and kill every process below ``pids`` that is not in ``before``; return them.

    Each is stopped (SIGSTOP) before any is killed, and the tree read again until no new one
    shows: a process that forks again as it is found (a daemon's double fork, a fork after a
    delay) is stopped before its child can escape the tree.
    """
    found: dict[int, str] = {}
    for _ in range(rounds):
        new = {p: c for p, c in processes_below(pids).items() if p not in before | set(found)}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        found.update(new)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # SIGKILL is not instant: wait until none runs
    while time.monotonic() < deadline and set(found) & set(_parents()):
        time.sleep(0.01)
    return found


def reap(pids: list[int]) -> None:
    """Rank side: collect the exit status of those of ``pids`` that are this rank's children
    (a subreaper's orphans are; nobody else would wait for them)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def ipc_objects() -> dict[tuple[str, int], int]:
    """System V shared memory segments and message queues: ``{(kind, id): pid}``, the pid
    that made the segment or last sent to the queue (notebook side, from ``/proc``)."""
    out = {}
    for kind, pid_col in (("shm", 4), ("msg", 5)):
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > pid_col:
                out[(kind, int(cols[1]))] = int(cols[pid_col])
    return out


def remove_ipc(kind: str, ident: int) -> None:
    """Remove one System V object (``shmctl``/``msgctl`` with ``IPC_RMID``); gone is fine."""
    libc = _libc()
    ctl = libc.shmctl if kind == "shm" else libc.msgctl
    ctl(ctypes.c_int(ident), ctypes.c_int(0), None)


#: What a refused write or connection says, in a rank's failure (its message or type;
#: gloo's, when a new process group may not bind its socket: "Cannot resolve ... address").
_REFUSED = (
    "Permission denied",
    "Operation not permitted",
    "cannot be opened",
    "Errno 13",
    "to a (local) address",
)


#: A reply that failed (``launcher/failures.py``'s wording): the rank, and what raised.
_REPLY = re.compile(
    r"rank (\d+) raised .*?could not be sent back to the notebook \((.*)\); return plain",
    re.S,
)


@contextlib.contextmanager
def refusals_explained(why: str) -> Iterator[None]:
    """Notebook side: a check that stopped because the confined call was refused something
    (a file, a socket, the store's file) says ``why`` after the rank's own message."""
    try:
        yield
    except CheckStopped as stop:
        if not any(m in stop.message for m in _REFUSED):
            raise
        said = _REPLY.search(stop.message)
        if said:  # not the job's value: code it left behind ran as the rank replied
            raise wrong(
                f"rank {said[1]} could not reply: after your function returned, code it left "
                f"in the rank (a function it rebound) ran as the rank replied, and was "
                f"refused ({said[2]}).\n{why}"
            ) from None
        raise wrong(f"{stop.message}\n{why}") from None
