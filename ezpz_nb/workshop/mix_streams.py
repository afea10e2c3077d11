"""Notebook 17's draw and its rules on a whole stream (the checker is :mod:`.mixture`).

:func:`draw_setup` draws one check's cases, horizon, seeds and far steps. The rules are pure
functions of a stream (``stream[step]`` a list of ``(source, index)`` pairs), judged
in the notebook: each returns "" when the rule holds, else the sentence saying where it
breaks and what to do. Every bound is worked out from counts, so that a right answer (a
fresh permutation per seed, source and pass, as ``np.random.default_rng([seed, 1 + s,
pass])``) is turned down by a rule with a chance of at most :data:`CHANCE`:

* the pass rules, in :mod:`.mix_passes` (every sample of a source once before any
  repeats, a new order each pass, not an arithmetic one);
* :func:`replayed`: batches far past the judged horizon (:func:`far_steps`) are not its
  batches again.

How far the far steps reach is a trade: an answer that replays its quotas from step 0 on
every call pays its step per call (measured, 2 cores: 6 ms a call at step 1000, 60 ms at
10**4, 0.6 s at 10**5), so a check covers every replayed table up to :data:`COVER` batches
with runs a gap apart, and judges the windows of :mod:`.mix_window` (consecutive batches
past 2**16) beside them: an answer pays the steps before its first call once, keeping its
running totals between calls, as the notebook's solution does.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from ezpz_nb.workshop.mix_seeds import CHANCE, Stream, draw_many, draw_seeds, few_window
from ezpz_nb.workshop.mix_window import draw_windows, window_steps

__all__ = [
    "CHANCE",
    "COVER",
    "GLOBALS",
    "SEEDS",
    "SOURCES",
    "STEPS",
    "THIRDS",
    "TWIN_APART",
    "Case",
    "Draw",
    "draw_setup",
    "far_steps",
    "quotas",
    "replayed",
]

#: Consecutive global batches that :func:`replayed` compares: a right answer's 4 batches
#: are never the same samples as 4 others (a chance far below ``CHANCE``).
RUN = 4


#: Global batches drawn from (1, 2 and 4 divide each one: the DP sizes of the first case).
GLOBALS = (8, 12, 16, 20, 24)
#: The second case's global batch is one of these (another than the first's): it also runs
#: at dp=3, so slots cut for powers of two only (``global_batch >> (dp_size // 2)``) show.
THIRDS = (12, 24)
#: Numbers of sources drawn from; a check's two cases never have the same number.
SOURCES = (2, 3, 4, 5)
#: The number of global batches a check runs is drawn from this range (both ends
#: included). Long enough that a replayed table of batches shows: over 500 draws each
#: (offline, the rules above on in-process streams at dp=1), ``step % 16``, ``% 24`` and
#: ``% 31`` were rejected 500 times (by rule 2 or 3), ``% 40`` passed on the 145 draws
#: of 40 or fewer batches (since the far steps: 500 of 500 rejected); the notebook's
#: solution, the library's plan and the sources side by side passed 500 of 500. The
#: solution replays its quotas from step 0, so its cost grows with the square of this
#: number: a check took as long as the old 16 to 24.
STEPS = (32, 64)
#: Far steps (:func:`far_steps`) reach this step or further, so a table of batches replayed
#: from step 0 every ``T`` steps (or right up to step ``T``, then again) shows again there
#: for any ``T`` up to it: 23 runs of 4 a check on average, ~0.3 s for the notebook's
#: solution. A longer table holds other counts of draws in the windows of
#: :mod:`.mix_window`, past 2**16.
COVER = 1024
#: Seeds run at dp=1, spread over the ranks with the 128 of few_streams: every two must give
#: other streams, so a seed that picks one of a few fixed streams (4 or fewer: one or two
#: bits of it) always meets two that match; the first three after the check's own are its
#: twins (:func:`~.mix_seeds.draw_seeds`), so a seed cut to a part of it meets one too.
SEEDS = 5


class Case(NamedTuple):
    """One stream the checker asks for: the sources' sizes and weights, the global batch."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    global_batch: int


