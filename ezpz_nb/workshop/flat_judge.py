"""Notebook 19: the verdict on where a dataset keeps its tokens, from the rank's walk of it
(:func:`.flat_held.holdings`) and its samples read with the tokens in those buffers replaced
by zeros (:mod:`.flat_protect`).

Each rule says "wrong" on evidence, and where the evidence is missing says "not judged",
with the reason, in the verdict: a walk cut short (:data:`.flat_held.WALK_MOST` objects)
reached only some buffers, so the rules that need every buffer do not pass on it.
"""

from __future__ import annotations

from typing import Any

from ezpz_nb.workshop.flat_held import WALK_MOST
from ezpz_nb.workshop.flat_protect import judge_protected
from ezpz_nb.workshop.stops import wrong

__all__ = ["FEW_ROWS", "UNREACHED", "judge_held"]

#: Buffers below a 64th of the data's int64 size are small; as many small buffers as this
#: share of the rows, holding a byte a token or more and the runs of the rows' tokens, is
#: storage per row. Measured (4096 rows of 256 tokens): 21 right answers' walks (numpy, a
#: tensor and offsets, ``bytes``, ``bytearray``, ``array('q')``, ``mmap``, memory maps, a
#: file, two arrays, a metadata dict beside them, a class attribute, a closure) reach 1-2
#: large buffers and of one type at most 14 small ones, 33 KiB (names, metadata, offsets); a
#: buffer per row (an array, a ``bytes``, ``bytearray`` or ``str``; in a list, a tuple, a
#: dict's keys, an object array, a closure) 4096, 3.2-8.5 MB. A tokenizer's vocabulary
#: (128,256 ``str``, the twelfth trial) is as many small buffers, holding no runs.
FEW_ROWS = 1 / 8
#: Where the large buffers do not hold the runs, this many small objects holding them says
#: why: storage cut in chunks of a few rows, not a leak.
_CHUNKS = 64
#: The share of the data's bytes make_flat may leave allocated where the dataset's
#: buffers do not reach (a right answer's temporaries are freed; what stays is its array).
#: Measured (malloc's bytes in use less the reached buffers on the heap): one numpy array
#: 0.01x the data; a ``datasets`` table 0.28x quiet, 0.50x once in a fresh clone's run
#: (pyarrow keeps some of what it allocated), which 0.5 rejected; rows kept in malloc blocks
#: beside a decoy (the eleventh trial) 1.03x. Halfway between. Kept beside the reads with
#: the tokens replaced (:mod:`.flat_protect`), which a copy that faults or raises leaves not
#: judged: this still counts the rows kept in ``malloc``'s blocks.
UNREACHED = 0.75
_MIB = 1 << 20


def _per_row(held: dict[str, Any], rank: int, n: int, tokens_n: int) -> None:
    """Wrong when the small buffers of one type hold the tokens: storage per row or in chunks
    (those found are a lower bound where the walk was cut short: evidence all the same)."""
    count, kind = int(held["small"]), held["kind"]
    hits = held.get("small_found")
    rows_there = held["small_bytes"] >= tokens_n and (hits is None or hits >= held["runs"] / 2)
    if count >= FEW_ROWS * n and rows_there:
        per = "one per row" if abs(count - n) <= n / 10 else f"{count / n:.1f} a row"
        where = f" (in {held['where']})" if held["where"] else ""
        raise wrong(
            f"On rank {rank} your dataset keeps the tokens in {count:,} {kind} objects, "
            f"{per}{where}: keep the tokens in one array. Each row is then a Python object "
            "of its own, allocated apart, with a header and a reference count; the exercise "
            "asks for one flat array (np.array([r['tokens'] for r in rows], "
            "dtype=np.int64)), a sample a slice of it; rows of other lengths: one "
            "np.concatenate of them and an array of offsets."
        )
    got, hits = held["all_bytes"], held.get("found")
    missing = got < tokens_n or (hits is not None and hits < held["runs"] / 2)
    if missing and count >= _CHUNKS and rows_there:
        # The tokens are there, cut into many small arrays (rows in chunks): runs that
        # cross a cut are not found, which is not a leak; say what the storage is.
        where = f" (in {held['where']})" if held["where"] else ""
        raise wrong(
            f"On rank {rank} your dataset keeps the tokens in {count:,} {kind} "
            f"objects, about {n / count:.0f} rows each{where}: keep them in one array "
            "(np.concatenate of the rows, a sample a slice of it, and an array of "
            "offsets); each small array is an object of its own, with a header and a "
            "reference count a read writes."
        )
    if missing and held["complete"]:
        said = (
            f"{got:,} bytes in all"
            if got < tokens_n
            else (
                f"{hits} of {held['runs']} runs of tokens drawn from the rows found in its "
                f"{got:,} bytes"
            )
        )
        raise wrong(
            f"On rank {rank} the checker found no array holding the tokens in what your "
            f"dataset references ({said}, for {tokens_n:,} tokens): they are kept where "
            "it does not reference them (a global, a reference leaked with ctypes). Keep "
            "the tokens in one array the dataset holds as an attribute (self.tokens = "
            "np.array(..., dtype=np.int64))."
        )


