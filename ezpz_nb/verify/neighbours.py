"""Neighbours kept: how many pairs of samples that sat next to each other in one order sit
next to each other again in the next, against what a fresh shuffle keeps.

An order read backwards keeps every neighbouring pair; samples glued in pairs (or threes)
whose groups alone are shuffled keep half of them or more. In a fresh permutation of ``n``
samples a given pair is neighbours with chance ``2 / n``, so about 2 pairs are kept
whatever ``n``; the count is near Poisson, and :func:`poisson_tail` bounds its tail (heavier
than the count's: 15 samples, 200 000 fresh shuffles kept 9 pairs at most, where the Poisson
tail at 9 is 1e-4). Used by :mod:`~ezpz_nb.verify.orders` (a contract's epochs, per DP
replica) and the workshop's notebook 17 checker (a source's passes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Kept", "kept_neighbours", "poisson_tail"]


def poisson_tail(k: int, lam: float) -> float:
    """``P(X >= k)`` for ``X`` Poisson with mean ``lam``."""
    if k <= 0:
        return 1.0
    if lam <= 0:
        return 0.0
    terms = (math.exp(-lam + i * math.log(lam) - math.lgamma(i + 1)) for i in range(k, k + 400))
    return min(1.0, math.fsum(terms))


@dataclass(frozen=True)
class Kept:
    """Neighbouring pairs of a later order that the earlier one also had.

    Attributes:
        kept: Pairs neighbours in both orders.
        out_of: Pairs of neighbours in the later order (``n - 1``).
        expected: How many a fresh shuffle of the later order's samples keeps, on average.
    """

    kept: int
    out_of: int
    expected: float

    def __add__(self, other: Kept) -> Kept:
        return Kept(
            self.kept + other.kept, self.out_of + other.out_of, self.expected + other.expected
        )

    def chance(self) -> float:
        """How often a fresh shuffle keeps as many (an upper bound)."""
        return poisson_tail(self.kept, self.expected)

    def half(self) -> bool:
        """Half the pairs or more kept: far above what a shuffle buffer keeps."""
        return self.out_of > 0 and 2 * self.kept >= self.out_of


def _pairs(order: Sequence[int]) -> set[frozenset[int]]:
    return {frozenset(p) for p in zip(order, order[1:], strict=False)}


def kept_neighbours(before: Sequence[int], after: Sequence[int]) -> Kept:
    """What ``after`` keeps of ``before``'s neighbouring pairs (pairs whose two samples are
    both in ``after`` can be kept: a replica's samples may change between epochs)."""
    if len(after) < 3:
        return Kept(0, 0, 0.0)
    mine = set(after)
    could = [p for p in _pairs(before) if p <= mine]
    kept = len(_pairs(after).intersection(could))
    return Kept(kept, len(after) - 1, len(could) * 2 / len(after))
