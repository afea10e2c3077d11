"""Checks over a sample ledger: the seven ways DP/TP data loading goes wrong.

Each check reads only :class:`~ezpz_nb.ledger.records.StepRecord` s and answers in plain
words, so a learner can read what happened without knowing the code:

* ``step_mismatch``: ranks took different numbers of steps in an epoch (the
  next collective hangs);
* ``tp_mismatch``: TP peers held different samples, or the same samples with
  different bytes, at a step;
* ``dp_duplicate``: a sample was seen by two DP replicas in one epoch;
* ``never_seen``: samples no rank saw in an epoch;
* ``rank_duplicate``: one rank saw a sample more than once in an epoch (the
  DataLoader workers of an IterableDataset that all yield the same stream);
* ``batch_size``: the global batch (the DP replicas' batches together) changed
  size from one step to another;
* ``order_unchanged``: an epoch repeated the previous epoch's order although
  shuffling was asked for (``set_epoch`` never reached the sampler).

A finding that the loader's own settings explain (``drop_last`` and padding, see
:class:`Allowance`) carries the reason in :attr:`Problem.expected`; each
finding also names where it first shows (:attr:`Problem.first`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable

from ezpz_nb.ledger.batch_checks import check_batch, check_order, dp_allowed, never_allowed
from ezpz_nb.ledger.problem import Allowance, Problem, format_ids
from ezpz_nb.ledger.records import StepRecord

__all__ = ["Allowance", "Problem", "check_records"]


def _check_steps(epoch: int, recs: list[StepRecord], ranks: set[int]) -> list[Problem]:
    # Every rank of the run starts at 0: one that took no step in this epoch
    # has no record here, yet it is the rank that leaves the others waiting.
    counts: dict[int, int] = dict.fromkeys(ranks, 0)
    for r in recs:
        counts[r.rank] += 1
    if len(set(counts.values())) <= 1:
        return []
    by_count: dict[int, list[int]] = defaultdict(list)
    for rank, n in sorted(counts.items()):
        by_count[n].append(rank)
    parts = "; ".join(f"ranks {v} took {n}" for n, v in sorted(by_count.items()))
    fewest = min(by_count)
    return [
        Problem(
            "step_mismatch",
            f"Epoch {epoch}: ranks took different numbers of steps ({parts}). Collectives pair "
            "by call order: the extra step's collective meets the next epoch's first one on "
            "the ranks with fewer steps (steps silently mixed), and after the last epoch it "
            "meets nothing: a hang.",
            epoch,
            ranks=tuple(sorted(counts)),
            # The first rank to run out: the job hangs at its missing step.
            first=(by_count[fewest][0], fewest, None),
        )
    ]


def _check_tp(epoch: int, recs: list[StepRecord]) -> list[Problem]:
    groups: dict[tuple[int, int], list[StepRecord]] = defaultdict(list)
    for r in recs:
        groups[(r.dp_rank, r.step)].append(r)
    bad_ids, bad_bytes = [], []
    for (dp_rank, step), peers in groups.items():
        if len(peers) == 1:
            continue
        if len({p.sample_ids for p in peers}) > 1:
            bad_ids.append((step, dp_rank, peers))
        # CP peers hold the same samples but different slices of them: only
        # ranks with the same cp_rank (TP peers) must hold the same bytes.
        elif len({(p.cp_rank, p.digest) for p in peers}) > len({p.cp_rank for p in peers}):
            bad_bytes.append((step, dp_rank, peers))
    # Sort only what is reported (by step, then replica), not every group.
    id_steps = [(s, ps) for s, _, ps in sorted(bad_ids, key=lambda b: b[:2])]
    byte_steps = [(s, ps) for s, _, ps in sorted(bad_bytes, key=lambda b: b[:2])]
    out = []
    if id_steps:
        step, peers = id_steps[0]
        lead, *rest = sorted(peers, key=lambda p: (p.cp_rank, p.tp_rank, p.rank))
        odd = next(p for p in rest if p.sample_ids != lead.sample_ids)
        diff = [i for i in odd.sample_ids if i not in lead.sample_ids] or list(odd.sample_ids)
        eg = "; ".join(
            f"rank {p.rank} has {format_ids(p.sample_ids, 4)}"
            for p in sorted(peers, key=lambda p: p.rank)
        )
        out.append(
            Problem(
                "tp_mismatch",
                f"Epoch {epoch}: TP peers held different samples at {len(id_steps)} step(s) "
                f"(e.g. step {step}: {eg}). TP ranks split one model over one batch, so they "
                "must see the same samples: shard over dp_group, not the whole world.",
                epoch,
                ranks=tuple(sorted({p.rank for _, ps in id_steps for p in ps})),
                steps=tuple(s for s, _ in id_steps),
                first=(odd.rank, step, diff[0] if diff else None),
            )
        )
    if byte_steps:
        step, peers = byte_steps[0]
        by_cp: dict[int, StepRecord] = {}
        odd_rank = None
        for p in sorted(peers, key=lambda p: (p.tp_rank, p.rank)):
            lead_rec = by_cp.setdefault(p.cp_rank, p)
            if odd_rank is None and p.digest != lead_rec.digest:
                odd_rank = p.rank
        out.append(
            Problem(
                "tp_mismatch",
                f"Epoch {epoch}: TP peers held the same sample ids but different bytes at "
                f"{len(byte_steps)} step(s) (first at step {step}, ranks "
                f"{sorted(p.rank for p in peers)}). The dataset is not the same on every rank "
                "(seeded by rank?): make it deterministic per sample, or broadcast within TP.",
                epoch,
                ranks=tuple(sorted({p.rank for _, ps in byte_steps for p in ps})),
                steps=tuple(s for s, _ in byte_steps),
                first=(odd_rank, step, None),
            )
        )
    return out


def _why_never_seen(missing: int, recs: list[StepRecord]) -> str:
    """What can leave ``missing`` samples unseen, given the epoch's replicas and batches."""
    dp_size = max(r.dp_size for r in recs)
    batch = max(len(r.sample_ids) for r in recs)
    # Two flags called drop_last: the sampler's drops at most the remainder over the
    # replicas, the DataLoader's at most one partial batch per replica.
    by_sampler, by_loader = dp_size - 1, dp_size * (batch - 1)
    droppable = by_sampler + by_loader
    if missing <= droppable:
        return (
            "The sampler's drop_last=True drops the samples that do not divide evenly over "
            f"the DP replicas (at most {by_sampler} here); the DataLoader's drop_last=True "
            f"drops each replica's last partial batch (at most {by_loader} in all). Or the "
            "epoch was cut short, or the loader skipped them."
        )
    return (
        f"That is more than drop_last can drop (at most {droppable} with {dp_size} DP "
        f"replica(s) and batches of {batch}). Either the epoch was cut short, or the data "
        "was split into more shards than there are DP replicas (a DistributedSampler over "
        "the whole world instead of the DP group, e.g. no dp_group), so some shards were "
        "never read."
    )


