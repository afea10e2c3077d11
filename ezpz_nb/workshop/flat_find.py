"""Notebook 19: whether the tokens are in the large buffers a dataset references.

:mod:`.flat_held` walks the dataset to its buffers; a dataset that keeps its rows where the
walk cannot reach them (a reference leaked with ``ctypes``) and references a large array of
other values beside them would pass on sizes alone. So a few runs of tokens from rows drawn
at random (:func:`needles`, taken from the rows before ``make_flat`` sees them) are looked
for in those buffers' bytes, as int64, int32 and 16-bit values: storage holding the tokens
holds them, in any of these widths.
"""

from __future__ import annotations

import io
import mmap
import os
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["NEEDLES", "found", "needles"]

#: Rows whose runs are looked for, and tokens in a run (4 tokens: 8 bytes at 16 bits, which
#: random bytes match by chance about once in 2**64 places).
NEEDLES, RUN = 16, 4


def needles(rows: list[dict[str, Any]]) -> np.ndarray:
    """``NEEDLES`` runs of ``RUN`` tokens, from rows drawn at random, mid-row (int64).

    Taken from the middle of a row at an offset no multiple of 32, so none of the ints
    :class:`.flat_rows.Given` samples is referenced here.
    """
    pick = secrets.SystemRandom().sample(range(len(rows)), min(NEEDLES, len(rows)))
    runs = []
    for i in pick:
        row = rows[i]["tokens"]
        at = len(row) // 2 + 3
        runs.append(row[at : at + RUN])
    return np.array(runs, dtype=np.int64)


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
    elif isinstance(obj, bytes | bytearray | mmap.mmap) or hasattr(obj, "buffer_info"):
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


def found(buffers: list[Any], runs: np.ndarray) -> int:
    """How many of the ``runs`` appear in the ``buffers``' bytes, at some width."""
    wanted = [
        {run.astype(dtype).tobytes() for dtype in (np.int64, np.int32, np.uint16)} for run in runs
    ]
    hits = [False] * len(wanted)
    for buffer in buffers:
        try:
            pieces = list(_pieces(buffer))
        except (OSError, ValueError, RuntimeError, TypeError, BufferError):
            continue  # closed, moved, not on the CPU: not counted
        for piece in pieces:
            for k, forms in enumerate(wanted):
                hits[k] = hits[k] or any(piece.find(form) >= 0 for form in forms)
    return sum(hits)
