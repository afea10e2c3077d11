"""What is checked and prepared before any rank process starts.

Bad input must fail here, in the notebook, with a message that says what to do,
rather than as a crash inside N processes.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ezpz_nb.launcher.errors import LaunchTypeError, LaunchValueError
from ezpz_nb.launcher.kernel import in_jupyter_kernel
from ezpz_nb.launcher.settings import (
    MAX_WORLD_SIZE,
    PRELOAD_ENV,
    START_METHOD_ENV,
    START_METHODS,
    WARMUP_ENV,
    is_off,
)
from ezpz_nb.launcher.torchrun import check_backend, in_torchrun_env
from ezpz_nb.launcher.wire import dumps_job, unpicklable_part


class StartMethodError(LaunchValueError):
    """``EZPZ_NB_START_METHOD`` names a start method this platform cannot run."""


def resolve_start_method(value: str | None, platform: str) -> str:
    """The default start method for ``platform`` (``sys.platform``), given the variable.

    Args:
        value: ``EZPZ_NB_START_METHOD`` as set (None or blank: the platform's own).
        platform: A ``sys.platform`` value: ``"linux"``, ``"darwin"``, ``"win32"``...

    Raises:
        StartMethodError: The value is not a start method, or the platform cannot run it.
    """
    native = "forkserver" if platform.startswith("linux") else "spawn"
    wanted = (value or "").strip().lower()
    if not wanted:
        # forkserver needs fork underneath (Linux); macOS forks badly and Windows cannot.
        return native
    if wanted not in START_METHODS:
        raise StartMethodError(
            f"{START_METHOD_ENV}={value!r} is not a start method: set it to one of "
            f"{', '.join(START_METHODS)}, or unset it for this platform's default ({native!r})"
        )
    if wanted in ("fork", "forkserver") and platform in ("win32", "cygwin"):
        raise StartMethodError(
            f"{START_METHOD_ENV}={value!r}: {wanted} needs os.fork, which Windows does not "
            f"have; set it to 'spawn' or unset it"
        )
    return wanted


def default_start_method() -> str:
    """``EZPZ_NB_START_METHOD`` if set, else ``"forkserver"`` on Linux, ``"spawn"`` elsewhere."""
    return resolve_start_method(os.environ.get(START_METHOD_ENV), sys.platform)


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_args(
    world_size: Any,
    timeout: Any,
    threads: Any,
    start_method: Any,
    backend: Any,
    *,
    ranks_here: bool = True,
) -> None:
    """Reject bad input before any process starts.

    ``ranks_here=False``: the ranks exist already (under torchrun, perhaps on several
    nodes), so this machine needs no GPU per rank; each rank checks its own as it joins.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise LaunchTypeError(
            f"world_size must be an int, got {type(world_size).__name__}: pass e.g. world_size=4"
        )
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise LaunchValueError(
            f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {world_size}: "
            "on one machine, 2-8 ranks show everything this tutorial teaches"
        )
    check_timeout(timeout)
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise LaunchValueError(f"threads must be a positive int or None, got {threads!r}")
    if start_method is not None and start_method not in START_METHODS:
        raise LaunchValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method in ("fork", "forkserver") and not hasattr(os, "fork"):
        raise LaunchValueError(f"start_method={start_method!r} needs os.fork; use 'spawn' here")
    check_backend(backend, ranks=world_size if ranks_here else None)


def check_timeout(timeout: Any) -> float:
    """``timeout`` as a float, or a LaunchTypeError/LaunchValueError saying what to pass."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise LaunchTypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
    if not timeout > 0 or timeout != timeout or timeout == float("inf"):
        raise LaunchValueError(f"timeout must be a finite number of seconds > 0, got {timeout}")
    return float(timeout)


def pack_job(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    """Pickle a job for the ranks, or say which part cannot travel and what to do."""
    if not callable(fn):
        raise LaunchTypeError(
            f"fn must be callable, got {type(fn).__name__}: pass the function "
            "itself, not its result (launch(f), not launch(f()))"
        )
    named = [("fn", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword {k!r}", v) for k, v in kwargs.items()]
    return pack_naming_culprit(
        (fn, args, kwargs),
        named,
        lambda label, obj, exc: (
            f"{label} (a {type(obj).__name__}) cannot be sent to the ranks: {exc}. "
            "Create it inside the function instead, or pass something picklable."
        ),
    )


def pack_naming_culprit(
    whole: Any, named: list[tuple[str, Any]], blame: Callable[[str, Any, Exception], str]
) -> bytes:
    """``dumps_job(whole)``, or a LaunchTypeError that names the part that cannot travel.

    Args:
        whole: What to pickle.
        named: ``(label, part)`` for each part of ``whole``, searched in order only
            when ``whole`` failed (one pickle when all is well).
        blame: Words the error from the first failing part's label, object and error.

    Raises:
        LaunchTypeError: ``whole`` cannot be pickled.
    """
    try:
        return dumps_job(whole)
    except Exception as exc:
        culprit = unpicklable_part(named)
        if culprit is None:
            raise LaunchTypeError(f"the job cannot be sent to the ranks: {exc}") from exc
        raise LaunchTypeError(blame(*culprit)) from culprit[2]


class PreloadError(LaunchValueError):
    """``EZPZ_NB_PRELOAD`` names a module this Python cannot find."""


def preload_modules(value: str | None) -> list[str]:
    """The modules ``EZPZ_NB_PRELOAD`` names (``value``), each one found here.

    Raises:
        PreloadError: a name no installed module has (the forkserver would skip it in
            silence, and every rank would pay for it again).
    """
    names = [n for n in (value or "").replace(",", " ").split() if n]
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a bad name
            found = False
        if not found:
            raise PreloadError(
                f"{PRELOAD_ENV}={value!r}: no module {name!r} can be imported here. Name "
                "installed modules (e.g. EZPZ_NB_PRELOAD=torch.distributed.checkpoint), or "
                "unset it."
            )
    return names


def forkserver_context() -> Any:
    """multiprocessing's forkserver context, with torch, the rank code and the modules of
    ``EZPZ_NB_PRELOAD`` (:func:`preload_modules`) preloaded."""
    ctx = mp.get_context("forkserver")
    # One import of torch in the server; every rank after that is a fast fork.
    # forkserver first: it leaves the kernel's process group (see there).
    ctx.set_forkserver_preload(
        [
            "ezpz_nb.launcher.forkserver",
            "ezpz_nb.launcher.rank",
            *preload_modules(os.environ.get(PRELOAD_ENV)),
        ]
    )
    return ctx


def warm_up_allowed(env: Mapping[str, str]) -> bool:
    """False when ``EZPZ_NB_WARMUP`` is 0 (or off/false/no)."""
    return not is_off(env.get(WARMUP_ENV))


def should_warm_up() -> bool:
    """Whether to prepare ranks at import: in a Jupyter kernel, not under torchrun,
    unless ``EZPZ_NB_WARMUP=0`` (the forkserver, or under spawn the standby pool)."""
    if not warm_up_allowed(os.environ):
        return False
    return default_start_method() != "fork" and not in_torchrun_env() and in_jupyter_kernel()
