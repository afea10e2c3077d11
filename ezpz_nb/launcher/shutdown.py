"""Leaving cleanly when Jupyter shuts the kernel down.

See :func:`on_kernel_shutdown`: without it every notebook shutdown took 2.5 s and
left multiprocessing's ``pymp-*`` folder behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from ezpz_nb.launcher.kernel import in_jupyter_kernel, shell

_KERNEL_HOOKED = False


def on_kernel_shutdown(close_all: Callable[[], None]) -> None:
    """In a Jupyter kernel, close the clusters as soon as it is asked to shut down.

    ipykernel, once asked, terminates every child left in its process group and
    waits until none is: ranks run in their own groups and the forkserver leaves
    the kernel's (``ezpz_nb.launcher.forkserver``), but multiprocessing's resource
    tracker ignores SIGTERM. The kernel then outlived its manager's grace
    period and was killed, skipping its exit handlers, so every shutdown took
    2.5 s and left multiprocessing's ``pymp-*`` folder behind. ``do_shutdown``
    sets the shell's ``exit_now`` before any child is signalled; this closes
    our clusters then and lets the tracker go, so the kernel exits at once and
    cleans up after itself. Outside a kernel it does nothing.
    """
    global _KERNEL_HOOKED
    if _KERNEL_HOOKED or not in_jupyter_kernel():
        return
    ipython = shell()
    if ipython is None or not ipython.has_trait("exit_now"):
        return

    def shutting_down(change: dict[str, Any]) -> None:
        if not change["new"]:
            return
        # An exception here would escape ipykernel's do_shutdown and stop the
        # shutdown reply: each step is best effort, the next runs regardless.
        with contextlib.suppress(Exception):
            close_all()
        with contextlib.suppress(Exception):
            _stop_forkserver()
        with contextlib.suppress(Exception):
            _release_resource_tracker()

    ipython.observe(shutting_down, names="exit_now")
    _KERNEL_HOOKED = True


def _stop_forkserver() -> None:
    """End the forkserver and reap it, once every cluster is closed.

    A forkserver still importing torch (warmed up at ``import ezpz_nb``, then the
    kernel shut down at once) has not yet left the kernel's process group:
    ipykernel's SIGTERM would leave it a zombie that the kernel waits on until
    its manager kills it. Ended and reaped here, it is simply gone; a later
    launch (there is none at shutdown) would start a new one. Uses the
    forkserver's private ``_forkserver_pid`` (3.10-3.14; skipped if missing).
    """
    import signal
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    alive = getattr(server, "_forkserver_alive_fd", None)
    server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    if alive is not None:
        with contextlib.suppress(OSError):
            os.close(alive)


def _release_resource_tracker() -> None:
    """Let multiprocessing's resource tracker exit, never blocking on it.

    Only when no multiprocessing child of ours is left (one may still use the
    tracker). Uses the tracker's private ``_lock``, ``_fd`` and ``_pid``
    (3.10-3.14; skipped if missing): close our end of its pipe, forget it (a
    later launch starts a new one), and reap it from a daemon thread, because
    it exits only once every process holding that pipe has. Its own ``_stop``
    would wait holding the lock, freezing anything that used the tracker next.
    Semaphores the kernel itself still holds (a spawn-context Queue, say) are
    then unlinked by the exiting tracker with a warning, moments before the
    kernel's own exit would remove them: noise in the kernel's log, no more.
    """
    import multiprocessing
    import threading
    from multiprocessing import resource_tracker

    tracker: Any = resource_tracker._resource_tracker
    if multiprocessing.active_children() or not all(
        hasattr(tracker, name) for name in ("_lock", "_fd", "_pid")
    ):
        return
    if not tracker._lock.acquire(timeout=1.0):
        return
    try:
        fd, pid = tracker._fd, tracker._pid
        if fd is None or pid is None:
            return
        tracker._fd = tracker._pid = None
        os.close(fd)
    finally:
        tracker._lock.release()
    # A zombie tracker would keep ipykernel waiting just the same: reap it.
    reaper = threading.Thread(target=_reap, args=(pid,), name="ezpz_nb-reap-tracker", daemon=True)
    reaper.start()
    reaper.join(1.0)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
