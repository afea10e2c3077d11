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
with another id, or with made-up documents, is turned down). The returned values may be tensors, numpy arrays or lists.

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
    """``x`` (a tensor, numpy array or nested list) as plain lists of ints, or what is wrong."""
    try:
        t = x if torch.is_tensor(x) else torch.as_tensor(x)
        return t.detach().to(torch.int64).tolist()
    except (TypeError, ValueError, RuntimeError) as e:
        return f"{name} is a {type(x).__name__} that is not a grid of integers ({e})"


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
