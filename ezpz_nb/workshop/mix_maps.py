"""Notebook 17's rules on how one pass over a source follows from the pass before (the
checker is :mod:`.mixture`; the rules on each pass alone are :mod:`.mix_passes`).

A right answer draws every pass afresh (a permutation per seed, source and pass), so the
pass after is independent of the pass before. Issue 45's twelfth trial made passes from
the pass before in two ways that the rules on each pass alone let through:

* :func:`map_repeated`: pass ``2k + 1`` a fixed map of pass ``2k`` (riffled, ``o[0::2]``
  then ``o[1::2]``; or ``o[sigma]``, one ``sigma`` for every ``k``). Every neighbouring
  pair is new, so :func:`~.mix_passes.kept_neighbours_again` sees nothing; but the map from
  a place in one pass to the place of the same sample in the next (the *relative
  permutation*) is the same for every such pair of passes, where fresh passes give a map
  drawn uniformly from the ``n!`` of ``n`` samples, each time anew. The thirteenth trial
  renamed the samples instead (``tau[o]``: the map from the sample at a place to the sample
  at that place next, the same each time) and rotated the riffle by a drawn amount: both
  maps are counted, each exactly and up to a rotation of the pass after (:data:`MAPS`);
* :func:`seams_repeated`: each pass starting with the sample that ended the pass before
  (the same sample drawn twice in a row, often into one global batch), or, the thirteenth
  trial, with it in the second place: a sample of the pass before drawn again within ``k``
  draws, for each ``k`` of :data:`NEAR`, against its exact chance for a fresh pass
  (:func:`near_chance`: ``1 / n`` for ``k = 1``).

Pure functions of streams (``stream[step]`` a list of ``(source, index)`` pairs), judged in
the notebook after :func:`~.mix_passes.first_repeat` (each source's passes are whole): each
returns "" when the rule holds, else the sentence saying where it breaks and what to do.
Their bounds are worked out from counts (no clock): a right answer is turned down with a
chance of at most :data:`~.mix_seeds.CHANCE` per source (:func:`map_repeated`, its four
maps at a quarter of it each) or per stream (:func:`seams_repeated`, all its sources
together, each ``k`` at a sixth of it): at most ``(sources + 1) * CHANCE`` per stream,
two streams a check.

Offline (in-process streams at dp=1, both cases of a draw): the trial's riffled, sigma and
seam answers were turned down on 400 draws of 400 each; the notebook's solution, the
library's plan, torch.randperm per pass and the trial's three right answers (a
``RandomState``, ``random.Random`` and a ``torch.Generator`` per pass) on none of 40. The
thirteenth trial's renamed, riffled-and-rotated and last-sample-second answers were turned
down on 100 draws of 100 each, its right answers (a Feistel index shuffle, a swap so that no
pass starts with the last sample) and the twelfth's on none of 100.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import cache

import numpy as np

from ezpz_nb.workshop.mix_passes import draws
from ezpz_nb.workshop.mix_seeds import CHANCE, Stream

__all__ = [
    "MAPS",
    "NEAR",
    "log_same_map",
    "map_repeated",
    "near_chance",
    "seam_tail",
    "seams_repeated",
]

_DO = (
    "Draw each pass's order as a permutation from the seed, the source and the pass number "
    "(as np.random.default_rng([seed, 1 + source, pass]).permutation(size)), not from the "
    "pass before."
)


def _passes(got: Sequence[int], n: int) -> list[Sequence[int]]:
    """The source's complete passes (its draws cut every ``n`` from its first)."""
    return [got[j : j + n] for j in range(0, len(got) - n + 1, n)]


def _place_keys(before: Sequence[int], after: Sequence[int], turned: bool) -> set[tuple[int, ...]]:
    """Where the sample at each place of ``before`` sits in ``after`` (``turned``: in each of
    the ``n`` rotations of ``after``, the places less ``r``, modulo ``n``)."""
    place = {x: j for j, x in enumerate(after)}
    moved, n = [place[x] for x in before], len(after)
    return {tuple((j - r) % n for j in moved) for r in range(n if turned else 1)}


