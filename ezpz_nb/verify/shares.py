"""The DP replicas' batches at one step: as large as each other, but for a replica's last.

DDP averages the replicas' gradients, each the mean over that replica's own batch. Where
the replicas batch 5 and 3 samples at one step, a sample of the 3-sample batch weighs 5/3
of one of the other, though the global batch (8) keeps its size and every sample comes
once (the ninth trial's loader: shares of 20 and 12 of 32, four steps each). So at every
step the replicas' batches must be as large as each other, except where the step is a
replica's last of the epoch: there it holds the remainder of its share
(``DataLoader(drop_last=False)``), and shares that differ by one sample (a stream dealt
``i % dp``) leave remainders that differ.

"As large" is counted two ways, and a step is at fault only when both differ: the samples
the batch carries (its ids), and the rows of its largest field that hold data, with their
shape (:func:`~ezpz_nb.verify.batches.batch_rows`): a packer fills fixed rows with however
many samples fit, so its replicas' sample counts differ while their rows match. Rows all of
one value (zeros added to even out the rows) hold no data, and rows of another width are
other rows (samples padded longer). A batch without a numeric field (raw text) is counted
by its samples alone. For the same reason :func:`packed_batch` takes a global batch whose
samples change from step to step but whose rows of data do not (packed) as keeping its size.

What the check cannot see: a loss that divides a sum by the global batch's size weighs
every sample alike with any split; the rule assumes the usual mean per replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ezpz_nb.ledger import Problem
from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.report import Finding

__all__ = ["packed_batch", "share_findings", "unvouched_rows", "vouched"]

_HINT = (
    "give every replica the same batch size and an equal share of the epoch (a sampler "
    "deals ceil(N / dp) each, as DistributedSampler does); only a replica's last batch may "
    "hold less (its remainder)"
)


def _data_rows(outs: Sequence[Outcome]) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Each leader's rows of data per ``(rank, epoch, step)``: :attr:`Outcome.rows`, less the
    rows a short batch was padded with to the full batches' count.

    A rank whose batches its re-read showed padded (:mod:`.padding`: rows of values in none
    of the batch's samples beside rows of theirs) holds a row of data per sample in each
    batch of more rows than samples (the eleventh trial padded every batch, the full ones
    too). Where the re-read vouched for no rank's rows (a stream), the counts decide:
    where every batch of the most samples (``m``) holds a row per sample, a batch of fewer
    samples with more rows (``m`` at most) was padded to look full (the tenth trial's rows
    of random tokens; blank rows and copies count nothing already). A chunker whose short
    batches hold two rows a sample does that too, so a vouched rank is never counted so.
    """
    padded = {o.rank for o in outs if o.padded}
    # Ranks the re-read judged at all: vouched, padded, or unsure (a window, a text dataset:
    # not judged then, never recounted by the rule below).
    read = {o.rank for o in outs if o.rows_vouched or o.rows_unsure or o.padded}
    got: dict[tuple[int, int, int], tuple[tuple[int, ...], int]] = {}
    for o in outs:
        for r in o.records:
            if r.tp_rank == 0 and r.cp_rank == 0:
                got[(r.rank, r.epoch, r.step)] = (
                    o.rows.get((r.epoch, r.step), ()),
                    len(r.sample_ids),
                )
    m = max((n for _, n in got.values()), default=0)
    full = [rows for rows, n in got.values() if n == m]
    tied = m > 0 and all(rows and rows[0] == m for rows in full)
    return {
        k: (n, *rows[1:])
        if rows and n < rows[0] and (tied and rows[0] <= m and k[0] not in read or k[0] in padded)
        else rows
        for k, (rows, n) in got.items()
    }


def vouched(outs: Sequence[Outcome]) -> set[int]:
    """Ranks whose rows past their samples the re-read showed to be the samples' data
    (:mod:`.padding`), in every batch it judged."""
    return {o.rank for o in outs if o.rows_vouched and not o.rows_unsure and not o.padded}


def _by_step(
    outs: Sequence[Outcome],
) -> dict[tuple[int, int], dict[int, tuple[int, tuple[int, ...], int]]]:
    """Per ``(epoch, step)``, each replica's ``(samples, rows of data, leader rank)``, less
    the steps where only remainders differ (a replica's last, within one of the others)."""
    size: dict[tuple[int, int, int], tuple[int, tuple[int, ...], int]] = {}
    data = _data_rows(outs)
    for o in outs:
        for r in o.records:
            if r.tp_rank == 0 and r.cp_rank == 0:
                rows = data[(r.rank, r.epoch, r.step)]
                size[(r.epoch, r.step, r.dp_rank)] = (len(r.sample_ids), rows, r.rank)
    last: dict[tuple[int, int], int] = {}
    full: dict[tuple[int, int], int] = {}  # a replica's largest batch before its last
    for epoch, step, dp in size:
        last[(epoch, dp)] = max(last.get((epoch, dp), step), step)
    for (epoch, step, dp), value in size.items():
        if step != last[(epoch, dp)]:
            full[(epoch, dp)] = max(full.get((epoch, dp), 0), value[0])
    at: dict[tuple[int, int], dict[int, tuple[int, tuple[int, ...], int]]] = {}
    for (epoch, step, dp), value in size.items():
        at.setdefault((epoch, step), {})[dp] = value
    for (epoch, step), by_dp in list(at.items()):
        ends = [dp for dp in by_dp if step == last[(epoch, dp)]]
        # A remainder: no more than the replica's full batches, and within one of the
        # others' (shares dealt perm[r::dp] differ by one). Else the last step hides
        # unequal shares (the eleventh trial's 5 and 1 after batches of 4).
        if (
            ends
            and all(by_dp[dp][0] <= full.get((epoch, dp), by_dp[dp][0]) for dp in ends)
            and (max(n for n, _, _ in by_dp.values()) - min(n for n, _, _ in by_dp.values()) <= 1)
        ):
            del at[(epoch, step)]
    return at


