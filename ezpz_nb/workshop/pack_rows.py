"""Notebook 11, exercise 1's row judge: one call's packed rows, judged against the secret map.

Split from :mod:`.packing` (its checker, draw and rank job) to keep each module short.
``judge_call`` judges one call's rows by document: what each token sees, where its
position ids count from, and that the rows hold every token of the call. Documents may
share token ids, as words recur over texts (issue 45's eighth trial: a token's document
looked up by its id passed while ids were unique): an id that two documents hold is read
each way its places can go to its occurrences, and the rows pass when one reading is
right (they are then the very tensors of a right packing).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from ezpz_nb.workshop.stops import CheckStopped, wrong

__all__ = ["PAD", "judge_call"]

#: The padding id the exercise gives the learner.
PAD = 0
#: Readings of a call's shared ids tried at most (a check shares one id a call: two).
MOST_READINGS = 24

Place = tuple[int, int]  # (document, offset); (-1, -1) for padding


class _Fault(CheckStopped):
    """A row's fault, with the columns it names (to say when one holds a shared id)."""

    def __init__(self, message: str, cols: tuple[int, ...]) -> None:
        super().__init__("wrong", message)
        self.cols = cols


def _dims(x: Any) -> tuple[int, ...]:
    """The shape of nested lists, read along the first element of each level."""
    dims = []
    while isinstance(x, list):
        dims.append(len(x))
        x = x[0] if x else None
    return tuple(dims)


def _grid(x: Any, dims: tuple[int, ...]) -> bool:
    """True if ``x`` is nested lists of exactly ``dims``, with ints at the bottom."""
    if not dims:
        return isinstance(x, int)
    return isinstance(x, list) and len(x) == dims[0] and all(_grid(v, dims[1:]) for v in x)


