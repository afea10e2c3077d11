"""Notebook 11, exercise 1: a packing collate whose rows attend within each document only.

``check_pack(fn)``: ``fn(docs, row_len)`` packs a list of 1-D token tensors into rows of
``row_len`` and returns ``input_ids``, ``position_ids`` and ``mask`` (``rows x L x L``,
True where a query may attend to a key), padding with :data:`PAD`. Judged on 4 real
ranks, each packing its share of documents, judged by document (a row may interleave
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

Every token of a check is an id drawn at random for it, unique over the check, and the
map from id to ``(document, offset)`` stays in the notebook process that judges: the
checker can tell from ``input_ids`` alone which token of which document sits where,
while the learner's code, on the ranks, can learn a token's document only from the
document tensors it was given (issue 45: ids that spelled out the document let a mask
be computed without them). The rows are judged by :mod:`.pack_rows`; what each check
draws is in :func:`draw_pack`.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.workshop.pack_rows import PAD, judge_call
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["PAD", "check_pack", "draw_pack", "job_pack", "judge_packs", "pack_calls", "pack_docs"]

DOCS, PER_CALL, WORLD = 24, 3, 4
#: Row lengths a packing check draws from: an answer cannot fit a fixed one.
ROW_LENS = (8, 12, 16, 20, 24)


#: Token ids are drawn from ``1 .. VOCAB - 1``, as from a tokenizer's vocabulary.
VOCAB = 2**16


def pack_docs(
    seed: int,
    n: int,
    row_len: int,
    *,
    fill: tuple[tuple[list[int], int, int], ...] = (),
    twins: tuple[tuple[list[int], int], ...] = (),
) -> tuple[list[list[int]], dict[int, tuple[int, int]]]:
    """``n`` documents of 1 to ``3 * row_len`` tokens (some longer than a row), drawn per check.

    Each ``(documents, length)`` of ``twins`` is a call whose first two documents get
    ``length`` tokens each, so they share the call's first row. Each ``(documents, length,
    rest)`` of ``fill`` is one call of the check: its last document is lengthened until
    the call's tokens fill whole rows of ``length`` and ``rest`` tokens more (0: whole
    rows exactly, where ``n // length + 1`` rows, one of nothing but padding, differs from
    the ceiling; under half a row: one full row at least before it, where
    ``round(n / length)`` rows drop the last). Returns the documents (lists of token ids,
    each id used once in the check) and the map ``id -> (document, offset)`` that only
    the judging process keeps.
    """
    rng = random.Random(seed)
    lengths = [
        rng.choice((rng.randint(1, row_len // 2), rng.randint(1, 3 * row_len))) for _ in range(n)
    ]
    for call, length in twins:
        lengths[call[0]] = lengths[call[1]] = length
    for call, length, rest in fill:
        lengths[call[-1]] += (rest - sum(lengths[d] for d in call)) % length
        if rest and sum(lengths[d] for d in call) < length:
            lengths[call[-1]] += length
    ids = rng.sample(range(PAD + 1, VOCAB), sum(lengths))
    docs, where, k = [], {}, 0
    for d, m in enumerate(lengths):
        docs.append(ids[k : k + m])
        where.update({t: (d, o) for o, t in enumerate(docs[-1])})
        k += m
    return docs, where


def draw_pack(seed: int) -> tuple[list[int], list[list[int]], dict[int, tuple[int, int]]]:
    """One check's draw: ``(row_lens, docs, where)`` (see :func:`pack_docs`).

    Two row lengths, call by call: a length written into the answer fits neither; the
    shorter first, so what an answer kept from its first call meets a longer row. At
    each row length one call, drawn, has two documents of one length in its first row
    (issue 45's sixth trial: documents told apart by their length passed 11 checks in
    20), and another ends in a row less than half full (``round(tokens / row_len)`` rows
    passed 2 in 17). Half the calls, drawn from the rest, fill their rows exactly (one
    row more is all padding).
    """
    rng = random.Random(seed)
    row_lens = sorted(rng.sample(ROW_LENS, 2))
    calls = _calls(WORLD, row_lens)
    twins, short, fill = [], [], []
    for length in row_lens:
        at = [c for c in calls if c[1] == length]
        twins.append((at[rng.randrange(len(at))][0], rng.randint(1, length // 2)))
        call = rng.choice([c for c in at if c[0] is not twins[-1][0]])
        short.append((call[0], length, rng.randint(1, (length - 1) // 2)))
    rest = [c for c in calls if all(c[0] is not s[0] for s in short)]
    fill = [(docs, length, 0) for docs, length in rng.sample(rest, len(calls) // 2)]
    docs, where = pack_docs(seed, DOCS, max(row_lens), fill=(*short, *fill), twins=tuple(twins))
    return row_lens, docs, where


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


def pack_calls(fn: Callable, mine: list[list[int]], row_lens: list[int], per_call: int) -> Any:
    """The learner's ``fn`` on one rank's documents, ``per_call`` at a time (see :func:`job_pack`)."""
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


def job_pack(fn: Callable, docs: list[list[int]], row_lens: list[int], per_call: int) -> Any:
    """Notebook 11, exercise 1: this rank's documents (dealt round-robin), packed ``per_call`` at a time.

    Call ``c`` packs at ``row_lens[c % len(row_lens)]``: a check asks for two row lengths.
    Returns, per call, the ``input_ids``, ``position_ids`` and ``mask`` the learner's
    ``fn(list_of_token_tensors, row_len)`` returned, as plain lists (or, for a value
    that is no grid of integers, a line saying so, which the checker turns into a verdict).
    """
    return pack_calls(fn, docs[dist.get_rank() :: dist.get_world_size()], row_lens, per_call)


def judge_packs(
    got: list[Any], docs: list[list[int]], row_lens: list[int], where: dict[int, tuple[int, int]]
) -> str:
    """Stop at the first fault of every rank's calls (``got``: what :func:`job_pack` returned
    on each rank); what they achieved otherwise. Pure: a test judges offline with it."""
    seen: Counter[tuple[int, int]] = Counter()
    rows = 0
    for rank, calls in enumerate(got):
        mine = docs[rank :: len(got)]  # as job_pack deals them
        if not isinstance(calls, list) or len(calls) != -(-len(mine) // PER_CALL):
            raise wrong(f"rank {rank} did not return one result per call of its job.")
        for c, out in enumerate(calls):
            given = {t for doc in mine[c * PER_CALL : (c + 1) * PER_CALL] for t in doc}
            place = f"rank {rank}, call {c}"
            n, toks = judge_call(place, out, row_lens[c % len(row_lens)], where, given)
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


def check_pack(
    fn: Callable[[list[Any], int], dict[str, Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 1: ``fn(docs, row_len)`` packs documents without attention across them.

    24 documents of fresh random lengths (some three rows long) are dealt over 4
    ranks; each rank packs its own 3 at a time with ``fn``, at two row lengths drawn anew
    (one per call, in turn, the shorter first). At each row length one call, drawn, has
    two documents of one length in a row, and another ends in a row less than half full;
    half the calls, drawn, hold tokens that fill whole rows exactly (see :func:`draw_pack`).
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        # Drawn here, after judge() pickled the answer: no frame holds it while code the
        # answer carries runs at pickling.
        row_lens, docs, where = draw_pack(fresh_seed())
        got = run_learner(job_pack, fn, docs, row_lens, PER_CALL, world_size=WORLD, timeout=timeout)
        each_returned(got, "the packed rows of every call")
        return judge_packs(got, docs, row_lens, where)

    return judge("pack", body)
