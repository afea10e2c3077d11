"""Notebook 19's rows: what :mod:`.flat_storage`'s checker hands ``make_flat``, and what the
dataset holds once the checker lets go of them.

The rows (:func:`given_rows`) are drawn in the rank from a seed no one else sees and kept
only as the rows and as digests (:class:`Given`): no array of the answers, nor a seed that
makes one, is in any frame or global of the rank while the learner's code runs, so a
dataset can only be built from the rows. :meth:`Given.kept` then says what the dataset
holds: the rows themselves, their ints in containers of its own, new objects per token; and
:func:`judge_kept` turns that into a verdict. The workers' growth (:mod:`.witness`) sees
what reading writes; this sees what the dataset is, however it is read.
"""

from __future__ import annotations

import bisect
import ctypes
import gc
import hashlib
import secrets
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ezpz_nb.workshop.flat_find import needles
from ezpz_nb.workshop.stops import wrong
from ezpz_nb.workshop.storages import tokens

__all__ = [
    "BLOCKS_MOST",
    "SHARED_MOST",
    "Expect",
    "Given",
    "Row",
    "Tokens",
    "digests",
    "given_rows",
    "heap_in_use",
    "named_mappings",
    "off_heap",
    "judge_kept",
    "row_digest",
]

#: The checker's vocabulary: ids up to Llama 3's 128,256, past 16 bits, so storage that
#: narrows the tokens to uint16 (right only for vocabularies under 65,536, GPT-2's) loses
#: them (the eighth trial): pick the dtype from the largest id, or keep int32/int64.
VOCAB = 128_256

#: Each row's ``(input_ids, labels)`` digests, by index.
Expect = tuple[tuple[bytes, bytes], ...]

#: Small-object blocks (Python's allocator) a dataset may hold per token once built, the
#: rows let go of: a new int, a small tuple or str per token is one each, a flat array or a
#: tensor a few in all. Measured: 13 flat storages (numpy, a tensor, ``bytes``, memory maps,
#: an array per row, two arrays, a pickle per row) 0.00-0.01, with a token count beside
#: 0.05; the rows kept, their ints or new ints in lists or tuples 0.98-1.01.
BLOCKS_MOST = 0.5
#: The share of the rows' ints (every :data:`_EVERY`-th token sampled) a dataset may still
#: reference once built: a token count or a vocabulary (an int per distinct value, ~5% of
#: the tokens) passes, the rows' ints copied into lists or tuples (all of them) do not.
SHARED_MOST = 0.5
_EVERY = 32


class Row(dict[str, Any]):
    """A row as the checker hands it to ``make_flat``: a plain dict that takes a weak reference.

    So the checker can tell, once it let go of the rows, whether the dataset kept one.
    """

    __slots__ = ("__weakref__",)


class Tokens(list[int]):
    """A row's tokens as the checker hands them over: a plain list of Python ints that takes
    a weak reference (see :class:`Row`)."""

    __slots__ = ("__weakref__",)


def row_digest(values: np.ndarray) -> bytes:
    """A digest of int64 ``values`` (16 bytes): what a sample must hold, not its tokens."""
    return hashlib.blake2b(
        np.ascontiguousarray(values, dtype=np.int64).tobytes(), digest_size=16
    ).digest()


def digests(data: np.ndarray) -> Expect:
    """Each row's ``(input_ids, labels)`` as digests: what a sample must hold, not the tokens."""
    return tuple((row_digest(row[:-1]), row_digest(row[1:])) for row in data)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def heap_in_use() -> int | None:
    """Bytes glibc's ``malloc`` has handed out and not got back (every arena, and the
    blocks it maps apart: ``uordblks + hblkhd``); None where there is no ``mallinfo2``
    (another libc, glibc before 2.33). numpy's and torch's buffers come from it; Python's
    small objects do not (its own arenas)."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    call.restype = _Mallinfo2
    got = call()
    return int(got.uordblks + got.hblkhd)


def named_mappings(path: str = "/proc/self/maps") -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of this process's mappings that have a name other than
    ``[heap]`` (a file, ``/dev/shm``, a ``memfd``, shared ``/dev/zero``), sorted; ``[]``
    where they cannot be read (not Linux). ``malloc``'s memory is never in one of them: its
    arenas are the ``[heap]`` and anonymous maps, and so are the blocks it maps apart."""
    out = []
    try:
        with open(path) as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                name = parts[5].strip() if len(parts) > 5 else ""
                if name and name != "[heap]":
                    lo, hi = parts[0].split("-")
                    out.append((int(lo, 16), int(hi, 16), name))
    except (OSError, ValueError, IndexError):
        return []
    return sorted(out)


def off_heap(address: int, named: list[tuple[int, int, str]]) -> bool:
    """Whether ``address`` lies in one of ``named`` (:func:`named_mappings`): memory that
    :func:`heap_in_use` does not count (a tensor's ``share_memory_()``, a memory map)."""
    k = bisect.bisect_right(named, (address, float("inf"), "")) - 1
    return k >= 0 and named[k][0] <= address < named[k][1]


