"""Running under torchrun: join its process group, or run a launcher job in place.

* :func:`ensure_distributed`: join the process group torchrun describes in the
  environment, or do nothing inside an ``ez.launch`` rank (already joined).
* :func:`run_in_place`: ``ez.launch``'s result list for a process that torchrun
  started; ``ez.launch`` calls it instead of starting ranks when
  :func:`in_torchrun_env` is true.
* :func:`check_backend`: gloo on CPU by default, nccl with one GPU per rank when
  asked; asking for nccl without a GPU fails *before* any process group exists,
  with what to do instead.
"""

from __future__ import annotations

import atexit
import os
import pickle
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ezpz_nb._dist import destroy_distributed
from ezpz_nb.launcher.errors import LaunchTypeError, LaunchValueError
from ezpz_nb.launcher.failures import cannot_travel

__all__ = [
    "BACKENDS",
    "TORCHRUN_VARS",
    "check_backend",
    "ensure_distributed",
    "gather_in_place",
    "in_torchrun_env",
    "run_in_place",
]

#: Backends the examples accept.
BACKENDS = ("gloo", "nccl")
#: Variables torchrun (and srun/mpiexec wrappers around it) set for each process.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def check_backend(backend: str, local_rank: int | None = None, *, ranks: int | None = None) -> None:
    """Reject a backend this process cannot use, before any process group exists.

    The one backend check: ``ez.launch`` calls it before starting ranks (``ranks``),
    a process torchrun started calls it before joining (``local_rank``).

    Args:
        backend: ``"gloo"`` or ``"nccl"``.
        local_rank: This process's index on its node (``LOCAL_RANK``); with nccl it
            must name a visible GPU.
        ranks: Ranks about to be started on this machine; with nccl each needs a GPU.

    Raises:
        LaunchValueError: Unknown backend, or nccl without a (free) GPU; the message
            says what to run instead.
    """
    if backend not in BACKENDS:
        raise LaunchValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "nccl":
        return
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise LaunchValueError(
            "backend 'nccl' needs one CUDA GPU per rank, but torch sees no GPU here"
            f"{hint}. Use gloo (the default: backend='gloo', --backend gloo) on this machine, or run on "
            "a node with GPUs and a CUDA build of torch."
        )
    count = torch.cuda.device_count()
    if ranks is not None and count < ranks:
        raise LaunchValueError(
            f"backend 'nccl' needs one CUDA GPU per rank: asked for {ranks} ranks, this "
            f"machine has {count} GPU(s). Start at most {count} ranks, or use backend='gloo'."
        )
    if local_rank is not None and not 0 <= local_rank < count:
        raise LaunchValueError(
            f"backend 'nccl' gives each rank its own GPU, but this is local rank {local_rank} "
            f"and the node has {count} visible GPU(s). Start at most {count} processes per "
            f"node (torchrun --nproc_per_node={count}), or use --backend gloo."
        )


def ensure_distributed(backend: str = "gloo", timeout_s: float | None = None) -> bool:
    """Join torch.distributed from torchrun's environment, unless already joined.

    Inside an ``ez.launch`` rank (or any initialised process) this does nothing,
    so a walkthrough's worker runs unchanged in a notebook and under torchrun.

    Args:
        backend: Backend to initialise with when this call does initialise.
        timeout_s: Collective timeout in seconds; torch's defaults are 30 minutes on
            gloo and 10 on nccl, far too long to wait for a teaching example that hangs.

    Returns:
        True if this call created the process group (the caller may destroy
        it), False if one already existed.

    Raises:
        RuntimeError: Not initialised and no torchrun environment to join.
        ValueError: See :func:`check_backend`.
    """
    if dist.is_available() and dist.is_initialized():
        return False
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. Start this under torchrun "
            "(python -m torch.distributed.run --standalone --nproc_per_node=4 -m "
            "ezpz_nb.examples.<name>) or from a notebook with ez.launch(run, world_size=4)."
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    check_backend(backend, local_rank)
    if backend == "nccl":
        # Before init: NCCL binds each rank's communicator to the current device.
        torch.cuda.set_device(local_rank)
    kwargs: dict[str, Any] = {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method="env://", **kwargs)
    # Whoever makes the group tears it down (see destroy_distributed): also when
    # the caller (run_in_place under torchrun) never does. atexit runs before the
    # interpreter starts finalizing, while gloo's threads can still take the GIL.
    atexit.register(destroy_distributed)
    return True


def in_torchrun_env() -> bool:
    """True when torchrun (or srun/mpiexec around it) set this process's rank variables."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def run_in_place(
    fn: Callable[..., Any],
    /,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """``ez.launch``'s contract for a process torchrun already started.

    Joins the group (:func:`ensure_distributed`), runs ``fn`` in this process
    and gathers every rank's result, so code written for ``ez.launch`` gets the
    same answer, a list in rank order, on every rank. The launcher can call this
    instead of starting ranks when :func:`in_torchrun_env` is true.

    Returns:
        ``[result of rank 0, result of rank 1, ...]`` on every rank.
    """
    return gather_in_place(fn, args, kwargs, backend=backend, timeout_s=timeout_s)


def gather_in_place(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    backend: str = "gloo",
    timeout_s: float | None = None,
) -> list[Any]:
    """:func:`run_in_place` with ``fn``'s arguments apart from ours, so that none of
    ``fn``'s keywords (``backend``, ``timeout_s``...) can be taken for ours."""
    ensure_distributed(backend, timeout_s)
    value = fn(*args, **kwargs)
    # Pickled here, not inside all_gather_object: a value that cannot travel would fail
    # there with torch's own words and frames on its rank alone, while its peers waited
    # in the gather. Sent as bytes or as why not, every rank learns who could not send.
    try:
        parcel: tuple[bytes | None, str, str] = (pickle.dumps(value), "", "")
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises, it is the answer
        parcel = (None, type(value).__qualname__, f"{type(exc).__name__}: {exc}")
    parcels: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parcels, parcel)
    for rank, (data, kind, why) in enumerate(parcels):
        if data is None:  # every rank raises the same: none returns a list with a hole
            raise LaunchTypeError(cannot_travel(f"rank {rank}'s return value (a {kind})", why))
    return [pickle.loads(p[0]) for p in parcels]
