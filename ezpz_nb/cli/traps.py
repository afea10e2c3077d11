"""The platform's traps, for ``ezpz-nb doctor``: pure functions of the platform and environment.

Each takes what it looks at as arguments (``sys.platform``, the environment, the core
count) so that what a Windows or macOS laptop is told can be tested on any machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ezpz_nb.cli.report import Check

__all__ = ["start_method_check", "threads_check", "torchrun_check", "trap_checks"]

# 4 ranks under spawn, measured on 2 busy cores (benchmarks/launch.py, docs/benchmarks.md):
# what a launch costs without help.
_SPAWN_COST = "about 7 s for 4 ranks on 2 busy cores, 1-2 s on a quiet laptop"


def start_method_check(platform: str, env: Mapping[str, str], standby: int = 0) -> Check:
    """How ``ez.launch`` starts ranks here, and what that costs each launch.

    Args:
        platform: A ``sys.platform`` value.
        env: The environment (``EZPZ_NB_START_METHOD`` may choose the method).
        standby: Ranks the standby pool keeps ready under spawn (0: no pool).
    """
    # Imported here: the doctor runs (and says what to install) in a Python without torch,
    # and importing anything under ezpz_nb.launcher imports the launcher, which needs it.
    from ezpz_nb.launcher.settings import START_METHOD_ENV
    from ezpz_nb.launcher.startup import resolve_start_method

    try:
        method = resolve_start_method(env.get(START_METHOD_ENV), platform)
    except ValueError as exc:  # StartMethodError
        return Check("start method", False, f"{START_METHOD_ENV} is not usable", str(exc))
    chosen = f" ({START_METHOD_ENV})" if env.get(START_METHOD_ENV, "").strip() else ""
    if method == "forkserver":
        return Check(
            "start method",
            True,
            f"forkserver{chosen}: torch is imported once, each rank forks in milliseconds",
        )
    if method == "fork":
        return Check(
            "start method",
            None if platform == "darwin" else True,
            f"fork{chosen}: ranks are copies of the kernel: fastest, but they can hang or "
            "crash once the kernel has used CUDA or threads (on macOS, system libraries "
            "start threads of their own)",
            f"unset {START_METHOD_ENV} unless you need fork" if platform == "darwin" else "",
        )
    why = "the platform's default" if not chosen else START_METHOD_ENV
    detail = f"spawn ({why}): every rank is a fresh Python that imports torch"
    if standby:
        return Check(
            "start method",
            True,
            f"{detail}; in a kernel {standby} standby ranks import it ahead, so a launch "
            "that finds them ready does not wait",
        )
    return Check(
        "start method",
        None,
        f"{detail}, so each launch waits for that ({_SPAWN_COST})",
        "nothing is broken, only slower; keep EZPZ_NB_STANDBY unset (the standby pool "
        "imports torch ahead) and leave a few seconds between opening a notebook and "
        "the first launch",
    )


def torchrun_check(platform: str, env: Mapping[str, str]) -> Check | None:
    """On Windows: torchrun's TCP store needs ``USE_LIBUV=0`` (pytorch issue 139990).

    Returns:
        None elsewhere: the trap exists only in Windows builds of torch.
    """
    if platform not in ("win32", "cygwin"):
        return None
    if env.get("USE_LIBUV", "").strip() == "0":
        return Check("torchrun", True, "USE_LIBUV=0: torchrun's store works on Windows")
    return Check(
        "torchrun",
        None,
        "on Windows, torchrun (and init_process_group on older torch) stops with "
        '"use_libuv was requested but PyTorch was built without libuv support"',
        "set USE_LIBUV=0 in the terminal before torchrun (PowerShell: $env:USE_LIBUV=0; "
        "cmd: set USE_LIBUV=0); ez.launch uses a file store and is not affected",
    )


def threads_check(cores: int, env: Mapping[str, str], ranks: int | None = None) -> Check:
    """Whether ``ranks`` ranks, with their threads, oversubscribe ``cores`` cores.

    ``ez.launch`` gives each rank ``max(1, cores // ranks)`` threads; torchrun gives
    each process ``OMP_NUM_THREADS`` threads (1 when it is not set).
    """
    if ranks is None:  # the world size most cells launch
        from ezpz_nb.launcher.settings import ONE_LAUNCH

        ranks = ONE_LAUNCH
    per_rank = max(1, cores // ranks)
    omp = env.get("OMP_NUM_THREADS", "").strip()
    torchrun_threads = int(omp) if omp.isdigit() and int(omp) > 0 else 1
    if torchrun_threads * ranks > cores and torchrun_threads > 1:
        return Check(
            "threads",
            None,
            f"OMP_NUM_THREADS={omp}: under torchrun {ranks} processes run "
            f"{ranks * torchrun_threads} threads on {cores} cores",
            f"unset OMP_NUM_THREADS (torchrun then gives each process 1 thread) or set it "
            f"to {max(1, cores // ranks)}; oversubscribed ranks wait for each other at "
            "every collective",
        )
    if ranks > cores:
        return Check(
            "threads",
            None,
            f"{ranks} ranks x {per_rank} thread on {cores} cores: ranks take turns",
            "nothing breaks, but runs are slower and timings noisier; close other "
            f"programs, and read speed comparisons with world_size <= {cores}",
        )
    return Check(
        "threads", True, f"{ranks} ranks x {per_rank} thread(s) fit {cores} cores (ez.launch)"
    )


def trap_checks(
    platform: str | None = None,
    env: Mapping[str, str] | None = None,
    cores: int | None = None,
    standby: int | None = None,
) -> list[Check]:
    """Every platform trap for this machine (arguments default to this process's own;
    ``standby``: the pool a kernel here would keep under spawn)."""
    platform = sys.platform if platform is None else platform
    env = os.environ if env is None else env
    if cores is None:
        from ezpz_nb.launcher.startup import cores as count

        cores = count()
    if standby is None:
        standby = _standby_here(env)
    checks = [start_method_check(platform, env, standby)]
    torchrun = torchrun_check(platform, env)
    if torchrun is not None:
        checks.append(torchrun)
    checks.append(threads_check(cores, env))
    return checks


def _standby_here(env: Mapping[str, str]) -> int:
    from ezpz_nb.launcher.pool import size_from_env
    from ezpz_nb.launcher.startup import warm_up_allowed

    if not warm_up_allowed(env):
        return 0
    try:
        return size_from_env(env)
    except ValueError:  # a bad EZPZ_NB_STANDBY: import ezpz_nb in a kernel says so
        return 0