def unvouched_rows(outs: Sequence[Outcome]) -> str:
    """Why ``global_batch`` is not judged ("" where it is): steps whose replicas hold
    different numbers of samples in as many rows, where no re-read vouched for the rows of
    a replica holding more rows than samples (:func:`vouched`). Its rows may be a packer's
    or padding added to look full: counted by rows the step keeps the global batch, by
    samples it does not, and nothing shows which."""
    sure = vouched(outs)
    steps = [
        (epoch, step, by_dp)
        for (epoch, step), by_dp in sorted(_by_step(outs).items())
        if len({n for n, _, _ in by_dp.values()}) > 1
        and len({v for _, v, _ in by_dp.values()}) == 1
        and () not in {v for _, v, _ in by_dp.values()}
        and any(v[0] > n and rank not in sure for n, v, rank in by_dp.values())
    ]
    if not steps:
        return ""
    epoch, step, by_dp = steps[0]
    sizes = ", ".join(f"replica {d}: {by_dp[d][0]}" for d in sorted(by_dp))
    rows = "x".join(map(str, next(iter(by_dp.values()))[1]))
    stream = any(o.iterable for o in outs)
    why = (
        "a stream's samples cannot be read again"
        if stream
        else "its samples could not be read again alike (dataset[i] naming sample i, read "
        "twice the same), or some rows hold values neither clearly theirs nor clearly not"
    )
    return (
        f"at {len(steps)} step(s) the DP replicas' batches hold different numbers of samples in "
        f"as many rows (first: epoch {epoch}, step {step}: {sizes} samples, each {rows} rows "
        f"of data), and the rows past the samples were not shown to hold the samples' data: "
        f"{why}. Counted by rows the global batch keeps its size, by samples it does not. Give "
        "every replica as many samples a step, or read a map-style dataset (dataset[i] holds "
        "sample i) so the rows can be checked"
    )


def share_findings(outs: Sequence[Outcome]) -> list[Finding]:
    """Per epoch, the first step where the DP replicas' batches differ in size (samples and
    values both), that step being none of theirs' last; one finding an epoch. Only each
    replica's leader is read (its TP/CP peers hold the same samples, CP peers a slice)."""
    at = _by_step(outs)
    out: list[Finding] = []
    faulty: dict[int, list[int]] = {}
    for (epoch, step), by_dp in sorted(at.items()):
        samples = {n for n, _, _ in by_dp.values()}
        shapes = {v for _, v, _ in by_dp.values()}
        # Unknown rows (a text batch: ()) leave the samples to decide.
        if len(by_dp) > 1 and len(samples) > 1 and (len(shapes) > 1 or () in shapes):
            faulty.setdefault(epoch, []).append(step)
    for epoch, steps in sorted(faulty.items()):
        step = steps[0]
        by_dp = at[(epoch, step)]
        small = min(by_dp, key=lambda d: (by_dp[d][0], d))
        big = max(by_dp, key=lambda d: (by_dp[d][0], -d))
        n_small, n_big = by_dp[small][0], by_dp[big][0]
        sizes = ", ".join(f"replica {d}: {by_dp[d][0]}" for d in sorted(by_dp))
        more = f" ({len(steps) - 1} more such step(s) this epoch)" if len(steps) > 1 else ""
        out.append(
            Finding(
                "global_batch",
                "replica_batch",
                epoch,
                f"Epoch {epoch}, step {step}: the DP replicas' batches hold different numbers "
                f"of samples ({sizes}), and the step is no replica's last, or holds more than a "
                f"remainder{more}. DDP averages "
                f"the replicas' mean gradients, so a sample of replica {small}'s {n_small}-"
                f"sample batch weighs {n_big}/{n_small} of one of replica {big}'s: the global "
                "batch keeping its size does not make its samples weigh alike.",
                rank=by_dp[small][2],
                step=step,
                ranks=sorted(v[2] for v in by_dp.values()),
                hint=_HINT,
            )  # fmt: skip
        )
    return out


def packed_batch(p: Problem, outs: Sequence[Outcome]) -> Problem:
    """A ``batch_size`` finding (the global batch's samples changed) made expected where every
    batch's rows have one shape and every step holds as many rows of data over the replicas
    (the last one at most as many): rows filled with however many samples fit (packed) keep
    their size in tokens, not in samples."""
    if p.kind != "batch_size" or p.expected:
        return p
    totals: dict[int, int] = {}
    shapes = set()
    data = _data_rows(outs)
    for o in outs:
        for r in o.records:
            if r.epoch == p.epoch and r.tp_rank == 0 and r.cp_rank == 0:
                rows = data[(r.rank, r.epoch, r.step)]
                if not rows:  # no numeric field (text): the samples are all there is
                    return p
                shapes.add(rows[1:])
                totals[r.step] = totals.get(r.step, 0) + rows[0]
    steps = sorted(totals)
    full = {totals[s] for s in steps[:-1]}
    if len(shapes) != 1 or len(full) != 1 or totals[steps[-1]] > min(full):
        return p
    shape = "x".join(map(str, shapes.pop())) or "1"
    return replace(
        p,
        expected=f"every step holds {min(full)} rows of {shape} values over the replicas (the "
        "last one at most as many): rows filled with however many samples fit (packed) keep the "
        "global batch's size in tokens while its samples vary",
    )
