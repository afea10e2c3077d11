"""Notebook 05, exercise 3 (after notebook 02): a sampler that shards over DP replicas.

``check_make_sampler(fn)``: ``fn(dataset, layout, seed)`` returns a sampler. Its job
builds one on each of 4 real gloo ranks (dp 2 x tp 2), calls ``set_epoch`` before each
pass as a training loop does, and sends back the indices each pass yielded; the
checker judges them together: TP peers alike, DP replicas disjoint, equal and
complete, and an order that follows the seed and the epoch. The number of samples
and the seeds are drawn per check.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_make_sampler"]


def sampler_samples(seed: int) -> int:
    """Samples in exercise 3, drawn per check: odd, so they never divide over 2 replicas."""
    return 2 * random.Random(seed).randrange(10, 20) + 1


#: Exercise 3's passes: (which seed, epoch given to ``set_epoch``). The same epoch twice
#: (the order is the epoch's, not the count of passes), and the first seed again on a
#: fresh sampler (the order is the seed's, reproducible).
SAMPLER_PASSES: tuple[tuple[int, int], ...] = ((0, 0), (0, 1), (0, 1), (1, 0), (2, 0))


def job_sampler(fn: Callable, num_samples: int, seeds: tuple[int, int, int]) -> Any:
    """Exercise 3: the indices each pass of ``fn``'s samplers yielded, with this rank's place.

    One sampler per seed, built by ``fn``; ``seeds[2] == seeds[0]``, a second sampler
    built from the first seed.
    """
    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=num_samples)
    samplers: dict[int, Any] = {}
    passes: list[list[int] | str] = []
    for which, epoch in SAMPLER_PASSES:
        if which not in samplers:
            samplers[which] = fn(ds, lay, seeds[which])
        sampler = samplers[which]
        if sampler is None:
            return None
        if not hasattr(sampler, "set_epoch"):
            passes.append(f"a {type(sampler).__name__} without set_epoch")
            continue
        sampler.set_epoch(epoch)
        passes.append([int(i) for i in sampler])
    return lay.dp_rank, lay.tp_rank, passes


def _overlap_hint(both: list[int], dp_size: int) -> str:
    if len(both) < dp_size:  # no more than padding adds: the replicas are right, the tail is not
        return (
            "DistributedSampler's default drop_last=False pads the shards by repeating "
            "samples; drop_last=True drops the remainder instead."
        )
    return "each replica must get its own share (rank=layout.dp_rank)."


def _sampler_pass(k: int) -> str:
    which, epoch = SAMPLER_PASSES[k]
    fresh = " (a fresh sampler)" if which == 2 else ""
    return f"seed {'B' if which == 1 else 'A'}{fresh}, set_epoch({epoch})"


def _check_shards(shards: list[list[int]], n: int, at: str) -> None:
    """Raise unless the DP replicas' shards of one pass are disjoint, equal and complete."""
    dp_size = len(shards)
    for d, ids in enumerate(shards):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise wrong(
                f"DP replica {d} got samples {twice[:8]} more than once{at}: no sample "
                "may be seen twice in an epoch. " + _overlap_hint(twice, dp_size)
            )
    for d, ids in enumerate(shards[1:], start=1):
        both = sorted(set(shards[0]) & set(ids))
        if both:
            raise wrong(
                f"DP replicas 0 and {d} both got samples {both[:8]}{at}: no sample may "
                "go to two replicas; " + _overlap_hint(both, dp_size)
            )
    lengths = [len(ids) for ids in shards]
    want = n // dp_size
    if len(set(lengths)) > 1:
        raise wrong(
            f"the DP replicas got {lengths} samples{at}: unequal shards give unequal "
            "step counts, and the replica with more steps waits forever in its "
            f"next collective (notebook 02). Give each replica {want} and drop the "
            f"{n - want * dp_size} left over (drop_last=True)."
        )
    if lengths[0] != want:
        raise wrong(
            f"each DP replica got {lengths[0]} samples{at}; {n} samples over {dp_size} "
            f"replicas give {want} each: drop only the {n - want * dp_size} that "
            "do not divide."
        )
    for d, ids in enumerate(shards):
        if ids == sorted(ids):
            raise wrong(
                f"DP replica {d} gets its samples in ascending order {ids[:6]}...{at}: "
                "shuffle, or training sees the data in one fixed order."
            )


