"""Checkers for the workshop notebook: run the learner's function on real ranks.

Each ``check_<name>(fn)`` launches a few gloo ranks, calls ``fn`` inside every
rank the way the exercise describes, and looks at what the ranks *did* (the
values they returned, the samples their loaders yielded, how often each rank's
dataset was read, whether they hung). It prints one verdict in plain words and
returns a :class:`CheckResult`:

* ``"not done"``: the function still raises ``NotImplementedError`` (or returns
  ``None``), as shipped;
* ``"wrong"``: what was wrong, on which rank, and a hint;
* ``"correct"``.

Checkers never read the learner's source and never trust what it says about
itself: any code that behaves right passes, and code that only looks right
fails. Inputs an answer could be fitted to (values, seeds, lengths, shapes) are drawn
anew for each check. What runs on the ranks lives in :mod:`ezpz_nb.workshop.jobs`;
the checkers of exercises 5-7 in :mod:`ezpz_nb.workshop.batch_exercises`, and every other
notebook's checkers in their own modules (all imported here: see the package docstring).
Every checker also takes ``timeout=`` (seconds, default :data:`CHECK_TIMEOUT`)
after which the learner's code is reported as hung and its ranks are stopped.

The exercises follow the notebooks: 1-2 after 01 (collectives, subgroups), 3-4
after 02 (sharding, epochs), 5 after 03 (a batch of unknown shape), 6-7 after
04 (step alignment).

Example::

    import ezpz_nb.workshop.exercises as ex

    def global_sum(x):
        dist.all_reduce(x)
        return x

    ex.check_global_sum(global_sum).passed   # True
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ezpz_nb.workshop import jobs
from ezpz_nb.workshop.batch_exercises import (
    check_leader_batches,
    check_send_batch,
    check_steps_over_stream,
)

# Every other family's checkers, so that one import reaches them all (the package
# docstring lists them by module).
from ezpz_nb.workshop.dcp_state import check_loader_state
from ezpz_nb.workshop.exact_eval import check_exact_mean
from ezpz_nb.workshop.memory_exercises import check_flat
from ezpz_nb.workshop.mixture import check_mix_batch
from ezpz_nb.workshop.packing_exercises import check_budget_plan, check_pack
from ezpz_nb.workshop.throughput import check_faster_loader
from ezpz_nb.workshop.tp_plan import check_tp_plan
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    as_text,
    each_returned,
    fresh_seed,
    judge,
    run_learner,
    wrong,
)

__all__ = [
    "CHECK_TIMEOUT",
    "CheckResult",
    "check_budget_plan",
    "check_exact_mean",
    "check_faster_loader",
    "check_flat",
    "check_global_sum",
    "check_leader_batches",
    "check_loader_state",
    "check_make_sampler",
    "check_mix_batch",
    "check_pack",
    "check_run_epochs",
    "check_send_batch",
    "check_share_from_leader",
    "check_steps_over_stream",
    "check_tp_plan",
]


# ----------------------------------------------------------------- 1. all_reduce
def check_global_sum(
    fn: Callable[[torch.Tensor], torch.Tensor], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 1: ``fn(x)`` returns the element-wise sum of ``x`` over all ranks.

    Rank ``r`` passes ``[r + 1, 10 r]`` on 4 ranks; every rank must return ``[10, 60]``.
    Then every rank calls ``fn`` again with values drawn for this check, so an
    answer that does not depend on the ranks' data fails.
    """
    seed = fresh_seed()

    def body() -> str:
        got = run_learner(jobs.job_global_sum, fn, seed, timeout=timeout)
        world = len(got)
        for k, s in enumerate((None, seed)):
            again = " (second call, other inputs)" if k else ""
            inputs = jobs.sum_inputs(world, s)
            want = torch.stack(inputs).sum(0)
            for r, outs in enumerate(got):
                out = outs[k]
                if not isinstance(out, torch.Tensor):
                    raise wrong(
                        f"rank {r} returned {type(out).__name__} {out!r}{again}; return a tensor."
                    )
                if out.shape == want.shape and torch.equal(out, inputs[r]):
                    raise wrong(
                        f"rank {r} returned its own input {as_text(out)} instead of the "
                        f"sum over all {world} ranks {as_text(want)}: nothing was exchanged "
                        "between the ranks. Look for the collective of notebook 01 that "
                        "combines every rank's tensor."
                    )
                if out.shape != want.shape or not torch.allclose(out.float(), want):
                    raise wrong(
                        f"rank {r} returned {as_text(out)}{again}, expected the sum over "
                        f"all ranks {as_text(want)} (inputs were "
                        f"{[as_text(i) for i in inputs]}): compute it from x."
                    )
        first = as_text(torch.stack(jobs.sum_inputs(world, None)).sum(0))
        return (
            f"All {world} ranks returned {first}, the sum of every rank's input, and the "
            "right sum again for other inputs."
        )

    return judge("global_sum", body)


