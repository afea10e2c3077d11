"""What the check reads from one batch: sample ids (or keys, or digests), its bytes, its shape.

Batches are whatever a loader yields: dicts of tensors (a DataLoader's default
collate), tuples ``(x, y)``, a Hugging Face batch with lists of strings, numpy arrays,
namedtuples and dataclasses; :mod:`ezpz_nb.data.tree` walks them all.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ezpz_nb.data.tree import leaves, sample_values

__all__ = ["KEYS", "METADATA", "NoSampleIds", "field_digests", "leaf_digest", "observe_batch",
           "resolve_key",
           "sample_contents", "structure"]  # fmt: skip

#: What ``key=`` accepts besides a field name: ``"auto"`` looks for ``index``
#: then ``__key__``; ``"digest"`` tells samples apart by the bytes they hold.
KEYS = ("auto", "digest")

#: Fields that tag a sample with where and when it was loaded, not what it holds: left
#: out of a batch's content digest, so a resumed loader whose samples came from another
#: worker (or carry another step counter) still holds the same samples.
METADATA = ("worker_id", "step", "epoch")


class NoSampleIds(Exception):
    """A batch without a way to tell its samples apart (the check turns it into a VerifyError)."""


def _leaf_bytes(x: Any) -> bytes:
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor
        import torch

        t = x.detach().cpu().contiguous().reshape(-1)
        if t.numel() and t.stride(0) != 1:  # one element from a strided numpy slice: stride 2
            t = t.new_empty(t.shape).copy_(t)
        # Viewed as bytes in torch first: numpy has no bfloat16.
        return bytes(t.view(torch.uint8).numpy().data) if t.numel() else b""
    if hasattr(x, "tobytes"):  # numpy array or scalar
        return bytes(x.tobytes())
    if isinstance(x, bytes):
        return x
    return repr(x).encode()


def leaf_digest(obj: Any) -> str:
    """A digest of every leaf of ``obj`` and its path (a sample, a batch): equal bytes, equal digest."""
    h = hashlib.blake2b(digest_size=8)
    for path, leaf in leaves(obj):
        h.update(path.encode() + b"\0" + _leaf_bytes(leaf))
    return h.hexdigest()


def _content(batch: Any) -> list[tuple[str, Any]]:
    """The batch's leaves without the :data:`METADATA` tags."""
    return [(p, v) for p, v in leaves(batch) if p.rsplit("/", 1)[-1] not in METADATA]


def _kind(leaf: Any) -> str:
    """``"data"`` for what a sample holds (floats, masks, rows of tokens), ``"tag"`` for one
    integer or string per sample (an id, a label, a counter)."""
    dtype = str(getattr(leaf, "dtype", ""))
    if any(k in dtype for k in ("float", "bool", "complex", "half")):
        return "data"
    return "data" if len(getattr(leaf, "shape", ())) >= 2 else "tag"


def field_digests(batch: Any) -> dict[str, str]:
    """``{path: "kind:digest"}`` of each content leaf (:func:`_kind`): which field differs
    when a batch's digest does, and whether it holds data an RNG could have drawn."""
    return {
        path or ".": f"{_kind(leaf)}:"
        + hashlib.blake2b(_leaf_bytes(leaf), digest_size=8).hexdigest()
        for path, leaf in _content(batch)
    }


def structure(batch: Any) -> str:
    """Keys and leaf types, not sizes (the last batch may be smaller)."""
    parts = []
    for path, leaf in leaves(batch):
        kind = type(leaf).__name__
        dtype = getattr(leaf, "dtype", None)
        parts.append(f"{path or '.'}:{kind}{f'[{dtype}]' if dtype is not None else ''}")
    return " ".join(parts)


def _hash_id(text: str) -> int:
    # 62 bits: an int every JSON reader keeps exact enough, collisions negligible.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 2


def _samples_by_digest(batch: Any) -> list[str]:
    found = _content(batch)
    sized = [v for _, v in found if hasattr(v, "__len__") and not isinstance(v, (str, bytes))]
    if not sized:
        return [hashlib.blake2b(b"".join(_leaf_bytes(v) for _, v in found)).hexdigest()[:16]]
    n = len(sized[0])
    out = []
    for i in range(n):
        h = hashlib.blake2b(digest_size=8)
        for v in sized:
            h.update(_leaf_bytes(v[i]))
        out.append(h.hexdigest())
    return out


def _array(v: Any) -> Any:
    if not hasattr(v, "detach"):
        return v
    t = v.detach().cpu()
    try:
        return t.numpy()
    except TypeError:  # bfloat16 and kin have no numpy type: float32 holds them exactly
        return t.float().numpy()


def _numeric(v: Any) -> bool:
    dtype = str(getattr(v, "dtype", ""))
    return ("int" in dtype or "float" in dtype) and hasattr(v, "shape")


