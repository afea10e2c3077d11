"""Evaluation and step-count checks: where a repeated or dropped sample is a violation.

``check_contract`` judges a training loader, where ``DistributedSampler``'s padding
is an expected cost. An evaluation metric has no such slack: :func:`check_eval`
fails a sample counted twice (padding) or never (``drop_last``), summing the
``weight`` field each batch carries (weight 0 marks padding), and fails unequal
step counts when the eval step makes a collective (FSDP's forward does). Only a DP
leader's samples are counted; each TP/CP peer must read its leader's very batches
(:func:`judge_peers`).
:func:`check_steps` runs an endless loader for ``steps`` batches and judges that
every rank yields them all and that each epoch (read from an ``epoch`` field)
deals every sample once, the ranks' shares within one.

Each rank iterates without any collective, so unequal step counts are measured,
not hung on (:mod:`ezpz_nb.verify.seen`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ezpz_nb.ledger.problem import format_ids
from ezpz_nb.verify.contents import seen_twin
from ezpz_nb.verify.contract import parse_layout
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.outcomes import EvalReport
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.seen import Seen, run_seen, seen_report, split_values
from ezpz_nb.verify.seen_reread import with_contents, with_slices
from ezpz_nb.verify.universe import beyond_len, head_cut, prefix_cut, universe_of
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = ["check_eval", "eps_of", "judge_counted_once", "judge_equal_steps", "judge_peers"]


def _name(seen: list[Seen], i: int) -> str:
    return next((s.names[i] for s in seen if i in s.names), str(i))


def eps_of(dtype: str) -> float:
    """The machine epsilon of a dtype named as batches carry it (``torch.float32``, ``bfloat16``)."""
    import torch

    name = dtype.rsplit(".", 1)[-1]
    kind = getattr(torch, name, None)
    if isinstance(kind, torch.dtype) and kind.is_floating_point:
        return float(torch.finfo(kind).eps)
    return float(torch.finfo(torch.float64).eps)  # Python floats, ints: float64's rounding


def _tolerance(pieces: int, smallest: float, eps: float) -> float:
    # The dtype's rounding over the pieces summed (each piece off by at most eps/2 of
    # itself), never as loose as half the smallest piece: a piece counted twice shows.
    return min(max(pieces, 1) * eps, smallest / 2)


def _uniform_scale(total: dict[int, float], tols: dict[int, float]) -> float | None:
    """The one total every counted sample's weights reach, under 1 (normalised weights, as
    1/N each: the tenth trial's right answer), or None when the totals differ."""
    counted = {i: w for i, w in total.items() if w > tols[i]}
    if not counted:
        return None
    c = statistics.median(counted.values())
    same = all(abs(w - c) <= max(tols[i], 1e-12) for i, w in counted.items())
    return c if same and c < 1 else None