def _sample_keys(before: Sequence[int], after: Sequence[int], turned: bool) -> set[tuple[int, ...]]:
    """Which sample ``after`` holds where ``before`` held each sample, by index (``turned``:
    ``r`` places further on in ``after``, for each ``r``, modulo ``n``)."""
    at, n = [j for _, j in sorted((x, j) for j, x in enumerate(before))], len(after)
    return {tuple(after[(j + r) % n] for j in at) for r in range(n if turned else 1)}


#: The maps between neighbouring passes that :func:`map_repeated` counts: a map of places
#: (riffled, ``pass[sigma]``: the twelfth trial) or of samples (``tau[pass]``: the
#: thirteenth), each exactly and up to a rotation of the pass after (``turned``: one map for
#: each of the ``n`` rotations; the thirteenth trial's riffle rotated by a drawn amount
#: shares one with every other such pair), with the words for each. Each is judged at
#: ``CHANCE / len(MAPS)``.
MAPS: tuple[tuple[Callable[..., set[tuple[int, ...]]], bool, str], ...] = (
    (_place_keys, False, "where a sample sat fixes where it sits next"),
    (_sample_keys, False, "the sample at a place fixes the one there next"),
    (_place_keys, True, "where a sample sat fixes where it sits next, up to a rotation"),
    (_sample_keys, True, "the sample at a place fixes the one there next, up to a rotation"),
)


def log_same_map(maps: int, same: int, n: int, spread: int = 1) -> float:
    """The log of a bound on the chance that ``same`` or more of ``maps`` fresh pairs of
    passes of ``n`` samples share one map, each pair counting ``spread`` maps (all of them
    uniform: each pass is drawn anew, whatever came before, so each map of a pair is one of
    the ``n!`` with a chance of ``1 / n!``, given the pairs before).

    For a set of ``same`` pairs: one of the first pair's ``spread`` maps is among each other
    pair's ``spread`` with a chance of at most ``spread * (spread / n!) ** (same - 1)``, and
    there are ``C(maps, same)`` such sets (``spread = 1``: ``(1 / n!) ** (same - 1)``)."""
    if same < 2 or same > maps:
        return 0.0
    log_pair = math.log(spread) - math.lgamma(n + 1)
    return math.log(math.comb(maps, same)) + math.log(spread) + (same - 1) * log_pair


def map_repeated(stream: Stream, sizes: Sequence[int]) -> str:
    """A source whose passes follow one another by one map (each of :data:`MAPS`) more often
    than fresh passes do but for a chance of :data:`~.mix_seeds.CHANCE`
    (:func:`log_same_map`, each of :data:`MAPS` at a share of it).

    Several repeats are asked where ``n!`` is small: 6 passes of a source of 4 samples
    (24 maps) share a map by chance often, 18 passes in which 9 maps are one map do not.
    So every other pass made from the one before is seen for a source of 8 samples or
    more in 6 passes, of 11 or more in 4 passes, of 4 in 18; rotated as well, of 9 or more
    in 6 passes, of 13 or more in 4, of 6 in 18 (and of smaller sources where the draws of
    the rotation meet)."""
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        passes = _passes(got, n)
        pairs = list(zip(passes, passes[1:], strict=False))
        for keys, turned, said in MAPS if pairs else ():
            maps = Counter(key for a, b in pairs for key in keys(a, b, turned))
            same, spread = max(maps.values()), n if turned else 1
            if log_same_map(len(pairs), same, n, spread) < math.log(CHANCE / len(MAPS)):
                return (
                    f"source {s} ({n} samples) went from one pass to the next by one and the "
                    f"same reordering {same} times in {len(passes)} passes ({said}: a pass "
                    "riffled, permuted by a fixed permutation or its samples renamed by one, "
                    f"from the pass before; fresh passes share one so often with a chance "
                    f"under {CHANCE:.0e}). {_DO}"
                )
    return ""


def seam_tail(chances: Sequence[float], count: int) -> float:
    """The chance that ``count`` or more of independent seams, each repeating with its own
    chance in ``chances`` (each between 0 and 1, both left out), repeat: the tail of their
    Poisson binomial count, exactly, as one less the chance of fewer (the seams of a chance
    together are a binomial: their counts below ``count`` convolved, group by group)."""
    if count <= 0:
        return 1.0
    below = np.zeros(count)
    below[0] = 1.0
    for p, m in Counter(chances).items():
        i = np.arange(min(m, count - 1) + 1)
        log_c = [math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) for j in i]
        below = np.convolve(below, np.exp(log_c + i * math.log(p) + (m - i) * math.log1p(-p)))
        below = below[:count]
    return max(0.0, 1.0 - math.fsum(below))


