"""A loader that fills ``/dev/shm``, run where ``/dev/shm`` is small (notebook 19).

:func:`shm_run` runs on a rank: one epoch of blocks of ``batch_mib`` MiB through a
forked DataLoader, the loop slow enough that every worker keeps
``prefetch_factor`` batches waiting: the peak of :func:`ezpz_nb.shm.predict_peak`.

:func:`small_shm` runs configurations in a private mount namespace whose
``/dev/shm`` is a fresh tmpfs of each configuration's ``shm_mib`` (64 MiB: a Docker
container's), on one set of warm ranks, polling ``/dev/shm`` during each run
(:class:`~ezpz_nb.shm.ShmPoller`): the peak is measured, not computed. Nothing is
mounted outside the namespace, and it ends with the command. It needs root (or
unprivileged user namespaces: ``unshare -r``); :func:`namespace_refusal` says
why not when it cannot.

``python -m ezpz_nb.workshop.shm_fill CONFIG_JSON`` is what runs inside.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "SHARING",
    "ShmConfig",
    "ShmResult",
    "last_error_line",
    "namespace_refusal",
    "shm_run",
    "small_shm",
]

SHM_PATH = "/dev/shm"


@dataclass(frozen=True)
class ShmConfig:
    """One loader configuration to run.

    Attributes:
        name: How the notebook calls it ("prefetch 1"...).
        batch_mib: MiB per batch (one float32 tensor).
        workers: ``num_workers`` per rank.
        prefetch_factor: Batches each worker makes ahead.
        ranks: Ranks, each with its loader.
        sharing: torch's sharing strategy: ``file_descriptor`` (Linux's default)
            or ``file_system``.
        steps: Batches per rank.
        step_s: Seconds each step takes: much longer than a batch takes to make,
            so every queue is full and both ranks' peaks overlap.
        shm_mib: The size of the ``/dev/shm`` it runs in (MiB).
    """

    name: str
    batch_mib: float = 8.0
    workers: int = 2
    prefetch_factor: int = 2
    ranks: int = 2
    sharing: str = "file_descriptor"
    steps: int = 8
    step_s: float = 0.2
    shm_mib: int = 64

    def __post_init__(self) -> None:
        # Here, in the notebook: inside the namespace a wrong value would come back as a
        # rank's failure nested in the namespace's own traceback.
        if self.sharing not in SHARING:
            raise ValueError(
                f"sharing={self.sharing!r} is not one of torch's sharing strategies: use "
                f"{' or '.join(repr(s) for s in SHARING)} (torch.multiprocessing."
                "get_all_sharing_strategies() lists this machine's)"
            )


#: torch's sharing strategies on Linux (``torch.multiprocessing.get_all_sharing_strategies``).
SHARING = ("file_descriptor", "file_system")


@dataclass(frozen=True)
class ShmResult:
    """What one configuration did.

    Attributes:
        config: The configuration.
        predicted: Bytes :func:`~ezpz_nb.shm.predict_peak` predicted.
        peak: Bytes of ``/dev/shm`` in use at most, polled, above the start.
        size: ``/dev/shm``'s size where it ran.
        steps: Steps each rank took.
        errors: Each rank's error, in its first line ("" when it finished).
    """

    config: ShmConfig
    predicted: int
    peak: int
    size: int
    steps: list[int]
    errors: list[str]

    @property
    def ok(self) -> bool:
        """Every rank took every step."""
        return not any(self.errors)


#: float32 elements per sample: 256 KiB, so a batch is a whole number of samples.
SAMPLE = 1 << 16


def batch_bytes(batch_mib: float) -> int:
    """Bytes of the one tensor of a :func:`shm_run` batch of about ``batch_mib`` MiB."""
    return max(1, round(batch_mib * (1 << 20) / (4 * SAMPLE))) * 4 * SAMPLE


def shm_run(
    batch_mib: float, workers: int, prefetch_factor: int, steps: int, step_s: float, sharing: str
) -> tuple[int, str]:
    """On a rank: ``steps`` batches of ``batch_mib`` MiB; ``(steps taken, error or "")``."""
    import torch
    import torch.multiprocessing as tmp
    from torch.utils.data import DataLoader, TensorDataset

    tmp.set_sharing_strategy(sharing)
    batch = batch_bytes(batch_mib) // (4 * SAMPLE)
    data = TensorDataset(torch.zeros(batch * steps, SAMPLE))
    # A worker killed or stuck would otherwise keep the rank waiting: 60 s, then an error.
    loader = DataLoader(
        data,
        batch_size=batch,
        num_workers=workers,
        prefetch_factor=prefetch_factor,
        multiprocessing_context="fork",
        timeout=60,
    )
    taken, error = 0, ""
    batches = iter(loader)
    try:
        for batch in batches:
            time.sleep(step_s)
            taken += 1
            # Dropped before asking for the next one: a loop that still holds it while
            # the next arrives (a plain ``for``) holds one batch more for a moment.
            del batch
    except RuntimeError as exc:  # a worker's failure, relayed: the result, rank by rank
        error = last_error_line(exc)
        # The other workers are blocked on a full /dev/shm, and torch's shutdown waits
        # for each (5 s, MP_STATUS_CHECK_INTERVAL) before it terminates it: ~9 s of a
        # 12 s failed run here. The result is known: stop them now.
        procs = list(getattr(batches, "_workers", ()))
        for worker in procs:
            worker.terminate()
        # And wait until they are gone: a worker still exiting holds its batches in
        # /dev/shm, and the next run on this rank started on a /dev/shm not yet free
        # (a busy machine: "prefetch 1" failed after the default's failure, in make test).
        for worker in procs:
            worker.join()
    # A failed iterator sits in reference cycles with its traceback, holding the batches
    # it received: on a warm rank they would fill the next run's /dev/shm.
    del batches, loader, data
    gc.collect()
    return taken, error


def last_error_line(exc: BaseException) -> str:
    """``Type: message`` of the error at the bottom of ``exc``, in one line.

    A worker's failure reaches the rank as torch's RuntimeError whose text ends with
    the worker's own traceback, its last line already ``RuntimeError: unable to
    allocate...``: that line is the error, and naming the relay's type before it
    would say the type twice.
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    named = re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?", last)
    return last if named else f"{type(exc).__name__}: {last}"


