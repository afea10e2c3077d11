"""Facts about this process's torch.distributed state that every layer shares.

The bottom of the package: it imports nothing of ezpz_nb. :func:`uses_nccl` is the
one backend test, :func:`collective_device` the one device choice that follows from
it; :func:`destroy_distributed` the one teardown, with the hooks
that other modules register (:func:`on_teardown`) so that it can free what they
keep without importing them.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable
from types import FunctionType
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["collective_device", "destroy_distributed", "on_teardown", "uses_nccl"]

#: Name of gloo's collective worker threads (two per process group), as Linux shows it.
_GLOO_WORKER_THREAD = "pt_gloo_runloop"
_TEARDOWN: list[Callable[[], None]] = []


def uses_nccl(group: Any = None) -> bool:
    """True when torch.distributed is initialised and ``group`` (default: the world) runs NCCL."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return "nccl" in str(dist.get_backend(group)).lower()


def collective_device(group: Any = None) -> torch.device:
    """Where the tensors of ``group``'s collectives live: this rank's GPU under nccl
    (which moves CUDA buffers only), else the CPU (gloo, or no group at all)."""
    if uses_nccl(group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def on_teardown(release: Callable[[], None]) -> None:
    """Have :func:`destroy_distributed` call ``release`` first (e.g. to drop cached groups)."""
    if release not in _TEARDOWN:
        _TEARDOWN.append(release)


def _gloo_worker_threads() -> int:
    """How many gloo collective worker threads this process has (0 where unknown)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux: nothing to count
        return 0
    count = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == _GLOO_WORKER_THREAD
        except OSError:  # the thread ended meanwhile
            pass
    return count


# DTensor's caches, as (module, attribute path): their entries hold DTensorSpecs
# or meshes, hence every DeviceMesh a DTensor used and its process groups. After
# an FSDP2 x TP run (the capstone) six gloo worker threads outlived
# destroy_process_group(); emptying these frees four (the last two: see
# _release_captured_groups). Paths a torch version lacks are skipped.
_DTENSOR_CACHES = (
    ("torch", "_C._clear_DTensor_sharding_propagator_cache"),
    (
        "torch.distributed.tensor",
        "DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear",
    ),
    (
        "torch.distributed.tensor",
        "DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear",
    ),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
    # Keyed by a weak reference to the mesh, but each planner holds the mesh itself.
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
)


def _release_dtensor_caches() -> None:
    """Empty DTensor's caches, if DTensor was used (this never imports it)."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    for module, path in _DTENSOR_CACHES:
        clear: Any = sys.modules.get(module)
        for name in path.split("."):
            clear = getattr(clear, name, None)
        if callable(clear):
            clear()


def _release_captured_groups() -> None:
    """Take process groups out of the default arguments of loaded torch.distributed functions.

    ``torch.distributed.nn.functional`` declares ``def broadcast(tensor, src,
    group=group.WORLD)`` and nine more like it: the default is evaluated when the
    module is imported. Imported after the group was made (DTensor imports it),
    ten functions hold the default group for good, in tuples the garbage
    collector does not track, and its two gloo threads outlived every teardown.
    ``None`` is what those defaults are when the module is imported before any
    group, and means "the default group" at call time, so it is put back. The
    methods of the classes these modules define are looked at too
    (``ShardedGradScaler.__init__`` has ``process_group=dist.group.WORLD``).
    """
    if not dist.is_available():
        return
    for name, module in list(sys.modules.items()):
        if not name.startswith("torch.distributed") or module is None:
            continue
        for obj in list(vars(module).values()):
            # type() first: touching a deprecated attribute (dist.reduce_op) warns.
            if type(obj) is FunctionType:
                _drop_group_defaults(obj)
            elif issubclass(type(obj), type) and vars(obj).get("__module__") == name:
                for member in list(vars(obj).values()):
                    if type(member) is FunctionType:
                        _drop_group_defaults(member)


def _drop_group_defaults(fn: FunctionType) -> None:
    if fn.__defaults__ and any(_is_group(d) for d in fn.__defaults__):
        fn.__defaults__ = tuple(None if _is_group(d) else d for d in fn.__defaults__)
    if fn.__kwdefaults__ and any(_is_group(d) for d in fn.__kwdefaults__.values()):
        fn.__kwdefaults__ = {k: None if _is_group(d) else d for k, d in fn.__kwdefaults__.items()}


def _is_group(obj: object) -> bool:
    return issubclass(type(obj), dist.ProcessGroup)  # isinstance() on some defaults warns


def destroy_distributed() -> int:
    """Destroy the process group and free every group object, joining their threads.

    ``dist.destroy_process_group()`` alone is not enough. It unregisters the
    groups, but a gloo group's C++ object, and its two worker threads, live as
    long as a Python object refers to it (a Layout, a loader, a group cache). A
    worker thread drops its reference to a finished collective *after* the
    caller's ``wait()`` returned; the collective holds tensors whose Python
    objects can only be freed with the GIL. If that thread asks for the GIL once
    the interpreter is finalizing, CPython ends it with ``pthread_exit``, whose
    unwinding through torch's ``noexcept`` destructor calls ``std::terminate``:
    "terminate called without an active exception", SIGABRT, exit -6 after all
    the work was done, and torchrun reports the job FAILED. Freeing the group
    objects instead runs their destructors here, which release the GIL and join
    the threads: teardown is over when this returns.

    Returns:
        The number of gloo worker threads still alive afterwards: 0 unless
        something outside ezpz_nb still holds a group object (then a warning on
        stderr says so).
    """
    for release in _TEARDOWN:
        release()
    _release_dtensor_caches()
    _release_captured_groups()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    # Groups held only by reference cycles (an exception's frames) are freed now,
    # not at some later collection that might come during interpreter exit.
    gc.collect()
    left = _gloo_worker_threads()
    if left:
        print(
            f"ezpz_nb: {left} gloo worker thread(s) outlive destroy_process_group(): "
            "something still refers to a process group (a Layout or a loader kept in "
            "a global?), and such a thread can abort this process as it exits. Drop "
            "those references before the end.",
            file=sys.stderr,
            flush=True,
        )
    return left