#: How near a sample may come back across a seam: within ``k`` draws for each ``k`` here
#: (1: drawn twice in a row), each ``k`` judged at ``CHANCE / len(NEAR)``. Up to 8: within
#: a global batch of the smallest (the thirteenth trial moved it to the second place).
NEAR = (1, 2, 3, 4, 6, 8)


@cache
def near_chance(n: int, k: int) -> float:
    """The chance that a fresh pass of ``n`` samples, whatever the pass before it, draws a
    sample again within ``k`` draws of the last time: some sample at place ``a`` of the pass
    before comes at place ``b`` of this one with ``(n - a) + b <= k``.

    Its first ``k`` places against the last ``k`` of the pass before form a staircase of
    cells (``k`` rows of 1 to ``k``), and a uniform permutation misses them with a chance of
    ``sum_j (-1)**j r_j (n - j)! / n!`` (``r_j``: ways to put ``j`` rooks on the staircase,
    none sharing a row or column), exactly: ``1 / n`` for ``k = 1``."""
    if k >= n:
        return 1.0
    rooks = [1]  # ways to place j rooks on the rows so far
    for row in range(k):  # row ``row`` has row + 1 cells, the rooks above take j - 1 of them
        rooks = [
            (rooks[j] if j < len(rooks) else 0) + (rooks[j - 1] * (row + 2 - j) if j else 0)
            for j in range(len(rooks) + 1)
        ]
    miss = sum(Fraction((-1) ** j * r, math.perm(n, j)) for j, r in enumerate(rooks))
    return float(1 - miss)


def _back_within(before: Sequence[int], start: Sequence[int]) -> int:
    """How soon a sample of ``before`` is drawn again in ``start`` (the next pass's first
    draws): the fewest draws from its place in ``before`` to its place in ``start``."""
    n, place = len(before), {x: a for a, x in enumerate(before)}
    return min((n - place[x] + b for b, x in enumerate(start)), default=n + 1)


def seams_repeated(stream: Stream, sizes: Sequence[int]) -> str:
    """Where samples come back within ``k`` draws across a seam more often, over every source
    of the stream, than fresh passes do but for a chance of :data:`~.mix_seeds.CHANCE` (for
    any ``k`` of :data:`NEAR`, each at a share of it).

    A seam is the end of a complete pass and the first draws of the next. A fresh pass of
    ``n`` samples draws a sample again within ``k`` draws with a chance of
    :func:`near_chance` (``1 / n`` for ``k = 1``: it starts with the last one's last
    sample), whatever the pass before it holds, so the count of such seams is a Poisson
    binomial (:func:`seam_tail`); a source of ``k`` samples or fewer always does, and is
    left out at that ``k``. A source of 4 samples in 6 passes alone repeats 5 seams of 5
    with a chance of 1e-3: the seams of all the sources together judge it (offline, every
    draw of 400). A pass that avoids starting with the last sample (a swap, as some
    loaders do) comes back less often, never more."""
    seams = [
        (s, sizes[s], _back_within(got[j - sizes[s] : j], got[j : j + NEAR[-1]]))
        for s, got in enumerate(draws(stream, len(sizes)))
        for j in range(sizes[s], len(got), sizes[s])  # got[j] starts a pass after a whole one
    ]
    for k in NEAR:
        chances = [near_chance(n, k) for _, n, _ in seams if k < n]
        hits = Counter(s for s, n, back in seams if k < n and back <= k)
        count = hits.total()
        if count and seam_tail(chances, count) < CHANCE / len(NEAR):
            s = max(hits, key=lambda x: hits[x])
            what = (
                "started with the sample that ended the pass before"
                if k == 1
                else f"drew a sample of the pass before again within {k} draws of its last draw"
            )
            return (
                f"{count} of the {len(chances)} passes over the sources {what} (source {s}: "
                f"{hits[s]} times; fresh passes do so about {math.fsum(chances):.1f} times, "
                f"{count} or more with a chance under {CHANCE / len(NEAR):.1e}): the same sample "
                f"drawn twice in a row, or nearly, across the end of a pass. {_DO}"
            )
    return ""
