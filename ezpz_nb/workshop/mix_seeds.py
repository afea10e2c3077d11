"""Notebook 17's seeds: their draw, and the rule on the streams of several seeds (the
checker is :mod:`.mixture`, the rest of its draw and rules :mod:`.mix_streams`).

:func:`seed_blind` returns "" when every two seeds' streams differ, else the sentence saying
where two match and what to do. Like the rules of :mod:`.mix_streams`, it turns a right
answer (a fresh permutation per seed, source and pass) down with a chance of at most
:data:`CHANCE` per source (the rules of :mod:`.mix_streams` too).
:func:`draw_seeds` draws a check's seeds, twins of its own among them.

Offline (in-process streams at dp=1, every rule of the check, 300 draws each): a numpy
permutation, torch.randperm with a Generator and random.Random per (seed, source, pass)
passed 300 of 300; ``seed % 1000``, ``seed % 10**6``, ``seed & 0xFFFF``, ``seed // 8``,
one or two bits of the seed, a seed that orders the slots only and a seed for one source
only (the first, or the largest) were turned down 300 of 300. A seed for every source but
one passed 1 draw in 300: there that source held a whole pass in every global batch, so
its batches are the same whatever the seed, a right answer's too (order within a batch
aside, which no rule judges).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = ["CHANCE", "Stream", "draw_seeds", "seed_blind"]

#: A stream: ``stream[step]`` is the global batch of that step, ``(source, index)`` pairs.
Stream = Sequence[Sequence[tuple[int, int]]]

#: The most a right answer may fail one of these rules on one source of one stream.
#: With at most 5 sources and 2 streams judged, a check turns a right answer down at most
#: once in 10**5 checks; offline, 0 of 500 draws (module docstring of :mod:`.mixture`).
CHANCE = 1e-6


def draw_seeds(rng: random.Random, seed: int, count: int) -> tuple[int, ...]:
    """``count`` different seeds from 1 to 2**31 - 1, ``seed`` first, then twins of it:
    one with its last 8 decimal digits, one with its low 24 bits, one with all but its
    lowest 3 bits; the rest at random. An answer that keeps only a part of the seed
    (``seed % 1000``, ``seed & 0xFFFF``, ``seed // 8``) meets two seeds with one stream."""
    twins = (
        lambda: seed % 10**8 + 10**8 * rng.randrange(21),
        lambda: seed % 2**24 + 2**24 * rng.randrange(128),
        lambda: seed ^ rng.randrange(1, 8),
    )
    seeds = [seed]
    for make in twins + (lambda: rng.randrange(1, 2**31),) * (count - 1 - len(twins)):
        more = make()
        while more in seeds or not 0 < more < 2**31:
            more = make()
        seeds.append(more)
    return tuple(seeds)


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