class Given:
    """What the checker keeps of the rows it handed ``make_flat``: digests, weak references,
    and a sample of the rows' ints, for :meth:`kept` to say what the dataset holds.

    Three ways a dataset can hold Python objects per token, each seen once the checker let
    go of the rows: the rows themselves (a weak reference to each dict and token list
    survives); the rows' ints in lists or tuples of its own (the sampled ints are referenced
    by more than the checker); new objects per token (Python's small-object allocator counts
    its blocks in use, from before the rows were made: an int, a small tuple or str is one;
    a numpy array, a tensor, a ``bytes`` of a row or more, a memory map one or none).
    ``tracemalloc`` would say the same in bytes, at seconds a check, and its freed traces
    moved a right answer's workers' pages (an array per row grew 4 MiB a worker).
    """

    def __init__(
        self,
        expect: Expect,
        rows: list[dict[str, Any]],
        before: int,
        *,
        heap: int | None = None,
        _blocks: Callable[[], int] = sys.getallocatedblocks,
    ) -> None:
        mine = _blocks()
        self.heap = heap
        self.expect = expect
        self.refs = tuple(weakref.ref(x) for r in rows for x in (r, r["tokens"]))
        # Every 32nd token's int: distinct objects (all above 256), referenced by their
        # token list and here, and by nothing else unless make_flat keeps them.
        self.ints = tuple(t for r in rows for t in r["tokens"][::_EVERY])
        self._rows: list[dict[str, Any]] | None = rows
        # A few runs of tokens, for .flat_find to look for in the dataset's buffers.
        self.runs = needles(rows)
        # Blocks in use before the rows were made, and the checker's own made since.
        self.before, self.own = before, _blocks() - mine

    def take(self) -> list[dict[str, Any]]:
        """The rows, let go of here: passed straight to ``make_flat``, they are a local of no
        frame of the checker's (a frame's ``f_locals``, once read, as a debugger does,
        would keep them alive)."""
        rows, self._rows = self._rows, None
        if rows is None:
            raise RuntimeError("the rows were taken already: take them once, for make_flat")
        return rows

    def kept(
        self,
        *,
        _collect: Callable[[], int] = gc.collect,
        _blocks: Callable[[], int] = sys.getallocatedblocks,
        _count: Callable[[object], int] = sys.getrefcount,
        _heap: Callable[[], int | None] = heap_in_use,
    ) -> dict[str, Any]:
        """What the dataset holds, the checker's rows let go of.

        ``alive``: rows or token lists still alive (of ``rows``); ``ints``: the share of the
        sampled ints something else references; ``blocks``: small-object blocks in use
        beyond those before the rows were made and the checker's own (the rows, if kept,
        and what ``make_flat`` made); ``heap``: bytes of ``malloc`` in use beyond those
        before the rows were made (:func:`heap_in_use`; None where it cannot be read). The tools are bound here, at import, not looked up
        after the learner's code ran in the rank.
        """
        _collect()
        alive = sum(ref() is not None for ref in self.refs)
        # 3: this tuple, the loop's name and getrefcount's argument.
        ints = sum(_count(t) > 3 for t in self.ints) / max(1, len(self.ints))
        self.ints = ()  # counted no more, and the epoch's workers fork without them
        blocks = _blocks() - self.before - self.own
        now = _heap()
        # What make_flat left allocated, the rows let go of (None: not measured here).
        heap = now - self.heap if now is not None and self.heap is not None else None
        return {"alive": alive, "rows": len(self.refs), "ints": ints, "blocks": blocks,
                "heap": heap}  # fmt: skip


def given_rows(n: int, length: int) -> Given:
    """On a rank: rows of ``n`` fresh samples for ``make_flat`` (:meth:`Given.take`), and
    what the checker keeps of them.

    The tokens are drawn here from a seed no one else sees, and neither they nor the seed
    outlive this call: while the learner's code runs, the answers are in the rows alone (and
    as digests), so a dataset can only be built from the rows.
    """
    heap = heap_in_use()  # before the tokens and rows exist: what make_flat leaves is above
    data = tokens(n, length, secrets.randbits(62), high=VOCAB)
    expect = digests(data)
    before = sys.getallocatedblocks()
    rows: list[dict[str, Any]] = [
        Row(index=i, tokens=Tokens(row)) for i, row in enumerate(data.tolist())
    ]
    return Given(expect, rows, before, heap=heap)


def judge_kept(outs: list[dict[str, Any]], tokens_n: int) -> None:
    """Wrong when a rank's dataset holds the rows, or a Python object per token, once built.

    Judged after the workers' growth: reads that write nothing (values taken from the
    ints' memory, a row kept for its index only) leave the workers' pages shared, but the
    rows still cost their memory (an int object per token) and every worker's collector
    walks them. What is held is what the dataset is, however it is read.
    """
    for rank, out in enumerate(outs):
        if out.get("alive", 0):
            raise wrong(
                f"On rank {rank} your dataset keeps the rows: {out['alive']} of the "
                f"{out['rows']} dicts and token lists the checker handed make_flat are alive "
                "after it let go of them. Each token in them is a Python int (an object of 32 "
                "bytes), which every worker's garbage collector walks, however the samples "
                "are read. Copy the tokens into one array in make_flat and keep no reference "
                "to the rows (a sample's index is its position)."
            )
        if out.get("ints", 0) >= SHARED_MOST:
            raise wrong(
                f"On rank {rank} your dataset holds the rows' Python ints: {out['ints']:.0%} "
                "of the tokens the checker sampled are still referenced once the rows are let "
                "go of (copied into lists or tuples of yours). Each is an object of 32 bytes "
                "with a reference count, which every worker's garbage collector walks. Copy "
                "the values into one array (np.array(..., dtype=np.int64)), not the objects."
            )
        per_token = out.get("blocks", 0) / tokens_n
        if per_token >= BLOCKS_MOST:
            raise wrong(
                f"On rank {rank} your dataset holds {per_token:.1f} Python objects per token "
                f"(new ints in lists or tuples, say; one array is one object; the bound is "
                f"{BLOCKS_MOST}), each with a reference count, which every worker's garbage "
                "collector walks. Hold the tokens in one array."
            )
