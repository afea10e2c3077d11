"""Notebook 17's far windows: consecutive global batches far out, judged for the rules over
all batches so far (the checker is :mod:`.mixture`, its other far steps :mod:`.mix_streams`).

The horizon shows the running totals and the passes of a source from step 0. Far out the
checker sees only a window of :data:`WINDOW` consecutive global batches from a drawn step
``start`` (:data:`REACH`), not what came before it. A right answer has drawn some number
``c`` of each source's samples before ``start``, within one sample of its target
``weight * global_batch * start``, the sources' ``c`` adding up to ``global_batch * start``,
and from there:

* its running total stays within one sample of its target at the end of every batch of
  the window (``c`` plus what the window drew so far);
* its passes start every ``size`` draws counted from step 0, so the window's draws of the
  source, cut where ``c`` plus the draws so far is a multiple of ``size``, hold no sample
  twice between two cuts.

:func:`far_rules` asks whether any such ``c`` exists (at most three counts per source, all
tried). A right answer's own counts are one, whatever its rounding and ties: the rule never
turns it down (no chance involved). A stream that drifts (the same rounding in every far
batch: ``weight * global_batch`` off by a fraction each batch, which
:func:`~.mix_streams.draw_setup` makes more than 1.2 samples over half a horizon) leaves the
running totals; one that replays a table of ``T`` batches (``step % T``) or guesses its pass
positions hands out the samples of another count there, whose cuts fall elsewhere.

The checker judges the windows with both of its cases (:mod:`.mixture`): a table replayed
every ``T`` steps keeps every rule a window can judge where ``T * weight * global_batch`` is
(within a sample) a whole number of passes over every source, for then its window is a right
stream's with other permutations; two cases of other weights and sizes rarely both allow that.

Measured offline (in-process streams at dp=1, the windows of :func:`draw_windows` with both
cases, 200 draws): the notebook's solution passed 200 of 200; a table of 16384 batches
replayed (``step % 16384``, issue 45's seventh trial) and a stream exact to step 1024, then
the same rounding each batch with pass positions guessed from the weights, were turned down
200 of 200 each, ``step % 65535`` 200 and ``step % 55440`` 198 (with the first case alone:
199, 200, 196 and 171 of 200). A table longer than a window's first step is not seen there,
its batches being right ones: ``T`` from 2**16 to 2**17 on some draws, 2**17 or more on all.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence

from ezpz_nb.workshop.mix_seeds import Stream

__all__ = [
    "REACH",
    "WINDOW",
    "WINDOWS",
    "draw_windows",
    "far_rules",
    "window_steps",
    "windows_broken",
]

#: Consecutive global batches in each far window.
WINDOW = 32
#: Far windows a check judges for each of its two cases, each from its own drawn step.
WINDOWS = 2
#: Each window starts at a step drawn from ``REACH[0]`` to ``REACH[1] - WINDOW``: past
#: 2**16, so a table of up to 2**16 batches replayed from step 0 holds another count there.
#: An answer pays for the steps before its first call in a process once (the notebook's
#: solution keeps its running totals between calls: ~0.2 s of Python to 2**17), not per call.
REACH = (2**16, 2**17)
#: Slack on a target, in samples: targets are floats near 3 * 10**6 samples at most.
_EPS = 1e-6


def draw_windows(rng: random.Random) -> tuple[int, ...]:
    """:data:`WINDOWS` first steps, ascending, the windows apart (an answer that keeps its
    totals between calls goes forward only)."""
    lo, hi = REACH
    while True:
        starts = sorted(rng.randrange(lo, hi - WINDOW + 1) for _ in range(WINDOWS))
        if all(b - a >= WINDOW for a, b in itertools.pairwise(starts)):
            return tuple(starts)


def window_steps(starts: Sequence[int]) -> list[int]:
    """Every step of the windows from ``starts``, in order."""
    return [p + j for p in starts for j in range(WINDOW)]


def _counts_allowed(drawn: Sequence[int], w: float, g: int, start: int) -> range:
    """The counts ``c`` before ``start`` that keep ``c + drawn[j]`` within one sample of
    ``w * g * (start + j)`` for every ``j`` (``drawn[j]``: draws in the window's first
    ``j`` batches)."""
    lo = max(w * g * (start + j) - 1 - d for j, d in enumerate(drawn))
    hi = min(w * g * (start + j) + 1 - d for j, d in enumerate(drawn))
    return range(math.ceil(lo - _EPS), math.floor(hi + _EPS) + 1)


def _first_repeat(draws: Sequence[int], size: int, before: int) -> int | None:
    """The place in ``draws`` of the first sample handed out twice within one pass, the
    passes cut where ``before`` plus the draws so far is a multiple of ``size``."""
    seen: set[int] = set()
    for at, i in enumerate(draws):
        if (before + at) % size == 0:
            seen = set()
        if i in seen:
            return at
        seen.add(i)
    return None


def far_rules(window: Stream, start: int, weights: Sequence[float], sizes: Sequence[int]) -> str:
    """Where the window of global batches from ``start`` breaks the rules over all batches
    so far, for every count of draws before it a right answer may have; '' if it keeps
    them for one."""
    g, k, total = len(window[0]), len(sizes), sum(weights)
    end = start + len(window) - 1
    drawn: list[list[int]] = [[0] for _ in range(k)]
    draws: list[list[int]] = [[] for _ in range(k)]
    for batch in window:
        for s, i in batch:
            draws[s].append(i)
        for s in range(k):
            drawn[s].append(len(draws[s]))
    kept: list[list[int]] = []
    for s, n in enumerate(sizes):
        w = weights[s] / total
        counts = _counts_allowed(drawn[s], w, g, start)
        if not counts:
            return (
                f"global batches {start} to {end}: source {s} drew {drawn[s][-1]} samples in "
                f"these {len(window)} batches against a target of {w * g * len(window):.1f}, and "
                "no count of draws before them keeps its running total within one sample of "
                "its target at every one: the stream drifts far out, where the first batches "
                "do not show it. Give the extra samples to the sources furthest behind over "
                "all batches so far, at every step."
            )
        kept.append([c for c in counts if _first_repeat(draws[s], n, c) is None])
        if not kept[-1]:
            c = min(counts, key=lambda c: abs(c - w * g * start))
            at = _first_repeat(draws[s], n, c) or 0  # not None: no count was kept
            allowed = f"{counts.start}" + (f" to {counts[-1]}" if len(counts) > 1 else "")
            return (
                f"global batches {start} to {end}: source {s} ({n} samples) hands out sample "
                f"{draws[s][at]} twice within one pass (its draw {at} in these batches; "
                f"counting {c} draws before step {start}), and so for every count of draws "
                f"before that step within one sample of its target ({allowed}), its passes "
                f"starting every {n} draws from step 0: the stream repeats a table of batches, "
                "or loses count of its draws, far out. Count each source's draws from the "
                "quotas of every batch before the step, however far."
            )
    if not any(sum(c) == g * start for c in itertools.product(*kept)):
        return (
            f"global batches {start} to {end}: no counts of draws before step {start} that keep "
            f"each source's running total within one sample and its passes whole add up to "
            f"{g} * {start} samples: the stream loses count of its draws far out. Count each "
            "source's draws from the quotas of every batch before the step, however far."
        )
    return ""


def windows_broken(
    batches: Stream, starts: Sequence[int], weights: Sequence[float], sizes: Sequence[int]
) -> str:
    """:func:`far_rules` on each window of ``batches`` (the windows from ``starts``, one after
    another, :data:`WINDOW` batches each): the first that breaks them, '' if none."""
    for j, start in enumerate(starts):
        broken = far_rules(batches[j * WINDOW : (j + 1) * WINDOW], start, weights, sizes)
        if broken:
            return broken
    return ""
