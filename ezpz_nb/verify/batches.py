"""What the check reads from one batch: sample ids (or keys, or digests), its bytes, its shape.

Batches are whatever a loader yields: dicts of tensors (a DataLoader's default
collate), tuples ``(x, y)``, a Hugging Face batch with lists of strings, numpy arrays,
namedtuples and dataclasses; :mod:`ezpz_nb.data.tree` walks them all.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ezpz_nb.data.tree import leaves, sample_values

__all__ = ["KEYS", "METADATA", "NoSampleIds", "batch_rows", "data_field",
           "field_values", "field_digests", "is_batch_tag",
           "leaf_digest", "observe_batch", "resolve_key", "structure"]  # fmt: skip

#: What ``key=`` accepts besides a field name: ``"auto"`` looks for ``index``
#: then ``__key__``; ``"digest"`` tells samples apart by the bytes they hold.
KEYS = ("auto", "digest")

#: Fields that tag a batch with where and when it was loaded, not what it holds: left
#: out of a batch's content digest (:func:`is_batch_tag`), so a resumed loader whose
#: samples came from another worker (or carry another step counter) still holds the same
#: samples.
METADATA = ("worker_id", "step", "epoch")


def is_batch_tag(name: str, value: Any) -> bool:
    """Whether a field is a :data:`METADATA` tag of the whole batch: named so, AND one integer
    for the batch (or the same integer for each of its samples). The name alone is not
    trusted: random noise levels in a field named ``step`` (one per sample, or floats) are
    content, which a resume must reproduce."""
    if name not in METADATA:
        return False
    if hasattr(value, "tolist"):
        value = value.tolist()
    values = value if isinstance(value, (list, tuple)) else [value]
    ints = all(isinstance(v, int) for v in values)  # bool is an int too: a flag, alike
    return ints and len(set(values)) <= 1


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
    """The batch's leaves without its tags (:func:`is_batch_tag`)."""
    return [(p, v) for p, v in leaves(batch) if not is_batch_tag(p.rsplit("/", 1)[-1], v)]


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


_POSITION = re.compile(r"/\d+(?=/|$)")  # a list's item in a leaf's path: "/0/input_ids"


def _rows(items: list[Any]) -> list[Any]:
    """A field's rows: a leaf's first axis, or one row per leaf of a list of samples."""
    if len(items) > 1:
        return items
    leaf = items[0]
    return [leaf] if len(leaf.shape) == 1 else list(leaf)


def _blank(row: Any) -> bool:
    """A row of two values or more, all one value: padding, no data (zeros added as rows)."""
    flat = row.reshape(-1)
    return len(flat) >= 2 and bool((flat == flat[0]).all())


def _fields(batch: Any, key: str) -> dict[str, list[tuple[str, Any]]]:
    """``{name: [(path, leaf)]}`` of the batch's numeric content fields, a list's items under
    one name (``/input_ids/0`` ... as ``/input_ids``); the ids ``key`` and tags left out."""
    fields: dict[str, list[tuple[str, Any]]] = {}
    for path, leaf in _content(batch):
        dtype = getattr(leaf, "dtype", None)
        kind = getattr(dtype, "kind", None) or str(dtype)  # numpy's "i", torch's "torch.int64"
        numeric = kind in ("i", "u", "f", "b") or any(
            k in kind for k in ("int", "float", "bool", "half")
        )
        if numeric and getattr(leaf, "shape", None) and path.rsplit("/", 1)[-1] != key:
            fields.setdefault(_POSITION.sub("", path), []).append((path, leaf))
    for name, found in list(fields.items()):
        # Parts of a tuple batch ((x, y)) are fields of their own, not samples of one field.
        if len({(len(x.shape), str(x.dtype)) for _, x in found}) > 1:
            del fields[name]
            fields.update({path: [(path, x)] for path, x in found})
    return fields


