"""Per sample, what it holds: one digest per content field, in every shape a batch leaf takes.

:func:`sample_contents` cuts a batch into its samples and digests each sample's content
fields apart (:mod:`ezpz_nb.verify.contents` compares them across DP replicas). A sample's
content is read from:

- a tensor or array with one row (or more) of two numbers or more per sample
  (``(batch, seq)`` tokens, ``(batch, C, H, W)`` pixels);
- a column of one value per sample: strings (raw text), lists of numbers (a collate
  to Python lists), arrays, or records of those (``collate_fn=list``);
- samples packed end to end in one 1-D (or ``(1, total)``) row, cut by offsets
  (``cu_seqlens``: ``count + 1`` ints from 0) or by position ids that restart at 0 once a
  sample (Hugging Face's ``DataCollatorWithFlattening``).

One number per sample (an id, a label, a loss) is a tag, not content; so are the id
field and the batch tags of :func:`~ezpz_nb.verify.batches.content_leaves`. Each field's
digest is named by its path, so fields are compared one by one: a per-replica tag added to
each sample cannot hide its tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ezpz_nb.data.tree import fields
from ezpz_nb.verify.batches import is_batch_tag

__all__ = [
    "ANY_ORDER",
    "SEP",
    "field_token",
    "identifying_fields",
    "sample_columns",
    "sample_contents",
    "sample_tags",
    "tag_columns",
]

#: Between a sample's field digests in one string (``"<field path>:<digest>.<bytes>"`` each).
SEP = "\n"


def _array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):
        t = v.detach().cpu()
        try:
            return t.numpy()
        except TypeError:  # bfloat16 and kin have no numpy type: float32 holds them exactly
            return t.float().numpy()
    return np.asarray(v)


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "iuf"


def _one(x: Any) -> bytes | None:
    """One sample's value as bytes: text, two numbers or more, or a record of those; None
    for a tag (one number) or what this cannot read."""
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, bytes):
        return x
    named = fields(x)
    if named is not None:
        parts = [(k, _one(v)) for k, v in named]
        found = [k.encode() + b"\0" + b for k, b in parts if b is not None]
        return b"\1".join(found) if found else None
    if isinstance(x, (list, tuple)) or hasattr(x, "shape"):
        try:
            a = _array(x)
        except (TypeError, ValueError):
            return None
        if _numeric(a) and a.size >= 2:
            # Python ints and an int64 tensor hold one value alike: compare values, not widths.
            return np.ascontiguousarray(
                a, dtype=np.float64 if a.dtype.kind == "f" else np.int64
            ).tobytes()
    return None


def _offsets(flat: dict[str, np.ndarray], count: int) -> tuple[str, list[int]] | None:
    """Where ``count`` samples packed in one row start and end: ``(leaf, bounds)``."""
    for path, a in flat.items():
        if a.dtype.kind not in "iu" or count < 1 or not len(a) or a[0] != 0:
            continue
        if len(a) == count + 1 and bool(np.all(np.diff(a) >= 0)):  # cu_seqlens
            return path, [int(x) for x in a]
        starts = np.flatnonzero(a == 0)
        steps = np.diff(a)
        # Position ids: 0, 1, 2... once a sample, restarting at 0 for the next one.
        if len(starts) == count and bool(np.all((steps == 1) | (a[1:] == 0))):
            return path, [*(int(s) for s in starts), len(a)]
    return None


#: Appended to a token field's path for its values in any order (:func:`sample_contents`).
ANY_ORDER = " in any order"

# Sorting a sample's values costs; tokens are short, pixels need no such digest.
_ORDERLESS_MAX = 1 << 16


def _orderless(x: Any) -> bytes | None:
    """An integer row's values sorted (the same tokens in another order alike), or None."""
    if isinstance(x, (str, bytes)) or fields(x) is not None:
        return None
    try:
        a = _array(x)
    except (TypeError, ValueError):  # ragged lists, objects
        return None
    if a.dtype.kind not in "iu" or not 2 <= a.size <= _ORDERLESS_MAX:
        return None
    return np.sort(a, axis=None).astype(np.int64).tobytes()


def _columns(batch: Any, skip: str, count: int, orderless: bool = False) -> dict[str, list[bytes]]:
    """``{path: one bytes a sample}`` of every content field of ``batch``; ``orderless``:
    with each integer field's values in any order too (path + :data:`ANY_ORDER`)."""
    cols: dict[str, list[bytes]] = {}
    flat: dict[str, np.ndarray] = {}

    def walk(node: Any, path: str) -> None:
        named = fields(node)
        if named is not None:
            for k, v in named:
                if k != skip and not is_batch_tag(k, v):
                    walk(v, f"{path}/{k}")
            return
        if hasattr(node, "shape"):
            a = _array(node)
            if not _numeric(a) or a.ndim == 0:
                return
            if a.ndim >= 2 and a.shape[0] == count and a[0].size >= 2:
                cols[path] = [_one(a[i]) or b"" for i in range(count)]
                add_orderless(path, [a[i] for i in range(count)])
            elif a.ndim == 2 and a.shape[0] == 1 or a.ndim == 1 and len(a) != count:
                flat[path] = a.reshape(-1)
            return
        if isinstance(node, (list, tuple)):
            per = [_one(x) for x in node] if len(node) == count else []
            if per and all(b is not None for b in per):
                cols[path] = [b for b in per if b is not None]
                add_orderless(path, list(node))
                return
            for i, v in enumerate(node):
                walk(v, f"{path}/{i}")

    def add_orderless(path: str, rows: list[Any]) -> None:
        got = [_orderless(r) for r in rows] if orderless else []
        if got and all(b is not None for b in got):
            cols[path + ANY_ORDER] = [b for b in got if b is not None]

    walk(batch, "")
    cut = _offsets(flat, count)
    if cut is not None:
        at, bounds = cut
        total = bounds[-1]
        for path, a in flat.items():
            if path != at and len(a) == total:
                parts = [a[bounds[k] : bounds[k + 1]] for k in range(count)]
                cols[path] = [_one(x) or b"" for x in parts]
                add_orderless(path, parts)
    return cols