def judge_held(outs: list[dict[str, Any]], n: int, tokens_n: int) -> str:
    """Wrong when a rank's dataset keeps its tokens per row, or nowhere it references.

    Judged after the workers' growth and the rows (:func:`.flat_rows.judge_kept`): an array
    or a ``bytes`` per row, read so that nothing is written, grows no worker, yet it is not
    the one array the exercise asks for. Then, samples read with the buffers' tokens
    replaced by zeros (:func:`.flat_protect.judge_protected`): right reads come from
    elsewhere; then ``malloc``'s bytes beyond those buffers. Returns what could not be
    judged, in words for the verdict (``""``: everything was).
    """
    unmeasured, unread, cut = [], [], []
    for rank, out in enumerate(outs):
        held = out.get("held")
        if not isinstance(held, dict):
            continue
        _per_row(held, rank, n, tokens_n)
        read = out.get("protect")
        unjudged = judge_protected(read, rank) if isinstance(read, dict) else "not run"
        if unjudged:
            unread.append(f"rank {rank}: {unjudged}")
        if not held["complete"] and unjudged:
            # Neither every buffer reached nor samples that need the buffers reached.
            cut.append(rank)
            continue
        # What make_flat left allocated (malloc's bytes in use, the rows let go of) beyond
        # the buffers the walk reached: tokens kept where the dataset references nothing
        # (an address, a finalizer's arguments, C memory), beside a decoy array it holds
        # (the eleventh trial), read so as to touch the decoy (which defeats the reads
        # above). Right answers leave little (see UNREACHED for the figures).
        heap, data = out.get("heap"), tokens_n * 8
        if heap is None:  # not glibc: not measured
            unmeasured.append(rank)
            continue
        if not held["complete"]:
            continue  # the reads above are the evidence: the buffers reached are not all
        unreached = heap - held.get("memory_bytes", 0)
        if unreached >= UNREACHED * data:
            raise wrong(
                f"On rank {rank} make_flat left {heap / _MIB:.1f} MiB allocated, of which the "
                f"buffers your dataset references hold {held.get('memory_bytes', 0) / _MIB:.1f} "
                f"MiB (the tokens are {data / _MIB:.1f} MiB): {unreached / _MIB:.1f} MiB are "
                "kept where the dataset does not reference them (an address, a finalizer, C "
                "memory). Keep the tokens in one array the dataset holds as an attribute and "
                "read every sample from it."
            )
    said = []
    if cut:
        said.append(
            "Not judged here: where your dataset keeps the tokens (rank(s) "
            f"{', '.join(map(str, cut))}: the walk of what it references stopped after "
            f"{WALK_MOST:,} objects, and no read showed the samples come from what it reached)."
        )
    if unread:
        said.append(
            "Not judged here: whether your samples are read from the arrays your dataset "
            f"holds ({'; '.join(unread)})."
        )
    if unmeasured:
        said.append(
            "Not judged here: whether make_flat kept the tokens where your dataset references "
            f"nothing (rank(s) {', '.join(map(str, unmeasured))} cannot count malloc's bytes "
            "in use without glibc's mallinfo2, e.g. on macOS)."
        )
    return " ".join(said)
