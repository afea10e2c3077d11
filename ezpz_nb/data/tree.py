"""The one walker of batches: their fields, leaves and sample values, and a picklable tree.

A batch is whatever a loader yields: a tensor, a dict (or any mapping) of columns, a
list or tuple of samples or of ``(x, y)`` parts, or a record with named fields (a
namedtuple, a dataclass, an ``attrs`` class), nested in any way. :func:`children`
says what a node holds; :func:`sample_values`, :func:`find_in_batch` and
:func:`leaves` read a batch through it, for the ledger and :mod:`ezpz_nb.verify`
alike. The TP broadcast sends the tensors of :func:`flatten_batch` in one buffer
and the tree beside them; the ledger digests the tensors in this same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

__all__ = [
    "children",
    "fields",
    "find_in_batch",
    "flatten_batch",
    "leaves",
    "sample_values",
    "unflatten_batch",
]


def fields(node: Any) -> list[tuple[str, Any]] | None:
    """A record's ``(name, value)`` pairs, or None when ``node`` is not a record.

    Records are mappings (a dict, a tokenizer's ``BatchEncoding``), namedtuples,
    dataclass instances and ``attrs`` instances: whatever names its fields.
    """
    if isinstance(node, Mapping):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return list(zip(node._fields, node, strict=True))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return [(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)]
    attrs = getattr(type(node), "__attrs_attrs__", None)
    if attrs is not None:
        return [(a.name, getattr(node, a.name)) for a in attrs]
    return None


def children(node: Any) -> list[tuple[str, Any]] | None:
    """What a node holds: a record's fields, a list's or tuple's items by position; None for a leaf."""
    named = fields(node)
    if named is not None:
        return named
    if isinstance(node, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(node)]
    return None


def _is_structure(node: Any) -> bool:
    # A list of tensors, records or lists is structure ((x, y) batches, samples); a
    # list of strings or numbers is one column (a HF batch's text, a list of keys).
    return children(node) is not None or hasattr(node, "shape")


def leaves(batch: Any) -> list[tuple[str, Any]]:
    """Every leaf of a batch with its path (``/input_ids``, ``/0/meta/index``), depth first.

    A record always opens; a list or tuple opens when its first item is structure
    (a tensor, a record or a list), else it is one leaf: a column of strings or numbers.
    """
    out: list[tuple[str, Any]] = []

    def walk(node: Any, path: str) -> None:
        inside = children(node)
        if inside is not None and (fields(node) is not None or (node and _is_structure(node[0]))):
            for name, v in inside:
                walk(v, f"{path}/{name}")
        else:
            out.append((path, node))

    walk(batch, "")
    return out


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
    """The first value under ``key`` in a (nested) batch of records, lists and tuples, else None.

    Args:
        batch: The batch to search, depth first.
        key: The field to find (a dict key, a namedtuple's or dataclass's field).
        accept: When given, a value under ``key`` that it rejects is searched
            into instead of returned (e.g. ``torch.is_tensor``).
    """
    named = fields(batch)
    if named is not None:
        here = dict(named)
        if key in here and (accept is None or accept(here[key])):
            return here[key]
        values: Iterable[Any] = here.values()
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

    Reads the shapes loaders give: a record of columns (``{"index": tensor([3, 7])}``,
    a Hugging Face batch's lists, a namedtuple or dataclass with an ``index`` field),
    a list or tuple of sample records (``collate_fn=list``), and any nesting of them.
    In a record, the first field that holds ``key`` answers for the whole record (its
    fields describe the same samples); in a list or tuple, every element that holds
    ``key`` adds its samples (``(x, y)`` pairs: only ``x`` holds it; a list of
    samples: all do).

    Args:
        batch: One batch as a loader yields it.
        key: The field to read (``"index"``, ``"__key__"``, ``"worker_id"``...), or a
            tuple batch's place (``"1"``: the second of ``(input_ids, index)``).
    """
    named = fields(batch)
    if named is not None:
        here = dict(named)
        if key in here:
            return _flat(here[key])
        return next(
            (found for v in here.values() if (found := sample_values(v, key)) is not None), None
        )
    if isinstance(batch, (list, tuple)):
        position = key.lstrip("/")
        if position.isdigit() and int(position) < len(batch) and fields(batch) is None:
            # A tuple batch's field by its place ("1" or "/1", as structure() prints it):
            # torchvision-style (input_ids, index) samples collate to [ids, index].
            return _flat(batch[int(position)])
        parts = [found for v in batch if (found := sample_values(v, key)) is not None]
        return [x for p in parts for x in p] if parts else None
    return None