class Draw(NamedTuple):
    """One check's draw (:func:`draw_setup`).

    Attributes:
        main: The case judged at every layout and with both seeds.
        other: The case judged at dp=1 only: another global batch, another number of sources.
        steps: Global batches in every run.
        seeds: The seed of every run, then the other seeds of rule 4 (:data:`SEEDS` in all).
        far: The first far step (:func:`far_steps`), less than a gap past the horizon.
        windows: The first step of each window of :mod:`.mix_window`, ascending.
        many: The seeds of :func:`~.mix_seeds.few_streams`, none of ``seeds``.
        window: The global batches each of ``many`` runs (:func:`~.mix_seeds.few_window`).
        twin: The first case's sizes and global batch with other weights, asked in the same
            process right after it: running totals kept under the global batch (or the
            sizes) alone go on from the first case's.
    """

    main: Case
    other: Case
    steps: int
    seeds: tuple[int, ...]
    far: int
    windows: tuple[int, ...]
    many: tuple[int, ...]
    window: int
    twin: Case


def draw_setup(seed: int) -> Draw:
    """One check's cases, number of global batches and seeds, all from ``seed``.

    The weights do not divide a case's batch evenly, and the number of batches is long
    enough that any composition used in every batch from half-way on (the same rounding
    each time) drifts past one sample over the second half alone.
    """
    rng = random.Random(seed)
    steps = rng.randint(*STEPS)
    k, k_other = rng.sample(SOURCES, 2)
    g = rng.choice(GLOBALS)
    main = _draw_case(rng, k, g, steps)
    other = _draw_case(rng, k_other, rng.choice([x for x in THIRDS if x != g]), steps)
    seeds = draw_seeds(rng, seed, SEEDS)
    far = steps + rng.randrange(steps - RUN + 1)
    windows = draw_windows(rng)
    many = draw_many(rng, seeds)
    window = few_window(quotas(main.weights, main.global_batch, FEW_HORIZON), main.sizes)
    twin = _draw_twin(rng, main)
    return Draw(main, other, steps, seeds, far, windows, many, window, twin)


#: Samples by which some source's target in a batch differs between a case and its twin, at
#: least: the first case's quotas given to the twin miss its targets by more than one sample.
TWIN_APART = 2.5


def _draw_twin(rng: random.Random, case: Case) -> Case:
    """``case``'s sizes and global batch with other weights, some source's target in a batch
    :data:`TWIN_APART` samples or more from ``case``'s."""
    g = case.global_batch
    while True:
        raw = [rng.randint(1, 12) for _ in case.weights]
        w = tuple(x / sum(raw) for x in raw)
        if max(abs(a - b) * g for a, b in zip(w, case.weights, strict=True)) >= TWIN_APART:
            return Case(case.sizes, w, g)