def _check_shuffle(shards: list[list[list[int]]]) -> None:
    """Raise unless the order is the seed's and the epoch's: ``shards[pass][replica]``."""
    passes = [_sampler_pass(k) for k in range(len(shards))]
    if shards[0] == shards[1]:
        raise wrong(
            f"the order was the same for set_epoch(0) and set_epoch(1) "
            f"({shards[0][0][:6]}... on replica 0): a shuffle gives each epoch its own "
            "order. Look at what your sampler does with the epoch it is given."
        )
    if shards[1] != shards[2]:
        raise wrong(
            f"reading the sampler twice after the same set_epoch(1) gave two orders "
            f"({shards[1][0][:6]}... then {shards[2][0][:6]}...): the order must follow "
            "the epoch set, not how often the sampler was read (a job resumed at that "
            "epoch must see it again)."
        )
    if shards[3] == shards[0]:
        raise wrong(
            f"two different seeds gave the same order ({passes[0]} and {passes[3]}): "
            "a shuffle's order depends on its seed. Look at where your order comes from."
        )
    if shards[4] != shards[0]:
        raise wrong(
            f"the same seed and epoch gave another order on a fresh sampler ({passes[0]}: "
            f"{shards[0][0][:6]}..., then {shards[4][0][:6]}...): the order must follow "
            "from the seed and the epoch alone, so that every rank, and a rerun, draws "
            "the same one. Look at which random generator your order comes from."
        )


def check_make_sampler(
    fn: Callable[[Any, Any, int], Iterable[int]],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 3: ``fn(dataset, layout, seed)`` returns a sampler that shards over DP replicas.

    4 ranks as dp 2 x tp 2 and an odd number of samples (drawn per check), which
    do not divide over the 2 replicas. The checker calls ``set_epoch`` before
    each pass, as a training loop does, and requires exactly what the exercise
    asks: TP peers get the same indices in the same order; no sample on two
    replicas or twice on one; every replica gets ``n // 2`` (the one left over
    is dropped); and a shuffle: the order changes with the epoch, stays the
    same for the same seed and epoch (on a fresh sampler too, and read twice),
    and changes with the seed. Any object with ``set_epoch`` and ``__iter__`` passes.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        check_seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        n = sampler_samples(check_seed)
        seed_a, seed_b = random.Random(check_seed).sample(range(1, 2**20), 2)
        got = run_learner(
            job_sampler, fn, n, (seed_a, seed_b, seed_a), timeout=timeout, cluster=cluster
        )
        each_returned(got, "a sampler")
        for r, (_dp, _tp, passes) in enumerate(got):
            bad = [p for p in passes if isinstance(p, str)]
            if bad:
                raise wrong(
                    f"rank {r} returned {bad[0]}: the checker calls sampler.set_epoch(epoch) "
                    "before each epoch, as a training loop does; return a sampler that has it."
                )
        by_dp: dict[int, tuple[int, list[list[int]]]] = {}
        for r, (dp, _tp, passes) in enumerate(got):
            first, peer = by_dp.setdefault(dp, (r, passes))
            for k, (a, b) in enumerate(zip(peer, passes, strict=True)):
                if a != b:
                    raise wrong(
                        f"TP peers disagree ({_sampler_pass(k)}): rank {first} got "
                        f"{a[:6]}... and rank {r} got {b[:6]}... TP peers must see the "
                        "same samples in the same order: shard over the DP group only, "
                        "and draw the order the same way on every rank."
                    )
        dps = sorted(by_dp)
        shards = [[by_dp[d][1][k] for d in dps] for k in range(len(SAMPLER_PASSES))]
        for k, pass_shards in enumerate(shards):
            _check_shards(pass_shards, n, f" ({_sampler_pass(k)})")
        _check_shuffle(shards)
        want = n // len(dps)
        return (
            f"TP peers share their replica's indices; the {len(dps)} DP replicas got "
            f"{want} disjoint samples each of {n}, the {n - want * len(dps)} left over "
            "dropped; the order changed with the epoch and the seed, and came back for "
            "the same seed and epoch."
        )

    return judge("make_sampler", body)
