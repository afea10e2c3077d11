"""From what the ranks observed to a :class:`~ezpz_nb.verify.Report`: findings and rules not judged."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from ezpz_nb.ledger import Ledger, Problem, StepRecord, check_records
from ezpz_nb.verify import hints
from ezpz_nb.verify.observe import Grid, Outcome
from ezpz_nb.verify.ranks import Ranks
from ezpz_nb.verify.report import Finding, Report
from ezpz_nb.verify.verdict import RULES

__all__ = ["findings_from", "judge"]

_BIG_INT = re.compile(r"\b\d{12,}\b")
_SENTENCE = re.compile(r"(?<=\.)\s+(?=[A-Z])")  # a sentence's end ("e.g. step 3" is not one)
_RULE_OF = {kind: rule for rule, (_, kinds) in RULES.items() for kind in kinds}


def _fact(message: str) -> str:
    """The first sentence of a ledger message: what happened, without its general advice."""
    return _SENTENCE.split(message, maxsplit=1)[0]


def _hint(p: Problem, recs: Sequence[StepRecord], outs: Sequence[Outcome]) -> str:
    """A cause chosen from the evidence, for the kinds whose general advice can mislead."""
    if p.expected:
        return ""
    if p.kind == "dp_duplicate":
        return hints.dp_hint(recs)
    if p.kind == "tp_mismatch":
        return hints.tp_hint(recs, same_ids="same sample ids" in p.message)
    if p.kind == "never_seen":
        return hints.never_seen_hint(next((o.allowance for o in outs if o.allowance), None))
    if p.kind == "order_unchanged":
        shufflers = sorted({s for o in outs for s in o.shufflers})
        return hints.order_hint(shufflers, sorted({s for o in outs for s in o.unreached}))
    return ""


def findings_from(
    problems: Iterable[Problem],
    ledger: Ledger,
    names: Mapping[int, str],
    outcomes: Sequence[Outcome] = (),
) -> list[Finding]:
    """The ledger's problems as :class:`Finding` s, samples named by their keys.

    With the rank ``outcomes``, a problem whose general advice could contradict
    the evidence gets its first sentence as message and a hint chosen from the
    records instead (:mod:`ezpz_nb.verify.hints`).
    """
    by_step = {(r.rank, r.epoch, r.step): r for r in ledger.records}
    out = []

    def named(m: re.Match[str]) -> str:
        return names.get(int(m.group()), m.group())

    for p in problems:
        rank, step, sample = p.first
        worker = None
        rec = by_step.get((rank, p.epoch, step)) if rank is not None and step is not None else None
        if (
            rec is not None
            and sample in rec.sample_ids
            and len(rec.worker_ids) == len(rec.sample_ids)
        ):
            worker = rec.worker_ids[rec.sample_ids.index(sample)]
        hint = (
            _hint(p, [r for r in ledger.records if r.epoch == p.epoch], outcomes)
            if outcomes
            else ""
        )
        message = _fact(p.message) if hint else p.message
        out.append(
            Finding(
                # Ids hashed from keys read back as the keys.
                _RULE_OF[p.kind],
                p.kind,
                p.epoch,
                _BIG_INT.sub(named, message) if names else message,
                p.expected,
                rank,
                step,
                None if sample is None else names.get(sample, str(sample)),
                worker,
                hint=hint,
                ranks=list(p.ranks),
            )  # fmt: skip
        )
    return out


#: Checks that count what arrived: after a hang, the missing records would read as findings.
_COUNTED = ("step_mismatch", "never_seen", "batch_size")

#: Why the counting rules are not judged after a hang (equal_steps keeps the hang itself).
HUNG = "the run hung; the records are only what arrived (the hang is the finding)"


def _stuck(ranks: Ranks, records: list[StepRecord]) -> list[Finding]:
    """A hang, said as the stacks show it: in a collective only when one is on the stack."""
    out = []
    for rank, where in sorted(ranks.hung.items()):
        steps = sum(1 for r in records if r.rank == rank)
        inside = (
            "blocked in a collective inside the loader, which never completed"
            if rank in ranks.in_collective
            else "still running inside the loader (no collective on its stack)"
        )
        # Records travel in bunches (observe._PUBLISH_S): a hung rank's last ones may be missing.
        done = (
            f"{steps} step(s) reported before" if steps else "no step reported before"
        ) + " (records are sent every 0.2 s: its last ones may be missing)"
        out.append(
            Finding(
                "equal_steps",
                "hang",
                max((r.epoch for r in records), default=0),
                f"Rank {rank} hung, {inside}; {done}: {where}.",
                rank=rank,
                step=steps or None,
                hint=(
                    "its ranks disagree on how many batches there are, or one rank stopped early"
                    if rank in ranks.in_collective
                    else hints.NO_KNOWN_CAUSE
                ),
            )  # fmt: skip
        )
    for o in ranks.outcomes:
        if o.phase == "timeout":
            last = o.records[-1] if o.records else None
            out.append(
                Finding(
                    "equal_steps",
                    "timeout",
                    last.epoch if last else 0,
                    f"Rank {o.rank} was still iterating after {len(o.records)} steps when the "
                    "time ran out: an endless stream (an IterableDataset that never stops, a "
                    "repeat()) gives no epochs to check. Cut it (take(n)) or raise timeout=.",
                    rank=o.rank,
                    step=last.step if last else None,
                )  # fmt: skip
            )
    return out


def _no_data(
    steps: Mapping[int, list[int]], outs: Sequence[Outcome], grid: Grid, start: int
) -> list[Finding]:
    """Epochs in which no rank took a step: a finding, never an empty pass."""
    out = []
    allowance = next((o.allowance for o in outs if o.allowance is not None), None)
    n = max((o.num_samples for o in outs if o.num_samples is not None), default=None)
    reiterable = all(o.reiterable for o in outs)
    length = max((o.length for o in outs if o.length is not None), default=None)
    epochs = len(next(iter(steps.values()), []))
    empty = [e for e in range(epochs) if not any(s[e] for s in steps.values())]
    if len(empty) == epochs and epochs:
        hint = hints.no_data_hint(start, False, reiterable, allowance, n, grid.dp, length)
        return [
            Finding(
                "equal_steps",
                "no_data",
                start,
                f"The loader gave no batch at all: no rank took a step in any of the "
                f"{epochs} epoch(s).",
                rank=min(steps),
                step=0,
                hint=hint,
                ranks=sorted(steps),
            )  # fmt: skip
        ]
    for e in empty:
        hint = hints.no_data_hint(start + e, e > 0, reiterable, allowance, n, grid.dp, length)
        out.append(
            Finding(
                "equal_steps",
                "no_data",
                start + e,
                f"Epoch {start + e}: no rank took a step (steps per rank: "
                f"{ {r: s[e] for r, s in steps.items()} }).",
                rank=min(steps),
                step=0,
                hint=hint,
                ranks=sorted(steps),
            )  # fmt: skip
        )
    return out


def _unjudged(
    grid: Grid, epochs_with_data: int, shuffle: bool, asked: bool, n: int | None, any_data: bool
) -> dict[str, str]:
    """``{rule: why}`` for the rules this run gave no evidence on."""
    out = {}
    if not any_data:
        why = "no batch to judge (see equal_steps)"
        return {
            r: why
            for r in ("tp_identical", "dp_disjoint", "exactly_once", "global_batch", "reshuffle")
        }
    if n is None and epochs_with_data < 2:
        out["exactly_once"] = (
            "no dataset length and one epoch: which samples were never seen cannot be told "
            "(pass num_samples=, or epochs=2)"
        )
    if not shuffle:
        out["reshuffle"] = (
            "shuffle=False was passed"
            if asked
            else "the loader asked for no shuffle (no shuffling sampler, RandomSampler or "
            "HF .shuffle() in it); pass shuffle=True to judge one the check cannot see"
        )
    elif epochs_with_data < 2:
        out["reshuffle"] = "fewer than two epochs with batches: no order to compare"
    return out


def judge(
    ranks: Ranks,
    *,
    what: str,
    grid: Grid,
    epochs: int,
    key: str,
    num_samples: int | None,
    shuffle: bool | None,
    wall_s: float,
    start_epoch: int = 0,
) -> Report:
    """Check the records of one run and write the report."""
    outs = ranks.outcomes
    records = [r for o in outs for r in o.records]
    names: dict[int, str] = {}
    for o in outs:
        names.update(o.names)
    n = (
        num_samples
        if num_samples is not None
        else max((o.num_samples or 0 for o in outs), default=0) or None
    )
    if names:  # ids hashed from keys or bytes: range(n) means nothing
        n = None
    with_data = len({r.epoch for r in records})
    # Without a dataset length, an epoch must cover what the epochs saw together.
    universe = (
        None if n is not None or with_data < 2 else {i for r in records for i in r.sample_ids}
    )
    allow = next((o.allowance for o in outs if o.allowance is not None), None)
    asked = shuffle is not None
    shuffled = any(o.shuffles for o in outs) if shuffle is None else shuffle
    ledger = Ledger(records, n)
    problems = check_records(
        records, n, universe=universe, allowance=allow, shuffle=shuffled, global_batch=True
    )
    if ranks.hung:  # records arrive in 0.2 s bunches: what is absent is timing, not evidence
        problems = [p for p in problems if p.kind not in _COUNTED]
    findings = _stuck(ranks, records) + findings_from(problems, ledger, names, outs)
    steps = {
        o.rank: [
            sum(1 for r in o.records if r.epoch == e)
            for e in range(start_epoch, start_epoch + epochs)
        ]
        for o in outs
    }
    if not ranks.hung and not any(o.phase == "timeout" for o in outs):
        findings += _no_data(steps, outs, grid, start_epoch)
    seconds = {
        "wall": wall_s,
        "loader": sum(o.loader_s for o in outs),
        "observe": sum(o.observe_s for o in outs),
    }
    key = next((o.key for o in outs if o.key), key)  # "auto" -> the field it found
    unjudged = _unjudged(
        grid,
        with_data,
        shuffled,
        asked,
        n if n is not None else (len(universe) if universe else None),
        bool(records),
    )
    if ranks.hung:
        unjudged.update(dict.fromkeys(("exactly_once", "global_batch"), HUNG))
    return Report(
        what, {"dp": grid.dp, "tp": grid.tp, "cp": grid.cp}, epochs, key, findings, steps,
        seconds, not_judged=unjudged, ledger=ledger,
    )  # fmt: skip
