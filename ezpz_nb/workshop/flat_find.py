"""Notebook 19: whether the tokens are in the large buffers a dataset references.

:mod:`.flat_held` walks the dataset to its buffers; a dataset that keeps its rows where the
walk cannot reach them (a reference leaked with ``ctypes``) and references a large array of
other values beside them would pass on sizes alone. So a few runs of tokens from rows drawn
at random (:func:`needles`, taken from the rows before ``make_flat`` sees them) are looked
for in those buffers' bytes, as int64, int32 and 16-bit values: storage holding the tokens
holds them, in any of these widths. Small buffers (:func:`small_found`) are storage per row
only where they hold them too: a tokenizer's vocabulary of ``str`` holds none.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["NEEDLES", "holding", "located", "needles", "small_found"]

#: Rows whose runs are looked for, and tokens in a run (4 tokens: 8 bytes at 16 bits, which
#: random bytes match by chance about once in 2**64 places).
NEEDLES, RUN = 16, 4


def needles(rows: list[dict[str, Any]]) -> np.ndarray:
    """``NEEDLES`` runs of ``RUN`` tokens, from rows drawn at random, mid-row (int64): each
    the row's index, then its run (:mod:`.flat_protect` reads the rows whose runs it finds).

    Taken from the middle of a row at an offset no multiple of 32, so none of the ints
    :class:`.flat_rows.Given` samples is referenced here.
    """
    pick = secrets.SystemRandom().sample(range(len(rows)), min(NEEDLES, len(rows)))
    runs = []
    for i in pick:
        row = rows[i]["tokens"]
        at = len(row) // 2 + 3
        runs.append([i, *row[at : at + RUN]])
    return np.array(runs, dtype=np.int64).reshape(-1, RUN + 1)


def _pieces(obj: Any) -> Iterator[bytes]:
    """The bytes of the memory ``obj`` holds or views (all of it, not only the view)."""
    if isinstance(obj, str):  # a path the walk found a file at
        with open(obj, "rb") as fh:
            yield fh.read()
    elif isinstance(obj, io.IOBase):
        yield os.pread(obj.fileno(), os.fstat(obj.fileno()).st_size, 0)
    elif isinstance(obj, memoryview) and obj.obj is not None:
        yield from _pieces(obj.obj)
    elif isinstance(obj, np.ndarray):
        if obj.ndim >= 2 and not obj.flags.c_contiguous:
            # Its rows as a read gives them: a column-major array (pandas' to_numpy) holds a
            # row's tokens apart in memory, where no run of them would be found.
            yield np.ascontiguousarray(obj).tobytes()
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        if base.base is not None and not isinstance(base.base, np.ndarray):
            yield from _pieces(base.base)
        else:
            yield base.tobytes(order="A")
    elif isinstance(obj, torch.Tensor | torch.UntypedStorage):
        storage = obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj
        whole = torch.empty(0, dtype=torch.uint8).set_(storage.cpu())
        yield whole.numpy().tobytes()
    elif isinstance(obj, bytes | bytearray | mmap.mmap | memoryview | ctypes.Array):
        yield bytes(memoryview(obj))
    elif hasattr(obj, "buffer_info"):  # an array.array
        yield bytes(memoryview(obj))
    elif type(obj).__module__.startswith("pyarrow"):
        yield from _arrow(obj)


def _arrow(obj: Any) -> Iterator[bytes]:
    """An Arrow table's, batch's, chunked or plain array's buffers (its children's too)."""
    for part in getattr(obj, "columns", None) or getattr(obj, "chunks", None) or []:
        yield from _arrow(part)
    buffers = getattr(obj, "buffers", None)
    if callable(buffers):
        yield from (b.to_pybytes() for b in buffers() if b is not None)


def _forms(runs: np.ndarray) -> list[list[bytes]]:
    """Each run's bytes at each width, the widest first (column 0 is its row: see
    :func:`needles`)."""
    return [[run[1:].astype(t).tobytes() for t in (np.int64, np.int32, np.uint16)] for run in runs]


def holding(buffers: list[Any], runs: np.ndarray) -> tuple[int, list[bool]]:
    """How many of the ``runs`` appear in the ``buffers``' bytes, at some width, and which
    buffers hold one or more (those :mod:`.flat_protect` reads without: :func:`located`)."""
    wanted = _forms(runs)
    hits, holds = [False] * len(wanted), [False] * len(buffers)
    for b, buffer in enumerate(buffers):
        try:
            pieces = list(_pieces(buffer))
        except (OSError, ValueError, RuntimeError, TypeError, BufferError):
            continue  # closed, moved, not on the CPU: not counted
        for piece in pieces:
            for k, forms in enumerate(wanted):
                if any(piece.find(form) >= 0 for form in forms):
                    hits[k] = holds[b] = True
    return sum(hits), holds


def _text(s: str) -> bytes:
    """A ``str``'s characters as CPython stores them: a byte, 2 or 4 a character, by the
    widest (a row's bytes decoded as latin-1 are stored as those bytes)."""
    widest = max(map(ord, s), default=0)
    if widest < 256:
        return s.encode("latin-1")
    return s.encode("utf-16-le" if widest < 65536 else "utf-32-le", "surrogatepass")


def small_found(objects: list[Any], runs: np.ndarray) -> int:
    """How many of the ``runs`` the small buffers ``objects`` hold, their bytes joined in
    the walk's order (a row cut in chunks is whole again). A vocabulary's ``str`` holds
    none: only storage of the rows does (the twelfth trial: a tokenizer's 128,256 ``str``
    were taken for a ``str`` per row)."""
    parts: list[bytes] = []
    for obj in objects:
        try:
            parts.extend([_text(obj)] if isinstance(obj, str) else _pieces(obj))
        except (OSError, ValueError, RuntimeError, TypeError, BufferError):
            continue
    joined = b"".join(parts)
    return sum(any(joined.find(form) >= 0 for form in forms) for forms in _forms(runs))


def located(
    spans: list[tuple[int, int]], runs: np.ndarray
) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """Where the ``runs`` are in the memory of ``spans`` (``(address, bytes)`` of this
    process, as :func:`.flat_protect.memory` gives a buffer's): each span's extent from the
    first run found in it to the end of the last, or the whole span where none is (a
    column-major array keeps a row's tokens apart); and each run found, as ``(row, address,
    bytes)``. Outside that extent a buffer may keep what is not tokens (a header, a table of
    addresses): :mod:`.flat_protect` replaces the extent's pages only, and reads those rows."""
    extents, found = [], []
    forms, rows = _forms(runs), [int(r) for r in runs[:, 0]] if len(runs) else []
    for address, size in spans:
        if size <= 0:
            continue
        raw = ctypes.string_at(address, size)  # the memory itself: its offsets are addresses
        here = []
        for row, wanted in zip(rows, forms, strict=True):
            hit = next(((a, len(f)) for f in wanted if (a := raw.find(f)) >= 0), None)
            if hit is not None:
                here.append((row, address + hit[0], hit[1]))
        if here:
            low = min(a for _, a, _ in here)
            extents.append((low, max(a + b for _, a, b in here) - low))
        else:
            extents.append((address, size))
        found += here
    return extents, found
