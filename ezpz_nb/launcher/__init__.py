"""Start real torch.distributed ranks from a notebook and talk to them.

The notebook side is :mod:`.cluster` (``Cluster``, ``launch``); what runs in each
rank is :mod:`.rank`; the two meet only through :mod:`.wire`. Around them:
:mod:`.startup` (checks before anything starts), :mod:`.forkserver` and
:mod:`.shutdown` (the kernel's life cycle), :mod:`.output` (rank output relay),
:mod:`.errors` (how failures and hangs are worded), :mod:`.rankgroup` (a rank's
process group), :mod:`.torchrun` (running in place under torchrun) and
:mod:`.magic` (``%%ranks``). Nothing here knows about data or ledgers.
"""

from __future__ import annotations

from ezpz_nb.launcher.cluster import Cluster, launch, live_clusters
from ezpz_nb.launcher.startup import MAX_WORLD_SIZE, START_METHODS

__all__ = ["MAX_WORLD_SIZE", "START_METHODS", "Cluster", "launch", "live_clusters"]
