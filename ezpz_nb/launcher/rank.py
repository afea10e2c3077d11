"""What runs inside each rank process started by :mod:`ezpz_nb.launcher.cluster`.

Imported by the forkserver before it forks (``set_forkserver_preload``), so torch
is already in memory and each rank starts in milliseconds instead of paying an
``import torch`` of its own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from ezpz_nb.launcher import rankgroup
from ezpz_nb.launcher.failures import encode
from ezpz_nb.launcher.runtime import GroupSpec, RankRuntime
from ezpz_nb.launcher.stacks import register_dump
from ezpz_nb.launcher.wire import (
    Event,
    Ok,
    Ready,
    Stop,
    ToNotebook,
    Unpicklable,
    dumps,
    loads,
    loads_job,
)

# Replies (main thread) and published events (any thread) share the command pipe.
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


def _publish_through(conn: Any) -> Any:
    def send_event(item: Any) -> None:
        data = dumps(Event(item))
        with _SEND_LOCK:
            conn.send_bytes(data)

    return send_event


def _send(conn: Any, msg: ToNotebook) -> None:
    try:
        data = dumps(msg)
    except Exception as exc:  # noqa: BLE001 - the return value (or exception) cannot travel
        kind = type(msg[0])
        name = (
            kind.__qualname__
            if kind.__module__ == "builtins"
            else (f"{kind.__module__}.{kind.__qualname__}")
        )
        what = f"return value (a {name})" if isinstance(msg, Ok) else type(msg).__name__
        data = pickle.dumps(Unpicklable(what, f"{type(exc).__name__}: {exc}"))
    with _SEND_LOCK:
        conn.send_bytes(data)


# Folders to remove if the notebook dies: set once this process is a rank (a standby
# process has none yet). The lifeline watcher reads it when the notebook is gone.
_CLEANUP_DIRS: tuple[str, ...] = ()
_WATCHING = False
#: Calls the lifeline watcher makes on its own thread at its next wake (within half a
#: second), each once: how a check confines that thread too (workshop/seal.py).
WATCHER_CALLS: list[Any] = []


def _watch_parent(lifeline: Any, parent_pid: int) -> None:
    """Exit when the notebook goes away, so a dead kernel leaves no ranks behind.

    The notebook normally removes the run's folders; when it died, the ranks do.
    """

    def gone() -> bool:
        return os.getppid() != parent_pid and not _parent_alive(parent_pid)

    while True:
        while WATCHER_CALLS:
            WATCHER_CALLS.pop(0)()
        try:
            if lifeline.poll(0.5):
                lifeline.recv_bytes()  # EOF raises: the notebook end was closed
        except (EOFError, OSError):
            break
        if gone():
            break
    _orphaned(_CLEANUP_DIRS)


def _start_watching(lifeline: Any, parent_pid: int) -> None:
    """One lifeline watcher per process (a standby that becomes a rank keeps its own)."""
    global _WATCHING
    if _WATCHING:
        return
    _WATCHING = True
    threading.Thread(
        target=_watch_parent, args=(lifeline, parent_pid), daemon=True, name="ezpz_nb-lifeline"
    ).start()


def _orphaned(dirs: tuple[str, ...]) -> NoReturn:
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


def standby(conn: Any, out_w: Any, err_w: Any, lifeline: Any, warm_w: Any, parent_pid: int) -> None:
    """Entry point of a standby process (spawn): torch is imported, wait to become a rank.

    Under spawn, unpickling this function imported this module, and with it torch:
    the seconds a launch would otherwise wait for. The notebook's pool hears that
    over ``warm_w``; a launch then sends the :class:`RankConfig` over ``conn`` and
    the process carries on as :func:`main`. It never outlives the notebook: the same
    lifeline as a rank's, and a closed ``conn`` (the pool let it go) ends it too.
    """
    os.setpgrp()  # as a rank: the kernel's signals to its group do not reach us
    signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored until now (pool.py)
    _start_watching(lifeline, parent_pid)
    # Taken before it was warm, the notebook no longer listens: nothing to tell.
    with contextlib.suppress(OSError):
        warm_w.send_bytes(b"warm")
    warm_w.close()
    try:
        cfg = conn.recv()
    except (EOFError, OSError):
        _orphaned(())
    main(cfg, conn, out_w, err_w, lifeline)


def main(cfg: RankConfig, conn: Any, out_w: Any, err_w: Any, lifeline: Any) -> None:
    """Entry point of a rank: join the group, then serve runs until told to stop."""
    global _CLEANUP_DIRS
    _CLEANUP_DIRS = cfg.cleanup_dirs
    with contextlib.suppress(PermissionError):  # already the leader (a standby)
        os.setpgrp()  # our own process group: the kernel's Ctrl-C does not hit us half-way
    _setup_io(out_w, err_w)
    os.environ.clear()
    os.environ.update(cfg.env)
    # torch read TORCH_DISTRIBUTED_DEBUG when the forkserver imported it, maybe long
    # before the notebook set it: read it again from the notebook's environment.
    dist.set_debug_level_from_env()
    try:
        os.chdir(cfg.cwd)
    except OSError:
        pass
    sys.path[:] = cfg.sys_path
    # multiprocessing hands its start method down to the children it starts; a rank
    # should start its own children (DataLoader workers) like any script would, not
    # through a forkserver or spawn that re-imports torch for every worker.
    multiprocessing.set_start_method(None, force=True)
    _start_watching(lifeline, cfg.parent_pid)
    register_dump(cfg.dump_path)  # a hang report asks where this rank is (stacks.py)
    torch.set_num_threads(cfg.threads)
    group = GroupSpec(cfg.backend, cfg.rank, cfg.world_size, timedelta(seconds=cfg.pg_timeout))
    runtime = RankRuntime(group, send_event=_publish_through(conn)).install()
    try:
        rankgroup.join(group, cfg.store_path)
    except BaseException as exc:  # noqa: BLE001 - report any start-up failure
        _send(conn, encode(exc))
        return
    _send(conn, Ready(os.getpid()))
    if not _serve_forever(conn, runtime):
        # The notebook's end of the pipe closed: it died. Whichever of this thread
        # and the lifeline watcher notices first must clean up, or the folders stay.
        _orphaned(cfg.cleanup_dirs)
    # Leave at once: every run has already flushed its output and replied, and the
    # group dies with the processes. Tearing gloo and the interpreter down politely
    # would cost more than the whole start of the next run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve_forever(conn: Any, runtime: RankRuntime) -> bool:
    """Run each job the notebook sends; the stack marker for hang reports.

    Returns True when told to stop, False when the notebook's end went away.
    """
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return False
        msg = loads(data)
        if isinstance(msg, Stop):
            return True
        reply: ToNotebook
        try:
            fn, args, kwargs = loads_job(msg.job, runtime.namespace)
            rankgroup.rejoin_if_destroyed()
        except BaseException as exc:  # noqa: BLE001 - report whatever broke, with our frames
            reply = encode(exc, ours=True)
        else:
            try:
                reply = Ok(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt too
                reply = encode(exc)
        sys.stdout.flush()
        sys.stderr.flush()
        _send(conn, reply)
