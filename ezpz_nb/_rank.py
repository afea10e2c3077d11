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
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

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


def _exception_chain(exc: BaseException) -> list[tuple[list, str, str]]:
    """The exception and its causes as plain data, oldest first: [(frames, header, link)].

    ``link`` is the sentence Python prints before an exception that was raised
    while handling (or because of) the one before it.
    """
    chain: list[tuple[list, str, str]] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = [(f.filename, f.lineno or 0, f.name, f.line or "")
                  for f in traceback.extract_tb(cur.__traceback__)
                  if not f.filename.endswith("_rank.py")]
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
        if cfg.backend == "nccl":
            # Before init: NCCL binds the rank's communicator to the current device.
            torch.cuda.set_device(cfg.rank)
        dist.init_process_group(cfg.backend, store=dist.FileStore(cfg.store_path, cfg.world_size),
                                rank=cfg.rank, world_size=cfg.world_size,
                                timeout=timedelta(seconds=cfg.pg_timeout))
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure
        _send(conn, ("error", _exception_chain(exc)))
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


def _by_value(obj: Any) -> bool:
    if not isinstance(obj, types.FunctionType):
        return False
    module = sys.modules.get(obj.__module__ or "")
    return module is None or obj.__globals__ is not vars(module)


def _rebind(fn: Any) -> Any:
    """Give a function sent by value this rank's persistent globals.

    cloudpickle rebuilds each function with a fresh globals dict, which would make
    ``global it; it = iter(loader)`` vanish before the next run. Names the function
    uses that exist in the notebook arrive with it and overwrite older values (the
    notebook wins); names only set on the ranks persist.
    """
    if not _by_value(fn):
        return fn
    shipped = {k: v for k, v in fn.__globals__.items() if not k.startswith("__")}
    for name, value in shipped.items():
        NAMESPACE[name] = _rebind(value) if _by_value(value) and value is not fn else value
    new = types.FunctionType(fn.__code__, NAMESPACE, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    return new


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
        try:
            fn, args, kwargs = cloudpickle.loads(payload)
            fn = _rebind(fn)
            value = fn(*args, **kwargs)
            reply: tuple = ("ok", value)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt too
            reply = ("error", _exception_chain(exc))
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, reply)
