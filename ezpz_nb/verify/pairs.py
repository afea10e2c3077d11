"""Two DP replicas alike among more: contents one pair of replicas shares far too often.

:func:`~ezpz_nb.verify.contents.first_twin` blames contents that lie one copy per replica
more often than a true shard spreads them. At dp 4 a loader that gives replicas 0 and 1 the
same data (under other ids) while replicas 2 and 3 read their own stays below it: a content
read twice lies on two replicas by chance 3/4 anyway (left open after the eighth trial). What a
true shard never does is put the copies on *the same pair* of replicas again and again: a
content of ``m`` copies touches both replicas ``a`` and ``b`` by a chance fixed by the shard
sizes (about 1/8 for two copies at dp 4), so the number of contents a pair shares is a sum
of such chances, bounded by Chernoff (the placements of a random permutation are negatively
associated, so the bound for independent draws holds). :func:`pair_twin` blames the pair
whose count is below :data:`PAIR_ALPHA` after a union bound over the pairs and fields.

That chance is a random shard's: a loader whose placement follows the dataset's order (no
shuffle, a fixed file per rank) can put a repeated dataset's copies on one pair every
epoch, rightly. So only epochs whose placement moved (a quarter of the ids or more on
another replica than in every other counted epoch) count, and two such epochs at least:
one epoch, or a fixed placement, is not judged by this rule. A loader that deals whole
blocks of samples together (a file at a time) over data that repeats in blocks breaks the
per-sample null too; the spread rule shares that limit.

Power: where the data itself repeats, its own copies blur the pair: replicas alike over
data holding every row twice fail 11 draws in 20 at 40 rows (dp 4, two epochs), 20 in 20
at 80 rows; over distinct rows, 24 rows suffice (chance bound about 1e-8).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

from ezpz_nb.verify.samples import SEP

__all__ = ["MOVED", "PAIR_ALPHA", "Pair", "pair_twin", "random_epochs"]

#: The chance bound below which a pair is blamed: stricter than the spread rule's, as a pair
#: dodge's copies fall far below it (about 1e-8 for 24 samples at dp 4, two epochs), while
#: 1000 true shards of data that repeats (every row twice, four times, ten classes, uneven
#: shards) never came below 0.07.
PAIR_ALPHA = 1e-4

#: The share of ids an epoch must place on another replica than each counted epoch did.
MOVED = 0.25

# (digests, id, replica, rank, epoch, step): contents.Read (not imported: no cycle).
_Read = tuple[str, int, int, int, int, int]


@dataclass(frozen=True)
class Pair:
    """Two replicas that share more contents (under other ids) than a true shard puts there."""

    a: _Read  # a read of one shared content on the first replica ...
    b: _Read  # ... and its copy on the second, under another id
    field: str
    replicas: tuple[int, int]
    shared: int  # contents (per counted epoch, summed) with a copy on both replicas
    expected: float  # how many a true shard puts on both, on average
    chance: float  # an upper bound of the chance of so many, times the pairs and fields


def _absent(n: int, s: int, m: int) -> float:
    """The chance that none of ``m`` copies among ``n`` samples dealt at random lies among
    the ``s`` of one replica (hypergeometric)."""
    p = 1.0
    for k in range(m):
        if n - s - k <= 0:
            return 0.0
        p *= (n - s - k) / (n - k)
    return p


@lru_cache(maxsize=4096)  # an epoch's sizes repeat for every content of m copies
def _touch(n: int, sa: int, sb: int, m: int) -> float:
    """The chance that a content of ``m`` copies has a copy on both replicas (sizes ``sa``,
    ``sb``) when ``n`` samples are dealt at random."""
    return max(0.0, 1 - _absent(n, sa, m) - _absent(n, sb, m) + _absent(n, sa + sb, m))


def _upper(p: np.ndarray, count: np.ndarray, x: int) -> float:
    """Chernoff's bound of the chance that independent draws (``count[k]`` of chance
    ``p[k]``) give ``x`` or more successes."""
    p = np.clip(p, 1e-12, 1 - 1e-12)
    t = np.linspace(0.0, 40.0, 161)
    each = np.logaddexp(np.log1p(-p)[:, None], np.log(p)[:, None] + t)
    logs = -t * x + (count[:, None] * each).sum(axis=0)
    return float(np.exp(min(0.0, float(logs.min()))))


def random_epochs(reads: Sequence[_Read]) -> list[int]:
    """The epochs whose placement of ids on replicas moved from every other counted one (by
    :data:`MOVED` of the ids both hold); ``[]`` unless two such epochs."""
    place: dict[int, dict[int, int]] = {}
    for r in reads:
        place.setdefault(r[4], {}).setdefault(r[1], r[2])
    counted: list[int] = []
    for e in sorted(place):
        ok = True
        for c in counted:
            both = place[e].keys() & place[c].keys()
            moved = sum(place[e][i] != place[c][i] for i in both)
            ok = ok and bool(both) and moved >= MOVED * len(both)
        if ok:
            counted.append(e)
    return counted if len(counted) >= 2 else []


def pair_twin(reads: Sequence[_Read], alpha: float, fewest: int) -> Pair | None:
    """The pair of replicas (and field) that shares contents under other ids more often than
    a true shard of the same contents would, ``fewest`` such contents at least; None: none.
    """
    epochs = set(random_epochs(reads))
    d = len({r[2] for r in reads})
    # At dp 2 every copy on two replicas is on the one pair (the spread rule's); past dp 62
    # a replica's bit leaves an int64 (not judged there).
    if not epochs or not 3 <= d <= 62:
        return None
    # (field, epoch) -> digest -> id -> its first read
    groups: dict[tuple[str, int], dict[str, dict[int, _Read]]] = {}
    for read in reads:
        if read[4] in epochs:
            for token in read[0].split(SEP):
                field, _, digest = token.rpartition(":")
                groups.setdefault((field, read[4]), {}).setdefault(digest, {}).setdefault(
                    read[1], read
                )
    # (field, a, b) -> [(chance to touch both, contents of that many copies)], hits
    items: dict[tuple[str, int, int], list[tuple[float, int]]] = {}
    hits: dict[tuple[str, int, int], int] = {}
    for (field, _), contents in groups.items():
        owner = {i: r[2] for by in contents.values() for i, r in by.items()}
        n, size = len(owner), Counter(owner.values())
        multi = [by for by in contents.values() if len(by) >= 2]
        if not multi:
            continue
        # Per content: its copies and the replicas it touches (a bit each): one pass, then
        # every pair is counted at once (a dataset of repeats has thousands of contents).
        copies = np.array([len(by) for by in multi])
        touched = np.array([sum({1 << r[2] for r in by.values()}) for by in multi], np.int64)
        ms, counts = np.unique(copies, return_counts=True)
        for a, b in combinations(sorted(size), 2):
            both = (1 << a) | (1 << b)
            key = (field, a, b)
            hits[key] = hits.get(key, 0) + int(np.count_nonzero(touched & both == both))
            items.setdefault(key, []).extend(
                (_touch(n, size[a], size[b], int(m)), int(c))
                for m, c in zip(ms, counts, strict=True)
            )
    found = []
    for key, pc in items.items():
        x = hits.get(key, 0)
        p, c = np.array([q for q, _ in pc]), np.array([k for _, k in pc])
        expected = float(np.dot(p, c))
        if x < fewest or x <= expected:
            continue
        chance = _upper(p, c, x) * len(items)  # a union bound: every pair and field
        if chance < alpha:
            found.append((chance, key, x, expected))
    if not found:
        return None
    chance, (field, a, b), x, expected = min(found)
    first, second = _example(groups, field, a, b)
    return Pair(first, second, field, (a, b), x, expected, chance)


def _example(
    groups: dict[tuple[str, int], dict[str, dict[int, _Read]]], field: str, a: int, b: int
) -> tuple[_Read, _Read]:
    """A content of ``field`` read on replica ``a`` and on ``b``: its two reads."""
    for (f, _), contents in sorted(groups.items(), key=lambda kv: kv[0][1]):
        for by in contents.values() if f == field else ():
            on = {r[2]: r for r in sorted(by.values(), key=lambda r: (r[4], r[5], r[3]))[::-1]}
            if a in on and b in on:
                return on[a], on[b]
    raise AssertionError("a counted pair has a content on both")  # never: hits counted it