def _packed(content: list[tuple[str, Any]], count: int) -> list[list[Any]]:
    """Per sample, its slices of the 1-D leaves packed end to end (``input_ids`` of all the
    samples in one row), cut where an offsets leaf (``cu_seqlens``: ``count + 1`` ints from 0,
    never decreasing) says; ``[]`` when the batch holds no such pair."""
    flat = [_array(v) for _, v in content if _numeric(v) and len(v.shape) == 1]
    for cu in flat:
        if "int" not in str(cu.dtype) or len(cu) != count + 1 or count < 1 or cu[0] != 0:
            continue
        if any(cu[k] > cu[k + 1] for k in range(count)):
            continue
        packed = [a for a in flat if a is not cu and len(a) == int(cu[-1]) != count + 1]
        if packed:
            return [[a[int(cu[k]) : int(cu[k + 1])] for a in packed] for k in range(count)]
    return []


def sample_contents(batch: Any, field: str, count: int | None = None) -> list[str]:
    """Per sample, a digest of the rows of numbers it holds (tokens, pixels, features).

    Only leaves of one row (or more) per sample count, integers and floats: one number
    per sample is an id, a label or a counter, and a mask (bool) may be drawn alike on
    every rank. Samples packed end to end in one 1-D row are cut by their offsets
    (``cu_seqlens``, ``count + 1`` of them; ``count``: the batch's samples). The id
    ``field`` and the :data:`METADATA` tags are left out: two samples with one digest
    hold the same data whatever ids they carry. ``[]`` when the batch holds no such leaf
    (or one this cannot read: the rule then has nothing to compare, never a crash).
    """
    try:
        return _row_digests(batch, field, count)
    except Exception:  # noqa: BLE001 - the user's data, read only to compare: never fatal
        return []


def _row_digests(batch: Any, field: str, count: int | None) -> list[str]:
    content = [(p, v) for p, v in _content(batch) if p.rsplit("/", 1)[-1] != field]
    # Two numbers a sample at least: a (batch, 1) column is a label or a loss, not a row.
    rows = [
        v for _, v in content
        if _numeric(v) and len(v.shape) >= 2 and int(np.prod(v.shape[1:])) >= 2
    ]  # fmt: skip
    sizes = {int(v.shape[0]) for v in rows}
    if len(sizes) == 1 and (count is None or sizes == {count}):
        # One numpy array per leaf, then a row each: indexing a tensor per sample costs 10x.
        arrays = [_array(v) for v in rows]
        per_sample = [[a[i] for a in arrays] for i in range(sizes.pop())]
    elif not rows and count:
        per_sample = _packed(content, count)
    else:
        return []
    out = []
    for parts in per_sample:
        h = hashlib.blake2b(digest_size=8)
        for a in parts:
            h.update(a.tobytes())
        out.append(h.hexdigest())
    return out


def resolve_key(batch: Any, key: str) -> str:
    """The field ``key="auto"`` reads in ``batch`` (``index`` or ``__key__``); else ``key``."""
    if key != "auto":
        return key
    return next((n for n in ("index", "__key__") if sample_values(batch, n) is not None), key)


def observe_batch(batch: Any, key: str) -> tuple[list[int], dict[int, str], str, list[int]]:
    """Sample ids, their names (for hashed keys), the batch's content digest and worker ids.

    The digest covers every leaf but the :data:`METADATA` tags (worker id, step, epoch).

    Args:
        batch: One batch as the loader yields it.
        key: ``"auto"``, ``"digest"`` or the name of a field holding sample ids/keys.

    Raises:
        NoSampleIds: The batch has no such field (``"auto"``: neither ``index`` nor ``__key__``).
    """
    names: dict[int, str] = {}
    if key == "digest":
        values: list[Any] = _samples_by_digest(batch)
    else:
        found = None
        for name in ("index", "__key__") if key == "auto" else (key,):
            found = sample_values(batch, name)
            if found is not None:
                break
        if found is None:
            want = "'index' or '__key__' field" if key == "auto" else f"{key!r} field"
            raise NoSampleIds(
                f"the batch has no {want} to tell its samples apart (its structure: "
                f"{structure(batch)}). Add the sample's index to each sample "
                "({'input_ids': ..., 'index': i}), name the field that identifies a sample "
                "(key='id'), or pass key='digest' to identify samples by their bytes."
            )
        values = found
    ids = []
    for v in values:
        if isinstance(v, (int, bool)) or (hasattr(v, "__index__") and not isinstance(v, str)):
            ids.append(int(v))
        else:
            text = v.decode() if isinstance(v, bytes) else str(v)
            i = _hash_id(text)
            names[i] = text
            ids.append(i)
    h = hashlib.blake2b(digest_size=16)
    for _, leaf in _content(batch):
        h.update(_leaf_bytes(leaf))
    workers = sample_values(batch, "worker_id") or []
    return ids, names, h.hexdigest(), [int(w) for w in workers]
