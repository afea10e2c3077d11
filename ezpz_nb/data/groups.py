"""The DP x TP rank layout: who shares data with whom.

Ranks are arranged as a ``dp_size x tp_size`` grid with TP innermost, the
layout of ezpz, Megatron-LM and picotron (a DeviceMesh follows the order of the
dimensions it is given; ``("dp", "tp")`` puts TP innermost): at world 4 with
tp 2 the TP groups are ``[0, 1], [2, 3]`` and the DP groups ``[0, 2], [1, 3]``.
TP peers must hold the *same* batch; DP replicas must hold *different* ones.

Example (inside a rank, e.g. ``ez.launch(fn, world_size=4)``)::

    from ezpz_nb.data.groups import make_layout
    layout = make_layout(tp_size=2)
    layout.dp_rank, layout.tp_rank   # rank 3 -> (1, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ezpz_nb._dist import on_teardown, uses_nccl

__all__ = [
    "Layout",
    "layout_table",
    "make_layout",
    "release_groups",
    "tp_groups_across_nodes",
    "valid_tp_sizes",
]


@dataclass(frozen=True)
class Layout:
    """Where one rank sits in the DP x TP grid, with the groups to talk in.

    Attributes:
        rank: Global rank in the default process group.
        world_size: Number of ranks in the default process group.
        dp_rank: Index of this rank's data-parallel replica (its row).
        dp_size: Number of data-parallel replicas (``world_size // tp_size``).
        tp_rank: Index of this rank inside its tensor-parallel group (its column).
        tp_size: Ranks per tensor-parallel group.
        dp_group: Process group of the ranks with the same ``tp_rank`` (shard
            the data over this one), or ``None`` outside torch.distributed.
        tp_group: Process group of the ranks with the same ``dp_rank`` (they
            must see identical batches), or ``None`` outside torch.distributed.
        cp_rank: Position in a context-parallel group, for a ``dp x cp x tp``
            layout built by hand from a DeviceMesh (``make_layout`` builds no
            CP group: 0).
        cp_size: Ranks per CP group (1 without CP).

    Pickling a layout (returning it from a rank) drops the groups.
    """

    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int
    # Groups are handles, not values: leave them out of ==/repr so two layouts
    # compare by position and printing one stays readable.
    dp_group: Any = field(default=None, compare=False, repr=False)
    tp_group: Any = field(default=None, compare=False, repr=False)
    cp_rank: int = 0
    cp_size: int = 1

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A process group handle means nothing in another process: pickling
        # (e.g. returning a layout from a rank to the notebook) keeps the numbers only.
        return (
            Layout,
            (
                self.rank,
                self.world_size,
                self.dp_rank,
                self.dp_size,
                self.tp_rank,
                self.tp_size,
                None,
                None,
                self.cp_rank,
                self.cp_size,
            ),
        )

    @property
    def is_tp_leader(self) -> bool:
        """True on the rank that loads for its TP group (``tp_rank == 0``)."""
        return self.tp_rank == 0


def valid_tp_sizes(world_size: int) -> list[int]:
    """Return the TP sizes that divide ``world_size`` evenly.

    Args:
        world_size: Number of ranks (>= 1).

    Returns:
        The divisors of ``world_size`` in increasing order.
    """
    return [d for d in range(1, world_size + 1) if world_size % d == 0]


def _check(world_size: int, tp_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not isinstance(tp_size, int) or tp_size < 1 or world_size % tp_size:
        raise ValueError(
            f"tp_size={tp_size!r} does not divide world_size={world_size}; "
            f"valid tp sizes are {valid_tp_sizes(world_size)}"
        )


def layout_table(world_size: int, tp_size: int) -> list[tuple[int, int, int]]:
    """Compute the grid without any process group (for plots in the notebook).

    Args:
        world_size: Number of ranks.
        tp_size: Ranks per TP group; must divide ``world_size``.

    Returns:
        One ``(rank, dp_rank, tp_rank)`` tuple per rank, in rank order.

    Raises:
        ValueError: If ``tp_size`` does not divide ``world_size``.
    """
    _check(world_size, tp_size)
    # TP innermost: consecutive ranks form a TP group (they usually share a
    # node, and TP talks the most).
    return [(r, r // tp_size, r % tp_size) for r in range(world_size)]


def tp_groups_across_nodes(world_size: int, tp_size: int, local_world_size: int) -> list[list[int]]:
    """The TP groups whose ranks sit on more than one node.

    torchrun numbers ranks node by node, ``local_world_size`` per node, so a TP
    group of consecutive ranks stays on one node only when ``tp_size`` divides
    ``local_world_size``: ``tp_size <= local_world_size`` is not enough (12
    ranks, 6 per node, tp 4: ``[4, 5, 6, 7]`` spans two nodes).

    Args:
        world_size: Number of ranks.
        tp_size: Ranks per TP group; must divide ``world_size``.
        local_world_size: Ranks per node (torchrun's ``LOCAL_WORLD_SIZE``).

    Returns:
        The global ranks of each TP group that spans nodes; empty when none does.
    """
    _check(world_size, tp_size)
    if local_world_size < 1:
        raise ValueError(f"local_world_size must be >= 1, got {local_world_size}")
    starts = range(0, world_size, tp_size)
    return [
        list(range(s, s + tp_size))
        for s in starts
        if s // local_world_size != (s + tp_size - 1) // local_world_size
    ]


def _warn_if_tp_spans_nodes(rank: int, world_size: int, tp_size: int) -> None:
    import os
    import warnings

    from ezpz_nb.data.distributed import DataLayoutWarning

    local = os.environ.get("LOCAL_WORLD_SIZE", "")  # set by torchrun; ez.launch: one node
    # One warning for the job (rank 0's log), not one per rank.
    if rank != 0 or not local.isdigit() or int(local) < 1:
        return
    spans = tp_groups_across_nodes(world_size, tp_size, int(local))
    if spans:
        fits = [d for d in valid_tp_sizes(world_size) if int(local) % d == 0]
        warnings.warn(
            f"TP group(s) {spans[:3]}{' ...' if len(spans) > 3 else ''} span two nodes "
            f"({local} ranks per node, tp_size={tp_size}): TP's traffic, the heaviest, "
            f"crosses the network. Use a tp_size that divides the ranks per node "
            f"(--nproc_per_node), e.g. one of {fits}.",
            DataLayoutWarning,
            stacklevel=3,
        )


def _groups_from_mesh(dp_size: int, tp_size: int) -> tuple[Any, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    device = "cuda" if uses_nccl() else "cpu"
    mesh = init_device_mesh(device, (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    # get_group by name, not mesh["dp"]: torch 2.14 slices a mesh inside a torch._dynamo
    # context, and that first import took 6-7 s per rank on 2 cores (2.13: none).
    return mesh.get_group("dp"), mesh.get_group("tp")


def _groups_from_new_group(world_size: int, tp_size: int) -> tuple[Any, Any]:
    import torch.distributed as dist

    rank = dist.get_rank()
    dp_size = world_size // tp_size
    dp_group = tp_group = None
    # new_group is collective over the whole world: every rank must create
    # every group, in the same order, even the groups it is not part of.
    for d in range(dp_size):
        ranks = list(range(d * tp_size, (d + 1) * tp_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            tp_group = g
    for t in range(tp_size):
        ranks = list(range(t, world_size, tp_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            dp_group = g
    return dp_group, tp_group


# (tp_size, use_device_mesh) -> (the default group it was built in, layout).
# Each new group costs sockets and threads on every member (about 10 file
# descriptors per call at world 4), and a persistent Cluster re-running a cell
# would otherwise pile them up. The cache holds the groups (and the default
# group) alive: destroy_distributed() calls release_groups() (registered below).
_CACHE: dict[tuple[int, bool], tuple[Any, Layout]] = {}


def release_groups() -> None:
    """Forget the groups :func:`make_layout` keeps for reuse, so they can be freed.

    ``dist.destroy_process_group()`` only unregisters groups; each group's
    threads live on until the last Python reference to it goes. Call this
    before (or right after) destroying the process group; layouts made
    earlier keep their own references, so drop those too.
    """
    _CACHE.clear()


on_teardown(release_groups)


def make_layout(tp_size: int = 1, *, use_device_mesh: bool = True) -> Layout:
    """Build this rank's DP and TP groups; call it on every rank, in the same order.

    Must run inside an initialised process group (``ez.launch``, torchrun).
    Outside one it returns the trivial single-process layout when
    ``tp_size == 1``. Within one process group the groups are built once per
    ``tp_size`` and reused by later calls (every rank makes the same calls, so
    every rank reuses alike).

    Args:
        tp_size: Ranks per TP group; must divide the world size.
        use_device_mesh: Build the groups with ``init_device_mesh`` (falls back
            to ``dist.new_group`` if DeviceMesh is unavailable or fails).

    Returns:
        The :class:`Layout` of the calling rank.

    Warns:
        DataLayoutWarning: On rank 0 under torchrun (``LOCAL_WORLD_SIZE`` set),
            when a TP group spans nodes because ``tp_size`` does not divide the ranks per
            node (see :func:`tp_groups_across_nodes`).

    Raises:
        ValueError: If ``tp_size`` does not divide the world size (the message
            lists the valid sizes).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        _check(1, tp_size)
        return Layout(0, 1, 0, 1, 0, 1)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    _check(world_size, tp_size)
    world = dist.group.WORLD
    cached = _CACHE.get((tp_size, use_device_mesh))
    if cached is not None and cached[0] is world:  # same process group: groups still valid
        return cached[1]
    _warn_if_tp_spans_nodes(rank, world_size, tp_size)
    dp_size = world_size // tp_size
    groups = None
    if use_device_mesh:
        try:
            groups = _groups_from_mesh(dp_size, tp_size)
        except (ImportError, RuntimeError, NotImplementedError):
            # Older torch or a backend DeviceMesh rejects: plain groups do.
            # Every rank takes the same branch because the cause is global.
            groups = None
    if groups is None:
        groups = _groups_from_new_group(world_size, tp_size)
    dp_group, tp_group = groups
    _, dp_rank, tp_rank = layout_table(world_size, tp_size)[rank]
    layout = Layout(rank, world_size, dp_rank, dp_size, tp_rank, tp_size, dp_group, tp_group)
    _CACHE[(tp_size, use_device_mesh)] = (world, layout)
    return layout
