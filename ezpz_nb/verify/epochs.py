"""What a loader holds that shuffles, and reaching every ``set_epoch`` in it.

The reshuffle rule is judged from the orders the ranks saw, not from where a
sampler sits. Before each epoch the check calls ``set_epoch`` where a training
loop (or accelerate) reaches it: on the loader itself, its ``sampler``, its
``batch_sampler`` and that one's ``sampler``, and its ``dataset`` (an HF
``IterableDataset``). It also walks the loader's attributes a few levels deep for
what asked for a shuffle, so that two epochs in the same order name the object
the epoch never reached (a sampler hidden in a wrapper object without
``set_epoch``, a generator seeded the same way every epoch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["LoaderParts", "loader_parts"]

# Attributes that hold a loader's parts, looked at first and in this order.
_PARTS = ("sampler", "batch_sampler", "dataset", "datasets", "loader", "dataloader", "inner")
_DEPTH = 4
# Samplers that shuffle by their type (torch's; a class named so, or one derived from one).
_RANDOM = ("RandomSampler", "SubsetRandomSampler")
_MAX_OBJECTS = 64


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    seen = set()
    for name in _PARTS:
        value = getattr(obj, name, None) if not isinstance(obj, type) else None
        if value is not None:
            seen.add(name)
            yield name, value
    for name, value in (getattr(obj, "__dict__", None) or {}).items():
        if name.lstrip("_") not in seen and name not in seen:
            yield name, value


def _is_part(obj: Any) -> bool:
    """An object worth looking into: a user's or a library's instance, not data or plumbing."""
    if isinstance(obj, (list, tuple)):
        return True
    if obj is None or isinstance(obj, (str, bytes, int, float, bool, dict, type)):
        return False
    module = type(obj).__module__ or ""
    if module.startswith(("torch.distributed", "multiprocessing", "threading", "builtins")):
        return False
    if hasattr(obj, "shape") or callable(obj) and not hasattr(obj, "__iter__"):
        return False  # tensors and arrays; functions and bound methods
    return hasattr(obj, "__dict__")


# Where a training loop reaches set_epoch: the loader, and these parts of it.
_REACHED = ("", ".sampler", ".batch_sampler", ".batch_sampler.sampler", ".dataset")


@dataclass
class LoaderParts:
    """The objects of a loader (``path -> object``) that take an epoch or shuffle.

    Attributes:
        reached: The parts with a ``set_epoch`` that a training loop reaches.
        shufflers: Every part found that asked for a shuffle.
    """

    reached: dict[str, Any]
    shufflers: dict[str, Any]

    def set_epoch(self, epoch: int) -> None:
        """Call ``set_epoch(epoch)`` on every reached part, outermost first."""
        for part in self.reached.values():
            part.set_epoch(epoch)

    def unreached(self) -> list[str]:
        """Shufflers no ``set_epoch`` reaches, each with why."""
        reached = {id(o) for o in self.reached.values()}
        return [
            f"{type(obj).__name__} at {path} ("
            + (
                "its set_epoch is never called: it sits in a wrapper without set_epoch"
                if callable(getattr(obj, "set_epoch", None))
                else "it has no set_epoch"
            )
            + ")"
            for path, obj in self.shufflers.items()
            if id(obj) not in reached
        ]


def _reached(loader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for suffix in _REACHED:
        obj = loader
        for name in filter(None, suffix.split(".")):
            obj = getattr(obj, name, None)
        if callable(getattr(obj, "set_epoch", None)) and id(obj) not in map(id, out.values()):
            out["loader" + suffix] = obj
    return out


def _shuffles(obj: Any) -> bool:
    if getattr(obj, "shuffle", None) is True:  # DistributedSampler(shuffle=True) and kin
        return True
    # Its class or one it derives from: a RandomSampler subclass is the usual way to give it
    # a set_epoch (the ninth trial's right answer was told it shuffled nothing).
    if any(c.__name__ in _RANDOM for c in type(obj).__mro__):
        return True
    # A Hugging Face IterableDataset after .shuffle(seed=...): a shuffled stage in
    # its chain of example iterables (its own set_epoch reseeds them).
    stage = getattr(obj, "_ex_iterable", None)
    for _ in range(16):
        if stage is None:
            return False
        if "Shuffled" in type(stage).__name__:
            return True
        stage = getattr(stage, "ex_iterable", None)
    return False


def loader_parts(loader: Any) -> LoaderParts:
    """The parts of ``loader`` that a loop reaches with ``set_epoch``, and those that shuffle."""
    shufflers: dict[str, Any] = {}
    seen: set[int] = set()
    todo: list[tuple[str, Any, int]] = [("loader", loader, 0)]
    while todo and len(seen) < _MAX_OBJECTS:
        path, obj, depth = todo.pop(0)
        if id(obj) in seen or not _is_part(obj):
            continue
        seen.add(id(obj))
        if isinstance(obj, (list, tuple)):
            todo += [(f"{path}[{i}]", v, depth + 1) for i, v in enumerate(obj[:8])]
            continue
        if _shuffles(obj):
            shufflers[path] = obj
        if depth < _DEPTH:
            todo += [(f"{path}.{name}", v, depth + 1) for name, v in _children(obj)]
    return LoaderParts(_reached(loader), shufflers)