def judge_counted_once(seen: list[Seen], num_samples: int | None) -> Judgement:
    """Each sample's weights summed over every rank and step must be 1, within the weights'
    dtype's rounding (:func:`_tolerance`), over the dataset's universe (a ``Subset``'s indices).
    """
    twin = seen_twin(seen)
    if twin is not None:  # the ids say each sample once, the data says one sample twice
        return replace(twin, rule="counted_once")
    split = split_values(seen)
    if split is not None:  # each id's weights may sum to 1 while a copy's value is made up
        return replace(split, rule="counted_once")
    dtype = next((s.dtype for s in seen if s.dtype), "") or "float64"
    eps = eps_of(dtype)
    total: dict[int, float] = defaultdict(float)
    pieces: dict[int, int] = defaultdict(int)
    smallest: dict[int, float] = {}
    worst = 0.0
    for s in (s for s in seen if s.counts):  # TP/CP peers share their replica's samples
        for step, (ids, ws) in enumerate(zip(s.ids, s.weights, strict=True)):
            for i, w in zip(ids, ws, strict=True):
                total[i] += w
                if w > 0:
                    pieces[i] += 1
                    smallest[i] = min(smallest.get(i, w), w)
                tol = _tolerance(pieces[i], smallest.get(i, 1.0), eps)
                if total[i] > 1 + tol:
                    return Judgement(
                        "counted_once", Verdict.FAIL,
                        f"sample {_name(seen, i)} counted again (weights now sum to {total[i]:.9g}, "
                        f"beyond {dtype}'s rounding of {tol:.2g}): padding that repeats samples "
                        "(DistributedSampler) needs weight 0 on the repeats, or shards that do not "
                        "repeat",
                        rank=s.rank, step=step, sample=_name(seen, i),
                    )  # fmt: skip
    tols = {i: _tolerance(pieces[i], smallest.get(i, 1.0), eps) for i in total}
    worst = max(tols.values(), default=0.0)
    short = sorted(i for i, w in total.items() if w < 1 - tols[i] and w > tols[i])
    scale = _uniform_scale(total, tols) if short else None
    if short and scale is None:
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"sample {_name(seen, short[0])} has weight {total[short[0]]:.9g} in all (beyond "
            f"{dtype}'s rounding of {tols[short[0]]:.2g})",
            sample=_name(seen, short[0]),
        )  # fmt: skip
    counted = {i for i, w in total.items() if w > tols[i]}
    within = f"weights summed in {dtype}, within {worst:.2g} of 1"
    if scale is not None:  # weights normalised (1/N each): the weighted sum is the mean
        within = (
            f"weights summed in {dtype}, each sample's to {scale:.9g}, the same for every one "
            "(a uniform scale leaves the weighted mean exact)"
        )
    hashed = any(s.names for s in seen)
    known = universe_of([s.dataset for s in seen], num_samples, total)
    if known.ids is None or hashed:
        return Judgement(
            "counted_once", Verdict.NOT_JUDGED,
            f"no sample counted twice ({len(counted)} counted once, {within}), but the dataset's "
            "length is unknown, so a dropped sample cannot be seen: pass num_samples=",
        )  # fmt: skip
    outside = sorted(counted - known.ids)
    if outside:  # past a declared universe (num_samples=): a sample counted all the same
        declared = f"num_samples={num_samples} says there are {num_samples} samples"
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"{len(outside)} sample id(s) outside {known.how} counted: {format_ids(outside)}, "
            f"weighing {math.fsum(total[i] for i in outside):.9g} in all; "
            f"{declared if num_samples is not None else f'the dataset holds {known.size}'}, so "
            "each is a sample counted beyond them (a padded copy under a fresh id counts its "
            "sample twice): give a repeat weight 0, or declare num_samples= the samples there are",
            sample=_name(seen, outside[0]),
        )  # fmt: skip
    beyond = "" if num_samples is not None else beyond_len([s.dataset for s in seen], known)
    if beyond:
        return Judgement("counted_once", Verdict.FAIL, f"{known.how} is short: {beyond}")
    dp = sum(1 for s in seen if s.counts)
    batch = max((len(ids) for s in seen for ids in s.ids), default=0)
    m, n = prefix_cut([s.dataset for s in seen], dp * batch) if num_samples is None else (0, 0)
    r, _ = head_cut([s.dataset for s in seen], dp * batch) if num_samples is None else (0, 0)
    if r:
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"{known.how} leave out the dataset's first {r} samples (less than one global "
            "batch): they are never counted, a remainder cut from the head by a Subset, which "
            f"biases the metric: evaluate every sample, or pass num_samples= if the cut is meant",
            sample="0",
        )  # fmt: skip
    if m:
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"{known.how} are the first {m} of the dataset's {n} samples: the last {n - m} "
            "(less than one global batch) are never counted, a drop_last done by a Subset, "
            f"which biases the metric: evaluate all {n}, or pass num_samples={m} if the cut "
            "is meant",
            sample=str(m),
        )  # fmt: skip
    missing = sorted(known.ids - counted)
    if missing:
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"{len(missing)} of {known.size} samples of {known.how} never counted (first: "
            f"{missing[0]}): drop_last (or a split that leaves the tail out) biases the metric"
            + (
                "; or several dataset items make one sample (chunks of a document, weights "
                "summed): then pass num_samples= the number of samples"
                if num_samples is None and max(pieces.values(), default=1) > 1
                else ""
            ),
            sample=str(missing[0]),
        )  # fmt: skip
    shared = _shared_work(seen, len(known.ids), dp, batch)
    if shared:
        return Judgement("counted_once", Verdict.FAIL, shared)
    return Judgement(
        "counted_once",
        Verdict.PASS,
        f"all {known.size} samples of {known.how} counted once, {within}",
    )