def _draw_case(rng: random.Random, k: int, g: int, steps: int) -> Case:
    """``k`` sources at global batch ``g``: a small one (4 to 9 samples) drawn in 6 passes
    or more, and one of 12 samples or more drawn in 2 passes or more, so that the pass
    rules (:mod:`.mix_streams`) judge both kinds; weights the notebook's rule keeps within
    the cumulative bound (:func:`_drift`)."""
    while True:
        sizes = [rng.randint(4, 9)] + [rng.randint(10, 40) for _ in range(k - 1)]
        rng.shuffle(sizes)
        raw = [rng.randint(2, 9) for _ in range(k)]
        w = tuple(x / sum(raw) for x in raw)
        # A weight-blind round-robin (g/k each) must miss by more than one sample somewhere.
        drawn = [x * g * steps - 1 for x in w]  # the fewest draws a right answer makes
        small = min(range(k), key=lambda s: sizes[s])
        passes = drawn[small] >= 6 * sizes[small] and any(
            n >= 12 and d >= 2 * n for n, d in zip(sizes, drawn, strict=True)
        )
        blind = max(abs(x * g - g / k) for x in w) > 1.2
        if (
            passes
            and blind
            and _fixed_error(w, g) * (steps // 2) > 1.2
            and _drift(w, g, steps) < 0.9
        ):
            return Case(tuple(sizes), w, g)


#: The first global batches :func:`draw_setup` works a case's quotas out for, to size
#: :attr:`Draw.window` (never more than :data:`~.mix_seeds.FEW_MOST`).
FEW_HORIZON = 16


def quotas(w: Sequence[float], g: int, steps: int, tie: int = 1) -> list[list[int]]:
    """Each source's samples in each of the first ``steps`` global batches under the
    notebook's rule: floor of ``w * g`` each batch, the rest to the sources furthest behind
    over all batches so far, ties to the first source (``tie=1``) or to the last (-1)."""
    done, out = [0] * len(w), []
    for b in range(1, steps + 1):
        quota = [int(x * g) for x in w]
        behind = [x * b * g - d - q for x, d, q in zip(w, done, quota, strict=True)]
        for s in sorted(range(len(w)), key=lambda s: (-behind[s], tie * s))[: g - sum(quota)]:
            quota[s] += 1
        done = [d + q for d, q in zip(done, quota, strict=True)]
        out.append(quota)
    return out


def _drift(w: tuple[float, ...], g: int, steps: int) -> float:
    """How far, in samples, the notebook's rule (:func:`quotas`, either tie) takes a source
    from its target over all batches so far. It passes 1 on some weights (equal ones of 5
    sources): those are not drawn, so that a right answer is held to a bound it can keep."""
    worst = 0.0
    for tie in (1, -1):
        done = [0] * len(w)
        for b, quota in enumerate(quotas(w, g, steps, tie), start=1):
            done = [d + q for d, q in zip(done, quota, strict=True)]
            worst = max([worst] + [abs(d - x * b * g) for x, d in zip(w, done, strict=True)])
    return worst


def _fixed_error(w: tuple[float, ...], g: int) -> float:
    """The smallest per-batch error, in samples, of a composition used in every batch.

    The best one rounds each ``w * g`` down and gives the leftover samples to the largest
    remainders: any other composition is off by a larger remainder or by a whole sample.
    """
    exact = [x * g for x in w]
    rest = sorted((e - int(e) for e in exact), reverse=True)
    up = g - sum(int(e) for e in exact)
    return max([1 - r for r in rest[:up]] + [r for r in rest[up:]] + [0.0])


def far_steps(start: int, horizon: int, windows: Sequence[int]) -> list[int]:
    """The far steps judged beside a horizon of ``horizon`` batches: runs of :data:`RUN`
    steps from ``start`` (at most ``gap = horizon - RUN + 1`` past the horizon), each
    ``gap`` steps after the last, up to the first run from :data:`COVER` or later; then
    every step of the windows from ``windows`` (:func:`~.mix_window.window_steps`).

    A stream replayed from step 0 every ``T`` steps (``horizon < T <= COVER``) holds at
    step ``p`` the batch of ``p - T``. The runs' first steps come every ``gap`` steps from
    before ``T + gap`` to past ``T``, so one starts at some ``p`` in ``T .. T + gap - 1``:
    that run is the run from ``p - T < gap`` again, inside the horizon.
    """
    gap = horizon - RUN + 1
    runs = 1 + max(0, -(-(COVER - start) // gap))
    starts = [start + i * gap for i in range(runs)]
    return [p + j for p in starts for j in range(RUN)] + window_steps(windows)


def replayed(near: Stream, far: Stream, steps: Sequence[int]) -> str:
    """Where a run of :data:`RUN` batches of ``far`` (at ``steps``) repeats ``near``'s, or
    an earlier far run's (a stream right up to some step, then that step's batch again)."""

    def run(stream: Stream, x: int) -> tuple[frozenset[tuple[tuple[int, int], int]], ...]:
        return tuple(frozenset(Counter(b).items()) for b in stream[x : x + RUN])

    first = {run(near, x): x for x in range(len(near) - RUN + 1)}
    for j in range(0, len(far) - RUN + 1, RUN):
        x = first.setdefault(run(far, j), steps[j])
        if x != steps[j]:
            return (
                f"global batches {steps[j]} to {steps[j] + RUN - 1} hold the same samples as "
                f"global batches {x} to {x + RUN - 1}: the stream replays a table of "
                "batches. Compute any step's batch from (seed, step), however far."
            )
    return ""
