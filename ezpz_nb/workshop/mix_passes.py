"""Notebook 17's pass rules: how each source of a stream hands out its samples (the checker
is :mod:`.mixture`, its draw and far-step rules :mod:`.mix_streams`).

Pure functions of a stream (``stream[step]`` a list of ``(source, index)`` pairs), judged
in the notebook: each returns "" when the rule holds, else the sentence saying where it
breaks and what to do. Every bound is worked out from counts, so that a right answer (a
fresh permutation per seed, source and pass) is turned down by a rule with a chance of at
most :data:`~.mix_seeds.CHANCE`:

* :func:`first_repeat`: every sample of a source once before any repeats (a pass);
* :func:`same_order_again`: the passes of a source are not a few orders used again;
* :func:`unshuffled`: a pass is not the samples in an arithmetic order (``0, 1, 2...``
  from a seeded start, reversed, or by a fixed stride);
* :func:`kept_neighbours_again`: a pass is not the last one reversed, or with neighbours
  swapped (half its neighbouring pairs kept: :mod:`~ezpz_nb.verify.neighbours`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ezpz_nb.verify.neighbours import Kept, kept_neighbours
from ezpz_nb.workshop.mix_seeds import CHANCE, Stream

__all__ = [
    "SHUFFLED_FROM",
    "draws",
    "first_repeat",
    "kept_neighbours_again",
    "orders_needed",
    "same_order_again",
    "unshuffled",
]

#: Passes shorter than this are not judged by :func:`unshuffled`: a random order of
#: ``n >= 12`` samples is arithmetic with a chance of at most 1 / 10! (2.8e-7).
SHUFFLED_FROM = 12


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


def kept_neighbours_again(stream: Stream, sizes: Sequence[int]) -> str:
    """A source whose complete passes keep more of the neighbouring pairs of the pass before,
    over all its passes, than fresh permutations keep but for a chance of
    :data:`~.mix_seeds.CHANCE`: every other pass the last one reversed, or with neighbours
    swapped in pairs (the eleventh trial's: distinct orders, one draw). Each pass must be a
    fresh permutation (the notebook asks for one per seed, source and pass), so no "half
    the pairs" floor as for a contract's epochs, where a shuffle buffer is right."""
    for s, got in enumerate(draws(stream, len(sizes))):
        n = sizes[s]
        passes = [got[j : j + n] for j in range(0, len(got) - n + 1, n)]
        kept = sum(
            (kept_neighbours(a, b) for a, b in zip(passes, passes[1:], strict=False)),
            Kept(0, 0, 0.0),
        )
        if kept.chance() < CHANCE:
            return (
                f"source {s} ({n} samples) keeps {kept.kept} of the {kept.out_of} neighbouring "
                f"pairs of samples from one pass to the next (fresh permutations keep about "
                f"{kept.expected:.0f}): a pass read backwards, or with neighbours swapped, is "
                "not a new order. Draw each pass's order as a permutation from the seed, the "
                "source and the pass number (as np.random.default_rng([seed, 1 + source, "
                "pass]).permutation(size))."
            )
    return ""