def judge_call(
    place: str, out: Any, row_len: int, given: dict[int, tuple[Place, ...]]
) -> tuple[int, list[Place]]:
    """Raise a verdict for the first thing wrong in one call's rows; else ``(rows, tokens)``.

    ``given`` maps each token id of the documents this call was given to its places,
    ``(document, offset)``: more than one where documents share the id.
    """
    if isinstance(out, str):
        raise wrong(f"{place}: {out}")  # the line says what to return
    ids, pos, mask = out["input_ids"], out["position_ids"], out["mask"]
    rows = len(ids) if isinstance(ids, list) else 0
    if not (
        rows
        and _grid(ids, (rows, row_len))
        and _grid(pos, (rows, row_len))
        and _grid(mask, (rows, row_len, row_len))
    ):
        raise wrong(
            f"{place}: input_ids has shape {_dims(ids)}, position_ids {_dims(pos)}, mask "
            f"{_dims(mask)}: return rows x {row_len} tensors and a rows x {row_len} x "
            f"{row_len} mask."
        )
    tokens = sum(len(at) for at in given.values())
    if rows * row_len < tokens:
        need = -(-tokens // row_len)
        left = tokens - rows * row_len
        why = (
            "a last row less than half full is a row too (round() drops it)"
            if rows == round(tokens / row_len)
            else "keep every token, splitting a document that does not fit into the next row"
        )
        raise wrong(
            f"{place}: {rows} rows of {row_len} hold at most {rows * row_len} tokens, but the "
            f"documents this call was given have {tokens}, so {left} "
            f"{'token' if left == 1 else 'tokens'} never made it into a row: too few rows. "
            f"Make ceil({tokens} / {row_len}) = {need} rows: {why}."
        )
    for r, row in enumerate(ids):
        for i, t in enumerate(row):
            if t != PAD and t not in given:
                raise wrong(
                    f"{place}, row {r}: position {i} holds id {t}, neither padding ({PAD}) "
                    "nor a token of the documents this call was given: fill the rows with the "
                    f"documents' own tokens and pad with {PAD} only."
                )
    pad = sum(t == PAD for row in ids for t in row)
    if pad >= row_len:
        raise wrong(
            f"{place}: {pad} padding tokens in {rows} rows, a whole row's worth or more. "
            "Pack: fill each row before starting the next (split a document that does not "
            "fit), so only the last row of a call is short, and make ceil(tokens / row_len) "
            "rows, not one more."
        )
    readings = list(_readings(ids, given))
    # Judged on the readings whose rows hold each document's tokens in order (no other can
    # pass), else on the plain one: a reading that gave a shared id's places the other way
    # round fails there, which is not what is wrong with the answer.
    # When every reading fails, one whose position ids all hold is told first: a reading
    # that dealt a shared id's places the wrong way round fails at that id's position,
    # before the rows reach what is wrong (1 draw in 100 blamed a position id for a mask
    # that hides too much).
    faults: list[tuple[bool, int, _Fault]] = []
    for reading in [x for x in readings if _in_order(x)] or readings[:1]:
        toks: list[Place] = []
        try:
            for r in range(rows):
                toks += _check_row(f"{place}, row {r}", reading[r], pos[r], mask[r])
        except _Fault as fault:
            faults.append((_positions_hold(reading, pos), r, fault))
            continue
        return rows, toks
    assert faults  # _readings yields the plain reading at least
    _, r, stop = next((f for f in faults if f[0]), faults[0])
    shared = sorted({ids[r][c] for c in stop.cols if len(given.get(ids[r][c], ())) > 1})
    if not shared:
        raise wrong(stop.message)
    docs = sorted({d for d, _ in given[shared[0]]})
    raise wrong(
        f"{stop.message} (Row {r} holds id {shared[0]}, a token of documents "
        f"{' and '.join(map(str, docs))} of this call: ids recur over documents as words "
        "do, so a token's document is the tensor it came from, not its id.)"
    )


def _readings(
    ids: list[list[int]], given: dict[int, tuple[Place, ...]]
) -> Iterator[list[list[Place]]]:
    """Each way to read the rows' ids as places (see :func:`judge_call`), the plain one
    first: an id's occurrences, in reading order, take its places in order. An id of one
    place reads one way; a shared one each way its places go to its occurrences, one place
    each (places again in turn only where it occurs more often than it has places)."""
    plain = [[given[t][0] if t in given else (-1, -1) for t in row] for row in ids]
    spots: dict[int, list[tuple[int, int]]] = {}  # shared id -> its (row, column)s
    for r, row in enumerate(ids):
        for i, t in enumerate(row):
            if len(given.get(t, ())) > 1:
                spots.setdefault(t, []).append((r, i))
    ways = []
    for t, at in spots.items():
        places, n = given[t], len(at)
        if n <= len(places):
            ways.append([list(zip(at, p, strict=True)) for p in itertools.permutations(places, n)])
        else:
            ways.append([[(s, places[j % len(places)]) for j, s in enumerate(at)]])
    for way in itertools.islice(itertools.product(*ways), MOST_READINGS):
        reading = [list(row) for row in plain]
        for (r, i), p in itertools.chain.from_iterable(way):
            reading[r][i] = p
        yield reading


def _pieces(place: str, toks: list[Place]) -> dict[int, int]:
    """Raise unless each document's tokens in the row are one piece of it, in order; return
    each document's first position in the row (see :func:`_check_row`)."""
    first: dict[int, int] = {}  # document -> position of its first token in the row
    last: dict[int, int] = {}  # document -> position of its latest token so far
    for i, (d, o) in enumerate(toks):
        if d < 0:
            continue
        if d in last and o <= toks[last[d]][1] and (d, o) in toks[:i]:
            raise _Fault(f"{place}: token {o} of document {d} is in the row twice.", (i,))
        if d in last and o != toks[last[d]][1] + 1:
            raise _Fault(
                f"{place}: document {d}'s tokens are not in order, or not one piece (token {i} is "
                f"its offset {o}, after offset {toks[last[d]][1]}): put a document's tokens "
                "in a row in their order, without gaps.",
                (i, last[d]),
            )
        first.setdefault(d, i)
        last[d] = i
    return first


def _in_order(reading: list[list[Place]]) -> bool:
    """True if every row of ``reading`` holds each document's tokens in order, one piece."""
    try:
        for row in reading:
            _pieces("", row)
    except _Fault:
        return False
    return True


def _positions_hold(reading: list[list[Place]], pos: list[list[int]]) -> bool:
    """True if every row's position ids count as :func:`_check_row` asks under ``reading``."""
    for toks, row in zip(reading, pos, strict=True):
        try:
            first = _pieces("", toks)
        except _Fault:
            return False
        if any(d >= 0 and not _counts(row, toks, first[d], i) for i, (d, _) in enumerate(toks)):
            return False
    return True


def _counts(pos: list[int], toks: list[Place], f: int, i: int) -> bool:
    """Whether token ``i``'s position id counts from its piece's start ``f`` (from 0 or from
    the piece's offset in the document)."""
    return pos[i] - pos[f] == toks[i][1] - toks[f][1] and pos[f] in (0, toks[f][1])


def _check_row(
    place: str, toks: list[tuple[int, int]], pos: list[int], mask: list[list[int]]
) -> list[tuple[int, int]]:
    """Raise a verdict for the first thing wrong in one packed row; return its tokens.

    ``toks`` holds each position's ``(document, offset)``, ``(-1, -1)`` for padding. Judged
    by document, not by run of neighbours (issue 45: pieces of documents interleaved, each
    seeing only itself, passed a judge by runs, and the right interleaving failed it): a
    document's tokens in a row must be one piece of it, in order (other documents' tokens
    may sit between them); each token sees exactly the earlier tokens of its own document
    in the row and itself; its position id counts from the piece's start, from 0 or from
    the piece's offset in the document.
    """
    first = _pieces(place, toks)
    for i, (d, o) in enumerate(toks):
        if d < 0:
            continue
        f = first[d]
        if not _counts(pos, toks, f, i):
            raise _Fault(f"{place}: {_position_fault(i, d, o, toks[f][1], pos[i], pos[f])}", (i, f))
        for j, (e, _) in enumerate(toks):
            allowed = bool(mask[i][j])
            want = e == d and j <= i
            if allowed and not want:
                what = "padding" if e < 0 else "a later token" if j > i else f"document {e}"
                raise _Fault(
                    f"{place}: token {i} (document {d}) may attend to token {j}, {what}. "
                    "Each token may see only the earlier tokens of its own document.",
                    (i, j),
                )
            if want and not allowed:
                what = "itself (the diagonal)" if i == j else "an earlier token of its own document"
                raise _Fault(
                    f"{place}: token {i} (document {d}) may not attend to token {j}, {what}: "
                    "the mask hides too much.",
                    (i, j),
                )
    return [t for t in toks if t[0] >= 0]


def _position_fault(i: int, d: int, o: int, start: int, got: int, first: int) -> str:
    """What is wrong with token ``i``'s position id ``got``, with the value expected.

    Token ``i`` is offset ``o`` of document ``d``, whose piece in the row starts at offset
    ``start`` with position id ``first``.
    """
    said = f"token {i} (document {d}, its token {o}) has position id {got}"
    if first in (0, start):  # the piece's first id is right: the count from it is not
        return (
            f"{said}, expected {first + o - start}: position ids go up by one along a "
            "document's piece in the row."
        )
    if start == 0:
        return (
            f"{said}, expected {o - start}: position ids count 0, 1, 2... from where each "
            "document starts in the row."
        )
    return (
        f"{said}, expected {o - start}, counting 0, 1, 2... from where the document's piece "
        f"starts in the row, or {o}, counting on from the document's start (it continues "
        "from another row): both are accepted."
    )