def _why_duplicated(dups: int, recs: list[StepRecord]) -> str:
    """What can make ``dups`` samples reach two DP replicas in one epoch."""
    dp_size = max(r.dp_size for r in recs)
    # DistributedSampler pads total_size - N < dp_size slots: at most dp_size - 1 repeats.
    if dups <= dp_size - 1:
        return (
            "With the sampler's drop_last=False, DistributedSampler pads the last shards by "
            "repeating the first samples of the epoch's order (at most "
            f"{dp_size - 1} with {dp_size} DP replicas)."
        )
    return (
        f"That is more than the sampler's padding repeats (at most {dp_size - 1} with "
        f"{dp_size} DP replicas): the replicas' shards overlap. Look for samplers that "
        "disagree (another seed, num_replicas or epoch on some ranks), or a resumed run "
        "whose saved position was written at another world size."
    )


def _first_on_second_replica(recs: list[StepRecord], dups: set[int]) -> tuple[int, int, int]:
    """``(rank, step, sample)`` of the earliest step where a duplicate reaches a second replica."""
    first_dp: dict[int, int] = {}
    best: tuple[int, int, int] | None = None
    for r in sorted(recs, key=lambda r: (r.step, r.dp_rank, r.rank)):
        for i in r.sample_ids:
            if i not in dups:
                continue
            dp = first_dp.setdefault(i, r.dp_rank)
            if dp != r.dp_rank and best is None:
                best = (r.rank, r.step, i)
    assert best is not None  # every id in dups was seen by two replicas
    return best


def _check_dp(
    epoch: int,
    recs: list[StepRecord],
    num_samples: int | None,
    universe: Collection[int] | None = None,
    allow: Allowance | None = None,
) -> list[Problem]:
    ids_by_dp: dict[int, set[int]] = defaultdict(set)
    ranks_by_dp: dict[int, set[int]] = defaultdict(set)
    for r in recs:
        ranks_by_dp[r.dp_rank].add(r.rank)
        ids_by_dp[r.dp_rank].update(r.sample_ids)
    # A sample counted once per replica that saw it: > 1 means two replicas.
    replicas: Counter[int] = Counter()
    for ids in ids_by_dp.values():
        replicas.update(ids)
    dp_size = max(r.dp_size for r in recs)
    out = []
    dups = sorted(i for i, n in replicas.items() if n > 1)
    if dups:
        rank, step, eg = _first_on_second_replica(recs, set(dups))
        seen_by = {eg: {d for d, ids in ids_by_dp.items() if eg in ids}}
        out.append(
            Problem(
                "dp_duplicate",
                f"Epoch {epoch}: {len(dups)} sample(s) {format_ids(dups)} were seen by more than one DP "
                f"replica (e.g. sample {eg} by DP ranks {sorted(seen_by[eg])}). Their gradients "
                f"count twice. {_why_duplicated(len(dups), recs)}",
                epoch,
                ranks=tuple(sorted({x for d in seen_by[eg] for x in ranks_by_dp[d]})),
                samples=tuple(dups),
                expected=dp_allowed(allow, len(dups), dp_size, num_samples),
                first=(rank, step, eg),
            )
        )
    if universe is None and num_samples is not None:
        universe = range(num_samples)
    if universe is not None:
        never = sorted(set(universe).difference(replicas))
        if never:
            of = len(universe)
            out.append(
                Problem(
                    "never_seen",
                    f"Epoch {epoch}: {len(never)} of {of} sample(s) {format_ids(never)} were "
                    f"never seen by any rank. {_why_never_seen(len(never), recs)}",
                    epoch,
                    samples=tuple(never),
                    expected=never_allowed(allow, len(never), dp_size, num_samples),
                    first=(None, None, never[0]),
                )
            )
    return out


