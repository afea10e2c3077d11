"""Ids that name their data in an eval or steps check: a few delivered samples read again.

:func:`~ezpz_nb.verify.check_eval` and :func:`~ezpz_nb.verify.check_steps` count ids,
weights and epochs. A loader whose ids and weights are right while a sample carries another
sample's data passes them: the twelfth trial's dataset gave sample 22 the loss of sample 0 in
a DataLoader worker only, so the metric counted sample 0 twice and sample 22 never.
``check_contract`` catches the same bug by reading samples again
(:class:`~ezpz_nb.verify.reread.Reread`); the eval and steps checks run that re-read too: each
DP leader whose loader has a map dataset keeps a few samples as delivered (its first, and
others drawn at random), with their one-number fields (a loss, a label; not the weight or
the epoch, which a pad or a later epoch changes rightly), reads ``dataset[i]`` again in the
rank after the run and compares. :func:`judge_misread` fails a sample whose delivered data is
not ``dataset[i]``'s and is what another id carries (the re-read's own guards hold: a field is
judged only where another kept sample matched it exactly, a sample only where
``dataset[i]`` names it ``i`` and reads alike twice), or is made up
(:func:`~ezpz_nb.verify.reread.made_up_finding`).

A field that reads differently twice in any kept sample (an augmentation, a TTA draw) is
left out, the others judged. A one-number field is judged by its value: delivered other than
``dataset[i]``'s, where the rank's other kept samples matched it exactly, it fails (a default
0.0 from a worker's empty cache, another sample's 0/1 flag), unless the id carried the field
with two values (a pad flag on a padded copy). Persistent workers are re-read too: one run,
no epoch changes the dataset between delivery and re-read.

Where no leader could read a sample again (the loader's dataset is a list of positions, a
stream, a dataset whose items do not name their index, a loader without ``.dataset``) the
contents are trusted: :func:`trusted_note` says so in the report, and what to do. A rank
whose samples carry nothing but ids, weights and epochs has nothing to misread: no note.

In a CP layout the peers' contents differ rightly (each its slice of the sequence), so
``judge_peers`` compares them only among peers of one ``cp_rank``, and a loader whose every
CP rank kept the first half of each sequence, or left token 3 on none, passed.
:func:`with_slices` holds the CP ranks of each replica to each re-read sample's values
together (:func:`~ezpz_nb.verify.cp_slices.cp_findings`, as ``check_contract`` does) and fails
``tp_identical`` where they leave a gap, an overlap or a part out of order; where nothing
could be read again, ``tp_identical`` is not judged, as in ``check_contract``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ezpz_nb.verify.cp_slices import cp_findings
from ezpz_nb.verify.reread import ONE, Reread, made_up_finding
from ezpz_nb.verify.samples import SEP
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = [
    "REREAD_S", "judge_misread", "rank_reread", "trusted_note", "with_contents", "with_slices",
]  # fmt: skip

#: Seconds a rank may spend reading its kept samples again after the run.
REREAD_S = 5.0


def rank_reread(loader: Any, leader: bool, weight: str) -> Reread:
    """The re-read of a rank's samples: on at a DP leader whose loader has a map dataset,
    comparing one-number fields too, all but ``weight`` and ``epoch``."""
    from torch.utils.data import IterableDataset

    stream = isinstance(getattr(loader, "dataset", loader), IterableDataset)
    return Reread(loader, leader and not stream, tags=frozenset({weight, "epoch"}), once=True)


def _under(seen: Sequence[Any]) -> tuple[dict[str, set[int]], dict[tuple[str, int], set[str]]]:
    """``(under, values)``: a field's delivered content or one-number value -> the ids it was
    delivered under; and (a one-number field, an id) -> the values delivered under that id."""
    under: dict[str, set[int]] = {}
    values: dict[tuple[str, int], set[str]] = {}
    for s in seen:
        for step, ids in enumerate(s.ids):
            for rows, tag in ((s.contents, False), (s.tags, True)):
                row = rows[step] if step < len(rows) else []
                for i, joined in zip(ids, row if len(row) == len(ids) else [], strict=False):
                    for token in filter(None, joined.split(SEP)):
                        under.setdefault(token, set()).add(i)
                        if tag:
                            values.setdefault((token.rpartition(":")[0], i), set()).add(token)
    return under, values


def judge_misread(seen: Sequence[Any], purpose: str) -> Judgement | None:
    """The first kept sample delivered with another id's data (or made-up data), as a failure
    whose ``rule`` the caller fills in; None: none. ``seen``: the ranks'
    :class:`~ezpz_nb.verify.seen.Seen`; ``purpose``: ``"eval"`` or ``"steps"``.

    A one-number field (a loss) blames another sample only where one other id carries the
    value, in every delivery of it: that sample's own value. A value many ids share (a class
    label) or one an id carries only sometimes (a pad flag, 1 on a padded copy) says nothing.
    """
    found = sorted(
        (st, s.rank, i, t, made)
        for s in seen
        for i, _, st, t, made in s.misnamed
        if not made or made.startswith(ONE)
    )
    under, values = _under(seen) if found else ({}, {})
    for step, rank, i, token, made in found:
        others = sorted(under.get(token, set()) - {i})
        path = token.rpartition(":")[0]
        own = len(others) == 1 and values.get((path, others[0])) == {token}
        if made:  # a one-number field: its value, not whose it is, is judged
            if len(values.get((path, i), ())) > 1:
                continue  # an id that carries it only sometimes (a pad flag on a padded copy)
        elif not others:
            continue  # new data (noise, a mask)
        field = path.lstrip("/") or "the sample"
        read = f"dataset[{i}], read again in the rank after the run (twice alike),"
        does = "the metric counts" if purpose == "eval" else "training reads"
        got, held = made.removeprefix(ONE).split() if made else ("", "")
        if made and not own:  # a default, a flag: its value is not the sample's
            said = (
                f"{field} {got} where {read} holds {held}, while the rank's other samples read "
                f"again matched their delivered {field} exactly. The ids and weights look "
                f"right, but {does} sample {i} with a {field} not its own"
            )
        else:
            what = f"holds {field} {held}, and the {got} delivered is" if made else (
                "holds other values, and the ones delivered are")  # fmt: skip
            said = (
                f"another sample's {field}: {read} {what} sample {others[0]}'s. The ids and "
                f"weights look right, but {does} sample {others[0]}'s {field} twice and sample "
                f"{i}'s never"
            )
        return Judgement(
            "", Verdict.FAIL,
            f"sample {i} (rank {rank}, step {step}) was delivered with {said}. Yield dataset[i] "
            "under id i: look for what differs where the sample is read (a DataLoader worker, "
            "where get_worker_info() is set; a cache or file handle shared across the fork; an "
            "off-by-one at the data's end)",
            rank=rank, step=step, sample=str(i),
        )  # fmt: skip
    made = made_up_finding(seen)
    if made is None:
        return None
    return Judgement(
        "", Verdict.FAIL, f"{made.message} {made.hint}", rank=made.rank, step=made.step,
        sample=made.sample,
    )  # fmt: skip


def _carries(s: Any) -> bool:
    """Whether a rank's samples carry a field besides the id, weight and epoch."""
    return any(x for rows in (s.contents, s.tags) for row in rows for x in row)


