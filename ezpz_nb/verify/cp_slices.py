"""Context-parallel slices: a replica's CP ranks together hold each sample's values.

The ledger compares bytes only among the ranks of one ``cp_rank`` (TP peers): CP peers hold
the same samples as different slices of each sequence, rightly, so a loader whose every CP
rank kept the first half of each sequence, or whose split left token 3 on no CP rank, passed
(the twelfth trial). So in a CP layout each rank with ``tp_rank`` 0 keeps (:class:`CpKeep`),
for a few samples an epoch picked by a hash of the id salted per check (:func:`picked`: every
CP peer keeps the same ones, and a loader cannot tell which), what each content field
delivered of them. The replica's leader reads each kept sample again whole (``dataset[i]``
through torch's default collate, :meth:`.reread.Reread.read_values`), and :func:`cp_findings`
asks that its CP ranks' values together be the sample's, as multisets: a contiguous split, a
load-balanced zigzag, peers that each hold the whole sample (``context_parallel()`` shards
the buffers itself) and peers that together hold the sample less its last (or first) value
(a next-token loss's inputs, or labels) pass; a gap (a value on no CP rank) or an overlap
(on two) fails. Each part must also be the sample's values in order, at most two runs of
it (a zigzag's two chunks): a half reversed passes as a multiset (the thirteenth trial;
:mod:`.cp_parts` compares).

The batch's pad (the value the parts hold most of among those in no sample read again, as
:mod:`.padding` leaves it out of rows) is left out of the parts: a part padded to an equal
length over a gap shows the gap. A field whose parts still hold values the sample lacks (a
collate that masks, scales or tokenizes) is not judged, and so is the rule, whatever other
field was judged. A targets field (``labels``...) whose parts only miss values, in order,
was masked by the collate (a prompt's labels set to the ignore index): not a gap; the same
shape in the inputs is one. Where no sample could be read again (a stream, a list of batches, a
dataset whose items do not name their index, a resumed part) the rule is "not judged", why.

``check_contract``'s ranks (:class:`~ezpz_nb.verify.observe.Outcome`) say where they sit by
their step records (:func:`record_place`); ``check_eval`` and ``check_steps``'s ranks
(:class:`~ezpz_nb.verify.seen.Seen`) by the layout they kept, through
:func:`~ezpz_nb.verify.seen_reread.with_slices`.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from ezpz_nb.verify.cp_parts import compare, flat_values, pads
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.reread import Reread
from ezpz_nb.verify.samples import sample_columns

#: Where a rank sits: ``(dp_rank, tp_rank, cp_rank, cp_size)``.
Place = tuple[int, int, int, int]

__all__ = ["KEEP", "CpKeep", "Place", "cp_findings", "picked", "record_place"]

#: Samples a CP rank keeps an epoch, about (a fixed share of the dataset's length).
KEEP = 8
# At most this many an epoch: a dataset of unknown length keeps its first ones.
_MOST = 4 * KEEP


def picked(salt: int, epoch: int, i: int, size: int | None) -> bool:
    """Whether sample ``i`` of ``epoch`` is kept: about :data:`KEEP` of ``size`` samples,
    alike on every rank of one check (the same ``salt``)."""
    rate = max(1, (size or 0) // KEEP)
    digest = hashlib.blake2b(f"{salt}:{epoch}:{i}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % rate == 0


class CpKeep:
    """What a CP rank delivered of a few samples an epoch; its leader reads them again whole.

    Args:
        layout: The rank's layout (kept only where ``cp_size > 1`` and ``tp_rank == 0``).
        reread: The rank's :class:`~.reread.Reread` (on at the replica's leader only).
        salt: The same on every rank of a check, drawn anew per check.
        size: The dataset's length, where known.
    """

    def __init__(self, layout: Any, reread: Reread, salt: int, size: int | None) -> None:
        self.on = layout.cp_size > 1 and layout.tp_rank == 0
        self.reread, self.salt, self.size = reread, salt, size
        # (epoch, id) -> (step, {field path: the values delivered, 8 bytes each}).
        self.kept: dict[tuple[int, int], tuple[int, dict[str, bytes]]] = {}
        # (epoch, id) -> {field path: the sample's values, dataset[id] read again}: the leader's.
        self.rows: dict[tuple[int, int], dict[str, list[Any]]] = {}
        self._count: Counter[int] = Counter()

    def see(self, batch: Any, ids: list[int], key: str, epoch: int, step: int) -> None:
        """Keep the picked samples of ``batch``. Never raises."""
        if not self.on or self._count[epoch] >= _MOST:
            return
        mine = [k for k, i in enumerate(ids) if picked(self.salt, epoch, i, self.size)]
        if not mine:
            return
        cols = sample_columns(batch, key, len(ids))
        for k in mine[: _MOST - self._count[epoch]]:
            self.kept[(epoch, ids[k])] = (step, {p: v[k] for p, v in cols.items()})
            self._count[epoch] += 1

    def read(self, epoch: int, deadline: float) -> None:
        """At the leader, read this epoch's kept samples again whole. Never raises."""
        if not self.reread.on:
            return
        for (e, i), (_, cols) in list(self.kept.items()):
            if e != epoch or time.monotonic() > deadline:
                continue
            try:
                got = {p: self.reread.read_values(i, p) for p in cols}
            except Exception:  # noqa: BLE001 - the user's dataset: a sample that cannot say
                continue
            self.rows[(e, i)] = {p: v for p, v in got.items() if v is not None}


