"""How a CP layout's parts of one sample compare with the sample read again whole (for
:mod:`.cp_slices`): as multisets (a gap, an overlap), in order (each part at most two runs of
the sample: a contiguous slice, or a load-balanced zigzag's two chunks; a half reversed or
shuffled is not), the batch's pad left out (the value the parts hold most of among those in
no sample read again: a part padded to an equal length over a gap shows the gap).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

__all__ = ["compare", "flat_values", "pads"]

# Where a part's first value starts a run: at most this many places of the sample tried.
_STARTS = 64


def flat_values(values: list[Any], parts: list[bytes]) -> tuple[list[Any], list[list[Any]]] | None:
    """The sample's values and each part's, as numbers of one kind (None: not numbers, or a
    part not whole 8-byte values)."""
    a = np.asarray(values)
    if a.dtype.kind not in "iuf" or a.size < 2 or any(len(p) % 8 for p in parts):
        return None
    kind = np.int64 if a.dtype.kind in "iu" else np.float64
    return a.astype(kind).reshape(-1).tolist(), [np.frombuffer(p, kind).tolist() for p in parts]


def _runs(part: list[Any], whole: list[Any], most: int = 2, after: int = 0) -> bool:
    """Whether ``part`` is at most ``most`` runs of consecutive values of ``whole``, each
    starting at or past ``after`` and past the one before (a contiguous slice, or the two
    chunks of a load-balanced zigzag, chunk r then chunk 2 cp - 1 - r): a half rotated,
    its second run before its first, is not (the thirteenth trial)."""
    if not part:
        return True
    if most == 0:
        return False
    for k in [j for j, v in enumerate(whole) if v == part[0] and j >= after][:_STARTS]:
        n = 0
        while n < len(part) and k + n < len(whole) and whole[k + n] == part[n]:
            n += 1
        if _runs(part[n:], whole, most - 1, k + n):
            return True
    return False


def compare(
    flat: list[Any], parts: list[list[Any]], pad: Any
) -> tuple[Counter[Any], Counter[Any], int] | None:
    """``(missing, extra, out_of_order)``: the values of the CP peers' ``parts`` together
    against the sample's ``flat`` values (both empty: held), and the first part that is not
    the sample's values in order (-1: none); None where a part holds a value the sample has
    not, the batch's ``pad`` left out (not judged: the collate made it)."""
    parts = [[v for v in p if v != pad] for p in parts]
    want = Counter(flat)
    held = [Counter(p) for p in parts]
    if any(h - want for h in held):
        return None
    # Multisets alone pass a part reversed or shuffled: each must be runs of the sample.
    order = next((k for k, p in enumerate(parts) if not _runs(p, flat)), -1)
    if all(h == want for h in held):
        return Counter(), Counter(), order  # every peer holds the whole sample
    total: Counter[Any] = sum(held, Counter())
    # The sample less its last (or first) value: a next-token loss's inputs (labels).
    if total in (want, Counter(flat[:-1]), Counter(flat[1:])):
        return Counter(), Counter(), order
    return want - total, total - want, order


def pads(items: list[tuple[dict[str, list[Any]], list[Any]]]) -> dict[str, Any]:
    """``{field path: its pad}``: the value the CP parts hold most of among those in no
    sample read again (a CP collate pads parts to one length, with -100 or 0); as
    padding.py leaves the pad out of rows. ``items``: each sample's values and its peers'
    kept parts (None where a peer kept none)."""
    values: dict[str, set[Any]] = {}
    extra: dict[str, Counter[Any]] = {}
    for row, held in items:
        for path, v in row.items():
            parts = [h[1].get(path) for h in held if h is not None]
            got = flat_values(v, [p for p in parts if p is not None])
            if got is None:
                continue
            values.setdefault(path, set()).update(got[0])
            own = set(got[0])
            extra.setdefault(path, Counter()).update(x for p in got[1] for x in p if x not in own)
    out = {}
    for path, c in extra.items():
        none = [(n, x) for x, n in c.items() if x not in values[path]]
        if none:
            out[path] = max(none, key=lambda t: t[0])[1]
    return out
