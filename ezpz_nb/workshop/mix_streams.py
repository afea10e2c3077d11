"""Notebook 17's draw and its rules on a whole stream (the checker is :mod:`.mixture`).

:func:`draw_setup` draws one check's cases, horizon, seeds and far steps. The rules are pure
functions of a stream (``stream[step]`` a list of ``(source, index)`` pairs), judged
in the notebook: each returns "" when the rule holds, else the sentence saying where it
breaks and what to do. Every bound is worked out from counts, so that a right answer (a
fresh permutation per seed, source and pass, as ``np.random.default_rng([seed, 1 + s,
pass])``) is turned down by a rule with a chance of at most :data:`CHANCE`:

* :func:`first_repeat`: every sample of a source once before any repeats (a pass);
* :func:`same_order_again`: the passes of a source are not a few orders used again;
* :func:`unshuffled`: a pass is not the samples in an arithmetic order (``0, 1, 2...``
  from a seeded start, reversed, or by a fixed stride);
* :func:`replayed`: batches far past the judged horizon (:func:`far_steps`) are not its
  batches again.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from ezpz_nb.workshop.mix_seeds import CHANCE, Stream, draw_seeds

__all__ = [
    "CHANCE",
    "COVER",
    "GLOBALS",
    "SEEDS",
    "SOURCES",
    "STEPS",
    "Case",
    "Draw",
    "draw_setup",
    "far_steps",
    "orders_needed",
    "first_repeat",
    "replayed",
    "same_order_again",
    "unshuffled",
]

#: Passes shorter than this are not judged by :func:`unshuffled`: a random order of
#: ``n >= 12`` samples is arithmetic with a chance of at most 1 / 10! (2.8e-7).
SHUFFLED_FROM = 12
#: Consecutive global batches that :func:`replayed` compares: a right answer's 4 batches
#: are never the same samples as 4 others (a chance far below ``CHANCE``).
RUN = 4


#: Global batches drawn from (every DP size checked, 1, 2 and 4, divides each one).
GLOBALS = (8, 16, 20, 24)
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
#: from step 0 every ``T`` steps shows again there for any ``T`` up to it. Not further: an
#: answer that rebuilds its batches from step 0 on each call (a cached epoch that grows)
#: costs the square of the step, and a right answer must pass on a busy laptop.
COVER = 128
#: Seeds run at dp=1, spread over the ranks with the far steps: every two of them must give
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
    """

    main: Case
    other: Case
    steps: int
    seeds: tuple[int, ...]
    far: int


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
    other = _draw_case(rng, k_other, rng.choice([x for x in GLOBALS if x != g]), steps)
    seeds = draw_seeds(rng, seed, SEEDS)
    return Draw(main, other, steps, seeds, steps + rng.randrange(steps - RUN + 1))


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


def _drift(w: tuple[float, ...], g: int, steps: int) -> float:
    """How far, in samples, the notebook's rule takes a source from its target over all
    batches so far (floor of ``w * g`` each batch, the rest to the sources furthest behind,
    ties to the first source or to the last). It passes 1 on some weights (equal ones of 5
    sources): those are not drawn, so that a right answer is held to a bound it can keep."""
    worst = 0.0
    for tie in (1, -1):
        done = [0] * len(w)
        for b in range(1, steps + 1):
            quota = [int(x * g) for x in w]
            behind = [x * b * g - d - q for x, d, q in zip(w, done, quota, strict=True)]
            for s in sorted(range(len(w)), key=lambda s: (-behind[s], tie * s))[: g - sum(quota)]:
                quota[s] += 1
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


def draws(stream: Stream, k: int) -> list[list[int]]:
    """Each source's samples in the order the stream hands them out."""
    out: list[list[int]] = [[] for _ in range(k)]
    for batch in stream:
        for s, i in batch:
            out[s].append(i)
    return out


def first_repeat(stream: Stream, sizes: Sequence[int]) -> str:
    """Where a source first hands out a sample again before its pass is over; '' if nowhere."""
    seen: dict[int, set[int]] = {s: set() for s in range(len(sizes))}
    for b, batch in enumerate(stream):
        for slot, (s, i) in enumerate(batch):
            if len(seen[s]) == sizes[s]:
                seen[s] = set()  # a pass over the source is complete: a new one starts
            if i in seen[s]:
                return (
                    f"global batch {b}, slot {slot}: source {s} hands out sample {i} again while "
                    f"{sizes[s] - len(seen[s])} of its {sizes[s]} samples were never drawn in this "
                    "pass. Draw without replacement: one permutation per pass over a source, from "
                    "the seed, the source and the pass (its k-th draw is item k % size of pass k "
                    "// size), with k counted from the step, not from a generator that calls, "
                    "workers or ranks share."
                )
            seen[s].add(i)
    return ""


