"""Notebook 11, exercise 1: a packing collate whose rows attend within each document only.

``check_pack(fn)``: ``fn(docs, row_len)`` packs a list of 1-D token tensors into rows of
``row_len`` and returns ``input_ids``, ``position_ids`` and ``mask`` (``rows x L x L``,
True where a query may attend to a key), padding with :data:`PAD`. Judged on 4 real
ranks, each packing its share of documents, judged by document (a row may interleave
pieces of its documents): no token attends to another document or to a later token;
every earlier token of its own document in the row is visible; a document's tokens in a
row are one piece of it, in order; position ids count from where that piece starts (from
0, or from the piece's offset in the document when a document continues from another
row: both are accepted); less than one row of padding per call; and, over the epoch,
every token of every document in exactly one row on exactly one rank; a row holds
nothing but the tokens of the documents its call was given and :data:`PAD` (so padding
with another id, or with made-up documents, is turned down). The returned values may be tensors, numpy arrays or lists.

Every token of a check is an id drawn at random for it, unique over the check, and the
map from id to ``(document, offset)`` stays in the notebook process that judges: the
checker can tell from ``input_ids`` alone which token of which document sits where,
while the learner's code, on the ranks, can learn a token's document only from the
document tensors it was given (issue 45: ids that spelled out the document let a mask
be computed without them).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["PAD", "check_pack", "job_pack", "pack_docs"]

DOCS, PER_CALL, WORLD = 24, 3, 4
#: Row lengths a packing check draws from: an answer cannot fit a fixed one.
ROW_LENS = (8, 12, 16, 20, 24)


#: The padding id the exercise gives the learner.
PAD = 0
#: Token ids are drawn from ``1 .. VOCAB - 1``, as from a tokenizer's vocabulary.
VOCAB = 2**16


def pack_docs(
    seed: int, n: int, row_len: int, *, fill: tuple[tuple[list[int], int], ...] = ()
) -> tuple[list[list[int]], dict[int, tuple[int, int]]]:
    """``n`` documents of 1 to ``3 * row_len`` tokens (some longer than a row), drawn per check.

    Each ``(documents, length)`` of ``fill`` is one call of the check: its last document
    is lengthened until the call's tokens fill whole rows of ``length`` exactly (where
    ``n // length + 1`` rows, one of nothing but padding, differs from the ceiling).
    Returns the documents (lists of token ids, each id used once in the check) and the
    map ``id -> (document, offset)`` that only the judging process keeps.
    """
    rng = random.Random(seed)
    lengths = [
        rng.choice((rng.randint(1, row_len // 2), rng.randint(1, 3 * row_len))) for _ in range(n)
    ]
    for call, length in fill:
        lengths[call[-1]] += -sum(lengths[d] for d in call) % length
    ids = rng.sample(range(PAD + 1, VOCAB), sum(lengths))
    docs, where, k = [], {}, 0
    for d, m in enumerate(lengths):
        docs.append(ids[k : k + m])
        where.update({t: (d, o) for o, t in enumerate(docs[-1])})
        k += m
    return docs, where


def _calls(world: int, row_lens: list[int]) -> list[tuple[list[int], int]]:
    """Each call of a check as ``job_pack`` makes it: its documents and its row length."""
    out = []
    for rank in range(world):
        mine = list(range(DOCS))[rank::world]
        for c, k in enumerate(range(0, len(mine), PER_CALL)):
            out.append((mine[k : k + PER_CALL], row_lens[c % len(row_lens)]))
    return out


def _plain(x: Any, name: str) -> list[Any] | str:
    """``x`` (a tensor, numpy array or nested list) as plain lists of ints, or what is wrong."""
    try:
        t = x if torch.is_tensor(x) else torch.as_tensor(x)
        return t.detach().to(torch.int64).tolist()
    except (TypeError, ValueError, RuntimeError) as e:
        return f"{name} is a {type(x).__name__} that is not a grid of integers ({e})"


def job_pack(fn: Callable, docs: list[list[int]], row_lens: list[int], per_call: int) -> Any:
    """Notebook 11, exercise 1: this rank's documents (dealt round-robin), packed ``per_call`` at a time.

    Call ``c`` packs at ``row_lens[c % len(row_lens)]``: a check asks for two row lengths.
    Returns, per call, the ``input_ids``, ``position_ids`` and ``mask`` the learner's
    ``fn(list_of_token_tensors, row_len)`` returned, as plain lists (or, for a value
    that is no grid of integers, a line saying so, which the checker turns into a verdict).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = docs[rank::world]
    calls = []
    for c, k in enumerate(range(0, len(mine), per_call)):
        row_len = row_lens[c % len(row_lens)]
        out = fn([torch.tensor(d, dtype=torch.int64) for d in mine[k : k + per_call]], row_len)
        if out is None:
            return None
        if not isinstance(out, dict):
            raise TypeError(f"return a dict of tensors, got {type(out).__name__}")
        missing = {"input_ids", "position_ids", "mask"} - set(out)
        if missing:
            raise KeyError(f"the returned dict has no {sorted(missing)}")
        plain = {k: _plain(out[k], k) for k in ("input_ids", "position_ids", "mask")}
        bad = [v for v in plain.values() if isinstance(v, str)]
        calls.append(bad[0] if bad else plain)
    return calls


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


