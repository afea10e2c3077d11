"""Judge a mixture: does each source get its share, and is the stream the same at every layout?

Two rules, each answered with a :class:`~ezpz_nb.verify.Judgement` (pass on evidence,
fail with the first place at fault: ``step`` is the global batch, ``position`` the place
in the stream; not judged with why):

* :func:`check_mixture`: the realized share of every source within a bound of its weight,
  per global batch or cumulatively, counted in samples or in tokens.
* :func:`check_layout_invariance`: two runs of one stream (say dp=1 and dp=4, or 0 and 2
  workers) gave the same global batches of ``(source, index)`` in the same order; else the
  first global batch whose size differs, or the first position that differs.

A stream is a list of global batches, each a list of ``(source, index)`` pairs in order.
:func:`global_batches` builds one from what the DP ranks held at each step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from ezpz_nb.ledger import Ledger
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = [
    "Stream",
    "check_layout_invariance",
    "check_mixture",
    "global_batches",
    "ledger_stream",
]

#: Global batches, each a list of ``(source, index)`` in stream order.
Stream = list[list[tuple[int, int]]]


def global_batches(per_rank: Sequence[Sequence[Sequence[tuple[int, int]]]]) -> Stream:
    """Global batches from each DP rank's batches, ``per_rank[dp_rank][step]``.

    Step ``b``'s global batch is every rank's batch ``b`` in DP-rank order: the
    contiguous split :class:`~ezpz_nb.data.mixture.MixedLoader` makes.

    Raises:
        VerifyError: The ranks took different numbers of steps.
    """
    steps = {len(r) for r in per_rank}
    if len(steps) > 1:
        raise VerifyError(
            f"the DP ranks took {sorted(steps)} steps: a global batch needs a batch from every "
            "rank (check_contract's equal_steps rule says which rank is short)"
        )
    n = steps.pop() if steps else 0
    return [[tuple(p) for r in per_rank for p in r[b]] for b in range(n)]  # type: ignore[misc]


def ledger_stream(ledger: Ledger, epoch: int = 0) -> Stream:
    """The global batches of one epoch of a ledger, as ``(dataset_id, sample_id)`` pairs.

    Each step's records of DP leaders (``tp_rank == 0``, ``cp_rank == 0``: their peers
    hold the same samples), in DP-rank order. Records without ``dataset_ids`` (ledger
    format 5, from batches with a ``dataset_id`` entry) add nothing, so a ledger of
    batches that do not say gives an empty stream, which the judges do not judge.
    """
    leaders = sorted(
        (r for r in ledger.records if r.epoch == epoch and r.tp_rank == 0 and r.cp_rank == 0),
        key=lambda r: (r.dp_rank, r.step),
    )
    per_rank: dict[int, list[list[tuple[int, int]]]] = {}
    for r in leaders:
        pairs = list(zip(r.dataset_ids, r.sample_ids, strict=False))
        per_rank.setdefault(r.dp_rank, []).append(pairs)
    return global_batches([per_rank[d] for d in sorted(per_rank)])


def _amounts(stream: Stream, tokens: Sequence[Sequence[int]] | None) -> list[np.ndarray]:
    if tokens is None:
        return [np.ones(len(b)) for b in stream]
    if [len(t) for t in tokens] != [len(b) for b in stream]:
        raise VerifyError("tokens must give one count per sample of every global batch")
    return [np.asarray(t, dtype=np.float64) for t in tokens]


def check_mixture(
    stream: Stream,
    weights: Sequence[float],
    *,
    bound: float,
    per: str = "batch",
    tokens: Sequence[Sequence[int]] | None = None,
) -> Judgement:
    """Is every source's realized share within ``bound`` of its weight?

    Args:
        stream: Global batches of ``(source, index)``.
        weights: Target share of each source (normalized here).
        bound: In samples (no ``tokens``): the most a source's count may differ from
            ``weight * samples``; in tokens: the most its share of the tokens may
            differ from its weight (0.05 is five points).
        per: ``"batch"`` judges each global batch alone; ``"cumulative"`` judges
            everything up to the end of each batch.
        tokens: Tokens of each sample, shaped like ``stream``: judge in tokens.

    Raises:
        VerifyError: Bad weights, ``per`` or ``bound``, or ``tokens`` of the wrong shape.
    """
    w = np.asarray(list(weights), dtype=np.float64)
    if w.ndim != 1 or not w.size or np.any(w < 0) or not w.sum() > 0:
        raise VerifyError(f"weights {list(weights)!r}: one non-negative number per source")
    if per not in ("batch", "cumulative") or not bound >= 0:
        raise VerifyError(
            f"per={per!r}, bound={bound!r}: per is 'batch' or 'cumulative', bound >= 0"
        )
    w = w / w.sum()
    unit = "samples" if tokens is None else "tokens"
    if not stream or not any(stream):
        return Judgement(
            "mixture",
            Verdict.NOT_JUDGED,
            "the stream holds no samples to count (from a ledger: its batches carried no "
            "dataset_id, see MixedLoader)",
        )
    got = np.zeros(len(w))
    worst = 0.0
    for b, (batch, amount) in enumerate(zip(stream, _amounts(stream, tokens), strict=True)):
        src = np.array([s for s, _ in batch], dtype=np.int64)
        if src.size and (src.min() < 0 or src.max() >= len(w)):
            bad = int(src[(src < 0) | (src >= len(w))][0])
            return Judgement(
                "mixture",
                Verdict.NOT_JUDGED,
                f"batch {b} names source {bad}, outside the {len(w)} weights",
            )
        here = np.bincount(src, weights=amount, minlength=len(w)).astype(np.float64)
        got = got + here if per == "cumulative" else here
        total = got.sum()
        off = got - w * total if tokens is None else got / max(total, 1) - w
        s = int(np.argmax(np.abs(off)))
        worst = max(worst, float(abs(off[s])))
        if abs(off[s]) > bound + 1e-9:
            scope = f"batches 0-{b}" if per == "cumulative" else f"global batch {b}"
            return Judgement(
                "mixture",
                Verdict.FAIL,
                f"{scope}: source {s} has {got[s] / total:.1%} of the {unit} "
                f"({got[s]:g} of {total:g}) against a target of {w[s]:.1%}: "
                f"off by {abs(off[s]):.3g} {'samples' if tokens is None else '(share)'}, "
                f"the bound is {bound:g}",
                step=b,
            )
    return Judgement(
        "mixture",
        Verdict.PASS,
        f"every source within {bound:g} of its target in {unit}, {per}, over {len(stream)} "
        f"global batches (worst {worst:.3g})",
    )


def check_layout_invariance(
    a: Stream, b: Stream, *, names: tuple[str, str] = ("first", "second")
) -> Judgement:
    """Did two runs of one stream give the same global batches, in the same order?

    A global batch is compared as a multiset (the samples of one optimizer step: their
    order inside the step does not change the gradient). Invariance is per global batch, not per flattened stream: the global batch size is
    part of the contract (it sets the optimizer's steps and the effective learning
    rate), so two runs whose flattened streams agree but whose global batches differ in
    size (each rank taking whole global batches in turn) fail, saying so.

    Args:
        a: The stream of one run (e.g. at dp=1).
        b: The stream of the other (e.g. at dp=4, or resumed).
        names: What to call the two runs in the message.
    """
    if not any(a) or not any(b):
        empty = names[0] if not any(a) else names[1]
        return Judgement(
            "layout_invariance",
            Verdict.NOT_JUDGED,
            f"the {empty} run's stream holds no (source, index) pairs: its batches carried no "
            "dataset_id entry (ledger_stream pairs each sample id with it; add dataset_id=0 "
            "to each sample of a single source), or it took no step",
        )

    def fail(reason: str, step: int, at: int) -> Judgement:
        return Judgement("layout_invariance", Verdict.FAIL, reason, step=step, position=at)

    position = 0
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if len(x) != len(y):
            return fail(
                f"global batch {k}: {names[0]} had {len(x)} samples, {names[1]} had {len(y)}: "
                "the global batch size changed with the layout, which changes the optimizer's "
                "steps and the effective learning rate (keep the global batch fixed: the "
                "per-rank batch is global batch / dp)",
                k,
                position,
            )
        # One global batch is one optimizer step: the order inside it does not change
        # the gradient, so the batches are compared as multisets.
        extra = Counter(map(tuple, x)) - Counter(map(tuple, y))
        if extra:
            slot = next(
                i for i, (p, q) in enumerate(zip(x, y, strict=True)) if tuple(p) != tuple(q)
            )
            lacks = next(tuple(p) for p in x if tuple(p) in extra)
            return fail(
                f"position {position + slot} (global batch {k}, slot {slot}): {names[0]} had "
                f"(source, index) {tuple(x[slot])}, {names[1]} had {tuple(y[slot])}, and the "
                f"global batches hold other samples ({names[1]}'s lacks {lacks}): the samples "
                "of an optimizer step changed with the layout",
                k,
                position + slot,
            )
        position += len(x)
    if len(a) != len(b):
        n = min(len(a), len(b))
        return fail(
            f"the same first {n} global batches, then {names[0]} had {len(a)} and {names[1]} "
            f"{len(b)}",
            n,
            position,
        )
    return Judgement(
        "layout_invariance",
        Verdict.PASS,
        f"{names[0]} and {names[1]}: the same {len(a)} global batches ({position} (source, "
        "index) pairs) in order; within a global batch order is not compared",
    )