def _shared_work(seen: list[Seen], n: int, dp: int, batch: int) -> str:
    """Why the replicas did not share out the evaluation, '' when they did.

    A delivery again of a sample with the same contents is work done twice. A sharded loader
    repeats at most ``dp - 1`` (a sampler's pads, at weight 0 or split) plus a pad-to-a-full-
    batch's rows (``batch`` a replica); a document's chunks are each their own contents, so
    they repeat nothing (a sample that carries no data, ids and weights alone, is not
    counted: a repeat cannot be told from a chunk). The tenth trial: every rank evaluated
    everything, each delivery at 1/dp or at weight 0 on all but one rank: exact weights,
    ``dp`` times the work.
    """
    seen_once: set[tuple[int, str, str]] = set()
    again = again_weighted = 0
    for s in (s for s in seen if s.counts):
        for step, (ids, ws) in enumerate(zip(s.ids, s.weights, strict=True)):
            contents = s.contents[step] if step < len(s.contents) else []
            tags = s.tags[step] if step < len(s.tags) else []
            for k, (i, w) in enumerate(zip(ids, ws, strict=True)):
                key = (
                    i,
                    contents[k] if k < len(contents) else "",
                    tags[k] if k < len(tags) else "",
                )
                if not key[1] and not key[2]:
                    continue  # no data to tell a repeat from a chunk of its own: not counted
                if key in seen_once:
                    again += 1
                    again_weighted += w > 0
                seen_once.add(key)
    if again_weighted > dp - 1:
        return (
            f"{again_weighted} deliveries with a weight repeat a sample already evaluated (the "
            f"same id and data; {n} samples over {dp} replicas): the replicas evaluated samples "
            "more than once between them (every sample on every rank, or the set twice, weights "
            "split to sum to 1), which costs that many times the work: shard the set, each "
            "replica its own ~N/dp samples, weight 0 only on the pads that even out the shards"
        )
    if again > dp - 1 + dp * batch:
        return (
            f"{again} deliveries repeat a sample already evaluated, at weight 0 (the same id "
            f"and data; {n} samples over {dp} replicas): more than evening out the shards and "
            f"the last batches needs (at most {dp - 1 + dp * batch}); a weight of 0 does not "
            "make evaluating a sample free: shard the set, each replica its own ~N/dp samples"
        )
    return ""


def judge_equal_steps(seen: list[Seen], collective_step: bool) -> Judgement:
    """Equal step counts, needed when each step makes a collective."""
    counts = {s.rank: len(s.ids) for s in seen}
    if len(set(counts.values())) == 1:
        return Judgement("equal_steps", Verdict.PASS, f"every rank took {counts[0]} steps")
    fewest = min(counts, key=lambda r: (counts[r], r))
    parts = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
    if not collective_step:
        return Judgement(
            "equal_steps", Verdict.NOT_ASKED,
            f"steps differ ({parts}), which is safe only because collective_step=False says the "
            "eval step makes no collective (under FSDP or TP it does)",
        )  # fmt: skip
    return Judgement(
        "equal_steps", Verdict.FAIL,
        f"steps differ ({parts}): rank {fewest} runs out first and the others wait in the next "
        "step's collective (FSDP's all-gather) forever",
        rank=fewest, step=counts[fewest],
    )  # fmt: skip


def _batch_at(s: Seen, step: int, sliced: bool = False) -> tuple[Any, ...] | None:
    """What rank ``s`` read at ``step``: ids, contents (none where ``sliced``: a CP peer's
    slice of the sequence), weights and epochs; None past its end."""
    if step >= len(s.ids):
        return None
    contents = s.contents[step] if step < len(s.contents) and not sliced else []
    epochs = s.epochs[step] if s.epochs is not None and step < len(s.epochs) else None
    return s.ids[step], contents, s.weights[step], epochs