def _judge_call(
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
            raise wrong(
                f"{place}: token {i} (document {d}) has position id {pos[i]}; position "
                "ids count 0, 1, 2... from where each document starts in the row."
            )
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


def check_pack(
    fn: Callable[[list[Any], int], dict[str, Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 1: ``fn(docs, row_len)`` packs documents without attention across them.

    24 documents of fresh random lengths (some three rows long) are dealt over 4
    ranks; each rank packs its own 3 at a time with ``fn``, at two row lengths drawn anew
    (one per call, in turn, the shorter first); half the calls, drawn, hold tokens that
    fill whole rows exactly.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    seed = fresh_seed()

    def body() -> str:
        # Two row lengths, call by call: a length written into the answer fits neither.
        # The shorter first: what an answer kept from its first call meets a longer row.
        rng = random.Random(seed)
        row_lens = sorted(rng.sample(ROW_LENS, 2))
        # Half the calls, drawn, fill their rows exactly: one row more is all padding.
        calls = _calls(WORLD, row_lens)
        fill = tuple(rng.sample(calls, len(calls) // 2))
        docs, where = pack_docs(seed, DOCS, max(row_lens), fill=fill)
        got = run_learner(job_pack, fn, docs, row_lens, PER_CALL, world_size=WORLD, timeout=timeout)
        each_returned(got, "the packed rows of every call")
        seen: Counter[tuple[int, int]] = Counter()
        rows = 0
        for rank, calls in enumerate(got):
            mine = docs[rank :: len(got)]  # as job_pack deals them
            if not isinstance(calls, list) or len(calls) != -(-len(mine) // PER_CALL):
                raise wrong(f"rank {rank} did not return one result per call of its job.")
            for c, out in enumerate(calls):
                given = {t for doc in mine[c * PER_CALL : (c + 1) * PER_CALL] for t in doc}
                place = f"rank {rank}, call {c}"
                n, toks = _judge_call(place, out, row_lens[c % len(row_lens)], where, given)
                seen.update(toks)
                rows += n
        want = set(where.values())
        twice = [k for k, n in seen.items() if n > 1]
        never = sorted(set(want) - set(seen))
        if twice:
            raise wrong(f"token {twice[0][1]} of document {twice[0][0]} is in two rows.")
        if never:
            d, t = never[0]
            raise wrong(
                f"{len(never)} tokens never made it into a row, e.g. token {t} of document "
                f"{d} ({len(docs[d])} tokens long): keep every token, splitting documents "
                "longer than a row."
            )
        return (
            f"4 ranks packed {DOCS} documents ({len(want)} tokens) into {rows} rows of "
            f"{row_lens[0]} and {row_lens[1]} tokens (call by call): every token once, no "
            "attention across documents or to padding."
        )

    return judge("pack", body)
