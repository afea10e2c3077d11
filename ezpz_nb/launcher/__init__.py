"""Start real torch.distributed ranks from a notebook and talk to them.

The notebook side is :mod:`.cluster` (``Cluster``), a facade over three
steps: :mod:`.procs` (start, watch and kill the rank processes), :mod:`.run`
(gather one run into a ``RunResult``) and :mod:`.policy` (keep, kill or raise).
What runs in each rank is :mod:`.rank`, with its state in one :mod:`.runtime`
object; the two sides meet only through :mod:`.wire`. A failure on a rank is
encoded and decoded by :mod:`.failures`, a hung rank's stack asked for and read by
:mod:`.stacks` (both ends), and both are worded by :mod:`.errors`. :mod:`.on_ranks` runs a
function on ranks: ``launch`` (fresh ones), ``run_on_ranks`` (a cluster's, else
fresh ones; the one way checkers run). Around them:
:mod:`.startup` (checks before anything starts), :mod:`.settings` (the numbers and
switches both sides share), :mod:`.children` (start or kill one rank process),
:mod:`.session` (the notebook's clusters, warm-up), :mod:`.pool` (standby ranks for
spawn, and when to refill them), :mod:`.kernel` (are we in a kernel), :mod:`.forkserver`
and :mod:`.shutdown` (the kernel's life cycle), :mod:`.output` (rank output relay), :mod:`.rankgroup` (a
rank's process group) and :mod:`.torchrun` (running in place under torchrun).
Nothing here knows about data or ledgers; ``%%ranks`` is a front end above it
(:mod:`ezpz_nb.magic`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ezpz_nb.launcher.settings import MAX_WORLD_SIZE, START_METHODS

if TYPE_CHECKING:
    from ezpz_nb.launcher.cluster import Cluster, live_clusters
    from ezpz_nb.launcher.on_ranks import launch, run_on_ranks

__all__ = [
    "MAX_WORLD_SIZE",
    "START_METHODS",
    "Cluster",
    "launch",
    "live_clusters",
    "run_on_ranks",
]


def __getattr__(name: str) -> Any:
    # On first use, not at import: `ezpz_nb.launcher.settings` (which the doctor reads
    # before it knows torch and cloudpickle are there) must import without them.
    if name in ("Cluster", "live_clusters"):
        from ezpz_nb.launcher import cluster

        return getattr(cluster, name)
    if name in ("launch", "run_on_ranks"):
        from ezpz_nb.launcher import on_ranks

        return getattr(on_ranks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