def record_place(o: Any) -> Place | None:
    """Where a ``check_contract`` rank sits, as its first step record says (None: no step)."""
    if not o.records:
        return None
    r = o.records[0]
    return r.dp_rank, r.tp_rank, r.cp_rank, r.cp_size


def _replicas(
    outs: Sequence[Any], place: Callable[[Any], Place | None]
) -> dict[int, dict[int, Any]]:
    """``{dp_rank: {cp_rank: rank's outcome}}`` of the ranks with ``tp_rank`` 0."""
    out: dict[int, dict[int, Any]] = {}
    for o in outs:
        at = place(o)
        if at is not None and at[1] == 0:
            out.setdefault(at[0], {})[at[2]] = o
    return out


def cp_findings(
    outs: Sequence[Any], place: Callable[[Any], Place | None] = record_place, done: str = "trained"
) -> tuple[list[Finding], str]:
    """The first sample whose CP ranks together do not hold its values, as a ``tp_identical``
    failure; and why the rule was not judged (``""``: judged, or no CP layout).

    ``outs``: the ranks' outcomes, each with ``rank``, ``cp_kept`` and ``cp_rows`` (a
    :class:`CpKeep`'s); ``place``: where one sits (default: a
    :class:`~ezpz_nb.verify.observe.Outcome`'s records); ``done``: what the sequence is for,
    in the failure's words (``"trained"``, ``"evaluated"``)."""
    cp = max((p[3] for p in map(place, outs) if p is not None), default=1)
    if cp < 2:
        return [], ""
    read, kept = 0, 0
    items = []  # (replica, peers, epoch, id, the sample's values, its peers' kept parts)
    for d, peers in sorted(_replicas(outs, place).items()):
        lead = peers.get(0)
        if lead is None or len(peers) < cp:
            continue
        kept += len(lead.cp_kept)
        for (epoch, i), row in sorted(lead.cp_rows.items()):
            read += bool(row)
            items.append(
                (d, peers, epoch, i, row, [peers[c].cp_kept.get((epoch, i)) for c in range(cp)])
            )
    pad = pads([(row, held) for *_, row, held in items])
    judged, unsure = 0, set()
    for d, peers, epoch, i, row, held in items:
        for path, values in sorted(row.items()):
            parts = [h[1].get(path) for h in held if h is not None]
            if len(parts) < cp or any(p is None for p in parts):
                continue
            flat = flat_values(values, [p for p in parts if p is not None])
            got = None if flat is None else compare(*flat, pad.get(path))
            if got is None:
                unsure.add(path.lstrip("/") or "the sample")
                continue
            judged += 1
            if _masked(path, got):
                continue
            if got[0] or got[1] or got[2] >= 0:
                step = held[0][0] if held[0] is not None else None
                return [_finding(epoch, i, d, step, path, len(values), got, peers, done)], ""
    if unsure:
        # A field not judged stays so where another was: its slices could hide a gap.
        return [], (
            f"CP peers hold their own slices: every CP rank's values of {', '.join(sorted(unsure))} "
            "are not all among the sample's as dataset[i] holds them, the batch's pad left out (a "
            "collate that masks or tokenizes), so whether the CP ranks together hold each sample "
            "is not judged"
        )
    if judged:
        return [], ""
    if read:
        return [], (
            "CP peers hold their own slices, and no sample read again from dataset[i] was kept "
            "by every CP rank of its replica, so whether the CP ranks together hold each sample "
            "is not judged"
        )
    if not kept:
        return [], (
            "CP peers hold their own slices, which their bytes cannot compare, and none of the "
            f"samples delivered was among the few picked to be read again (about {KEEP} of "
            "num_samples or len(dataset): a run much shorter than that, or ids hashed from the "
            "bytes): whether the CP ranks together hold each sample's tokens is not judged"
        )
    return [], (
        "CP peers hold their own slices, which their bytes cannot compare, and no sample could "
        "be read again whole from loader.dataset (a stream, a list of batches, a dataset whose "
        "items do not name their index, a resumed part): whether the CP ranks together hold "
        "each sample's tokens is not judged"
    )


