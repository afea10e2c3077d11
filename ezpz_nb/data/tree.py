"""Nested batches as a picklable tree plus a flat list of tensors, and back.

The TP broadcast sends the tensors in one buffer and the tree beside them; the
ledger digests the tensors in this same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["find_in_batch", "flatten_batch", "sample_values", "unflatten_batch"]


def flatten_batch(batch: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split a batch into a picklable tree (without tensor data) and its tensors.

    Args:
        batch: A tensor, or dicts/lists/tuples/namedtuples nesting tensors and
            other picklable values.

    Returns:
        ``(tree, tensors)``: ``tree`` holds ``("t", i)`` where tensor ``i`` of
        ``tensors`` was; every other leaf is kept as ``("o", value)``.
    """
    tensors: list[torch.Tensor] = []

    def walk(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
            return ("t", len(tensors) - 1)
        if isinstance(obj, dict):
            return ("d", tuple((k, walk(v)) for k, v in obj.items()))
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return ("n", type(obj), tuple(walk(v) for v in obj))
        if isinstance(obj, (list, tuple)):
            return ("l" if isinstance(obj, list) else "u", tuple(walk(v) for v in obj))
        return ("o", obj)

    return walk(batch), tensors


def unflatten_batch(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`flatten_batch`."""
    tag = tree[0]
    if tag == "t":
        return tensors[tree[1]]
    if tag == "d":
        return {k: unflatten_batch(v, tensors) for k, v in tree[1]}
    if tag == "n":
        return tree[1](*(unflatten_batch(v, tensors) for v in tree[2]))
    if tag in ("l", "u"):
        items = [unflatten_batch(v, tensors) for v in tree[1]]
        return items if tag == "l" else tuple(items)
    return tree[1]


def find_in_batch(batch: Any, key: str, accept: Callable[[Any], bool] | None = None) -> Any:
    """The first value under ``key`` in a (nested) batch of dicts, lists and tuples, else None.

    Args:
        batch: The batch to search, depth first.
        key: The dict key to find.
        accept: When given, a value under ``key`` that it rejects is searched
            into instead of returned (e.g. ``torch.is_tensor``).
    """
    if isinstance(batch, dict):
        if key in batch and (accept is None or accept(batch[key])):
            return batch[key]
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return None
    for v in values:
        found = find_in_batch(v, key, accept)
        if found is not None:
            return found
    return None


def _flat(value: Any) -> list[Any]:
    """One field's values as a flat list: a tensor or array elementwise, lists flattened."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    return [value]


def sample_values(batch: Any, key: str) -> list[Any] | None:
    """Every sample's ``key`` in a batch, in order, or None when no sample has one.

    Reads the shapes loaders give: a dict of columns (``{"index": tensor([3, 7])}``,
    a Hugging Face batch's lists), a list or tuple of sample dicts
    (``collate_fn=list``), and any nesting of them. In a dict, the first field
    that holds ``key`` answers for the whole dict (its fields describe the same
    samples); in a list or tuple, every element that holds ``key`` adds its samples
    (``(x, y)`` pairs: only ``x`` holds it; a list of samples: all do).

    Args:
        batch: One batch as a loader yields it.
        key: The field to read (``"index"``, ``"__key__"``, ``"worker_id"``...).
    """
    if isinstance(batch, dict):
        if key in batch:
            return _flat(batch[key])
        return next(
            (found for v in batch.values() if (found := sample_values(v, key)) is not None), None
        )
    if isinstance(batch, (list, tuple)):
        parts = [found for v in batch if (found := sample_values(v, key)) is not None]
        return [x for p in parts for x in p] if parts else None
    return None
