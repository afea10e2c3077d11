"""The doctor's probes that start real gloo ranks: cores, a launch, the memory they need.

:func:`launch_check` launches ranks that all_reduce and measures each rank's memory;
:func:`check_memory` says whether :data:`NOTEBOOK_RANKS` such ranks fit in what is free.
"""

from __future__ import annotations

import os
import sys
import time

from ezpz_nb.cli.report import Check

__all__ = [
    "NOTEBOOK_RANKS",
    "check_cores",
    "check_memory",
    "check_shm",
    "launch_check",
    "launch_fix",
    "launch_name",
]

# The most ranks a notebook starts: 06_explorer's world-size slider goes up to 8.
NOTEBOOK_RANKS = 8


def check_cores() -> Check:
    """How many cores this process may use (fewer only makes the notebooks slower)."""
    try:
        from ezpz_nb.launcher.startup import cores
    except ImportError:  # no working torch (reported above): the launcher cannot load
        n = os.cpu_count() or 1
    else:
        n = cores()
    detail = f"{n} (each of r ranks gets max(1, {n} // r) threads)"
    if n < 2:
        return Check("cores", None, detail, "the notebooks run, more slowly: ranks take turns")
    return Check("cores", True, detail)


def _rank_memory() -> int:
    """This rank's share of memory in bytes: PSS on Linux (shared pages split fairly)."""
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _hello() -> tuple[float, int]:
    """On every rank: the all_reduce of the ranks' numbers, and this rank's memory."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item(), _rank_memory()


def launch_fix() -> str:
    """What to do when ranks cannot meet over gloo."""
    from ezpz_nb.launcher.settings import LOOPBACK as address

    named = os.environ.get("GLOO_SOCKET_IFNAME")
    if named:
        return (
            f"GLOO_SOCKET_IFNAME is set to {named!r}: unset it (ezpz_nb binds gloo to "
            f"{address}, the loopback address, by itself), and check again"
        )
    return (
        f"check that nothing (a firewall, a VPN client) blocks connections on {address}; "
        "the error says more"
    )


def _describe(exc: BaseException, limit: int = 300) -> str:
    """One line about a failed launch: for a RankError, the first failing rank's message."""
    from ezpz_nb.launcher.errors import RankError

    if isinstance(exc, RankError) and exc.ranks:
        first = exc.failures[exc.ranks[0]]
        text = f"RankError on rank(s) {exc.ranks}: {first.message}"
    else:
        lines = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def launch_name(world_size: int) -> str:
    # The first launch (2 ranks) answers "does gloo work here?"; the second times the usual 4.
    return "gloo on loopback" if world_size == 2 else f"{world_size}-rank launch"


def launch_check(world_size: int, timeout: float) -> tuple[Check, list[int]]:
    """Launch ``world_size`` ranks that all_reduce; a check and each rank's memory."""
    from ezpz_nb.launcher import launch

    name = launch_name(world_size)
    start = time.monotonic()
    try:
        results = launch(_hello, world_size=world_size, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, reported
        return Check(name, False, _describe(exc), launch_fix()), []
    took = time.monotonic() - start
    want = float(sum(range(world_size)))
    if any(total != want for total, _ in results):
        return Check(
            name, False, f"all_reduce gave {[t for t, _ in results]}, not {want}", launch_fix()
        ), []
    return (
        Check(name, True, f"{world_size} ranks, all_reduce correct, {took:.2f} s"),
        [mem for _, mem in results],
    )


def check_memory(rank_bytes: list[int], available: int | None) -> Check:
    """Enough free memory for :data:`NOTEBOOK_RANKS` ranks of the size just measured."""
    gib = 1024**3
    if not rank_bytes:
        free = "" if available is None else f"{available / gib:.1f} GiB free; "
        return Check(
            "memory", None, f"{free}rank size unknown (no launch succeeded)", "fix the launch first"
        )
    need = NOTEBOOK_RANKS * max(rank_bytes) + _rank_memory()  # the ranks and this kernel
    if available is None:
        return Check(
            "memory",
            None,
            "could not read the free memory here",
            f"make sure about {need / gib:.1f} GiB is free for {NOTEBOOK_RANKS} ranks",
        )
    detail = (
        f"{available / gib:.1f} GiB free, {NOTEBOOK_RANKS} ranks need about {need / gib:.1f} GiB"
    )
    if available < need:
        return Check(
            "memory",
            False,
            detail,
            "close other programs (browsers, IDEs) and run ezpz-nb doctor again",
        )
    return Check("memory", True, detail)


# The loader the doctor sizes /dev/shm for: notebook 19's, at NOTEBOOK_RANKS ranks.
SHM_LOADER = {"batch_mib": 8.0, "workers": 2, "prefetch_factor": 2}


def check_shm(
    batch_mib: float = SHM_LOADER["batch_mib"],
    workers: int = int(SHM_LOADER["workers"]),
    prefetch_factor: int = int(SHM_LOADER["prefetch_factor"]),
    ranks: int = NOTEBOOK_RANKS,
    path: str | None = None,
) -> Check:
    """``/dev/shm``'s size, and whether a loader of this configuration fits in it.

    The prediction is :func:`ezpz_nb.shm.plan_shm`'s, the helper notebook 19 uses;
    a loader that does not fit is a warning (the notebooks themselves stay small).
    """
    from ezpz_nb.shm import SHM, plan_shm

    plan = plan_shm(
        int(batch_mib * (1 << 20)),
        workers=workers,
        prefetch_factor=prefetch_factor,
        ranks=ranks,
        path=path or SHM,
    )
    if plan.fits is not False:  # fits, or no /dev/shm to compare with (macOS)
        return Check("shared memory", True, str(plan))
    return Check(
        "shared memory",
        None,
        str(plan).split(": does NOT fit")[0] + ": does NOT fit",
        "lower prefetch_factor or num_workers, or give /dev/shm more room "
        "(docker run --shm-size=1g; Kubernetes: an emptyDir with medium: Memory)",
    )
