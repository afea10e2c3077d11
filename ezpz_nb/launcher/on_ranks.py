"""Run a function on ranks: ``launch`` (fresh ranks, once) and ``run_on_ranks`` (the
caller's cluster if it passed one, else fresh ranks), each running in place under torchrun.

Every checker and judge of ``verify`` and ``workshop`` runs through
:func:`run_on_ranks`, so they all treat a cluster, a timeout and torchrun alike: the
caller's timeout holds for that run only (``cluster.timeout`` is left as it was), and
a cluster or a torchrun job of the wrong size is refused before anything runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ezpz_nb.launcher.cluster import Cluster
from ezpz_nb.launcher.errors import WorldSizeError
from ezpz_nb.launcher.startup import check_args, pack_job
from ezpz_nb.launcher.torchrun import gather_in_place, in_torchrun_env

__all__ = ["launch", "run_on_ranks"]


def launch(
    fn: Callable[..., Any],
    /,
    *args: Any,
    world_size: int = 2,
    timeout: float = 60.0,
    threads: int | None = None,
    start_method: str | None = None,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks and return their results.

    torch.distributed is initialised in every rank (``dist.get_rank()``,
    ``dist.all_reduce`` just work); the group is torn down afterwards, whatever happens.

    Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR set) no ranks are started:
    ``fn`` runs in this process and the results are gathered from torchrun's ranks
    (with a warning when torchrun started another number of them).

    Returns:
        The return values, in rank order.

    Raises:
        RankError, HangError, RunInterrupted: see :meth:`Cluster.run`.
        ValueError, TypeError: bad arguments, raised before any process starts.
    """
    if in_torchrun_env():
        check_args(world_size, timeout, threads, start_method, backend, ranks_here=False)
        # Under torchrun (or srun/mpiexec around it) the ranks already exist: run
        # here and gather, so notebook code gives the same list on a cluster.
        if _torchrun_size() != world_size:
            warnings.warn(
                f"launch(world_size={world_size}) under torchrun uses torchrun's "
                f"WORLD_SIZE={_torchrun_size()}",
                stacklevel=2,
            )
        return gather_in_place(fn, args, kwargs, backend=backend, timeout_s=timeout)
    return _on_fresh_ranks(
        fn, args, kwargs, world_size, timeout,
        threads=threads, start_method=start_method, backend=backend,
    )  # fmt: skip


def run_on_ranks(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    world_size: int,
    timeout: float,
    cluster: Cluster | None = None,
    start_method: str | None = None,
    what: str = "this job",
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks and return the results in rank order.

    Where: on ``cluster`` when one is given (ranks kept between checks, so their
    imports are paid once), else in place under torchrun, else on fresh ranks
    (``launch``). ``fn``'s arguments come as a tuple and a mapping, so none of its
    keywords can be taken for this function's own.

    Args:
        fn: The function each rank runs.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        world_size: The ranks ``fn`` needs.
        timeout: Seconds this run may take (a cluster's own ``timeout`` is left as
            it was); then ``HangError``.
        cluster: A running :class:`~ezpz_nb.launcher.cluster.Cluster` to run on.
        start_method: For fresh ranks (see ``launch``).
        what: Names the job in a ``WorldSizeError``, e.g. ``"layout dp 2 x tp 2"``.

    Raises:
        WorldSizeError: ``cluster`` (or torchrun) has another number of ranks than
            ``world_size``; nothing ran.
        RankError, HangError, RunInterrupted: see :meth:`Cluster.run`.
    """
    kwargs = dict(kwargs or {})
    if cluster is not None:
        if cluster.world_size != world_size:
            raise WorldSizeError(
                f"{what} needs {world_size} ranks but the cluster has {cluster.world_size}: "
                f"pass a Cluster(world_size={world_size}), or no cluster (fresh ranks)",
                needed=world_size,
                got=cluster.world_size,
            )
        return cluster.run_within(timeout, fn, *args, **kwargs)
    if in_torchrun_env():
        check_args(world_size, timeout, None, start_method, "gloo", ranks_here=False)
        if _torchrun_size() != world_size:
            # Unlike launch, no warning and carry on: a check judged on other ranks
            # than it was made for would judge something else.
            raise WorldSizeError(
                f"{what} needs {world_size} ranks but torchrun started {_torchrun_size()}: "
                f"start {world_size} (--nnodes times --nproc-per-node)",
                needed=world_size,
                got=_torchrun_size(),
            )
        return gather_in_place(fn, args, kwargs, timeout_s=timeout)
    return _on_fresh_ranks(fn, args, kwargs, world_size, timeout, start_method=start_method)


def _torchrun_size() -> int:
    return int(os.environ["WORLD_SIZE"])


def _on_fresh_ranks(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    world_size: int,
    timeout: float,
    **options: Any,
) -> list[Any]:
    job = pack_job(fn, args, kwargs)  # unpicklable input fails before anything starts
    # The cluster checks its arguments before it starts the ranks.
    cluster = Cluster(world_size, timeout, one_shot=True, **options)
    try:
        return cluster.run_job(job)
    finally:
        cluster.close()