def judge_peers(seen: list[Seen], grid: Grid) -> Judgement | None:
    """Every TP/CP peer reads exactly its DP leader's batches (same samples, order, contents).

    Only the leaders' samples are counted (:func:`judge_counted_once`), so a peer is judged
    here, step by step against its leader: a peer that reads another replica's shard feeds
    one forward two halves of other samples while the leaders' counts stay exact. None when
    the layout has no peers (``tp = cp = 1``): the report then has no such rule.
    """
    inner = grid.tp * grid.cp
    if inner == 1:
        return None
    by_rank = {s.rank: s for s in seen}
    for s in sorted(seen, key=lambda x: x.rank):
        lead = by_rank.get(s.rank - s.rank % inner)
        if lead is None or lead is s:
            continue
        peer = f"rank {s.rank} (a TP/CP peer of rank {lead.rank}, its DP leader)"
        # A CP peer holds its own slice of each sample's sequence: other contents, rightly
        # (TP innermost: a rank's cp_rank is (rank // tp) % cp; the leader's is 0).
        sliced = (s.rank // grid.tp) % grid.cp != 0
        for step in range(max(len(s.ids), len(lead.ids))):
            mine, theirs = _batch_at(s, step, sliced), _batch_at(lead, step, sliced)
            if mine == theirs:
                continue
            if mine is None or theirs is None:
                why = (
                    f"{peer} took {len(s.ids)} steps, its leader {len(lead.ids)}: the peers of "
                    "one forward must step together"
                )
            elif mine[0] != theirs[0] and sorted(i for ids in s.ids for i in ids) == sorted(
                i for ids in lead.ids for i in ids
            ):
                why = (
                    f"{peer} read rank {lead.rank}'s samples in another order (step {step}: "
                    f"{mine[0][:4]}, not {theirs[0][:4]}): a shuffle seeded per global rank; "
                    "seed it the same on every rank of a TP/CP group (by dp_rank at most)"
                )
            elif mine[0] != theirs[0]:
                why = (
                    f"{peer} read samples {mine[0][:4]} at step {step} where rank {lead.rank} "
                    f"read {theirs[0][:4]}: one forward's parts get other samples (a loader "
                    "sharded by the global rank, or by another replica's dp_rank): build every "
                    "rank's loader from layout.dp_rank and layout.dp_size"
                )
            else:
                why = (
                    f"{peer} read the same samples as rank {lead.rank} at step {step}, but "
                    "other contents, weights or epochs: data made per rank (a generator seeded "
                    "by the global rank): make each sample a function of its index"
                )
            return Judgement("tp_identical", Verdict.FAIL, why, rank=s.rank, step=step)
    return Judgement(
        "tp_identical", Verdict.PASS,
        f"every TP/CP peer read its DP leader's batches: the same samples, in the same order, "
        f"with the same contents{' where they share a cp_rank' if grid.cp > 1 else ''} "
        f"({len(seen)} ranks, groups of {inner})",
    )  # fmt: skip


def check_eval(
    make_loader: Callable[..., Any],
    layout: str | Mapping[str, int] | Grid = "dp=2",
    *,
    key: str = "auto",
    weight: str = "weight",
    num_samples: int | None = None,
    collective_step: bool = True,
    timeout: float = 60.0,
    cluster: Any = None,
) -> EvalReport:
    """Run an evaluation loader once on real ranks and judge whether its metric would be exact.

    Every rank calls ``make_loader(layout)`` and iterates it to its end. A sample's
    weight is its ``weight`` field (1 when batches carry none); the weights of each
    sample summed over every rank must be exactly 1: a repeat (``DistributedSampler``'s
    padding) or a drop (``drop_last``) is a violation here, not "expected". What a sample
    carries is judged by reading a few samples again from ``loader.dataset`` in the rank
    (:mod:`~ezpz_nb.verify.seen_reread`): a sample delivered with another's data (a loss
    read wrong in a worker) fails ``counted_once``; where no sample can be read again (the
    loader's dataset is a list of positions, a stream) the contents are trusted, and the
    rule's reason says so.

    Args:
        make_loader: ``make_loader(layout) -> iterable of batches`` with sample ids
            (an ``index`` field, or ``key=``).
        layout: ``"dp=3"`` (``tp``/``cp`` optional), a dict or a ``Grid``.
        key: The field naming each sample (see :func:`check_contract`).
        weight: The field holding each sample's weight (0 marks padding).
        num_samples: Declares the universe ``range(num_samples)``; by default the
            dataset's own: a ``Subset``'s (``random_split``'s) indices, composed through
            nested wrappers, else ``len`` of the dataset under any shard wrapper.
        collective_step: The eval step makes a collective (FSDP, TP): unequal
            steps then hang, a failure; False makes unequal steps "not asked"
            (no obstacle to a PASS).
        timeout: Seconds for the whole run.
        cluster: Run on this warm :class:`ezpz_nb.Cluster` (its size must match).

    Returns:
        An :class:`~ezpz_nb.verify.EvalReport` with rules ``counted_once`` and ``equal_steps``,
        and ``tp_identical`` where the layout has TP/CP peers (:func:`judge_peers`).

    Raises:
        VerifyError: Bad arguments (before any rank starts), a hang, or the loader raised.
    """
    grid = parse_layout(layout)
    if num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        raise VerifyError(f"num_samples must be a positive int or None, got {num_samples!r}")
    seen = run_seen(make_loader, grid, key, weight, None, timeout, cluster, num_samples)
    once = with_contents(judge_counted_once(seen, num_samples), seen, "eval")
    judged = [once, judge_equal_steps(seen, collective_step)]
    peers = with_slices(judge_peers(seen, grid), seen, "eval")  # CP peers hold each sample
    judged += [peers] if peers is not None else []
    # The report's first line names the universe the samples were counted over.
    ids = (i for x in seen for step in x.ids for i in step)
    known = universe_of([x.dataset for x in seen], num_samples, ids)
    over = f", over {known.how}" if known.how and not any(x.names for x in seen) else ""
    return seen_report(make_loader, grid, f"eval{over}", "eval", judged, seen)
