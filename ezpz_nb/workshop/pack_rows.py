"""Notebook 11, exercise 1's row judge: one call's packed rows, judged against the secret map.

Split from :mod:`.packing` (its checker, draw and rank job) to keep each module short.
``judge_call`` judges one call's rows by document: what each token sees, where its
position ids count from, and that the rows hold every token of the call.
"""

from __future__ import annotations

from typing import Any

from ezpz_nb.workshop.stops import wrong

__all__ = ["PAD", "judge_call"]

#: The padding id the exercise gives the learner.
PAD = 0


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
    place: str, out: Any, row_len: int, where: dict[int, tuple[int, int]], given: set[int]
) -> tuple[int, list[tuple[int, int]]]:
    """Raise a verdict for the first thing wrong in one call's rows; else ``(rows, tokens)``.

    ``given`` holds the token ids of the documents this call was given; ``where`` maps
    every token id of the check to ``(document, offset)``.
    """
    if isinstance(out, str):
        raise wrong(f"{place}: {out}: return tensors (or numpy arrays) of integers.")
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
    if rows * row_len < len(given):
        need, tokens = -(-len(given) // row_len), len(given)
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
    toks = []
    for r in range(rows):
        decoded = [where.get(t, (-1, -1)) for t in ids[r]]  # padding: (-1, -1)
        toks += _check_row(f"{place}, row {r}", decoded, pos[r], mask[r])
    return rows, toks


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
    first: dict[int, int] = {}  # document -> position of its first token in the row
    last: dict[int, int] = {}  # document -> position of its latest token so far
    for i, (d, o) in enumerate(toks):
        if d < 0:
            continue
        if d in last and o <= toks[last[d]][1] and (d, o) in toks[:i]:
            raise wrong(f"{place}: token {o} of document {d} is in the row twice.")
        if d in last and o != toks[last[d]][1] + 1:
            raise wrong(
                f"{place}: document {d}'s tokens are not in order, or not one piece (token {i} is "
                f"its offset {o}, after offset {toks[last[d]][1]}): put a document's tokens "
                "in a row in their order, without gaps."
            )
        first.setdefault(d, i)
        last[d] = i
    for i, (d, o) in enumerate(toks):
        if d < 0:
            continue
        f = first[d]
        if pos[i] - pos[f] != o - toks[f][1] or pos[f] not in (0, toks[f][1]):
            raise wrong(f"{place}: {_position_fault(i, d, o, toks[f][1], pos[i], pos[f])}")
        for j, (e, _) in enumerate(toks):
            allowed = bool(mask[i][j])
            want = e == d and j <= i
            if allowed and not want:
                what = "padding" if e < 0 else "a later token" if j > i else f"document {e}"
                raise wrong(
                    f"{place}: token {i} (document {d}) may attend to token {j}, {what}. "
                    "Each token may see only the earlier tokens of its own document."
                )
            if want and not allowed:
                what = "itself (the diagonal)" if i == j else "an earlier token of its own document"
                raise wrong(
                    f"{place}: token {i} (document {d}) may not attend to token {j}, {what}: "
                    "the mask hides too much."
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