def sample_columns(batch: Any, field: str, count: int) -> dict[str, list[bytes]]:
    """``{field path: one bytes a sample}`` of ``batch``'s content fields (``{}``: none, or
    the batch cannot be read); ``field`` (the ids) is left out. Never raises."""
    try:
        return _columns(batch, field, count) if count else {}
    except Exception:  # noqa: BLE001 - the user's data, read only to compare: never fatal
        return {}


def field_token(path: str, data: bytes) -> str:
    """One field of one sample as :func:`sample_contents` names it: ``"<path>:<digest>.<bytes>"``
    (the size tells the twins rule a sample's largest field: :func:`.contents.first_twin`)."""
    return f"{path or '.'}:{hashlib.blake2b(data, digest_size=8).hexdigest()}.{len(data)}"


def identifying_fields(digests: Sequence[str], replicas: int) -> set[str] | None:
    """The content fields that identify a sample among :func:`sample_contents`' ``digests``
    (read on ``replicas`` DP replicas): the largest (by its values' bytes) of those whose
    contents vary (more of them than replicas: a per-replica tag does not), and any as
    large; None: every field (one field, or digests without sizes).

    A twin (:func:`.contents.first_twin`) is two samples whose identifying content is
    equal, not one small field: an augmentation record beside the tokens (a crop's two
    offsets drawn in range(4), a flip bit) repeats across replicas whose workers are seeded
    alike, one copy per replica, while the tokens differ (the thirteenth trial's
    r13_random_crop_offsets)."""
    size: dict[str, int] = {}
    contents: dict[str, set[str]] = {}
    for joined in digests:
        for token in joined.split(SEP):
            path, _, digest = token.rpartition(":")
            n = digest.rpartition(".")[2]
            if not n.isdigit():
                return None
            size[path] = max(size.get(path, 0), int(n))
            contents.setdefault(path, set()).add(digest)
    varying = [size[p] for p, c in contents.items() if len(c) > replicas] or list(size.values())
    keep = {p for p, n in size.items() if n >= max(varying, default=0)}
    return None if keep == set(size) else keep


def sample_contents(batch: Any, field: str, count: int | None = None) -> list[str]:
    """Per sample, its content fields' digests joined by :data:`SEP` (``[]``: none found).

    ``field`` (the ids) is left out; ``count``: the batch's samples (from its ids). Two
    samples sharing a field's digest hold that field's very same values whatever ids they
    carry. An integer field (tokens) also gives its values sorted, as a field of its own
    (path + :data:`ANY_ORDER`): a replica that reads the others' documents reversed or
    shuffled holds no equal row, yet the same tokens (the tenth trial's dodge). Never
    raises: the user's data is read only to compare.
    """
    try:
        cols = _columns(batch, field, count, orderless=True) if count else {}
    except Exception:  # noqa: BLE001 - the user's data, read only to compare: never fatal
        cols = {}
    if not count or not cols:
        return []
    return [
        SEP.join(field_token(p, per[i]) for p, per in sorted(cols.items())) for i in range(count)
    ]


def _tag_columns(
    node: Any, skip: frozenset[str], count: int, path: str
) -> list[tuple[str, list[bytes]]]:
    named = fields(node)
    if named is not None:
        return [c for k, v in named if k not in skip and not is_batch_tag(k, v)
                for c in _tag_columns(v, skip, count, f"{path}/{k}")]  # fmt: skip
    if hasattr(node, "shape"):
        a = _array(node)
        if _numeric(a) and a.ndim >= 1 and a.shape[0] == count and a[:1].size == 1:
            flat = np.ascontiguousarray(a.reshape(count), dtype=np.float64)
            return [(path, [flat[i : i + 1].tobytes() for i in range(count)])]
        return []
    if isinstance(node, (list, tuple)):
        if len(node) == count and all(isinstance(x, (int, float)) for x in node):
            return [(path, [np.float64(x).tobytes() for x in node])]
        return [c for i, v in enumerate(node) for c in _tag_columns(v, skip, count, f"{path}/{i}")]
    return []


def tag_columns(batch: Any, skip: frozenset[str], count: int) -> dict[str, list[bytes]]:
    """``{field path: one bytes a sample}`` of ``batch``'s one-number fields (a loss, a
    label: 8 bytes each, as :func:`sample_tags` digests them); fields named in ``skip`` and
    batch tags are left out. Never raises."""
    try:
        return dict(_tag_columns(batch, skip, count, "")) if count else {}
    except Exception:  # noqa: BLE001 - the user's data, read only to compare: never fatal
        return {}


def sample_tags(batch: Any, skip: frozenset[str], count: int) -> list[str]:
    """Per sample, its one-number fields (a loss, a label) as one digest (``[]``: none);
    fields named in ``skip`` (the ids, the weight) and batch tags are left out. What
    :func:`sample_contents` calls tags, not content: an eval judge compares them between
    two deliveries of one sample. Never raises."""
    try:
        cols = _tag_columns(batch, skip, count, "") if count else []
    except Exception:  # noqa: BLE001 - the user's data, read only to compare: never fatal
        return []
    if not cols:
        return []
    return [SEP.join(field_token(p, per[i]) for p, per in sorted(cols)) for i in range(count)]