# ----------------------------------------------------------------- 2. group broadcast
def _layout_words(groups: tuple[tuple[int, ...], ...], sort_ranks: bool) -> str:
    listed = ", ".join(str(list(g)) for g in groups)
    return f"groups {listed}" + ("" if sort_ranks else " made with sort_ranks=False")


def check_share_from_leader(
    fn: Callable[[torch.Tensor, Any], torch.Tensor], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 2: ``fn(x, group)`` gives every rank of ``group`` the group leader's ``x``.

    4 ranks, several layouts in turn (:data:`~ezpz_nb.workshop.jobs.SHARE_LAYOUTS`):
    consecutive pairs ``[0, 1]``, ``[2, 3]``; strided pairs; and groups of other
    sizes made with ``new_group(..., sort_ranks=False)``, whose rank 0 is the
    first rank listed, not the smallest. Each rank holds 3 values drawn for this
    check and layout. Every rank must return its group's rank 0's values: only
    asking the group tells which rank that is, and only a collective what it holds.
    """
    seed = fresh_seed()

    def body() -> str:
        got = run_learner(jobs.job_share, fn, seed, timeout=timeout)
        world = len(got)
        for k, (groups, sort_ranks) in enumerate(jobs.SHARE_LAYOUTS):
            inputs = jobs.share_inputs(world, seed + k)
            where = f" (layout {k + 1}: {_layout_words(groups, sort_ranks)})"
            for r in range(world):
                out = got[r][k] if isinstance(got[r], list) else got[r]
                leader = jobs.share_leader(groups, sort_ranks, r)
                want = inputs[leader]
                if not isinstance(out, torch.Tensor):
                    raise wrong(
                        f"rank {r} returned {type(out).__name__} {out!r}{where}; return a tensor."
                    )
                if out.shape == want.shape and torch.equal(out.float(), want):
                    continue
                held = [
                    q
                    for q in range(world)
                    if out.shape == want.shape and torch.equal(out.float(), inputs[q])
                ]
                if r != leader and held == [r]:
                    raise wrong(
                        f"rank {r} still holds its own values {as_text(out)}{where}: it "
                        f"received nothing from its leader, global rank {leader}, the "
                        "rank its group numbers 0."
                    )
                if held:
                    raise wrong(
                        f"rank {r} holds rank {held[0]}'s values{where}, but its group's "
                        f"rank 0 is global rank {leader}. The leader is whichever rank "
                        "the group numbers 0, not a rank you compute from rank numbers "
                        "(the smallest member, r - r % 2): ask the group, and broadcast "
                        "inside it."
                    )
                raise wrong(
                    f"rank {r} holds {as_text(out)}{where}, expected its group leader's "
                    f"values {as_text(want)} (global rank {leader}'s, drawn for this "
                    "check): only a collective inside the group can bring them."
                )
        return (
            f"In all {len(jobs.SHARE_LAYOUTS)} layouts (consecutive and strided pairs, "
            "groups of 1, 3 and 4 listed out of order) every rank held its group "
            "leader's values."
        )

    return judge("share_from_leader", body)


# ----------------------------------------------------------------- 3. DP sampler
def _overlap_hint(both: list[int], dp_size: int) -> str:
    if len(both) < dp_size:  # no more than padding adds: the replicas are right, the tail is not
        return (
            "DistributedSampler's default drop_last=False pads the shards by repeating "
            "samples; drop_last=True drops the remainder instead."
        )
    return "each replica must get its own share (rank=layout.dp_rank)."


def _sampler_pass(k: int) -> str:
    which, epoch = jobs.SAMPLER_PASSES[k]
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
    fn: Callable[[Any, Any, int], Iterable[int]], *, timeout: float = CHECK_TIMEOUT
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
    check_seed = fresh_seed()
    n = jobs.sampler_samples(check_seed)
    seed_a, seed_b = random.Random(check_seed).sample(range(1, 2**20), 2)

    def body() -> str:
        got = run_learner(jobs.job_sampler, fn, n, (seed_a, seed_b, seed_a), timeout=timeout)
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
        shards = [[by_dp[d][1][k] for d in dps] for k in range(len(jobs.SAMPLER_PASSES))]
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


# ----------------------------------------------------------------- 4. set_epoch
def check_run_epochs(
    fn: Callable[[Any, int], list[list[int]]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 4: ``fn(loader, num_epochs)`` returns each epoch's sample ids, reshuffled.

    4 ranks as dp 2 x tp 2, 16 samples in batches of 2, 3 epochs; the loader
    shuffles with a DistributedSampler over the DP group (seed drawn per
    check). Judged by what the loader really yielded: once per epoch, in the
    order returned; a new order every epoch on every rank; TP peers alike; the
    two DP replicas split the 16 samples between them in every epoch. Any
    epoch numbering passes (``set_epoch(epoch + 1)`` as well as ``set_epoch(epoch)``).
    """
    epochs, seed = 3, fresh_seed()

    def body() -> str:
        got = run_learner(jobs.job_epochs, fn, epochs, seed, timeout=timeout)
        each_returned(got, "one list of sample ids per epoch")
        for r, (_dp, _tp, out, passes) in enumerate(got):
            if isinstance(out, str):
                raise wrong(
                    f"rank {r} returned {out}: return a list with one list of sample "
                    "ids (ints, from batch['index']) per epoch."
                )
            if len(passes) != epochs:
                raise wrong(
                    f"rank {r} iterated its loader {len(passes)} time(s) for "
                    f"{epochs} epochs: once per epoch."
                )
            if len(out) != epochs:
                raise wrong(f"rank {r} returned {len(out)} epoch(s), expected {epochs}.")
            for e, (o, p) in enumerate(zip(out, passes, strict=True)):
                if o != p:
                    raise wrong(
                        f"rank {r}, epoch {e}: returned {o}, but its loader yielded "
                        f"{p}: return the ids the loader gave, in order."
                    )
            for e in range(1, epochs):
                for earlier in range(e):
                    if out[e] == out[earlier]:
                        raise wrong(
                            f"rank {r} saw the same order in epoch {earlier} and epoch "
                            f"{e} ({out[e]}): the sampler reshuffles only when told a "
                            "new epoch. Look at what your loop tells loader.sampler "
                            "(set_epoch) before each pass."
                        )
        by_place = {(dp, tp): out for dp, tp, out, _ in got}
        for (dp, tp), out in by_place.items():
            if tp and out != by_place[(dp, 0)]:
                raise wrong(
                    f"the TP peers of DP replica {dp} saw different orders: call "
                    "set_epoch with the same number on every rank."
                )
        for e in range(epochs):
            a, b = by_place[(0, 0)][e], by_place[(1, 0)][e]
            if set(a) & set(b) or len(set(a) | set(b)) != 16:
                raise wrong(
                    f"in epoch {e} the DP replicas got {sorted(a)} and {sorted(b)}, "
                    "which do not split the 16 samples between them: every rank must "
                    "set the same epoch."
                )
        return (
            "Every epoch had a new order on every rank, TP peers alike, the DP replicas "
            "splitting the data between them."
        )

    return judge("run_epochs", body)
