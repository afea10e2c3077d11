"""Notebook 17's seeds: their draw, and the rules on the streams of several seeds (the
checker is :mod:`.mixture`, the rest of its draw and rules :mod:`.mix_streams`).

:func:`seed_blind` and :func:`few_streams` return "" when the seeds' streams differ as
fresh ones do, else the sentence saying where two match and what to do. Like the rules of
:mod:`.mix_streams`, each turns a right answer (a fresh permutation per seed, source and
pass) down with a chance of at most :data:`CHANCE` per source. :func:`draw_seeds` draws a
check's seeds, twins of its own among them; :func:`draw_many` the :data:`MANY` seeds of
:func:`few_streams`, and :func:`few_window` how many global batches each of them runs.

Offline (in-process streams at dp=1, every rule of the check, 300 draws each): a numpy
permutation, torch.randperm with a Generator and random.Random per (seed, source, pass)
passed 300 of 300; ``seed % 1000``, ``seed % 10**6``, ``seed & 0xFFFF``, ``seed // 8``,
one or two bits of the seed, a seed that orders the slots only and a seed for one source
only (the first, or the largest) were turned down 300 of 300. A seed for every source but
one passed 1 draw in 300: there that source held a whole pass in every global batch, so
its batches are the same whatever the seed, a right answer's too (order within a batch
aside, which no rule judges).

:func:`passes_shared` (issue 45's fifth trial: ``seed + source + pass`` as each pass's
seed, whose neighbouring seeds run the same orders a pass apart): in process, that answer
turned down in 58 draws of 60 (the other two hold no source large enough to judge), the
notebook's solution and torch.randperm per pass in none of 120.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "CHANCE",
    "MANY",
    "Stream",
    "draw_many",
    "draw_seeds",
    "few_streams",
    "few_window",
    "passes_shared",
    "seed_blind",
]

#: A stream: ``stream[step]`` is the global batch of that step, ``(source, index)`` pairs.
Stream = Sequence[Sequence[tuple[int, int]]]

#: The most a right answer may fail one of these rules on one source of one stream.
#: With at most 5 sources and 2 streams judged, a check turns a right answer down at most
#: once in 10**5 checks; offline, 0 of 500 draws (module docstring of :mod:`.mixture`).
CHANCE = 1e-6
#: Seeds drawn at random for :func:`few_streams`, each run for the first
#: :func:`few_window` global batches. An answer whose stream is one of ``K`` fixed ones
#: (the seed hashed, or cut down in any way, to ``K`` values), for the whole stream or
#: for one source the window judges (the largest always; a small source that holds most
#: of a pass in each batch may not be), gives two of them one stream unless all 128 fall
#: in different ones:
#: a chance of at most ``prod(1 - i / K for i < 128)`` whatever the map (uniform is its
#: best), 2.04e-4 at ``K = 1000``, 3.8e-3 at 1500, 1.6e-2 at 2000, 0 for K < 128.
MANY = 128
#: The most global batches :func:`few_window` asks each of the :data:`MANY` seeds for.
FEW_MOST = 16


def draw_seeds(rng: random.Random, seed: int, count: int) -> tuple[int, ...]:
    """``count`` different seeds from 1 to 2**31 - 1, ``seed`` first, then twins of it:
    one with its last 8 decimal digits, one with its low 24 bits, one with all but its
    lowest bit (its neighbour); the rest at random. An answer that keeps only a part of the
    seed (``seed % 1000``, ``seed & 0xFFFF``, ``seed // 8``) meets two seeds with one stream."""
    seeds = [seed]
    twins = (
        lambda: seed % 10**8 + 10**8 * rng.randrange(21),
        lambda: seed % 2**24 + 2**24 * rng.randrange(128),
        # Its neighbour (seed +- 1): all but the lowest bit shared, and one apart (an answer
        # seeding each pass with seed + pass runs the same orders one pass later).
        # (Where that one is taken or out of range, another low bit.)
        lambda: seed ^ (1 if (seed ^ 1) not in seeds and seed ^ 1 else rng.randrange(2, 8)),
    )
    for make in twins + (lambda: rng.randrange(1, 2**31),) * (count - 1 - len(twins)):
        more = make()
        while more in seeds or not 0 < more < 2**31:
            more = make()
        seeds.append(more)
    return tuple(seeds)


def draw_many(rng: random.Random, taken: Sequence[int]) -> tuple[int, ...]:
    """:data:`MANY` different seeds from 1 to 2**31 - 1, none of ``taken``."""
    out: set[int] = set()
    while len(out) < MANY:
        x = rng.randrange(1, 2**31)
        if x not in taken:
            out.add(x)
    return tuple(sorted(out))


def _few_below(k: int) -> float:
    """The log of the chance under which :func:`few_streams` judges one part (a source, or
    all of them): :data:`CHANCE` shared by every pair of the :data:`MANY` seeds and the
    ``k + 1`` parts."""
    return math.log(CHANCE / (math.comb(MANY, 2) * (k + 1)))


def few_window(drawn: Sequence[Sequence[int]], sizes: Sequence[int]) -> int:
    """How many first global batches :func:`few_streams` compares, ``drawn[b][s]`` being
    source ``s``'s samples in batch ``b``: the fewest (up to :data:`FEW_MOST`) where the
    whole batches, and each source that can be judged within :data:`FEW_MOST`, are."""
    below = _few_below(len(sizes))

    def logs(w: int) -> list[float]:
        return [_log_match([d[s] for d in drawn[:w]], 0, n) for s, n in enumerate(sizes)]

    def enough(w: int) -> bool:
        each = logs(w)
        return sum(each) <= below and all(each[s] <= below for s in judged)

    # A bound only falls as batches are added (each adds a -log C(.,.)): search by halves.
    lo, hi = 1, min(FEW_MOST, len(drawn))
    judged = [s for s, x in enumerate(logs(hi)) if x <= below]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return hi


def few_streams(streams: Mapping[int, Stream], sizes: Sequence[int]) -> str:
    """Where two of many seeds' streams (their first global batches) hold the same samples,
    order within a batch aside: the whole batches, or one source's samples in each; '' if
    nowhere. A part is judged where fresh permutations match with a chance of at most
    :data:`CHANCE` over all the pairs and parts (:func:`_log_match`); counted, no clock."""
    k, below = len(sizes), _few_below(len(sizes))
    picks = {x: _per_source(a, k) for x, a in streams.items()}
    for part in (None, *range(k)):
        seen: dict[tuple[frozenset[tuple[Any, int]], ...], int] = {}
        for x, a in streams.items():
            if part is None:
                key = tuple(frozenset(Counter(b).items()) for b in a)
            else:
                key = tuple(frozenset(c.items()) for c in picks[x][part])
            y = seen.setdefault(key, x)
            if y == x:
                continue
            drawn = [[sum(c.values()) for c in picks[x][s]] for s in range(k)]
            each = [_log_match(drawn[s], 0, n) for s, n in enumerate(sizes)]
            if (sum(each) if part is None else each[part]) > below:
                continue  # a match fresh streams make too often to judge
            what = "the same samples" if part is None else f"source {part} the same samples"
            return (
                f"seed={y} and seed={x}, two of {len(streams)} seeds drawn at random, gave "
                f"{what} in global batches 0 to {len(a) - 1}, where fresh permutations "
                f"match with a chance under {CHANCE:.0e}: the stream is one of a few, "
                f"whatever the seed (a seed hashed or cut down to a few values). {_WHOLE_SEED}"
            )
    return ""


def seed_blind(streams: Mapping[int, Stream], sizes: Sequence[int]) -> str:
    """Where two seeds' streams hold the same samples, order within a batch aside (as the
    layout rule compares batches); '' if nowhere.

    Compared: every global batch of the first half of the horizon, and of the second; and
    each source's samples in every global batch of a window (either half, or the whole
    horizon) where fresh permutations match with a chance of at most :data:`CHANCE` over
    all the pairs and windows compared (:func:`_log_match`), so that a seed that reaches
    only some sources shows too.
    """
    steps = len(next(iter(streams.values())))
    windows = ((0, steps // 2), (steps // 2, steps), (0, steps))
    pairs = math.comb(len(streams), 2)
    judged_below = math.log(CHANCE / (pairs * len(windows)))
    picks = {x: _per_source(a, len(sizes)) for x, a in streams.items()}
    for (x, a), (y, b) in itertools.combinations(streams.items(), 2):
        for lo, hi in windows[:2]:
            if [Counter(z) for z in a[lo:hi]] == [Counter(z) for z in b[lo:hi]]:
                return (
                    f"seed={x} and seed={y} gave the same samples in global batches {lo} to "
                    f"{hi - 1}: the seed changes nothing there. {_WHOLE_SEED}"
                )
        for s, n in enumerate(sizes):
            mine, theirs = picks[x][s], picks[y][s]
            drawn = [sum(c.values()) for c in mine]
            for lo, hi in windows:
                if mine[lo:hi] == theirs[lo:hi] and (
                    _log_match(drawn[lo:hi], sum(drawn[:lo]), n) <= judged_below
                ):
                    return (
                        f"seed={x} and seed={y} gave source {s} ({n} samples) the same samples "
                        f"in every global batch from {lo} to {hi - 1}: the seed changes nothing "
                        f"there for that source. {_WHOLE_SEED}"
                    )
    return ""


def passes_shared(streams: Mapping[int, Stream], sizes: Sequence[int]) -> str:
    """Where two seeds' streams give a source one order in different passes (seeds that
    differ a little shifting the same orders: ``seed + pass`` as the generator's seed);
    '' if nowhere.

    A source's draws, read in the stream's order, cut into passes of its size: where an
    answer lists a source's samples within a batch in their pass's order (as the notebook's
    does), each is that pass's permutation. Judged for a source only where two fresh
    permutations would meet by a chance of at most :data:`CHANCE` over every pair of
    passes compared (``pairs / n!``); an answer that lists them otherwise is not judged.
    """
    orders = {x: _pass_orders(stream, sizes) for x, stream in streams.items()}
    seed_pairs = list(itertools.combinations(orders.items(), 2))
    for (x, mine), (y, theirs) in seed_pairs:
        for s, n in enumerate(sizes):
            a, b = mine[s], theirs[s]
            compared = len(a) * len(b) * len(seed_pairs) * len(sizes)
            if not compared or math.log(compared) - math.lgamma(n + 1) > math.log(CHANCE):
                continue
            met = set(a) & set(b)
            if met:
                order = next(iter(met))
                return (
                    f"seed={x} and seed={y} gave source {s} ({n} samples) one order: its pass "
                    f"{a.index(order)} under seed={x} is its pass {b.index(order)} under "
                    f"seed={y}. Seeds a little apart shift the same orders (a seed added to "
                    f"the source or the pass, as seed + pass, does). {_WHOLE_SEED}"
                )
    return ""


def _pass_orders(stream: Stream, sizes: Sequence[int]) -> list[list[tuple[int, ...]]]:
    """For each source, its whole passes in ``stream`` in the order drawn (those that are
    permutations of its samples: a repeat is another rule's)."""
    seqs: list[list[int]] = [[] for _ in sizes]
    for batch in stream:
        for s, i in batch:
            seqs[s].append(i)
    out = []
    for seq, n in zip(seqs, sizes, strict=True):
        passes = [tuple(seq[q * n : (q + 1) * n]) for q in range(len(seq) // n)]
        out.append([p for p in passes if len(set(p)) == n])
    return out


_WHOLE_SEED = (
    "Draw the order of each source's samples from the whole seed (as np.random.default_rng"
    "([seed, 1 + source, pass])): a new seed is how a run gets a new order, for each epoch or "
    "run."
)


def _per_source(stream: Stream, k: int) -> list[list[Counter[int]]]:
    """For each source, the samples it holds in each global batch of ``stream``."""
    out: list[list[Counter[int]]] = [[Counter() for _ in stream] for _ in range(k)]
    for b, batch in enumerate(stream):
        for s, i in batch:
            out[s][b][i] += 1
    return out


def _log_match(drawn: Sequence[int], before: int, n: int) -> float:
    """The log of a bound on the chance that two fresh streams give a source of ``n``
    samples the same samples in every batch of a window, ``drawn[b]`` in batch ``b``,
    ``before`` before the window.

    The passes are independent permutations. Read the batches in order, each stream's
    passes before a batch's last pass known: the batch then names the samples that last
    pass holds in it (the batch's less the earlier passes' part), ``r`` given places of
    the pass. A pass whose ``r_1, r_2, ...`` places (``t`` in all) are named that way holds
    the named sets by a chance of ``r_1! r_2! ... (n - t)! / n!``; the passes multiply.
    """
    held: dict[int, list[int]] = {}
    at = before
    for r in drawn:
        if r:
            last = (at + r - 1) // n  # the batch's last pass, its places at + r - last * n
            held.setdefault(last, []).append(min(r, at + r - last * n))
        at += r
    return sum(
        sum(math.lgamma(r + 1) for r in rs) + math.lgamma(n - sum(rs) + 1) - math.lgamma(n + 1)
        for rs in held.values()
    )
