"""Token-budget batches over DP replicas: the plan that hangs and the plans that do not.

A token budget caps a padded batch's size, ``rows x longest row <= budget``; sorting
pieces by length first (length bucketing) keeps the padding small. The number of
batches then depends on *which* pieces a replica holds:

* :func:`shard_then_plan` shards pieces over DP first and plans per replica, as a
  per-rank loader would: replicas end up with different step counts, and the first
  collective after the shortest replica's last step hangs.
* :func:`plan_then_shard` plans batches over the whole corpus first, then deals
  *batches* over DP: equal counts by construction, at the cost of dropping up to
  ``dp_size - 1`` batches per epoch (different ones each epoch).

Every plan is computed in the notebook (or once per rank, identically: it depends
only on the lengths, ``seed`` and ``epoch``), so bad budgets fail before ranks start.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ezpz_nb.text.corpus import TextError

__all__ = ["budget_batches", "check_budget", "plan_then_shard", "shard_then_plan"]


def check_budget(budget: object, lengths: Sequence[int]) -> int:
    """Return ``budget`` if every piece fits in a batch of its own, else raise :class:`TextError`."""
    longest = max((int(n) for n in lengths), default=0)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < max(longest, 1):
        raise TextError(
            f"token budget {budget!r} is smaller than one row (the longest piece has "
            f"{longest} tokens): raise the budget to at least {longest}, or split the "
            "documents into shorter pieces (split_pieces(corpus, max_len=...))"
        )
    return budget


def budget_batches(lengths: Sequence[int], ids: Sequence[int], budget: int) -> list[list[int]]:
    """Batch ``ids`` longest first so that ``len(batch) * longest(batch) <= budget``.

    Args:
        lengths: Tokens of every piece, indexed by piece id.
        ids: The piece ids to batch.
        budget: Padded tokens allowed per batch (:func:`check_budget` first).

    Returns:
        Batches of piece ids, longest pieces first (ties by id: deterministic).
    """
    check_budget(budget, [lengths[i] for i in ids])
    order = sorted(ids, key=lambda i: (-int(lengths[i]), int(i)))
    batches: list[list[int]] = []
    for i in order:
        # Sorted longest first: a batch's first piece is its longest.
        if batches and (len(batches[-1]) + 1) * int(lengths[batches[-1][0]]) <= budget:
            batches[-1].append(int(i))
        else:
            batches.append([int(i)])
    return batches


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


def shard_then_plan(
    lengths: Sequence[int],
    dp_rank: int,
    dp_size: int,
    budget: int,
    *,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[int]]:
    """One replica's batches when each replica plans its own shard: counts differ across replicas.

    The pieces are shuffled (``seed``, ``epoch``) and dealt ``perm[dp_rank::dp_size]``,
    as ``DistributedSampler`` does, then batched by :func:`budget_batches` and the
    batches shuffled. Equal *piece* counts, unequal *batch* counts.
    """
    check_budget(budget, lengths)
    perm = _rng(seed, epoch).permutation(len(lengths))
    batches = budget_batches(lengths, perm[dp_rank::dp_size].tolist(), budget)
    return [batches[i] for i in _rng(seed + 1, epoch).permutation(len(batches))]


def plan_then_shard(
    lengths: Sequence[int],
    dp_size: int,
    budget: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    balance: bool = False,
) -> list[list[list[int]]]:
    """Every replica's batches, planned over the whole corpus and dealt out: equal counts.

    Args:
        lengths: Tokens of every piece.
        dp_size: Number of DP replicas.
        budget: Padded tokens per batch.
        seed: Shuffle seed; with ``epoch`` it orders the batches.
        epoch: The epoch (a different order, and different dropped batches, each).
        balance: Give each step's ``dp_size`` batches similar real-token counts
            (sorted by tokens, dealt in runs of ``dp_size``) instead of dealing them
            at random, so no replica waits long for another at the step's collective.

    Returns:
        ``plan[dp_rank]``: that replica's batches, all of the same count. The
        ``len(batches) % dp_size`` batches left over are dropped this epoch.
    """
    check_budget(budget, lengths)
    if dp_size < 1:
        raise TextError(f"dp_size={dp_size}: use at least 1")
    batches = budget_batches(lengths, list(range(len(lengths))), budget)
    rng = _rng(seed, epoch)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    steps = len(batches) // dp_size
    if steps == 0:
        raise TextError(
            f"{len(batches)} batches cannot give {dp_size} replicas one each: lower the "
            "budget or use fewer replicas"
        )
    batches = batches[: steps * dp_size]  # the dropped ones differ every epoch
    if balance:
        batches.sort(key=lambda b: sum(int(lengths[i]) for i in b))
        groups = [batches[s * dp_size : (s + 1) * dp_size] for s in rng.permutation(steps)]
        return [[g[r] for g in groups] for r in range(dp_size)]
    return [batches[r::dp_size] for r in range(dp_size)]
