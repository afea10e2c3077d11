"""What runs inside each rank process started by :mod:`ezpz_nb.launch`.

Imported by the forkserver before it forks (``set_forkserver_preload``), so torch
is already in memory and each rank starts in milliseconds instead of paying an
``import torch`` of its own.
"""

from __future__ import annotations

import faulthandler
import io
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import threading
import traceback
import types
from collections import ChainMap
from dataclasses import dataclass
from typing import Any

import cloudpickle
import torch

from ezpz_nb import _rankgroup

# Set while this process is a launcher rank; ``publish`` sends through it.
_CONN: Any = None
_SEND_LOCK = threading.Lock()


@dataclass(frozen=True)
class RankConfig:
    """Everything a rank needs to join the group (sent once, at start)."""

    rank: int
    world_size: int
    store_path: str
    dump_path: str
    threads: int
    backend: str
    pg_timeout: float
    env: dict[str, str]
    cwd: str
    sys_path: list[str]
    parent_pid: int
    # Folders the notebook would remove at exit: ours, and multiprocessing's own
    # (the forkserver's). If the notebook dies, the ranks remove them instead.
    cleanup_dirs: tuple[str, ...] = ()


def _code_keep_filename(code: types.CodeType) -> tuple:
    # cloudpickle renames every code object's file to "<dynamic-code>"; we keep the
    # real one so tracebacks and hang reports can point at the learner's cell line.
    ctor, args = cloudpickle.cloudpickle._code_reduce(code)
    return ctor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    if hasattr(cloudpickle.cloudpickle, "_code_reduce"):
        dispatch_table = ChainMap({types.CodeType: _code_keep_filename},
                                  cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """cloudpickle, keeping source file names (functions travel by value)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def publish(item: Any) -> bool:
    """Send ``item`` to the notebook now, while the rank keeps running.

    The notebook collects published items in arrival order (``Cluster.events``,
    and ``.events`` on :class:`~ezpz_nb.errors.RankError` / ``HangError``), so what a
    rank recorded before a failure or a hang is not lost.

    Returns:
        True when sent; False outside a launcher rank (plain script, torchrun),
        where it does nothing.
    """
    conn = _CONN
    if conn is None:
        return False
    data = dumps(("event", item))
    with _SEND_LOCK:
        conn.send_bytes(data)
    return True


def _send(conn: Any, msg: tuple) -> None:
    try:
        data = dumps(msg)
    except Exception as exc:  # the return value (or exception) cannot travel
        kind = type(msg[1])
        name = kind.__qualname__ if kind.__module__ == "builtins" else (
            f"{kind.__module__}.{kind.__qualname__}")
        what = f"return value (a {name})" if msg[0] == "ok" else msg[0]
        data = pickle.dumps(("unpicklable", what, f"{type(exc).__name__}: {exc}"))
    with _SEND_LOCK:
        conn.send_bytes(data)


def _exception_chain(exc: BaseException, ours: bool = False) -> list[tuple[list, str, str]]:
    """The exception and its causes as plain data, oldest first: [(frames, header, link)].

    ``link`` is the sentence Python prints before an exception that was raised
    while handling (or because of) the one before it. This module's frames are left
    out (they are the same in every traceback), unless ``ours``: the failure is in
    the rank's own plumbing, and they are then the only frames there are.
    """
    chain: list[tuple[list, str, str]] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = [(f.filename, f.lineno or 0, f.name, f.line or "")
                  for f in traceback.extract_tb(cur.__traceback__)
                  if ours or not f.filename.endswith("_rank.py")]
        header = "".join(traceback.format_exception_only(type(cur), cur)).rstrip()
        if cur.__cause__ is not None:
            link, nxt = _CAUSE, cur.__cause__
        elif cur.__context__ is not None and not cur.__suppress_context__:
            link, nxt = _CONTEXT, cur.__context__
        else:
            link, nxt = "", None
        chain.append((frames, header, link))
        cur = nxt
    chain.reverse()
    return chain


#: Said with a failure outside the user's function (loading the job, rejoining the group).
_OUR_FAULT = ("ezpz_nb failed on this rank before your function ran (while loading the job "
              "or preparing the process group): a bug in ezpz_nb, or an object in the job "
              "that cannot be rebuilt on the ranks. The traceback shows where.")

_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"


def _watch_parent(lifeline: Any, parent_pid: int, dirs: tuple[str, ...]) -> None:
    """Exit when the notebook goes away, so a dead kernel leaves no ranks behind.

    The notebook normally removes the run's folders; when it died, the ranks do.
    """
    def gone() -> bool:
        return os.getppid() != parent_pid and not _parent_alive(parent_pid)

    while True:
        try:
            if lifeline.poll(0.5):
                lifeline.recv_bytes()  # EOF raises: the notebook end was closed
        except (EOFError, OSError):
            break
        if gone():
            break
    _orphaned(dirs)


def _orphaned(dirs: tuple[str, ...]) -> None:
    """The notebook is gone without saying stop: remove its folders, then leave."""
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    try:
        os.killpg(0, signal.SIGKILL)  # our own group: this rank and its loader workers
    finally:
        os._exit(1)


def _parent_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _setup_io(out_w: Any, err_w: Any) -> None:
    # Redirect the file descriptors, not just sys.stdout: torch's C++ warnings and
    # anything a library writes to fd 2 must reach the notebook too.
    os.dup2(out_w.fileno(), 1)
    os.dup2(err_w.fileno(), 2)
    out_w.close()
    err_w.close()
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)


def main(cfg: RankConfig, conn: Any, out_w: Any, err_w: Any, lifeline: Any) -> None:
    """Entry point of a rank: join the group, then serve runs until told to stop."""
    global _CONN
    os.setpgrp()  # our own process group: the kernel's Ctrl-C does not hit us half-way
    _setup_io(out_w, err_w)
    os.environ.clear()
    os.environ.update(cfg.env)
    try:
        os.chdir(cfg.cwd)
    except OSError:
        pass
    sys.path[:] = cfg.sys_path
    # multiprocessing hands its start method down to the children it starts; a rank
    # should start its own children (DataLoader workers) like any script would, not
    # through a forkserver or spawn that re-imports torch for every worker.
    multiprocessing.set_start_method(None, force=True)
    threading.Thread(target=_watch_parent, args=(lifeline, cfg.parent_pid, cfg.cleanup_dirs), daemon=True,
                     name="ezpz_nb-lifeline").start()
    dump = open(cfg.dump_path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    torch.set_num_threads(cfg.threads)
    _CONN = conn
    try:
        _rankgroup.join(cfg.backend, cfg.store_path, cfg.rank, cfg.world_size, cfg.pg_timeout)
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure
        _send(conn, ("error", _exception_chain(exc), ""))
        return
    _send(conn, ("ready", os.getpid()))
    if not _serve_forever(conn):
        # The notebook's end of the pipe closed: it died. Whichever of this thread
        # and the lifeline watcher notices first must clean up, or the folders stay.
        _orphaned(cfg.cleanup_dirs)
    # Leave at once: every run has already flushed its output and replied, and the
    # group dies with the processes. Tearing gloo and the interpreter down politely
    # would cost more than the whole start of the next run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: One namespace per rank shared by every function sent by value (and by %%ranks
#: cells), so globals a run sets are still there in the next run.
NAMESPACE: dict[str, Any] = {"__name__": "__ranks__", "__builtins__": __builtins__}

# Stands in the pickle for the globals dict of every function sent by value.
_GLOBALS_TOKEN = "ezpz_nb:rank-namespace"


class _JobPickler(_Pickler):
    """Pickles a job so that its by-value functions share the rank's NAMESPACE.

    cloudpickle gives the functions of one pickle that shared a globals dict in the
    notebook one fresh dict on the ranks (``globals_ref``), and fills it with the
    names each function uses. Here that dict travels as a persistent id, and the
    rank loads it as NAMESPACE: cloudpickle then writes the notebook's values into
    NAMESPACE itself (the notebook wins for names a function uses), names set only
    on the ranks persist between runs, and every kind of by-value function
    (helpers calling each other in cycles, methods of cell classes, decorated
    functions, partials, lambdas in globals) reads and writes the same globals.
    Rebinding the functions after loading instead had to walk their references
    by hand, and recursed forever on any cycle (two helpers of one function).
    """

    def persistent_id(self, obj: Any) -> str | None:  # noqa: D102 - pickle's hook
        if type(obj) is dict:
            for shared in self.globals_ref.values():
                if obj is shared:
                    return _GLOBALS_TOKEN
        return None


class _JobUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:  # noqa: D102 - pickle's hook
        if pid == _GLOBALS_TOKEN:
            return NAMESPACE
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps_job(obj: Any) -> bytes:
    """Pickle what the notebook sends to run (see :class:`_JobPickler`)."""
    buf = io.BytesIO()
    _JobPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads_job(data: bytes) -> Any:
    """Load a job made by :func:`dumps_job` into this rank's NAMESPACE."""
    return _JobUnpickler(io.BytesIO(data)).load()


def _serve_forever(conn: Any) -> bool:
    """Run each job the notebook sends; the stack marker for hang reports.

    Returns True when told to stop, False when the notebook's end went away.
    """
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return False
        kind, payload = pickle.loads(data)
        if kind == "stop":
            return True
        reply: tuple
        try:
            fn, args, kwargs = loads_job(payload)
            _rankgroup.rejoin_if_destroyed()
        except BaseException as exc:  # noqa: BLE001 - report whatever broke, with our frames
            reply = ("error", _exception_chain(exc, ours=True), _OUR_FAULT)
        else:
            try:
                reply = ("ok", fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt too
                reply = ("error", _exception_chain(exc), "")
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, reply)
