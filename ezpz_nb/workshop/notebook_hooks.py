"""Code of the notebook's own that the interpreter runs by itself while a check runs.

Issue 45's sixth trial rewrote a check's counts and its verdict from a profile or trace
function, a gc callback, a signal handler, an audit hook and a thread, each set by an
earlier cell of the notebook. :func:`found` names such code, told from a library's (a
debugger's hook, a widget's thread) by where it was defined; :mod:`.send_time` refuses a
check while any is set. This module only looks: it changes nothing of the learner's.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import sysconfig
import threading
from typing import Any

__all__ = ["found", "threads", "watch_audit_hooks"]


def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives: the standard library, site-packages, and this package."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # ezpz_nb/
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _from_notebook(obj: Any) -> bool:
    """Whether ``obj`` (a hook, a thread's target) is the learner's code: defined in the
    notebook's cells or in a file of theirs (one ``%%writefile`` made), not in an installed
    library, the standard library or ezpz_nb (a debugger's hook, a widget's thread)."""
    for _ in range(4):  # a bound method's function, a partial's, ...
        inner = getattr(obj, "__func__", None) or getattr(obj, "func", None)
        if inner is None or inner is obj:
            break
        obj = inner
    if isinstance(obj, type):
        filename = getattr(sys.modules.get(obj.__module__), "__file__", None) or ""
    else:
        code = getattr(obj, "__code__", None) or getattr(type(obj).__call__, "__code__", None)
        if code is None:
            return False  # built in (C): no learner's code
        filename = code.co_filename
    if getattr(obj, "__module__", None) == "__main__" or not filename.startswith("/"):
        return not filename.startswith("<frozen")  # a cell, exec'd text; not a frozen module
    return not os.path.realpath(filename).startswith(_LIBRARY_DIRS)


_LIBRARY_DIRS = _library_dirs()


def _thread_code(t: threading.Thread) -> Any:
    """What a thread runs: its target, a Timer's function, or its class's own run()."""
    return getattr(t, "_target", None) or getattr(t, "function", None) or type(t)


#: How many audit hooks the notebook's code added since :func:`watch_audit_hooks` (an audit hook
#: runs on every audited event: opening a file, importing, ... and cannot be listed).
_AUDIT_HOOKS_ADDED = [0]
#: Whether :func:`_audit` is installed (an audit hook cannot be removed: install it once).
_WATCHING = [False]


def _audit(event: str, _args: tuple[Any, ...]) -> None:
    if event == "sys.addaudithook" and sys._getframe(1).f_globals.get("__name__") == "__main__":
        _AUDIT_HOOKS_ADDED[0] += 1


def found() -> list[str]:
    """Code of the notebook's own the interpreter runs on its own while a check runs: the
    sixth trial's second part rewrote checks' counts and verdicts from each of these."""
    found = []
    for what, hook in (
        ("a profile function (sys.setprofile)", sys.getprofile()),
        ("a trace function (sys.settrace)", sys.gettrace()),
        ("a profile function for new threads", getattr(threading, "_profile_hook", None)),
        ("a trace function for new threads", getattr(threading, "_trace_hook", None)),
    ):
        if hook is not None and _from_notebook(hook):
            found.append(what)
    if any(_from_notebook(c) for c in gc.callbacks):
        found.append("a garbage collector callback (gc.callbacks)")
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            handler = signal.getsignal(sig)
            if callable(handler) and _from_notebook(handler):
                found.append(f"a handler of {signal.Signals(sig).name} (signal.signal)")
    if _AUDIT_HOOKS_ADDED[0]:
        found.append("an audit hook (sys.addaudithook)")
    alive = [t for t in threading.enumerate() if _from_notebook(_thread_code(t))]
    if alive:
        found.append(f"a thread started in the notebook ({alive[0].name!r})")
    return found


def threads() -> set[int]:
    """This process's threads: Python's, and the kernel's where it lists them (Linux)."""
    ids = {t.ident or 0 for t in threading.enumerate()}
    with contextlib.suppress(OSError):
        ids |= {-int(tid) for tid in os.listdir("/proc/self/task")}
    return ids


def watch_audit_hooks() -> None:
    """From now on, count the audit hooks the notebook's code adds (once per process)."""
    if not _WATCHING[0]:
        _WATCHING[0] = True
        sys.addaudithook(_audit)