#: Fields a loss reads its targets from: a collate masks some with the pad (-100, the ignore
#: index), a fine-tuning prompt's labels, in place of their values.
_TARGETS = ("labels", "label", "targets", "target")


def _masked(path: str, got: tuple[Counter[Any], Counter[Any], int]) -> bool:
    """Whether a targets field's CP parts miss values only (none extra, in order): masked by
    the collate, as the loss ignores them; the inputs (every other field) never are."""
    missing, extra, order = got
    return path.rsplit("/", 1)[-1] in _TARGETS and bool(missing) and not extra and order < 0


def _finding(
    epoch: int, i: int, replica: int, step: int | None, path: str, n: int,
    got: tuple[Counter[Any], Counter[Any], int], peers: dict[int, Any], done: str,
) -> Finding:  # fmt: skip
    missing, extra, order = got
    field = path.lstrip("/") or "the sample"
    parts = []
    for count, where in (
        (sum(missing.values()), "no CP rank"),
        (sum(extra.values()), "two or more"),
    ):
        if count:
            parts.append(f"{count} of its {n} values {'is' if count == 1 else 'are'} on {where}")
    ranks = sorted(o.rank for o in peers.values())
    at = f"Epoch {epoch}: sample {i}'s {field} (DP replica {replica}, step {step})"
    if parts:
        said = (
            f"{at} is not held whole by its {len(peers)} CP ranks together (read again from "
            f"dataset[{i}]): {' and '.join(parts)}, so part of the sequence is "
            f"{f'never {done}' if missing else f'{done} twice'} in context parallel."
        )
        rank = peers[max(peers)].rank
    else:
        said = (
            f"{at}: CP rank {order}'s part holds the sample's values (read again from "
            f"dataset[{i}]) out of their order, not as one run of the sequence (or the two "
            f"chunks of a zigzag): reversed or shuffled, so that part is {done} as another "
            "sequence in context parallel."
        )
        rank = peers[order].rank
    return Finding(
        "tp_identical", "tp_mismatch", epoch, said,
        rank=rank, step=step, sample=str(i), ranks=ranks,
        hint="each CP rank must keep its own part of every sequence, in the sequence's order: "
        "offset the slice by cp_rank (positions cp_rank*L/cp_size to (cp_rank+1)*L/cp_size, or "
        "the load-balanced chunks cp_rank and 2*cp_size-1-cp_rank), so that the CP ranks "
        "together hold every token once; or give every CP rank the whole sequence, as torch's "
        "context_parallel() shards it itself",
    )  # fmt: skip
