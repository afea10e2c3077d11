"""Notebook 11, exercise 1: a packing collate whose rows attend within each document only.

``check_pack(fn)``: ``fn(docs, row_len)`` packs a list of 1-D token tensors into rows of
``row_len`` and returns ``input_ids``, ``position_ids`` and ``mask`` (``rows x L x L``,
True where a query may attend to a key), padding with :data:`PAD`. Judged on 4 real
ranks, each packing its share of documents in calls of a drawn number of documents
(1 to 6: issue 45's eighth trial, ``a, b, c = docs`` passed while every call held 3),
judged by document (a row may interleave
pieces of its documents): no token attends to another document or to a later token;
every earlier token of its own document in the row is visible; a document's tokens in a
row are one piece of it, in order; position ids count from where that piece starts (from
0, or from the piece's offset in the document when a document continues from another
row: both are accepted); less than one row of padding per call, and rows enough for
its tokens (``ceil(tokens / row_len)``: a last row less than half full is still a row);
and, over the epoch,
every token of every document in exactly one row on exactly one rank; a row holds
nothing but the tokens of the documents its call was given and :data:`PAD` (so padding
with another id, or with made-up documents, is turned down). The returned values may be
tensors, numpy arrays or lists, read as the dtype they come in (issue 45's ninth trial: a cast to int64 read a float mask
of 1.0 / 0.3 as 1 / 0): ids as integers (floats only when every value is whole), the mask as
bool, 0/1 integers, or SDPA's additive float mask, 0 where a query may attend and -inf (or
the dtype's lowest value) where not.

Every token of a check is an id drawn at random for it, and in each call of two documents
or more two of them share one id (where two can), as words recur over texts (issue 45's eighth trial: a
token's document looked up by its id passed while ids were unique over the check). The
checker, which holds the documents, tells from ``input_ids`` which token of which document
sits where (a shared id each way it can be read, see :mod:`.pack_rows`), while the
learner's code, on the ranks, can learn a token's document only from the document tensors
it was given (issue 45: ids that spelled out the document let a mask be computed without
them). What each check draws is in :mod:`.pack_draw`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.workshop.pack_draw import DOCS, WORLD, PackDraw, draw_pack, pack_docs
from ezpz_nb.workshop.pack_rows import PAD, judge_call
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = [
    "PAD",
    "PackDraw",
    "check_pack",
    "draw_pack",
    "job_pack",
    "judge_offline",
    "judge_packs",
    "pack_calls",
    "pack_docs",
]


def _plain(x: Any, name: str) -> list[Any] | str:
    """``x`` (a tensor, numpy array or nested list) as plain lists of ints, read as the dtype
    it came in, or a line saying what is wrong.

    Issue 45's ninth trial: a cast of any grid to int64 read a float mask of 1.0 / 0.3 (which
    SDPA adds to the scores, hiding nothing) as the right bool mask, and position ids 0.75 past
    the right ones as the right ids (0.3 and 0.75 truncate to 0).
    """
    try:
        t = (x if torch.is_tensor(x) else torch.as_tensor(x)).detach()
    except (TypeError, ValueError, RuntimeError) as e:
        return (
            f"{name} is a {type(x).__name__} that is not a grid of integers ({e}): return "
            "tensors (or numpy arrays) of integers."
        )
    if t.is_complex():
        return f"{name} is a grid of complex numbers ({t.dtype}): return {_WANT[name]}."
    return _mask_grid(t) if name == "mask" else _ids_grid(t, name)


#: What each returned grid should be, for the verdicts.
_WANT = {
    "input_ids": "integer token ids (torch.long)",
    "position_ids": "integer position ids (torch.long), counting 0, 1, 2... along a document",
    "mask": "a bool mask, True where a query may attend to a key",
}


def _first(t: torch.Tensor, odd: torch.Tensor) -> tuple[float | int, str]:
    """The first value of ``t`` where ``odd`` is True, and the line naming it and its index."""
    at = odd.nonzero()[0].tolist()
    v = t[tuple(at)].item()
    said = f"{v:g}" if isinstance(v, float) else str(v)
    return v, f"{said} (at {''.join(f'[{i}]' for i in at)})" if at else said


def _ids_grid(t: torch.Tensor, name: str) -> list[Any] | str:
    """Ids as plain ints. Token ids of an integer dtype only; position ids as floats too when
    every value is a whole number (a rotary embedding reads whole float positions as their
    ints, and a fraction as a turn between)."""
    if t.is_floating_point() and name == "input_ids":
        # An embedding looks ids up: nn.Embedding refuses a float grid, and float32 rounds
        # ids past 2**24 (the tenth trial's float64 input_ids passed).
        return (
            f"input_ids is a grid of {t.dtype}: an embedding looks token ids up by integer "
            f"(nn.Embedding refuses floats): return {_WANT[name]}."
        )
    if t.is_floating_point():
        odd = ~torch.isfinite(t) | (t != t.round())
        if odd.any():
            return (
                f"{name} is a grid of {t.dtype} that holds {_first(t, odd)[1]}, not a whole "
                f"number: return {_WANT[name]}."
            )
    return t.to(torch.int64).tolist()


def _mask_grid(t: torch.Tensor) -> list[Any] | str:
    """The mask as plain 0/1 ints (1: the query may attend to the key), read as SDPA reads it.

    A bool mask is what the exercise asks for. SDPA adds a float mask to the scores, so a float
    mask means the same only as 0 (keep) and -inf (hide), or the dtype's lowest value (hides as
    -inf does, and is what Hugging Face builds); any other value shifts a score: 0.3 hides
    nothing, and a finite -1e9 is told to use -inf. SDPA refuses an integer mask: 0/1 ints are read as False/True, nothing else.
    """
    if t.dtype == torch.bool:
        return t.to(torch.int64).tolist()
    if t.is_floating_point():
        hide = t <= torch.finfo(t.dtype).min
        odd = ~hide & (t != 0)  # NaN and +inf too
        if not odd.any():
            return (~hide).to(torch.int64).tolist()
        if not t[odd].isnan().any():  # name the lowest: the value meant to hide (0.3, -1e9)
            odd &= t == t[odd].min()
        v, said = _first(t, odd)
        if v != v:
            why = "NaN makes the scores NaN"
        elif v < 0:  # not -inf: a finite value (-1e9, say)
            why = f"{v:g} is finite: -inf hides a key whatever its score, {v:g} only lowers it"
        else:
            why = f"{v:g} only shifts the score and hides nothing"
            if bool(((t == 0) | (t == 1)).all()):
                why += " (a bool mask cast with .float() is 1/0: 0 hides nothing)"
        return (
            f"mask is a grid of {t.dtype} that holds {said}. SDPA adds a float mask to the "
            "attention scores: it means the same as the bool mask only with 0 where a query "
            f"may attend and -inf (or torch.finfo(dtype).min) where it may not; {why}. Return "
            f"{_WANT['mask']} (or, as a float mask, 0 where it may and -inf where it may not)."
        )
    odd = (t != 0) & (t != 1)
    if odd.any():
        return (
            f"mask is a grid of {t.dtype} that holds {_first(t, odd)[1]}: an integer mask is "
            f"read as 1 where a query may attend and 0 where not, nothing else. Return "
            f"{_WANT['mask']}."
        )
    return t.to(torch.int64).tolist()


def pack_calls(fn: Callable, mine: list[list[int]], row_lens: list[int], sizes: list[int]) -> Any:
    """The learner's ``fn`` on one rank's documents, ``sizes[c]`` in call ``c`` (see :func:`job_pack`)."""
    calls, k = [], 0
    for c, n in enumerate(sizes):
        row_len = row_lens[c % len(row_lens)]
        try:
            out = fn([torch.tensor(d, dtype=torch.int64) for d in mine[k : k + n]], row_len)
        except Exception as e:  # the verdict shows the learner's line and, below, the call
            note = getattr(e, "add_note", None)  # Python 3.11 and later
            # Not on a bare exception (the shipped NotImplementedError): the failure's
            # type is read from the header up to its first colon, which a note would join.
            if note is not None and str(e):
                note(f"(in call {c} of this rank: {_docs(n)}, row_len {row_len})")
            raise
        k += n
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


def _docs(n: int) -> str:
    return f"{n} document{'s' if n != 1 else ''}"


def job_pack(
    fn: Callable, docs: list[list[int]], row_lens: list[int], sizes: list[list[int]]
) -> Any:
    """Notebook 11, exercise 1: this rank's documents (dealt round-robin), packed in calls of
    ``sizes[rank]`` documents.

    Call ``c`` packs at ``row_lens[c % len(row_lens)]``: a check asks for two row lengths.
    Returns, per call, the ``input_ids``, ``position_ids`` and ``mask`` the learner's
    ``fn(list_of_token_tensors, row_len)`` returned, as plain lists (or, for a value
    that is no grid of integers, a line saying so, which the checker turns into a verdict).
    """
    rank = dist.get_rank()
    return pack_calls(fn, docs[rank :: dist.get_world_size()], row_lens, sizes[rank])


def judge_packs(got: list[Any], draw: PackDraw) -> str:
    """Stop at the first fault of every rank's calls (``got``: what :func:`job_pack` returned
    on each rank); what they achieved otherwise. Pure: a test judges offline with it."""
    row_lens, docs, sizes = draw
    seen: Counter[tuple[int, int]] = Counter()
    rows = 0
    for rank, calls in enumerate(got):
        mine = list(range(len(docs)))[rank :: len(got)]  # as job_pack deals them
        if not isinstance(calls, list) or len(calls) != len(sizes[rank]):
            raise wrong(f"rank {rank} did not return one result per call of its job.")
        k = 0
        for c, out in enumerate(calls):
            n, row_len = sizes[rank][c], row_lens[c % len(row_lens)]
            given: dict[int, tuple[tuple[int, int], ...]] = {}
            for d in mine[k : k + n]:
                for o, t in enumerate(docs[d]):
                    given[t] = (*given.get(t, ()), (d, o))
            k += n
            place = f"rank {rank}, call {c} ({_docs(n)}, rows of {row_len})"
            got_rows, toks = judge_call(place, out, row_len, given)
            seen.update(toks)
            rows += got_rows
    want = {(d, o) for d, doc in enumerate(docs) for o in range(len(doc))}
    twice = [k for k, n in seen.items() if n > 1]
    never = sorted(want - set(seen))
    if twice:
        raise wrong(f"token {twice[0][1]} of document {twice[0][0]} is in two rows.")
    if never:
        d, t = never[0]
        raise wrong(
            f"{len(never)} tokens never made it into a row, e.g. token {t} of document "
            f"{d} ({len(docs[d])} tokens long): keep every token, splitting documents "
            "longer than a row."
        )
    counts = sorted({n for s in sizes for n in s})
    return (
        f"4 ranks packed {DOCS} documents ({len(want)} tokens, some ids in two documents) "
        f"into {rows} rows of {row_lens[0]} and {row_lens[1]} tokens (call by call), in "
        f"calls of {', '.join(map(str, counts[:-1]))}{' and ' if len(counts) > 1 else ''}"
        f"{counts[-1]} documents: every token once, no attention across documents or to "
        "padding."
    )


def judge_offline(fn: Callable, seed: int) -> str:
    """:func:`judge_packs` on the draw of ``seed``, every rank's calls made in this process:
    the judge is pure, so a test judges many draws for what one check on ranks costs (for
    an ``fn`` that calls no collective)."""
    draw = draw_pack(seed)
    got = [pack_calls(fn, draw.docs[r::WORLD], draw.row_lens, draw.sizes[r]) for r in range(WORLD)]
    return judge_packs(got, draw)


def check_pack(
    fn: Callable[[list[Any], int], dict[str, Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 1: ``fn(docs, row_len)`` packs documents without attention across them.

    24 documents of fresh random lengths (some three rows long) are dealt over 4
    ranks; each rank packs its own in calls of 1 to 6 documents, drawn, with ``fn``, at
    two row lengths drawn anew (one per call, in turn, the shorter first). In each call of
    two documents or more, two documents share a token id (where two can). At each row
    length one call,
    drawn, has two documents of one length in a row, and another ends in a row less than
    half full; up to half the calls, drawn, hold tokens that fill whole rows exactly (see
    :func:`draw_pack`).
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        # Drawn here, after judge() pickled the answer: no frame holds it while code the
        # answer carries runs at pickling.
        draw = draw_pack(fresh_seed())
        got = run_learner(
            job_pack, fn, draw.docs, draw.row_lens, draw.sizes, world_size=WORLD, timeout=timeout
        )
        each_returned(got, "the packed rows of every call")
        return judge_packs(got, draw)

    return judge("pack", body)
