"""Judges across ranks of :class:`~ezpz_nb.verify.reread.Reread`'s findings: a sample
delivered with another id's data (:func:`misnamed`) or with made-up data
(:func:`made_up_finding`), and whether every replica vouched for its ids (:func:`vouched`).
Split from ``reread.py`` (what one rank keeps and reads again) by concern: these read the
ranks' outcomes together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.samples import SEP

__all__ = ["SHIFT", "made_up_finding", "misnamed", "vouched"]

#: :meth:`~ezpz_nb.verify.reread.Reread.judge`'s ``made`` for data delivered under an id that
#: is another kept id's as read again, then that id: ``"read again as: 12"``.
SHIFT = "read again as: "


def misnamed(outs: Sequence[Any]) -> Finding | None:
    """The first sample delivered with another sample's data, as a ``dp_disjoint`` failure;
    None: none. ``outs``: the ranks' :class:`~ezpz_nb.verify.observe.Outcome`.

    Its delivered data is not ``dataset[id]``'s as its rank re-read it after the run
    (:class:`~ezpz_nb.verify.reread.Reread`), and is what another id carries in some batch: an augmentation in
    the loader makes new data, not another sample's. Else (:func:`made_up_finding`) made-up
    data under the id.
    """
    # Made-up data (zeros under several ids) is judged by its own words, below; a mask can
    # make one row another's (a mostly-zero row masked to 0), rightly.
    found = sorted(
        (e, s, o.rank, i, token, made)
        for o in outs
        for i, e, s, token, made in o.misnamed
        if not made or made.startswith(SHIFT)
    )
    under: dict[str, set[int]] = {}  # a field's content -> the ids it was delivered under
    for o in outs:
        for r in o.records:
            for i, d in zip(r.sample_ids, o.contents.get((r.epoch, r.step), []), strict=False):
                for token in d.split(SEP):
                    under.setdefault(token, set()).add(i)
    for epoch, step, rank, i, token, made in found:
        # Delivered under another id, or (a shift) another kept id's as read again.
        others = sorted(under.get(token, set()) - {i}) or (
            [int(made.removeprefix(SHIFT))] if made else []
        )
        if not others:
            continue
        field = token.rpartition(":")[0].lstrip("/") or "the sample"
        replica = next((r.dp_rank for o in outs if o.rank == rank for r in o.records), rank)
        return Finding(
            "dp_disjoint", "dp_duplicate", epoch,
            f"Epoch {epoch}: the batch under id {i} on rank {rank} (DP replica {replica}, "
            f"step {step}) holds other data ({field}) than dataset[{i}] (read again after the "
            f"epoch, twice alike): the data of id {others[0]}; ids must name the data.",
            rank=rank, step=step, sample=str(i), ranks=[rank],
            hint="yield dataset[i] under id i: a sample stamped with another id than the "
            "data it holds hides a repeat (or a loss) from every rule that counts ids",
        )  # fmt: skip
    return made_up_finding(outs)


def made_up_finding(outs: Sequence[Any]) -> Finding | None:
    """The first sample delivered with made-up data (:func:`~ezpz_nb.verify.reread.made_up`: one value in every
    place) under its id, in a field where no kept sample on any rank was changed in part;
    None: none. Changed in part (masking, noise, a shift) shows a loader that transforms
    samples, and such a loop may wipe a short row whole: not judged there."""
    changed = {
        t.rpartition(":")[0] for o in outs for *_, t, made in o.misnamed if made in ("", "mask")
    }
    found = sorted(
        (e, s, o.rank, i, t, made)
        for o in outs
        for i, e, s, t, made in o.misnamed
        if made in ("zeros", "one value") and t.rpartition(":")[0] not in changed
    )
    if not found:
        return None
    epoch, step, rank, i, token, made = found[0]
    field = token.rpartition(":")[0].lstrip("/") or "the sample"
    what = "all zeros" if made == "zeros" else "one value in every place"
    return Finding(
        "dp_disjoint", "dp_duplicate", epoch,
        f"Epoch {epoch}: the batch under id {i} on rank {rank} (step {step}) holds "
        f"{field} {what}, where dataset[{i}] (read again after the epoch, twice alike) holds "
        f"varied values ({len(found)} such sample(s) kept, and no kept sample changed in "
        f"part): made-up data under a real id; ids must name the data.",
        rank=rank, step=step, sample=str(i), ranks=sorted({x[2] for x in found}),
        hint="yield dataset[i] under id i: a placeholder (zeros) stamped with a real id "
        "trains on nothing while every rule that counts ids sees the sample as read",
    )  # fmt: skip


def vouched(outs: Sequence[Any]) -> bool:
    """Every DP replica's leader re-read kept samples alike (:attr:`~ezpz_nb.verify.reread.Reread.alike`) and no
    kept sample differed on any rank: the loader delivers ``dataset[i]`` under id ``i``.
    ``outs``: the ranks' :class:`~ezpz_nb.verify.observe.Outcome`."""
    replicas = {o.records[0].dp_rank for o in outs if o.records}
    sure = {
        o.records[0].dp_rank
        for o in outs
        if o.records and o.reread_alike and o.records[0].tp_rank == 0 and o.records[0].cp_rank == 0
    }
    return bool(replicas) and replicas <= sure and not any(o.misnamed for o in outs)
