"""From what the ranks observed to a :class:`~ezpz_nb.verify.Report`: findings and rules not judged."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from ezpz_nb.ledger import Ledger, Problem, StepRecord, check_records
from ezpz_nb.verify import hints
from ezpz_nb.verify.allowances import exact_allowance, merged_allowance, remainder_batch
from ezpz_nb.verify.contents import content_findings, prefix_finding
from ezpz_nb.verify.cp_slices import cp_findings
from ezpz_nb.verify.observe import Grid, Outcome
from ezpz_nb.verify.orders import order_findings
from ezpz_nb.verify.ranks import Ranks
from ezpz_nb.verify.report import Finding, Report
from ezpz_nb.verify.shares import packed_batch, share_findings, unvouched_rows
from ezpz_nb.verify.universe import beyond_declared, universe_of
from ezpz_nb.verify.verdict import RULES

__all__ = ["epoch_universe", "fact", "findings_from", "judge"]

_BIG_INT = re.compile(r"\b\d{12,}\b")
_SENTENCE = re.compile(r"(?<=\.)\s+(?=[A-Z])")  # a sentence's end ("e.g. step 3" is not one)
_TWICE = {"dp_duplicate": "on two DP replicas", "rank_duplicate": "twice on one rank"}
_RULE_OF = {kind: rule for rule, (_, kinds) in RULES.items() for kind in kinds}


def fact(message: str) -> str:
    """The first sentence of a ledger message: what happened, without its general advice."""
    return _SENTENCE.split(message, maxsplit=1)[0]


def _same_share(recs: Sequence[StepRecord]) -> bool:
    """Every DP replica read the same samples (more than one replica)."""
    by_dp: dict[int, set[int]] = {}
    for r in recs:
        by_dp.setdefault(r.dp_rank, set()).update(r.sample_ids)
    return len(by_dp) > 1 and len({frozenset(v) for v in by_dp.values()}) == 1


def _hint(
    p: Problem,
    recs: Sequence[StepRecord],
    outs: Sequence[Outcome],
    unseen: bool = False,
    repeated: str = "",
) -> str:
    """A cause chosen from the evidence, for the kinds whose general advice can mislead.

    ``unseen``: the same epoch has samples never seen; ``repeated``: its duplicates, in
    words, when as many samples came twice as are missing.
    """
    if p.expected:
        return ""
    # A sampler, or a batch sampler's settings (drop_last, batch size), to blame at all.
    sampled = any(
        not o.iterable
        and (
            o.sampled
            or (
                o.allowance is not None
                and {o.allowance.loader_drop_last, o.allowance.batch_size} != {None}
            )
        )
        for o in outs
    )
    if p.kind == "dp_duplicate":
        return hints.dp_hint(
            recs, streams=any(o.iterable for o in outs), unseen=unseen, sampled=sampled
        )
    if p.kind == "tp_mismatch":
        return hints.tp_hint(recs, same_ids="same sample ids" in p.message)
    if p.kind == "never_seen":
        parts = {o.dataset.maps[0] for o in outs if o.dataset is not None and o.dataset.maps}
        return hints.never_seen_hint(
            merged_allowance(outs),
            same_share=_same_share(recs),
            parts=len(parts) > 1,
            sampled=sampled,
            repeated=repeated,
        )
    if p.kind == "step_mismatch":
        return hints.drop_last_differs({o.rank: o.allowance for o in outs})
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

    problems = list(problems)
    unseen = {p.epoch for p in problems if p.kind == "never_seen" and not p.expected}
    # Samples missing where as many came twice: the repeats took their places.
    twice: dict[int, dict[str, int]] = {}
    for p in problems:
        if p.kind in ("dp_duplicate", "rank_duplicate") and not p.expected:
            twice.setdefault(p.epoch, {})[p.kind] = len(p.samples)
    missing = {p.epoch: len(p.samples) for p in problems if p.kind == "never_seen"}
    repeated = {
        e: ", ".join(f"{n} {_TWICE[k]}" for k, n in sorted(kinds.items()))
        for e, kinds in twice.items()
        if sum(kinds.values()) == missing.get(e)
    }
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
            _hint(
                p,
                [r for r in ledger.records if r.epoch == p.epoch],
                outcomes,
                p.epoch in unseen,
                repeated.get(p.epoch, ""),
            )
            if outcomes
            else ""
        )
        message = fact(p.message) if hint else p.message
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
    allowance = merged_allowance(outs)
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


def _empty_steps(records: Sequence[StepRecord]) -> list[Finding]:
    """Steps that hold no sample: a finding at the first (equal steps made of empty batches).

    A DataLoader never yields an empty batch (under ``drop_last=False`` its last batch holds
    the remainder, one sample at least), so an empty one was made, e.g. to even out steps.
    """
    empty = [r for r in records if not r.sample_ids]
    if not empty:
        return []
    first = min(empty, key=lambda r: (r.epoch, r.step, r.rank))
    return [
        Finding(
            "equal_steps", "no_data", first.epoch,
            f"Rank {first.rank}'s step {first.step} holds no sample ({len(empty)} empty "
            "step(s) in all): a step that trains on nothing (its mean loss is NaN) while the "
            "optimizer and the schedule step on.",
            rank=first.rank, step=first.step, ranks=sorted({r.rank for r in empty}),
            hint="even out unequal shares with samples (DistributedSampler's padding) or "
            "drop them (drop_last=True), never with empty batches",
        )
    ]  # fmt: skip


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
    if not shuffle and not asked:
        out["reshuffle"] = (
            "the loader asked for no shuffle (no shuffling sampler, RandomSampler or "
            "HF .shuffle() in it); pass shuffle=False if that is meant, shuffle=True to "
            "judge one the check cannot see"
        )
    elif shuffle and epochs_with_data < 2:
        out["reshuffle"] = "fewer than two epochs with batches: no order to compare"
    return out


def epoch_universe(
    outs: Sequence[Outcome], num_samples: int | None, hashed: bool
) -> tuple[int | None, frozenset[int] | None, str, bool]:
    """``(n, ids, how, is_range)``: the ids every epoch must cover (:mod:`~ezpz_nb.verify.universe`).

    ``hashed``: ids hashed from keys or bytes, where ``range(n)`` means nothing.
    Without a dataset's universe, an epoch of a run with two epochs must cover what
    the epochs saw together, unless the universe is unknown for a reason (ids None,
    ``how`` the reason: ranks reading parts of different wholes).
    """
    records = [r for o in outs for r in o.records]
    known = universe_of(
        [o.dataset for o in outs], num_samples, (i for r in records for i in r.sample_ids)
    )
    if known.ids is not None and not hashed:
        return known.size, known.ids, known.how, known.is_range
    if known.how and not hashed:  # unknown, and why: the epochs' union would hide a part
        return None, None, known.how, False
    if len({r.epoch for r in records}) < 2:
        return None, None, "", False
    seen = frozenset(i for r in records for i in r.sample_ids)
    why = (
        "ids from keys or bytes: no range to hold them to"
        if hashed
        else "no dataset length"
        if known.outside is None
        else f"ids outside range({known.outside}), len(loader.dataset)"
    )
    return None, seen, f"the {len(seen)} ids the epochs saw together ({why})", False


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
    with_data = len({r.epoch for r in records})
    n, universe, how, ranged = epoch_universe(outs, num_samples, bool(names))
    allow = merged_allowance(outs)
    asked = shuffle is not None
    shuffled = any(o.shuffles for o in outs) if shuffle is None else shuffle
    ledger = Ledger(records, n if ranged else None)
    problems = check_records(
        records, n, universe=universe, allowance=allow, shuffle=shuffled, global_batch=True
    )
    problems = [
        packed_batch(remainder_batch(exact_allowance(p, outs, n), records), outs) for p in problems
    ]
    if ranks.hung:  # records arrive in 0.2 s bunches: what is absent is timing, not evidence
        problems = [p for p in problems if p.kind not in _COUNTED]
    findings = _stuck(ranks, records) + findings_from(problems, ledger, names, outs)
    own = num_samples is None
    findings += content_findings(outs, universe, n, how, ranged and own, shuffled)
    sliced, cp_unjudged = cp_findings(outs)  # CP peers' slices: the bytes cannot compare them
    findings += sliced
    findings += [] if names else beyond_declared(records, num_samples)  # ids, not hashed keys
    if shuffled and not ranks.hung:
        findings += order_findings(outs)
    if not ranks.hung:  # a hung run's last records may be missing: its sizes say nothing
        findings += share_findings(outs)
    if own and allow is not None and allow.batch_size and records:
        findings += prefix_finding(outs, allow.batch_size * grid.dp, records[0].epoch)
    steps = {
        o.rank: [
            sum(1 for r in o.records if r.epoch == e)
            for e in range(start_epoch, start_epoch + epochs)
        ]
        for o in outs
    }
    if not ranks.hung and not any(o.phase == "timeout" for o in outs):
        findings += _no_data(steps, outs, grid, start_epoch)
    findings += _empty_steps(records)
    seconds = {
        "wall": wall_s,
        "loader": sum(o.loader_s for o in outs),
        "observe": sum(o.observe_s for o in outs),
    }
    key = next((o.key for o in outs if o.key), key)  # "auto" -> the field it found
    unjudged = _unjudged(grid, with_data, shuffled, asked, len(universe) if universe else None,
                         bool(records))  # fmt: skip
    if universe is None and how and records:
        unjudged["exactly_once"] = f"never seen not judged: {how}"
        how = ""
    elif n is None and universe is not None and records:
        # Without a length the corpus is what the epochs saw together: a sample the loader
        # never yields is in no epoch (a stream that stops 2 short passed: the eighth trial).
        # What was seen, once an epoch, is judged (a fail shows); "every sample" is not.
        unjudged["exactly_once"] = (
            f"a sample the loader never yields cannot be seen without the dataset's length: "
            f"{how}; pass num_samples= to judge every sample"
        )
    if not ranks.hung and (rows := unvouched_rows(outs)):
        unjudged["global_batch"] = rows
    if ranks.hung:
        unjudged.update(dict.fromkeys(("exactly_once", "global_batch"), HUNG))
    if cp_unjudged and records:
        unjudged.setdefault("tp_identical", cp_unjudged)
    off = {"reshuffle": "shuffle=False was passed"} if asked and not shuffled else {}
    return Report(
        what, {"dp": grid.dp, "tp": grid.tp, "cp": grid.cp}, epochs, key, findings, steps,
        seconds, not_judged=unjudged, not_asked=off, universe=how, ledger=ledger,
    )  # fmt: skip