def orders_needed(n: int, passes: int) -> int:
    """The fewest different orders, up to rotation, that ``passes`` fresh permutations of
    ``n`` samples show, but for a chance of at most :data:`CHANCE`.

    There are ``m = (n - 1)!`` orders up to rotation, each as likely. All of them differ
    while two equal ones are that unlikely (``C(passes, 2) / m``); else the largest ``d + 1``
    for which at most ``d`` different ones is that unlikely, bounded by ``C(m, d) * (d / m)
    ** passes`` (the passes fall in some set of ``d`` orders).
    """
    log_orders = math.lgamma(n)
    if passes < 2 or math.log(passes * (passes - 1) / 2) - log_orders <= math.log(CHANCE):
        return passes
    orders = math.exp(log_orders)
    need = 1
    for d in range(1, passes):
        log_choose = sum(math.log(orders - j) for j in range(d)) - math.lgamma(d + 1)
        if log_choose + passes * (math.log(d) - log_orders) > math.log(CHANCE):
            break
        need = d + 1
    return need


def same_order_again(stream: Stream, sizes: Sequence[int]) -> str:
    """A source whose complete passes show fewer different orders than fresh ones would.

    Orders are compared up to rotation (each pass read from its sample 0), so that one
    order shifted pass by pass is one order. A complete pass holds sample 0: the stream
    passed :func:`first_repeat` first.
    """
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        passes = []
        for j in range(0, len(got) - n + 1, n):
            one = got[j : j + n]
            at = one.index(0)
            passes.append(tuple(one[at:] + one[:at]))
        different, need = len(set(passes)), orders_needed(n, len(passes))
        if different < need:
            return (
                f"source {s} ({n} samples) went through {len(passes)} complete passes in "
                f"{different} order{'s' if different > 1 else ''} only (fresh permutations "
                f"give at least {need}): draw a new order for each pass over a source, from "
                "the seed, the source and the pass number (as np.random.default_rng([seed, "
                "1 + source, pass]))."
            )
    return ""


def _arithmetic(order: Sequence[int], n: int) -> bool:
    gap = (order[1] - order[0]) % n
    return all((b - a) % n == gap for a, b in zip(order, order[1:], strict=False))


def unshuffled(stream: Stream, sizes: Sequence[int]) -> str:
    """A source whose every pass (of :data:`SHUFFLED_FROM` draws or more) is arithmetic."""
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        passes = [got[j : j + n] for j in range(0, len(got), n)]
        judged = [p for p in passes if len(p) >= SHUFFLED_FROM]
        if judged and all(_arithmetic(p, n) for p in judged):
            return (
                f"source {s} hands out its {n} samples in an arithmetic order in every pass "
                f"(its first: {judged[0][:5]}...): that is not shuffled. Draw each pass's order "
                "as a permutation from the seed, the source and the pass number (as "
                "np.random.default_rng([seed, 1 + source, pass]).permutation(size))."
            )
    return ""


def far_steps(start: int, horizon: int) -> list[int]:
    """The far steps judged beside a horizon of ``horizon`` batches: runs of :data:`RUN`
    steps from ``start`` (at most ``gap = horizon - RUN + 1`` past the horizon), each
    ``gap`` steps after the last, up to the first run from :data:`COVER` or later.

    A stream replayed from step 0 every ``T`` steps (``horizon < T <= COVER``) holds at
    step ``p`` the batch of ``p - T``. The runs' first steps come every ``gap`` steps from
    before ``T + gap`` to past ``T``, so one starts at some ``p`` in ``T .. T + gap - 1``:
    that run is the run from ``p - T < gap`` again, inside the horizon.
    """
    gap = horizon - RUN + 1
    runs = 1 + max(0, -(-(COVER - start) // gap))
    return [start + i * gap + j for i in range(runs) for j in range(RUN)]


def replayed(near: Stream, far: Stream, steps: Sequence[int]) -> str:
    """Where a run of :data:`RUN` batches of ``far`` (at ``steps``) repeats ``near``'s."""
    first = {
        tuple(frozenset(Counter(b).items()) for b in near[x : x + RUN]): x
        for x in range(len(near) - RUN + 1)
    }
    for j in range(0, len(far) - RUN + 1, RUN):
        x = first.get(tuple(frozenset(Counter(b).items()) for b in far[j : j + RUN]))
        if x is not None:
            return (
                f"global batches {steps[j]} to {steps[j] + RUN - 1} hold the same samples as "
                f"global batches {x} to {x + RUN - 1}: the stream replays a table of "
                "batches. Compute any step's batch from (seed, step), however far."
            )
    return ""