def trusted_note(seen: Sequence[Any]) -> str:
    """``"; what each sample carries is trusted, not judged ..."`` naming the DP leaders whose
    samples carry data and that read no kept sample again alike (nothing there vouched that
    ids name their data), else ``""``."""
    leaders = [s.rank for s in seen if s.counts]
    # A rank whose samples carry nothing but ids, weights and epochs has no data to misread.
    unsure = [s.rank for s in seen if s.counts and not s.reread_alike and _carries(s)]
    if not unsure:
        return ""
    where = "on every rank" if unsure == leaders else f"on rank(s) {unsure}"
    return (
        f"; what each sample carries is trusted, not judged, {where}: no sample read again "
        "from loader.dataset matched what was delivered in any field (a list of positions, a "
        "stream, a dataset whose items do not name their index, a collate that changes every "
        "field), so a sample holding another sample's data under its own id would not show; "
        "to judge it, give the loader a map-style dataset whose dataset[i] holds sample i "
        "(its id field i) as the loader delivers it"
    )


def with_contents(judged: Judgement, seen: Sequence[Any], purpose: str) -> Judgement:
    """``judged`` (the ids' rule: ``counted_once``, ``balanced_coverage``) failed where a
    sample was delivered with another's data (:func:`judge_misread`) and it did not fail
    already; a pass says where the contents were trusted (:func:`trusted_note`)."""
    if judged.verdict is Verdict.FAIL:
        return judged
    misread = judge_misread(seen, purpose)
    if misread is not None:
        return replace(misread, rule=judged.rule)
    if judged.verdict is Verdict.PASS:
        return replace(judged, reason=judged.reason + trusted_note(seen))
    return judged


def with_slices(peers: Judgement | None, seen: Sequence[Any], purpose: str) -> Judgement | None:
    """``peers`` (``judge_peers``' ``tp_identical``; None: no TP/CP peers) failed where the CP
    ranks of a replica together do not hold a re-read sample's values (a gap, an overlap) and
    it did not fail already; not judged where they could not be held to it. ``seen``: the ranks'
    :class:`~ezpz_nb.verify.seen.Seen`; ``purpose``: ``"eval"`` or ``"steps"``."""
    if peers is None or peers.verdict is not Verdict.PASS:
        return peers
    done = "evaluated" if purpose == "eval" else "trained"
    found, unjudged = cp_findings(seen, lambda s: s.place, done)
    if found:
        f = found[0]
        # No epoch is known here (one pass, or epochs from a field): the words say none.
        said = f.message.removeprefix(f"Epoch {f.epoch}: ")
        hint = f.hint[:1].upper() + f.hint[1:]
        return Judgement("tp_identical", Verdict.FAIL, f"{said} {hint}", rank=f.rank,
                         step=f.step, sample=f.sample)  # fmt: skip
    if unjudged:  # as check_contract says: no evidence that the CP slices hold each sample
        return replace(peers, verdict=Verdict.NOT_JUDGED, reason=f"{peers.reason}; {unjudged}")
    if any(s.place is not None and s.place[3] > 1 for s in seen):
        return replace(peers, reason=f"{peers.reason}; the CP ranks of each replica together "
                       "hold every value of each sample read again from dataset[i], once")  # fmt: skip
    return peers