def _check_repeats(epoch: int, recs: list[StepRecord]) -> list[Problem]:
    # Within one rank, so TP peers (who rightly share every sample) never count.
    seen: dict[int, Counter[int]] = defaultdict(Counter)
    workers: dict[tuple[int, int], set[int]] = defaultdict(set)
    again: dict[int, tuple[int, int]] = {}  # rank -> (step, sample) of its first repeat
    for r in sorted(recs, key=lambda r: (r.step, r.rank)):
        for i in r.sample_ids:
            if seen[r.rank][i] and r.rank not in again:
                again[r.rank] = (r.step, i)
            seen[r.rank][i] += 1
        if len(r.worker_ids) == len(r.sample_ids):
            for i, w in zip(r.sample_ids, r.worker_ids, strict=True):
                workers[(r.rank, i)].add(w)
    repeated = {rank: sorted(i for i, n in c.items() if n > 1) for rank, c in seen.items()}
    repeated = {rank: ids for rank, ids in sorted(repeated.items()) if ids}
    if not repeated:
        return []
    rank, ids = next(iter(repeated.items()))
    eg = ids[0]
    by = sorted(workers.get((rank, eg), ()))
    if len(by) > 1:
        why = (
            f"sample {eg} came from DataLoader workers {by} of rank {rank}. Each worker runs "
            "the IterableDataset's __iter__ on its own copy: shard the stream over "
            "get_worker_info().id and .num_workers as well as over the ranks."
        )
    else:
        why = (
            f"e.g. sample {eg} on rank {rank}, {seen[rank][eg]} times. A sampler or stream "
            "that repeats itself, or workers that all yield the same stream (record the "
            "worker id with ezpz_nb.ledger.tag_worker to tell)."
        )
    all_ids = sorted({i for v in repeated.values() for i in v})
    step, sample = again[rank]
    return [
        Problem(
            "rank_duplicate",
            f"Epoch {epoch}: {len(all_ids)} sample(s) {format_ids(all_ids)} were seen more than once by "
            f"one rank ({why})",
            epoch,
            ranks=tuple(repeated),
            samples=tuple(all_ids),
            first=(rank, step, sample),
        )
    ]


def check_records(
    records: Iterable[StepRecord],
    num_samples: int | None = None,
    *,
    universe: Collection[int] | None = None,
    allowance: Allowance | None = None,
    shuffle: bool = False,
    global_batch: bool = False,
) -> list[Problem]:
    """Run every check, epoch by epoch.

    Args:
        records: Step records of all ranks, in any order. A rank of the
            layout (``dp_size * cp_size * tp_size`` ranks) with no record in an epoch
            counts as 0 steps there.
        num_samples: Dataset length; without it (or ``universe``) ``never_seen``
            is not checked.
        universe: The sample ids every epoch must cover, when they are not
            ``range(num_samples)`` (ids hashed from keys, a stream's ids).
        allowance: The loader's settings; findings they explain get
            :attr:`Problem.expected` set (they are still returned).
        shuffle: Shuffling was asked for: an epoch in the same order as the
            previous one is an ``order_unchanged`` finding.
        global_batch: Also check that the global batch keeps its size
            (``batch_size``); off by default, as a partial last batch is common.

    Returns:
        One :class:`Problem` per kind and epoch found, empty when all is well.
    """
    by_epoch: dict[int, list[StepRecord]] = defaultdict(list)
    ranks: set[int] = set()
    world = 0
    for r in records:
        by_epoch[r.epoch].append(r)
        ranks.add(r.rank)
        world = max(world, r.dp_size * r.cp_size * r.tp_size)
    # The run's ranks: those that recorded anything plus the world size the
    # layout implies, so a rank that never got a batch still counts (0 steps).
    ranks.update(range(world))
    problems: list[Problem] = []
    for epoch, recs in sorted(by_epoch.items()):
        problems += _check_steps(epoch, recs, ranks)
        problems += _check_tp(epoch, recs)
        problems += _check_dp(epoch, recs, num_samples, universe, allowance)
        problems += _check_repeats(epoch, recs)
        if global_batch:
            problems += check_batch(epoch, recs, allowance)
    if shuffle:
        problems += check_order(by_epoch)
    return problems