def _inside(configs: list[ShmConfig]) -> list[dict[str, Any]]:
    """Run each configuration here (inside the namespace), polling ``/dev/shm``."""
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.shm import ShmPoller, paged, predict_peak, shm_size, shm_used

    idle = shm_used() or 0
    out = []
    clusters: dict[int, Cluster] = {}  # warm ranks by world size: one start for every run
    size = configs[0].shm_mib if configs else 0
    for c in configs:
        held = _settle(idle)
        if c.shm_mib != size:  # tmpfs resizes in place: the same namespace, warm ranks
            subprocess.run(["mount", "-o", f"remount,size={c.shm_mib}m", SHM_PATH], check=True)
            size = c.shm_mib
        one = paged([batch_bytes(c.batch_mib)])
        if c.ranks not in clusters:
            clusters[c.ranks] = Cluster(c.ranks, timeout=120)
        with ShmPoller() as poll:
            got = clusters[c.ranks].run(
                shm_run, c.batch_mib, c.workers, c.prefetch_factor, c.steps, c.step_s, c.sharing
            )
        predicted = predict_peak(
            one, workers=c.workers, prefetch_factor=c.prefetch_factor, ranks=c.ranks
        )
        out.append(
            {
                "config": asdict(c),
                "predicted": predicted,
                "peak": poll.peak,
                "size": shm_size() or 0,
                "steps": [g[0] for g in got],
                # A failure says whether the run began on a /dev/shm not yet free.
                "errors": [
                    f"{g[1]} (it began with {held / 2**20:.1f} MiB of /dev/shm still held)"
                    if g[1] and held
                    else g[1]
                    for g in got
                ],
            }
        )
    for cluster in clusters.values():
        cluster.close()
    return out


def _settle(idle: int, limit_s: float = 20.0) -> int:
    """Wait until ``/dev/shm`` is back to ``idle`` bytes in use (bounded by ``limit_s``);
    return the bytes above ``idle`` still held then (0 when settled).

    A failed run's workers are joined before its launch returns (:func:`shm_run`); what
    ``file_system`` sharing leaves (files its killed workers never released) may take
    longer: the next run's peak is measured from an empty ``/dev/shm`` where it frees in
    time, and a run that fails on one not yet free says so in its errors.
    """
    from ezpz_nb.shm import shm_used

    # A worker killed between making a segment and unlinking it leaves a file no process
    # frees (seen in CI, 16 MiB, load ~15: the next run began short). This /dev/shm is the
    # namespace's own and its runs are over: what is still listed is no one's.
    for name in os.listdir(SHM_PATH):
        if name.startswith("torch_"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_PATH, name))
    end = time.monotonic() + limit_s
    while (shm_used() or 0) > idle and time.monotonic() < end:
        time.sleep(0.05)
    return max(0, (shm_used() or 0) - idle)


def namespace_refusal() -> str | None:
    """Why a private mount namespace cannot be made here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "no /dev/shm on this system (macOS passes unnamed shared memory): prediction only"
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    if os.geteuid() != 0:
        return "not root: a mount namespace needs root here (or unshare -r, where allowed)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"unshare -m refused: {probe.stderr.strip() or probe.returncode}"
    return None


def small_shm(configs: list[ShmConfig], timeout: float = 300) -> list[ShmResult]:
    """Run ``configs`` in a private mount namespace, each in a ``/dev/shm`` of its ``shm_mib``.

    Give the sizes in increasing order: a tmpfs grows in place, and shrinking one
    that still holds a failed run's leftovers could fail.

    Raises:
        RuntimeError: The namespace cannot be made (:func:`namespace_refusal` says why),
            or the run inside failed before reporting.
    """
    why = namespace_refusal()
    if why:
        raise RuntimeError(f"cannot make a small /dev/shm here: {why}")
    inner = (
        f"mount -t tmpfs -o size={int(configs[0].shm_mib)}m ezpz-shm {SHM_PATH} && "
        f'exec {sys.executable} -m ezpz_nb.workshop.shm_fill "$0"'
    )
    # unshare -m makes mounts private by default: the tmpfs exists only for this tree.
    cmd = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        inner,
        json.dumps([asdict(c) for c in configs]),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"the run in the namespace failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    return [
        ShmResult(
            ShmConfig(**d["config"]), d["predicted"], d["peak"], d["size"], d["steps"], d["errors"]
        )
        for d in json.loads(lines[-1])
    ]


if __name__ == "__main__":
    print(json.dumps(_inside([ShmConfig(**d) for d in json.loads(sys.argv[1])])), flush=True)
