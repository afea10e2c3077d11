"""Notebook 11, exercise 2's draw: the cases a budget-plan check judges.

Split from :mod:`.budget_plan` (its checker, rank job and rules) to keep each module
short. A case is drawn again until the answers that do not keep step counts equal
cannot pass on it by luck (see :func:`budget_lengths`).
"""

from __future__ import annotations

import random

from ezpz_nb.text.plan import shard_then_plan

__all__ = ["budget_lengths", "draw_case"]


def budget_lengths(seed: int, n: int, longest: int, budget: int, world: int) -> list[int]:
    """Notebook 11, exercise 2: ``n`` document lengths from 2 to ``longest``, drawn per check.

    Drawn again until the global plan's batches do not divide evenly over the replicas:
    dealing every batch (the leftover ones kept) then gives unequal counts (issue 45's
    fourth trial: one draw in ``world`` let it pass). And until, for replicas that plan
    their own shard (dealt round-robin, in contiguous blocks, or by the library's
    ``shard_then_plan``), neither their own counts nor those counts cut to the global
    plan's share can pass for an agreement (see :func:`_unagreed_fails`).
    """
    rng, block = random.Random(seed), -(-n // world)
    while True:
        lengths = rng.choices(range(2, longest + 1), k=n)
        steps, left = divmod(_plan_shape(lengths, budget, 0)[0], world)
        if left == 0:
            continue
        # Cheapest first: most draws are turned down by the round-robin shards.
        rr = [_plan_shape(lengths[r::world], budget, steps) for r in range(world)]
        if not _unagreed_fails(rr, steps, budget):
            continue
        blocks = [
            _plan_shape(lengths[r * block : (r + 1) * block], budget, steps) for r in range(world)
        ]
        if not _unagreed_fails(blocks, steps, budget):
            continue
        own = [shard_then_plan(lengths, r, world, budget) for r in range(world)]
        cut = [(len(p), sum(lengths[i] for b in p[steps:] for i in b)) for p in own]
        if _unagreed_fails(cut, steps, budget):
            return lengths


def _plan_shape(lengths: list[int], budget: int, steps: int) -> tuple[int, int]:
    """``budget_batches`` over ``lengths`` without building it: its batch count, and the
    tokens past its first ``steps`` batches. Longest first, a batch that starts at a
    document of ``m`` tokens holds ``budget // m`` documents (the last one fewer)."""
    ordered = sorted(lengths, reverse=True)
    i = batches = 0
    cut = len(ordered)
    while i < len(ordered):
        if batches == steps:
            cut = i
        i += budget // ordered[i]
        batches += 1
    return batches, sum(ordered[cut:])


def _unagreed_fails(own: list[tuple[int, int]], steps: int, budget: int) -> bool:
    """True if replicas whose own plans have ``own`` = ``(batches, tokens past the first
    steps)`` each fail without agreeing on a count.

    As they are, their counts must differ: about one draw in eight gives equal counts by
    luck, which let a plan that does not keep counts equal pass. Each cut to ``steps``,
    the global plan's share (issue 45's sixth trial: that passed 8 checks in 20), some
    replica must have fewer batches than that, so the counts differ; or all have more
    and the cut leaves out more than dealing a global plan may, with no replica whole
    (``budget_plan._judge_drop`` turns it down).
    """
    counts = [c for c, _ in own]
    if len(set(counts)) == 1:
        return False
    if min(counts) < steps:
        return True
    return min(counts) > steps and sum(t for _, t in own) > (len(own) - 1) * budget


def draw_case(
    rng: random.Random, scale: int, dps: tuple[int, ...] = (2, 3, 4)
) -> tuple[int, int, list[int], int]:
    """One case of a check: ``(dp, budget, lengths, cap_seed)``, drawn from ``rng``.

    The DP size (one of ``dps``), a budget (2 to 6 times the longest document) and ``scale``
    times 160 to 240 documents, rounded up to a multiple of the DP size (equal shards:
    see ``budget_plan._judge_drop``); ``cap_seed`` seeds ``budget_plan._drop_cap``'s random
    shardings.
    """
    dp = rng.choice(dps)
    longest = rng.choice((32, 48, 64))
    budget = longest * rng.choice((2, 3, 4, 6))
    n = scale * rng.randint(160, 240)
    n += -n % dp
    lengths = budget_lengths(rng.randrange(2**31), n, longest, budget, dp)
    return dp, budget, lengths, rng.randrange(2**31)
