"""Notebook 11, exercise 1's draw: the documents a packing check deals, and its calls.

Split from :mod:`.packing` (its checker, rank job and judge) to keep each module short.
:func:`draw_pack` draws two row lengths, the documents, and how many documents each call
of each rank holds; :func:`pack_docs` makes the documents, some sharing a token id.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from ezpz_nb.workshop.pack_rows import PAD

__all__ = ["DOCS", "ROW_LENS", "VOCAB", "WORLD", "PackDraw", "draw_pack", "pack_docs"]

DOCS, WORLD = 24, 4
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
    share: tuple[tuple[list[int], int], ...] = (),
) -> list[list[int]]:
    """``n`` documents of 1 to ``3 * row_len`` tokens (some longer than a row), drawn per check.

    Each ``(documents, length)`` of ``twins`` is a call whose first two documents get
    ``length`` tokens each, so they share the call's first row. Each ``(documents, length,
    rest)`` of ``fill`` is one call of the check: its last document is lengthened until
    the call's tokens fill whole rows of ``length`` and ``rest`` tokens more (0: whole
    rows exactly, where ``n // length + 1`` rows, one of nothing but padding, differs from
    the ceiling; under half a row: one full row at least before it, where
    ``round(n / length)`` rows drop the last). Each ``(documents, length)`` of ``share`` is
    a call in which two documents get one token id (:func:`_share_id`). Returns the
    documents as lists of token ids, drawn from ``1 .. VOCAB - 1``, each used once in the
    check except those shared.
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
    docs, k = [], 0
    for m in lengths:
        docs.append(ids[k : k + m])
        k += m
    for call, length in share:
        _share_id(rng, docs, call, length)
    return docs


def _share_id(rng: random.Random, docs: list[list[int]], call: list[int], row_len: int) -> bool:
    """Give two documents of ``call`` one token id; False where no two can take it.

    Each of the two tokens has a neighbour of its own document in its row, as the call is
    packed in order: a mask that takes a token's document from its id (the id's last
    document, or its first) then joins or splits that pair, whichever reading the
    checker tries."""
    spots: dict[int, list[int]] = {}  # document -> offsets with a neighbour in their row
    start = 0
    for d in call:
        for o in range(len(docs[d])):
            col = (start + o) % row_len
            if (o > 0 and col > 0) or (o + 1 < len(docs[d]) and col + 1 < row_len):
                spots.setdefault(d, []).append(o)
        start += len(docs[d])
    if len(spots) < 2:
        return False
    a, b = rng.sample(sorted(spots), 2)
    docs[b][rng.choice(spots[b])] = docs[a][rng.choice(spots[a])]
    return True


class PackDraw(NamedTuple):
    """What one packing check draws (see :func:`draw_pack`)."""

    #: The two row lengths, the shorter first: call ``c`` of a rank packs at ``c % 2``.
    row_lens: list[int]
    #: Every document, as token ids; rank ``r`` packs ``docs[r::WORLD]``.
    docs: list[list[int]]
    #: Per rank, how many of its documents each of its calls holds, in order.
    sizes: list[list[int]]


def draw_pack(seed: int) -> PackDraw:
    """One check's draw (see :func:`pack_docs`).

    Two row lengths, call by call: a length written into the answer fits neither; the
    shorter first, so what an answer kept from its first call meets a longer row. Each
    rank's 6 documents are cut into calls of a drawn number of documents, some other than
    3 (:func:`_draw_sizes`). At each row length one call, drawn, has two documents of one
    length in its first row (issue 45's sixth trial: documents told apart by their length
    passed 11 checks in 20), and another ends in a row less than half full
    (``round(tokens / row_len)`` rows passed 2 in 17). Up to half the calls, drawn from
    the rest, fill their rows exactly (one row more is all padding). In each call of two
    documents or more, two share a token id where two can (:func:`_share_id`), and at
    least one call of the check does (else its documents are drawn anew).
    """
    rng = random.Random(seed)
    row_lens = sorted(rng.sample(ROW_LENS, 2))
    sizes = _draw_sizes(rng, row_lens)
    calls = _calls(sizes, row_lens)
    twins, short = [], []
    for length in row_lens:
        at = [c for c in calls if c[1] == length]
        pair = [c for c in at if len(c[0]) >= 2]
        twins.append((pair[rng.randrange(len(pair))][0], rng.randint(1, length // 2)))
        call = rng.choice([c for c in at if c[0] is not twins[-1][0]])
        short.append((call[0], length, rng.randint(1, (length - 1) // 2)))
    # Not the twins' calls: lengthening a two-document call's last document parts them.
    taken = [docs for docs, *_ in (*short, *twins)]
    rest = [c for c in calls if all(c[0] is not t for t in taken)]
    fill = [(docs, length, 0) for docs, length in rng.sample(rest, min(len(rest), len(calls) // 2))]
    while True:
        docs = pack_docs(
            seed,
            DOCS,
            max(row_lens),
            fill=(*short, *fill),
            twins=tuple(twins),
            share=tuple((d, length) for d, length in calls if len(d) >= 2),
        )
        if len({t for doc in docs for t in doc}) < sum(map(len, docs)):
            return PackDraw(row_lens, docs, sizes)
        seed += 1_000_003  # no two documents could share an id (rare): draw them anew


def _draw_sizes(rng: random.Random, row_lens: list[int]) -> list[list[int]]:
    """Per rank, its calls' numbers of documents: its share cut at random places.

    Drawn again until a call holds other than 3 (issue 45's eighth trial) and each row
    length has two calls at least, one of them of two documents or more (for the twins).
    """
    share = DOCS // WORLD
    while True:
        sizes = []
        for _ in range(WORLD):
            cuts = [k for k in range(1, share) if rng.random() < 0.5]
            sizes.append([b - a for a, b in zip([0, *cuts], [*cuts, share], strict=True)])
        calls = _calls(sizes, row_lens)
        if any(n != 3 for s in sizes for n in s) and all(
            sum(c[1] == length for c in calls) >= 2
            and any(c[1] == length and len(c[0]) >= 2 for c in calls)
            for length in row_lens
        ):
            return sizes


def _calls(sizes: list[list[int]], row_lens: list[int]) -> list[tuple[list[int], int]]:
    """Each call of a check as ``job_pack`` makes it: its documents and its row length."""
    out = []
    for rank, counts in enumerate(sizes):
        mine = list(range(DOCS))[rank::WORLD]
        k = 0
        for c, n in enumerate(counts):
            out.append((mine[k : k + n], row_lens[c % len(row_lens)]))
            k += n
    return out
