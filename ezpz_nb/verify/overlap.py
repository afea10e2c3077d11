"""Batches an epoch shares with an earlier one, and how rarely a fresh shuffle shares as many.

A loader that deals the same sample sets again has not reshuffled, whatever the order of
its ids: one shuffle drawn once with two neighbours swapped each epoch keeps all but a
batch or two (the ninth trial), and each replica handed another replica's fixed shard
keeps every global batch (the union of the replicas' batches at a step: what the averaged
gradient sees). So :mod:`~ezpz_nb.verify.orders` counts the batches of a later epoch that
are sample sets an earlier epoch also batched, per replica (any replica's earlier batch
counts) and per global step, and blames a count a fresh shuffle would reach by chance
less often than its bound.

The chance: given the samples each replica holds in the later epoch and its batch sizes, a
fresh shuffle arranges each replica's samples uniformly and independently of the other
replicas (so do DistributedSampler, a permutation dealt in blocks, and fixed shards each
shuffled within). Then ``s`` given disjoint sets all come out as batches with an exact
chance (:func:`_log_all`), and its sum over every ``s`` of the candidates, E[C(X, s)],
bounds the chance that ``s`` or more are shared. Ids a replica holds twice in the later
epoch (a padded sampler) are left out, which keeps the chance exact.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

__all__ = ["Shared", "global_shared", "replica_shared", "together"]

Batch = tuple[int, ...]
#: A batch's sizes, one per replica (one entry for a replica's own batch).
Sizes = tuple[int, ...]
#: The most size combinations summed over; beyond, the rarest sizes are not counted.
_COMBOS = 20_000


class Shared(NamedTuple):
    """How many of an epoch's batches (of the sizes counted) an earlier epoch also made,
    out of how many, and the chance bound a fresh shuffle shares that many."""

    shared: int
    out_of: int
    chance: float


def _lfall(m: int, j: int) -> float:
    return math.lgamma(m + 1) - math.lgamma(m - j + 1)


def _log_all(pools: Sizes, chosen: dict[Sizes, int], cands: Counter, slots: Counter) -> float:
    """log E[C(X, s)] over the candidate sets of ``chosen[sizes]`` of each sizes: (ways to
    pick them) x (slots of their sizes to put them in) x the chance of one such placing."""
    log, used = 0.0, [0] * len(pools)
    for sizes, j in chosen.items():
        log += _lfall(cands[sizes], j) - math.lgamma(j + 1) + _lfall(slots[sizes], j)
        log += j * sum(math.lgamma(z + 1) for z in sizes)
        used = [u + j * z for u, z in zip(used, sizes, strict=True)]
    if any(u > n for u, n in zip(used, pools, strict=True)):
        return -math.inf
    return log + sum(
        math.lgamma(n - u + 1) - math.lgamma(n + 1) for n, u in zip(pools, used, strict=True)
    )


def _counted(cands: Counter, slots: Counter) -> list[Sizes]:
    """The sizes counted: the most common first, while the sums stay under :data:`_COMBOS`
    (batches of one size: always all; every batch its own size: a few)."""
    common = sorted(set(cands) & set(slots), key=lambda z: (-min(cands[z], slots[z]), z))
    out: list[Sizes] = []
    combos = 1
    for z in common:
        combos *= min(cands[z], slots[z]) + 1
        if out and combos > _COMBOS:
            break
        out.append(z)
    return out


def _chance(pools: Sizes, cands: Counter, slots: Counter, shared: int) -> float:
    """The least of E[C(X, s)] for 1 <= s <= ``shared``: each bounds P(X >= shared), and
    the least keeps the bound from rising as more is shared."""
    sizes = list(cands)
    per = [-math.inf] * (shared + 1)
    for js in itertools.product(*(range(min(cands[z], slots[z], shared) + 1) for z in sizes)):
        s = sum(js)
        if 0 < s <= shared:
            got = _log_all(pools, {z: j for z, j in zip(sizes, js, strict=True) if j}, cands, slots)
            hi, lo = max(per[s], got), min(per[s], got)
            per[s] = hi if lo == -math.inf else hi + math.log1p(math.exp(lo - hi))
    return min(1.0, *(math.exp(p) for p in per[1:])) if shared else 1.0


def _shared(pools: Sizes, cands: Mapping[frozenset[int], Sizes], slots: list[Sizes],
            after: set[frozenset[int]]) -> Shared:  # fmt: skip
    """Count the candidates that are batches of ``after``, of the sizes counted."""
    by = Counter(cands.values())
    sl = Counter(z for z in slots if sum(z))
    keep = set(_counted(by, sl))
    count = sum(1 for c, z in cands.items() if z in keep and c in after)
    by = Counter({z: by[z] for z in keep})
    return Shared(count, sum(sl.values()), _chance(pools, by, sl, count))


def replica_shared(earlier: Sequence[Batch], later: Sequence[Batch]) -> Shared:
    """The batches of one replica's later epoch that are sample sets of an earlier epoch
    (``earlier``: every replica's batches of it)."""
    pool = Counter(i for b in later for i in b)
    cands = {
        frozenset(b): (len(b),)
        for b in earlier
        if b and len(set(b)) == len(b) and all(pool[i] == 1 for i in b)
    }
    return _shared((sum(pool.values()),), cands, [(len(b),) for b in later],
                   {frozenset(b) for b in later})  # fmt: skip


def _steps(replicas: Sequence[Sequence[Batch]]) -> list[Batch]:
    """The global batch of each step: every replica's batch at it, end to end."""
    return [
        tuple(i for r in replicas if t < len(r) for i in r[t])
        for t in range(max(map(len, replicas), default=0))
    ]


def global_shared(earlier: Sequence[Sequence[Batch]], later: Sequence[Sequence[Batch]]) -> Shared:
    """The global batches of the later epoch that are global batches of the earlier one
    (``earlier[r]``, ``later[r]``: replica r's batches, the replicas in one order)."""
    pools = [Counter(i for b in r for i in b) for r in later]
    every = sum(pools, Counter())
    cands: dict[frozenset[int], Sizes] = {}
    for g in _steps(earlier):
        if g and len(set(g)) == len(g) and all(every[i] == 1 for i in g):
            cands[frozenset(g)] = tuple(sum(1 for i in g if i in p) for p in pools)
    slots = [
        tuple(len(r[t]) if t < len(r) else 0 for r in later)
        for t in range(max(map(len, later), default=0))
    ]
    return _shared(tuple(sum(p.values()) for p in pools), cands, slots,
                   {frozenset(g) for g in _steps(later)})  # fmt: skip


def together(chances: Sequence[float]) -> float:
    """The chance that independent bounds multiply to as little as these do (Fisher's
    combination): their product alone would blame many replicas each a little unlucky."""
    t = math.prod(chances)
    if t <= 0.0:
        return 0.0
    return min(1.0, t * sum((-math.log(t)) ** i / math.factorial(i) for i in range(len(chances))))
