"""Start one rank process with its pipes, and kill one: the helper :mod:`.procs` and :mod:`.pool` share.

A rank (and a standby process, which becomes one) talks to the notebook over four
pipes: commands and replies (``conn``), its fd 1 and fd 2 (``out_r``, ``err_r``), and
a lifeline whose closing tells it the notebook is gone (``life_w``). A standby has a
fifth, ``warm_r``, that says it finished importing torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Child", "kill_group", "main_hidden", "start_child"]


@dataclass
class Child:
    """One started process and the notebook's ends of its pipes."""

    proc: Any
    conn: Any
    out_r: Any
    err_r: Any
    life_w: Any
    warm_r: Any = None

    def close_pipes(self) -> None:
        """Close every notebook end (the process sees EOF on each)."""
        for c in (self.conn, self.out_r, self.err_r, self.life_w, self.warm_r):
            if c is not None:
                c.close()


def start_child(
    ctx: Any,
    target: Callable[..., Any],
    *,
    name: str,
    start_method: str,
    head: tuple = (),
    standby: bool = False,
) -> Child:
    """Start ``target(*head, conn, out_w, err_w, lifeline[, warm_w, notebook_pid])``.

    Args:
        ctx: The multiprocessing context to start it with.
        target: :func:`.rank.main` (``head``: its config) or :func:`.rank.standby`.
        name: The process's name.
        start_method: ``ctx``'s start method (forkserver and spawn hide ``__main__``).
        head: Arguments before the pipes.
        standby: Add the ``warm`` pipe and the notebook's pid, and start it with
            SIGINT ignored (see :func:`_sigint_ignored`).
    """
    # Pipes are made just before each process starts so a forked rank never
    # inherits another rank's write ends (that would hide EOF on death).
    conn, child_conn = ctx.Pipe()
    out_r, out_w = ctx.Pipe(duplex=False)
    err_r, err_w = ctx.Pipe(duplex=False)
    life_r, life_w = ctx.Pipe(duplex=False)
    theirs = [child_conn, out_w, err_w, life_r]
    warm_r = None
    tail: tuple = ()
    if standby:
        warm_r, warm_w = ctx.Pipe(duplex=False)
        theirs.append(warm_w)
        tail = (warm_w, os.getpid())
    proc = ctx.Process(
        target=target,
        args=(*head, child_conn, out_w, err_w, life_r, *tail),
        name=name,
        daemon=False,  # a rank may start DataLoader workers: daemons may not
    )
    with main_hidden(start_method), _sigint_ignored() if standby else contextlib.nullcontext():
        proc.start()
    for c in theirs:
        c.close()
    return Child(proc, conn, out_r, err_r, life_w, warm_r)


@contextlib.contextmanager
def main_hidden(start_method: str) -> Iterator[None]:
    """Keep forkserver/spawn ranks from re-running the caller's ``__main__``.

    multiprocessing re-imports the parent's main script in each child so that
    functions pickled by reference can be found; ours travel by value, and
    re-running a script's top level in every rank would launch ranks again.
    """
    main = sys.modules.get("__main__")
    if start_method == "fork" or main is None:
        yield
        return
    saved: dict[str, Any] = {
        k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def kill_group(proc: Any) -> None:
    """SIGKILL a rank's process group (its DataLoader workers too) and the process itself.

    Does not wait: callers kill every rank first, then reap them together.
    """
    pid = proc.pid
    if pid is None:  # never started
        return
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), proc.kill):
        # Gone already, or never its own group leader yet (a standby mid-start).
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError, AttributeError):
            kill()


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Start a child that ignores SIGINT until it says otherwise (``rank.standby``).

    A standby is in the kernel's process group until its imports are done, and
    ipykernel's shutdown sends SIGINT to that group first: a refill started by the
    last launch then died in ``import site`` with "Fatal Python error" in the
    kernel's log. An ignored signal stays ignored across exec, until the standby,
    in a group of its own by then, restores it. Only the main thread may change a
    handler; elsewhere the child starts as before.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)
