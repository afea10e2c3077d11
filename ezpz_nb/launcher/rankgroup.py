"""A launcher rank's default process group: join it, rejoin it, and forgive pasted setup code.

Code copied from torchrun scripts and from PyTorch's own tutorials sets the group up
itself (``dist.init_process_group("gloo", rank=..., world_size=...)``) and tears it
down at the end (``dist.destroy_process_group()``). On a launcher rank the group
already exists, so the first call used to fail with torch's bare "trying to
initialize the default process group twice!", and after the second every later run
of a Cluster failed with "Default process group has not been initialized".

Here a rank keeps its rendezvous store for its whole life, so it can make a new
group whenever the old one was destroyed, and its ``init_process_group`` accepts a
call that asks for the group it is already in.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.runtime import GroupSpec, current
from ezpz_nb.launcher.settings import LOOPBACK

_REAL_INIT = c10d.init_process_group


def join(group: GroupSpec, store_path: str) -> None:
    """Make this rank's default process group (rendezvous through a FileStore)."""
    # Kept for the rank's life: a destroyed group is remade over the same file.
    group.store = dist.FileStore(store_path, group.world_size)
    if group.backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
        bind_gloo_to(LOOPBACK)
    if group.backend == "nccl":
        # Before init: NCCL binds the rank's communicator to the current device.
        torch.cuda.set_device(group.rank)
    _init(group)
    c10d.init_process_group = dist.init_process_group = _init_process_group


def bind_gloo_to(address: str) -> None:
    """Make every gloo group of this process listen on ``address`` only.

    Left alone, gloo binds to whatever this machine's hostname resolves to (on many
    laptops an address on the local network, where others can reach the ranks), and
    the only switch torch reads, ``GLOO_SOCKET_IFNAME``, takes an interface *name*,
    which differs between platforms (``lo``, ``lo0``, Windows' long display names).
    torch creates each gloo backend (the default group, ``new_group``, a DeviceMesh's
    groups) by calling ``distributed_c10d.ProcessGroupGloo``; that name now makes
    one whose device is created from the address. Instances stay ProcessGroupGloo
    (``isinstance`` checks in torch keep working). Only in a launcher rank.
    """
    base: Any = c10d.ProcessGroupGloo
    if getattr(base, "_ezpz_nb_address", None) is not None:
        base = base.__mro__[1]

    class _SameClass(type(base)):  # type: ignore[misc]  # pybind11's metaclass
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return issubclass(sub, base)

    class ProcessGroupGloo(base, metaclass=_SameClass):
        _ezpz_nb_address = address

        def __init__(self, store: Any, rank: int, size: int, *args: Any, **kwargs: Any) -> None:
            if args and isinstance(args[0], base._Options):  # options given: as asked
                super().__init__(store, rank, size, *args)
                return
            options = base._Options()
            options._timeout = args[0] if args else kwargs.get("timeout", timedelta(minutes=30))
            options._devices = [base.create_device(hostname=address)]
            super().__init__(store, rank, size, options)

    setattr(c10d, "ProcessGroupGloo", ProcessGroupGloo)  # noqa: B010 - mypy: not a type


def _group() -> GroupSpec:
    rt = current()
    if rt is None:  # only a launcher rank patches init_process_group
        raise EzpzError("ezpz_nb: no launcher rank runtime in this process")
    return rt.group


def _init(group: GroupSpec) -> None:
    store = group.store
    if group.generation:
        # Every key of a new group under a fresh prefix: the old group's keys are
        # still in the file and would be read as this group's.
        store = dist.PrefixStore(f"ezpz_nb-regroup-{group.generation}", store)
    group.generation += 1
    _REAL_INIT(
        group.backend,
        store=store,
        rank=group.rank,
        world_size=group.world_size,
        timeout=group.timeout,
    )


def rejoin_if_destroyed() -> None:
    """Before a run: remake the group if the previous run destroyed it.

    Every rank runs the same function, so all of them destroyed it and all of them
    rejoin here, under the same generation's prefix.
    """
    if dist.is_initialized():
        return
    group = _group()
    if group.rank == 0:
        print(
            "[ezpz_nb] the last run called dist.destroy_process_group(); made a new group "
            "for this run. In a notebook the launcher owns the group: no need to destroy it.",
            file=sys.stderr,
        )
    _init(group)


def _init_process_group(
    backend: Any = None,
    init_method: str | None = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    *args: Any,
    **kwargs: Any,
) -> None:
    """``dist.init_process_group`` on a launcher rank: the group is already made.

    A call asking for this rank's own place (or leaving rank and world size out) is
    accepted and does nothing, so torchrun-style setup code runs unchanged; a call
    asking for something else says what to write instead. ``init_method``,
    ``MASTER_ADDR``/``MASTER_PORT`` and ``store`` are not used: the launcher's own
    rendezvous serves every group of this rank.
    """
    g = _group()
    ours = f"rank {g.rank} of {g.world_size}, {g.backend}"
    wanted_backend = str(backend).lower() if backend is not None else None
    if wanted_backend is not None and g.backend not in wanted_backend:
        raise RuntimeError(
            f"dist.init_process_group({backend!r}): ezpz_nb already joined this rank to a "
            f"{g.backend} group ({ours}). Start the ranks with that backend instead "
            f"(ez.launch(..., backend={wanted_backend!r})) and remove this call."
        )
    if (rank not in (-1, None) and rank != g.rank) or (
        world_size not in (-1, None) and world_size != g.world_size
    ):
        raise RuntimeError(
            f"dist.init_process_group(rank={rank}, world_size={world_size}): ezpz_nb already "
            f"placed this process as {ours}. Pass rank=dist.get_rank() and "
            "world_size=dist.get_world_size(), or remove the call: the group exists."
        )
    if not dist.is_initialized():  # destroyed earlier in this same run
        _init(g)
        return
    if not g.noted and g.rank == 0:
        g.noted = True
        print(
            f"[ezpz_nb] dist.init_process_group(): the ranks are already in a {g.backend} "
            "group (made by the launcher); the call was skipped.",
            file=sys.stderr,
        )
