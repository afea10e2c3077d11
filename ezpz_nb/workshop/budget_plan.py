"""Notebook 11, exercise 2: a token-budget plan of batches with equal step counts over DP.

``check_budget_plan(fn)``: ``fn(lengths, dp_rank, dp_size, budget)`` returns this DP
replica's batches of document ids, with ``len(batch) * longest <= budget``. Each check
draws two cases (the DP size, the budget, the number and lengths of documents; the
second about three times the first's batches), each run on real ranks, one of them,
drawn, with two TP ranks per DP replica (issue 45's eighth trial: the global rank and
world size taken for the DP rank and size passed while the world was DP alone): TP peers
planning the same batches, equal step
counts, no document twice, no more tokens left out than one of the two fixes drops (see
:func:`_judge_drop`), and batches as full (:data:`FILL`) and padding within
:data:`EXCESS_PAD` of a plan sorted by length over the same documents (so one document
per batch, and fixed-size batches, are turned down). A plan made globally and dealt over
DP passes, and so does a per-replica plan that agrees on the count with
``all_reduce(MIN)``; a count fixed in advance cannot fit both cases, and every case is
drawn so that a count each replica works out alone (its own plan's, or the global plan's
share) fails too (:mod:`.plan_draw`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.text.plan import budget_batches, shard_then_plan
from ezpz_nb.workshop.plan_draw import budget_lengths, draw_case
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["budget_lengths", "check_budget_plan", "draw_case", "job_budget_plan"]

#: Padding share a plan may have beyond a plan sorted by length over the same documents.
#: Measured over 1000 drawn cases: a per-replica sorted plan (fix 2) up to 0.11 beyond,
#: unsorted batches of ``budget // longest`` documents at least 0.19.
EXCESS_PAD = 0.15
#: Share of the budget a plan must fill, as a fraction of what a sorted plan over the
#: same documents fills. Measured over 1000 checks (2000 cases) of the checker's own draw:
#: fix 2 at least 0.778 (the library's shards, round-robin, contiguous blocks, random ones)
#: and 0.75 (shards balanced by tokens), fix 1 (longest or shortest first) 1.00; sorted
#: batches of a fixed ``budget // longest`` documents at most 0.706 (issue 45: 0.6 let them
#: pass), one document per batch about a third.
FILL = 0.72
#: Random shardings whose fix-2 drop sets the cap on what a plan may leave out.
SHARDINGS = 16
#: Share of the tokens a plan may always leave out (see :func:`_drop_cap`). Fix 2 drops up
#: to a third of a small case's tokens on an unlucky sharding (1 case in 2000; 23% for the
#: worst of 15 shardings otherwise); shards that give each replica a band of lengths (the
#: shortest to one) drop at least 41% in the larger-dropping case of every one of 1000 checks.
CAP = 0.35
#: Fix 2's drop of long documents (:func:`_long_cap`): shardings simulated, and the margin
#: over the most they drop (a factor, and budgets added). Issue 45's third trial: dropping
#: the longest documents (20-30% of the tokens) passed. Measured over 500 checks (1000
#: cases) of the checker's own draw, this rule alone: fix 2 on a shuffled plan (3 random
#: shardings a case) at least 1.42 budgets under the cap; the longest documents holding
#: 20% of the tokens left out: over it in every check (by 0.50 budgets at least), 30%: by
#: 4.5 budgets; 15%: 25 checks in 500 pass (less than fix 2's worst drop of all tokens).
LONG_SIMS, LONG_FACTOR, LONG_SLACK = 48, 1.5, 2
#: TP ranks per DP replica in the case of a check run with TP peers.
TP = 2


def job_budget_plan(fn: Callable, lengths: list[int], budget: int, tp: int = 1) -> Any:
    """Notebook 11, exercise 2: this rank's plan, and the steps it took with a gradient all-reduce each.

    ``fn`` is given this rank's DP rank and size: with ``tp`` ranks per DP replica, TP
    innermost (``rank // tp``, as ``make_layout`` lays the ranks out). The ranks first
    compare their counts (one all_gather); only when they agree do they run the loop,
    each step one all-reduce over every rank, so a wrong plan is reported as unequal
    counts instead of waiting out a hang.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = fn(list(lengths), rank // tp, world // tp, budget)
    if plan is None:
        return None
    plan = [[int(i) for i in batch] for batch in plan]
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([len(plan)]))
    steps = 0
    if len({int(c) for c in counts}) == 1:
        for batch in plan:
            grad = torch.tensor([float(sum(lengths[i] for i in batch))])
            dist.all_reduce(grad)  # stands in for the gradient all-reduce
            steps += 1
    return plan, steps


def _padding(plan: list[list[int]], lengths: list[int]) -> float:
    """Share of a plan's padded tokens that are padding."""
    padded = sum(len(b) * max(lengths[i] for i in b) for b in plan)
    return 1 - sum(lengths[i] for b in plan for i in b) / max(padded, 1)


def _fix2_drop(lengths: list[int], shards: list[list[int]], budget: int) -> int:
    """Tokens that fix 2 leaves out on these shards: every replica's batches past the fewest."""
    own = [budget_batches(lengths, s, budget) for s in shards]
    fewest = min(len(p) for p in own)
    return sum(lengths[i] for p in own for b in p[fewest:] for i in b)


def _drop_cap(lengths: list[int], dp: int, budget: int, seed: int) -> float:
    """What a per-replica plan may leave out on a sharding of its own.

    Fix 2 has no bound of its own (a replica that drew many short documents plans many
    more batches), so the cap is generous: :data:`CAP` of the tokens, or twice the most
    fix 2 drops over common shardings and :data:`SHARDINGS` random ones plus two steps,
    if more.
    It turns down shards so lopsided that the agreed count drops most of the corpus.
    """
    n, rng = len(lengths), random.Random(seed)
    block = n // dp  # the checker draws n as a multiple of dp
    shards = [
        [list(range(r, n, dp)) for r in range(dp)],
        [list(range(r * block, (r + 1) * block)) for r in range(dp)],
        [[i for b in shard_then_plan(lengths, r, dp, budget) for i in b] for r in range(dp)],
    ]
    for _ in range(SHARDINGS):
        perm = list(range(n))
        rng.shuffle(perm)
        shards.append([perm[r::dp] for r in range(dp)])
    most = max(_fix2_drop(lengths, s, budget) for s in shards)
    return max(CAP * sum(lengths), 2 * most + 2 * dp * budget)


def _long_drop(lengths: list[int], dropped: set[int]) -> int:
    """Tokens in ``dropped`` from the longest documents, those holding half of all tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    long, acc = set(), 0
    for i in order:
        if 2 * acc >= sum(lengths):
            break
        long.add(i)
        acc += lengths[i]
    return sum(lengths[i] for i in dropped & long)


def _long_cap(lengths: list[int], dp: int, budget: int, seed: int) -> float:
    """The most long-document tokens (:func:`_long_drop`) fix 2 may leave out.

    Fix 2 that cuts a shuffled plan (the library's ``shard_then_plan``) leaves out random
    batches, long ones too: :data:`LONG_FACTOR` times the most it leaves out of the long
    documents over :data:`LONG_SIMS` random shardings and batch orders, plus
    :data:`LONG_SLACK` budgets. Cutting a plan sorted longest first leaves out short ones.
    """
    rng, n, most = random.Random(seed + 1), len(lengths), 0
    for _ in range(LONG_SIMS):
        perm = list(range(n))
        rng.shuffle(perm)
        own = [budget_batches(lengths, perm[r::dp], budget) for r in range(dp)]
        for p in own:
            rng.shuffle(p)
        fewest = min(len(p) for p in own)
        most = max(most, _long_drop(lengths, {i for p in own for b in p[fewest:] for i in b}))
    return LONG_FACTOR * most + LONG_SLACK * budget


def _judge_drop(
    plans: list[list[list[int]]], lengths: list[int], dp: int, budget: int, seed: int, case: str
) -> None:
    """Stop unless the tokens left out are what fix 1 or fix 2 leaves out.

    Fix 1 (a global plan dealt whole) drops fewer than ``dp`` batches, at most
    ``(dp - 1) * budget`` tokens. Fix 2 (each replica's own plan cut to the smallest
    count) may drop more, but the replica with the fewest batches keeps every document of
    its shard, ``n / dp`` of them (the checker draws ``n`` a multiple of ``dp``), and no
    replica keeps more: a plan that drops more than fix 1 and keeps no replica whole
    drops beyond the agreed count (issue 45's third trial: a replica given many short
    documents counted as whole), and one that leaves out more long documents than fix 2
    on random shardings (:func:`_long_cap`) picked what to drop by length.
    That rule does not depend on how lucky a sharding was, which a bound on tokens alone
    does (fix 2 drops 0 to a third of a small case's tokens, and a plan dropping 12% of
    the batches more passed 60% of checks under such a bound). Measured over 1000 checks
    (2000 cases) of the checker's own draw: fix 2 on 9 shardings (the library's with seed
    0 and another, round-robin, contiguous, balanced by tokens, 3 random) and fix 1 three
    ways: 0 rejected, at least 13.8% of the tokens (4.6 budgets) under the cap; fix 2 then
    12% of the batches more (3 shardings), and shards banded by length: every check
    rejected.
    """
    planned = {i for p in plans for b in p for i in b}
    total, dropped = sum(lengths), sum(lengths) - sum(lengths[i] for i in planned)
    if dropped <= (dp - 1) * budget:
        return
    said = (
        f"{case}: only {total - dropped} of {total} tokens are planned this epoch, "
        f"{dropped} left out"
    )
    kept = [len({i for b in p for i in b}) for p in plans]
    if max(kept) != len(lengths) // dp:
        raise wrong(
            f"{said}, more than dealing a global plan drops (fewer than {dp} batches), and "
            f"no replica kept all {len(lengths) // dp} documents of its shard and no more "
            f"(they kept {kept}). Agreeing on the smallest count keeps every batch of the "
            "replica with the fewest, one whole shard; deal the documents evenly, plan each "
            "shard, and cut only the others' surplus, not a count fixed in advance."
        )
    longest = _long_drop(lengths, set(range(len(lengths))) - planned)
    most = _long_cap(lengths, dp, budget, seed)
    if longest > most:
        raise wrong(
            f"{said}, {longest} of them from the longest documents (those holding half the "
            f"tokens), more than agreeing on the smallest count leaves out of them (at most "
            f"{most:.0f}): cut each replica's surplus batches, from the end of a plan sorted "
            "longest first or at random, not the longest documents."
        )
    cap = _drop_cap(lengths, dp, budget, seed)
    if dropped > cap:
        raise wrong(
            f"{said}, more than agreeing on the smallest count drops on a random sharding "
            f"(at most {cap:.0f}): deal documents evenly over the replicas (round-robin or "
            "shuffled), or plan over all documents and deal whole batches."
        )


def _judge_peers(got: list[Any], tp: int, case: str) -> list[Any]:
    """Stop unless the TP peers of each DP replica planned the same batches (``got``: every
    rank's, in rank order); each replica's plan and steps, as its first rank reported them."""
    for rank, (plan, _) in enumerate(got):
        lead = rank - rank % tp
        if plan != got[lead][0]:
            raise wrong(
                f"{case}: ranks {lead} and {rank} are TP peers of DP replica {rank // tp} "
                f"but planned other batches ({len(got[lead][0])} and {len(plan)} of them, "
                "not the same). TP peers train one replica on the "
                "same batches: plan from dp_rank and dp_size, not the global rank and world "
                "size (with TP they differ), and agree on counts over every rank."
            )
    return got[::tp]


def _judge_plan(
    got: list[Any], lengths: list[int], dp: int, budget: int, case: str, cap_seed: int = 0
) -> str:
    """Stop at the first fault of one drawn case's plans (one per DP replica); what they
    achieved otherwise."""
    counts = [len(plan) for plan, _ in got]
    if len(set(counts)) > 1:
        raise wrong(
            f"{case}: the replicas planned {counts} batches: after {min(counts)} steps the "
            "longer ones would wait in the next all-reduce. Plan over all documents "
            "and deal whole batches, or agree on the count."
        )
    if any(steps != counts[0] for _, steps in got):
        raise wrong(f"{case}: the ranks did not take one step per planned batch.")
    ids = Counter(i for plan, _ in got for batch in plan for i in batch)
    for rank, (plan, _) in enumerate(got):
        for s, batch in enumerate(plan):
            if not batch:
                raise wrong(f"{case}, rank {rank}, step {s}: an empty batch trains on nothing.")
            bad = [i for i in batch if not 0 <= i < len(lengths)]
            if bad:
                raise wrong(f"{case}, rank {rank}, step {s}: {bad[0]} is not a document id.")
            cost = len(batch) * max(lengths[i] for i in batch)
            if cost > budget:
                raise wrong(
                    f"{case}, rank {rank}, step {s}: {len(batch)} documents padded to the "
                    f"longest, {max(lengths[i] for i in batch)}, make {cost} tokens > budget "
                    f"{budget}."
                )
    twice = [i for i, n in ids.items() if n > 1]
    if twice:
        raise wrong(f"{case}: document {twice[0]} is planned {ids[twice[0]]} times in one epoch.")
    _judge_drop([plan for plan, _ in got], lengths, dp, budget, cap_seed, case)
    planned, total = sum(lengths[i] for i in ids), sum(lengths)
    plans = [batch for plan, _ in got for batch in plan]
    pad, fill = _padding(plans, lengths), planned / (budget * len(plans))
    best = budget_batches(lengths, list(ids), budget)
    sorted_pad, sorted_fill = _padding(best, lengths), planned / (budget * len(best))
    if fill < FILL * sorted_fill:
        raise wrong(
            f"{case}: the batches use {fill:.0%} of the budget on average, where batches sorted "
            f"by length over the same documents use {sorted_fill:.0%}: sort the documents by "
            "length over the whole shard (longest first), then put as many in a batch as the "
            "budget allows."
        )
    if pad > sorted_pad + EXCESS_PAD:
        raise wrong(
            f"{case}: {pad:.0%} of the padded tokens are padding, where batches sorted by "
            f"length over the same documents pad {sorted_pad:.0%}: put documents of similar "
            "length together (sort by length, longest first), as many as the budget allows."
        )
    _judge_sorted([plan for plan, _ in got], lengths, case)
    return f"{counts[0]} steps each, {planned / total:.0%} of the tokens, {pad:.0%} padding"


def _judge_sorted(plans: list[list[list[int]]], lengths: list[int], case: str) -> None:
    """Stop unless each replica's batches cut one order by length: no two of its batches'
    length ranges overlap (ties aside), as when its documents were sorted as a whole.

    A plan sorted over the whole corpus (fix 1, either direction) or over each shard
    (fix 2, any sharding, batches in any order) never overlaps; one sorted only within
    pools of a few documents does at once. Issue 45's fourth trial: pools of 16 passed
    4 in 12 checks on fill and padding alone (60 in 200 offline, pools of 32: 173). Over
    200 checks of the checker's own draw, judged offline: pools of 8, 16, 32 or 64
    documents, sorted and dealt round-robin, rejected 200 times each; fix 1 (longest or
    shortest first, the library's global plan) and fix 2 (the library's shards with two
    seeds, round-robin, contiguous blocks) accepted 200 times each.
    """
    for rank, plan in enumerate(plans):
        spans = sorted(
            ((max(lengths[i] for i in b), min(lengths[i] for i in b)) for b in plan),
            reverse=True,
        )
        for (hi, lo), (nhi, nlo) in zip(spans, spans[1:], strict=False):
            if nhi > lo:
                raise wrong(
                    f"{case}, rank {rank}: one batch holds documents of {lo} to {hi} tokens "
                    f"and another of {nlo} to {nhi}: their lengths interleave, so the "
                    "documents were not sorted as a whole (sorting within small pools, or "
                    "shuffling within buckets of similar lengths, leaves batches whose "
                    "lengths overlap side by side). Sort every document of "
                    "the shard (or of the corpus) by length, then cut batches in that order."
                )


def check_budget_plan(
    fn: Callable[[list[int], int, int, int], list[list[int]]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 2: ``fn(lengths, dp_rank, dp_size, budget)`` plans equal step counts.

    Two cases drawn per check, the second with about three times the batches: the DP
    size (2 to 4), a budget (2 to 6 times the longest document), 160 to 240 documents
    (three times as many in the second) of 2 to the longest tokens. One case, drawn, runs
    two TP ranks per DP replica (DP 2 or 3): ``fn`` is given the DP rank and size, which
    are not the global ones. Each step of the plan ends in an all-reduce over all ranks.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        # Drawn here, after judge() pickled the answer (see check_pack).
        rng = random.Random(fresh_seed())
        said = []
        with_tp = rng.choice((1, 3))  # the case whose DP replicas have two TP ranks each
        for scale in (1, 3):
            tp = TP if scale == with_tp else 1
            dp, budget, lengths, cap_seed = draw_case(rng, scale, (2, 3) if tp > 1 else (2, 3, 4))
            case = f"{len(lengths)} documents, budget {budget}, dp {dp}" + (
                f" x tp {tp} ({dp * tp} ranks)" if tp > 1 else ""
            )
            got = run_learner(
                job_budget_plan, fn, lengths, budget, tp, world_size=dp * tp, timeout=timeout
            )
            each_returned(got, "this replica's list of batches")
            got = _judge_peers(got, tp, case)
            verdict = _judge_plan(got, lengths, dp, budget, case, cap_seed)
            said.append(f"{case}: {verdict}")
        return (
            "every replica took as many steps, each document at most once, little left out "
            "and little padding (" + "; ".join(said) + ")."
        )

    return judge("budget_plan", body)
