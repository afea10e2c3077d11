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
  drawn uniformly from the ``n!`` of ``n`` samples, each time anew;
* :func:`seams_repeated`: each pass starting with the sample that ended the pass before
  (the same sample drawn twice in a row, often into one global batch). A fresh pass starts
  with it with a chance of ``1 / n``.

Pure functions of streams (``stream[step]`` a list of ``(source, index)`` pairs), judged in
the notebook after :func:`~.mix_passes.first_repeat` (each source's passes are whole): each
returns "" when the rule holds, else the sentence saying where it breaks and what to do.
Their bounds are worked out from counts (no clock): a right answer is turned down with a
chance of at most :data:`~.mix_seeds.CHANCE` per source (:func:`map_repeated`) or per
stream (:func:`seams_repeated`, all its sources together).

Offline (in-process streams at dp=1, both cases of a draw): the trial's riffled, sigma and
seam answers were turned down on 400 draws of 400 each; the notebook's solution, the
library's plan, torch.randperm per pass and the trial's three right answers (a
``RandomState``, ``random.Random`` and a ``torch.Generator`` per pass) on none of 40.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ezpz_nb.workshop.mix_passes import draws
from ezpz_nb.workshop.mix_seeds import CHANCE, Stream

__all__ = ["log_same_map", "map_repeated", "seam_tail", "seams_repeated"]

_DO = (
    "Draw each pass's order as a permutation from the seed, the source and the pass number "
    "(as np.random.default_rng([seed, 1 + source, pass]).permutation(size)), not from the "
    "pass before."
)


def _passes(got: Sequence[int], n: int) -> list[Sequence[int]]:
    """The source's complete passes (its draws cut every ``n`` from its first)."""
    return [got[j : j + n] for j in range(0, len(got) - n + 1, n)]


def _map(before: Sequence[int], after: Sequence[int]) -> tuple[int, ...]:
    """Where the sample at each place of ``before`` sits in ``after``."""
    place = {x: j for j, x in enumerate(after)}
    return tuple(place[x] for x in before)


def log_same_map(maps: int, same: int, n: int) -> float:
    """The log of a bound on the chance that ``same`` or more of ``maps`` fresh maps between
    passes of ``n`` samples are one map: every set of ``same`` of them agrees with a chance
    of ``(1 / n!) ** (same - 1)`` (the maps are independent and uniform: each pass is drawn
    anew, whatever came before), and there are ``C(maps, same)`` such sets."""
    if same < 2 or same > maps:
        return 0.0
    return math.log(math.comb(maps, same)) - (same - 1) * math.lgamma(n + 1)


def map_repeated(stream: Stream, sizes: Sequence[int]) -> str:
    """A source whose passes follow one another by one map more often than fresh passes do
    but for a chance of :data:`~.mix_seeds.CHANCE` (:func:`log_same_map`).

    Several repeats are asked where ``n!`` is small: 6 passes of a source of 4 samples
    (24 maps) share a map by chance often, 18 passes in which 9 maps are one map do not.
    So every other pass made from the one before is seen for a source of 7 samples or
    more in 6 passes, of 12 or more in 4 passes, of 4 in 18."""
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        passes = _passes(got, n)
        maps = Counter(_map(a, b) for a, b in zip(passes, passes[1:], strict=False))
        if not maps:
            continue
        same = max(maps.values())
        if log_same_map(maps.total(), same, n) < math.log(CHANCE):
            return (
                f"source {s} ({n} samples) went from one pass to the next by one and the same "
                f"reordering {same} times in {len(passes)} passes (where a sample sat in one "
                "pass fixes where it sits in the next: a pass riffled, or permuted by a fixed "
                f"permutation, from the pass before; fresh passes share one so often with a "
                f"chance under {CHANCE:.0e}). {_DO}"
            )
    return ""


def seam_tail(chances: Sequence[float], count: int) -> float:
    """The chance that ``count`` or more of independent seams, each repeating with its own
    chance in ``chances``, repeat: the tail of their Poisson binomial count, exactly (its
    distribution kept up to ``count``, the last cell holding ``count`` or more)."""
    dist = [1.0] + [0.0] * count
    for p in chances:
        dist = [dist[0] * (1 - p)] + [
            dist[k] * (1 - p if k < count else 1.0) + dist[k - 1] * p for k in range(1, count + 1)
        ]
    return dist[count] if count else 1.0


def seams_repeated(stream: Stream, sizes: Sequence[int]) -> str:
    """Where passes start with the sample that ended the pass before more often, over every
    source of the stream, than fresh passes do but for a chance of :data:`~.mix_seeds.CHANCE`.

    A seam is the end of a complete pass and the first draw of the next. A fresh pass of
    ``n`` samples starts with the last one's last sample with a chance of ``1 / n``, on
    each seam independently (each pass is drawn anew), so the count is a Poisson binomial
    (:func:`seam_tail`). A source of 4 samples in 6 passes alone repeats 5 seams of 5 with
    a chance of 1e-3: the seams of all the sources together judge it (offline, every
    draw of 400)."""
    chances: list[float] = []
    hits: Counter[int] = Counter()
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        for j in range(n, len(got), n):  # got[j] starts a pass; got[j - n:j] was whole
            chances.append(1 / n)
            hits[s] += got[j] == got[j - 1]
    count = hits.total()
    if count and seam_tail(chances, count) < CHANCE:
        s = max(hits, key=lambda x: hits[x])
        return (
            f"{count} of the {len(chances)} passes over the sources started with the sample "
            f"that ended the pass before (source {s}: {hits[s]} times; fresh passes do so "
            f"about {math.fsum(chances):.1f} times, {count} or more with a chance under "
            f"{CHANCE:.0e}): the same sample drawn twice in a row. {_DO}"
        )
    return ""