def data_field(batch: Any, key: str, samples: int | None = None) -> tuple[str, list[Any]] | None:
    """``(name, rows)`` of the field :func:`batch_rows` counts (None: no numeric field): its
    leaf's first axis, or a list's items, as tensors or arrays. :mod:`~ezpz_nb.verify.padding`
    reads the same field of a sample alone (:func:`field_values`) to tell data from padding."""
    fields = _fields(batch, key)
    if not fields:
        return None
    # Rows tied to the samples first: a field with a row per id (``samples`` of them) says
    # how many rows of data the batch holds; a larger side field of fixed rows does not (the
    # tenth trial's dodge evened 5 and 3 samples with one). A packer's rows are tied to no
    # id count: its largest field counts, as before.
    tied = {
        name: found
        for name, found in fields.items()
        if samples
        and len(rows := _rows([x for _, x in found])) == samples
        and all(len(r.shape) >= 1 for r in rows)
    }
    chosen = tied or fields
    name = max(chosen, key=lambda n: sum(_numel(x) for _, x in chosen[n]))
    return name, _rows([x for _, x in chosen[name]])


def field_values(batch: Any, key: str, name: str) -> list[Any] | None:
    """Every value of the field ``name`` (:func:`data_field`'s) of ``batch``, flat, in order;
    None where the batch has no such field."""
    found = _fields(batch, key).get(name)
    if not found:
        return None
    return [v for _, x in found for v in x.reshape(-1).tolist()]


def batch_rows(batch: Any, key: str, samples: int | None = None) -> tuple[int, ...]:
    """``(rows holding data, *row shape)`` of the batch's largest numeric content field: a
    packer's ``(rows, tokens)``, or a plain batch's ``(samples, *features)``; ``()`` when it
    has none (raw text), ``-1`` for a row shape that varies (lists of samples).

    A field's rows are its leaf's first axis (the items of a list of samples, one leaf
    each); a row all of one value (rows of zeros) holds no data and is not counted, and rows
    alike count once. The id
    field ``key`` and the batch tags are left out. :mod:`ezpz_nb.verify.shares` compares it
    across DP replicas whose sample counts differ (a packer fills fixed rows with however
    many samples fit).
    """
    found = data_field(batch, key, samples)
    if found is None:
        return ()
    rows = found[1]
    shapes = {tuple(int(d) for d in r.shape) for r in rows}
    shape = shapes.pop() if len(shapes) == 1 else (-1,)
    # A row equal to another of the batch counts once: copies of its own rows added to pad
    # a short batch to the others' size are no more data (the tenth trial's dodge).
    held = {tuple(r.reshape(-1).tolist()) for r in rows if not _blank(r)}
    return (len(held), *shape)


def _numel(leaf: Any) -> int:
    count = 1
    for d in leaf.shape:
        count *= int(d)
    return count


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


def resolve_key(batch: Any, key: str) -> str:
    """The field ``key="auto"`` reads in ``batch`` (``index`` or ``__key__``); else ``key``."""
    if key != "auto":
        return key
    return next((n for n in ("index", "__key__") if sample_values(batch, n) is not None), key)


def _id_place(batch: Any) -> str:
    """The place of a tuple batch's field of one integer per sample (``"1"`` of
    ``[input_ids, index]``), the last such; "" if none or not a tuple batch."""
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        return ""
    rows = {len(x) for x in batch if hasattr(x, "__len__")}
    found = ""
    for k, x in enumerate(batch):
        kind = getattr(getattr(x, "dtype", None), "is_floating_point", None)
        shape = getattr(x, "shape", None)
        if shape is not None and len(shape) == 1 and kind is False and len(rows) == 1:
            found = str(k)
    return found


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
            place = _id_place(batch)
            name = f"key={place!r} (the ids' place in the tuple)" if place else "key='id'"
            raise NoSampleIds(
                f"the batch has no {want} to tell its samples apart (its structure: "
                f"{structure(batch)}). Add the sample's index to each sample "
                "({'input_ids': ..., 'index': i}), name the field that identifies a sample "
                f"({name}), or pass key='digest' to identify samples by their bytes."
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
