"""What each rank's loader settings allow: ``drop_last`` read per rank, findings held to it.

Every rank reports its own :class:`~ezpz_nb.ledger.Allowance` (``drop_last`` from the
DataLoader, its batch sampler or the ``DistributedSampler`` inside it). The ledger's
checks take one allowance for the layout (:func:`merged_allowance`: a flag set on any
rank counts, so the mirror cases of a flag set on one rank read the same);
:func:`exact_allowance` then keeps a "never seen" finding expected only if each rank's
own settings explain that many missing samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from ezpz_nb.ledger import Allowance, Problem, StepRecord
from ezpz_nb.verify.observe import Outcome

__all__ = ["exact_allowance", "merged_allowance", "remainder_batch"]


def merged_allowance(outs: Sequence[Outcome]) -> Allowance | None:
    """What any rank's settings allow: ``drop_last`` set on any rank counts.

    Every rank reports its own settings; a flag set on one rank only must explain
    the same findings whichever rank it is on (the mirror cases agree), and
    :func:`exact_allowance` then holds the findings to what each rank may drop.
    """
    allows = [o.allowance for o in outs if o.allowance is not None]
    if not allows:
        return None

    def any_of(values: Iterable[bool | None]) -> bool | None:
        known = [v for v in values if v is not None]
        return any(known) if known else None

    return Allowance(
        any_of(a.sampler_drop_last for a in allows),
        any_of(a.loader_drop_last for a in allows),
        # A custom batch sampler may not say its size: its largest batch does.
        max((a.batch_size for a in allows if a.batch_size), default=None)
        or max((len(r.sample_ids) for o in outs for r in o.records), default=None),
    )


def exact_allowance(p: Problem, outs: Sequence[Outcome], n: int | None) -> Problem:
    """``p`` with its ``expected`` kept only if each rank's own ``drop_last`` explains it.

    The ledger counts what the loader's ``drop_last`` may drop for the whole layout;
    with the flag on some ranks only (or batch sizes that differ), only those ranks'
    partial batches may go missing. Unknown shares leave the ledger's answer.
    """
    if p.kind != "never_seen" or not p.expected:
        return p
    leaders = [o for o in outs if o.allowance is not None and o.records[:1]
               and o.records[0].tp_rank == 0 and o.records[0].cp_rank == 0]  # fmt: skip
    if not leaders or any(o.share is None for o in leaders):
        return p
    loader = sum(
        (o.share or 0) % (o.allowance.batch_size or 1)
        for o in leaders
        if o.allowance is not None and o.allowance.loader_drop_last
    )
    dp = len(leaders)
    sampler = (n % dp if n is not None else dp - 1) if any(
        o.allowance is not None and o.allowance.sampler_drop_last for o in leaders
    ) else 0  # fmt: skip
    if len(p.samples) <= loader + sampler:
        return p
    return replace(p, expected="")


def remainder_batch(p: Problem, records: Sequence[StepRecord]) -> Problem:
    """A ``batch_size`` finding made expected when each replica's only short batch is its last.

    Every batch but the last full, on every replica: the last holds the remainder of the
    replica's share, as ``DataLoader(drop_last=False)`` keeps it, whatever made the
    batches (a hand-made loader has no ``drop_last`` to read). Samples dropped or
    repeated are the exactly-once rule's to judge.
    """
    if p.kind != "batch_size" or p.expected:
        return p
    sizes: dict[int, list[int]] = {}
    for r in sorted(records, key=lambda r: r.step):
        if r.epoch == p.epoch and r.tp_rank == 0 and r.cp_rank == 0:
            sizes.setdefault(r.dp_rank, []).append(len(r.sample_ids))
    full = max((n for s in sizes.values() for n in s), default=0)
    if not sizes or any(n != full for s in sizes.values() for n in s[:-1]):
        return p
    return replace(
        p,
        expected="each replica's last batch holds the remainder of its share, every other "
        "batch is full (as DataLoader(drop_last=False) keeps it; drop_last=True drops it)",
    )
