"""Where a resumed run first leaves the straight one, and the likeliest cause.

A batch's identity is the same in every mode of :func:`~ezpz_nb.verify.check_resume`
(``via="state_dict"`` or ``"dcp"``): its sample ids and the samples' contents, less the
tags about where and when a batch was loaded: a field named worker id, step or epoch
that holds one integer for the whole batch (:func:`~ezpz_nb.verify.batches.is_batch_tag`;
per-sample noise levels in a field named ``step`` are content). When the ids
match and the contents do not, the fields that differ are named, and the RNG is
blamed only when they hold random data (floating point or a mask).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from ezpz_nb.ledger import Ledger, StepRecord, check_records
from ezpz_nb.verify.hints import MODULO, NO_KNOWN_CAUSE, resume_hint
from ezpz_nb.verify.judge import fact, findings_from
from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.report import Finding

__all__ = ["DRAWS_HINT", "Evidence", "judge_parts"]

#: Why a resumed batch holds the straight run's samples with other random contents.
DRAWS_HINT = (
    "the resumed loader drew other random values (masks, crops, noise): its RNG's state "
    "was not saved and restored with its place (put generator.get_state() in state_dict)"
)


@dataclass
class Evidence:
    """What the ranks of every part told about their batches, beyond the ledger.

    Attributes:
        names: Hashed ids -> the keys they came from.
        fields: A batch's content digest -> ``{field: "kind:digest"}``
            (:func:`~ezpz_nb.verify.batches.field_digests`).
        notes: What a load skipped (a key the fresh loader's ``state_dict`` lacks).
        streams: The loader reads an ``IterableDataset`` (no sampler applies).
        sampled: The loader has a sampler (one that could hold a position).
        changed: What the resume changed (layout, options), when it did.
    """

    names: dict[int, str] = field(default_factory=dict)
    fields: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    streams: bool = False
    sampled: bool = False
    changed: str = ""

    def add(self, outcomes: Iterable[Outcome]) -> None:
        """Take in the outcomes of one part's ranks."""
        for o in outcomes:
            self.names.update(o.names)
            self.streams = self.streams or o.iterable
            self.sampled = self.sampled or o.sampled
            by_step = {(r.epoch, r.step): r.digest for r in o.records}
            for at, digests in o.fields.items():
                if at in by_step:
                    self.fields[by_step[at]] = digests
            if o.load_note and o.load_note not in self.notes:
                self.notes.append(o.load_note)

    def contents_hint(self, got: StepRecord, want: StepRecord) -> tuple[str, str]:
        """``(what differs, likely cause)`` of two batches with the same ids, other contents."""
        a, b = self.fields.get(got.digest), self.fields.get(want.digest)
        differ = sorted(
            p for p in set(a or ()) | set(b or ()) if (a or {}).get(p) != (b or {}).get(p)
        )
        if self.notes:
            return "other contents", "; ".join(self.notes)
        if not differ:
            return "other contents", DRAWS_HINT
        data = [p for p in differ if (a or b or {}).get(p, "").startswith("data:")]
        said = "other values in " + ", ".join(differ)
        if data:
            return said, DRAWS_HINT
        return said, (
            "the differing fields are tags (one integer or string per sample), not data an "
            "RNG draws: a value the loader computes from its own history (a counter, a cache) "
            "rather than from the sample; " + NO_KNOWN_CAUSE
        )


def _first_divergence(
    scenario: str, epoch: int, rank: int, a: list[StepRecord], b: list[StepRecord], ev: Evidence
) -> Finding | None:
    at = next(
        (i for i in range(max(len(a), len(b)))
         if i >= len(a) or i >= len(b) or a[i].sample_ids != b[i].sample_ids
         or a[i].digest != b[i].digest),
        None,
    )  # fmt: skip
    if at is None:
        return None
    got = b[at] if at < len(b) else None
    want = a[at] if at < len(a) else None
    sample = next(
        (i for i in (got.sample_ids if got else ()) if not want or i not in want.sample_ids),
        got.sample_ids[0] if got and got.sample_ids else None,
    )
    worker = None
    if got is not None and sample in got.sample_ids and len(got.worker_ids) == len(got.sample_ids):
        worker = got.worker_ids[got.sample_ids.index(sample)]
    said = (f"got {list(got.sample_ids)[:6]}" if got else "got no batch") + (
        f", the straight run {list(want.sample_ids)[:6]}" if want else ", the straight run had none"
    )
    if got and want and got.sample_ids == want.sample_ids:
        what, hint = ev.contents_hint(got, want)
        said = f"the same samples {list(got.sample_ids)[:6]} with {what}"
    elif ev.notes:  # a load that skipped saved keys is the evidence, whatever differs
        hint = "; ".join(ev.notes)
    else:
        hint = resume_hint(a, b, at, ev.changed, scenario, ev.streams, ev.sampled)
    return Finding(
        "resume", "divergence", epoch,
        f"[{scenario}] epoch {epoch}: rank {rank} first differs from the straight run at step "
        f"{at} ({said}).",
        rank=rank, step=at, sample=None if sample is None else ev.names.get(sample, str(sample)),
        worker=worker, hint=hint,
    )  # fmt: skip


def judge_parts(
    scenario: str,
    parts: list[Ledger],
    straight: Ledger,
    n: int | None,
    universe: Iterable[int] | None,
    ev: Evidence,
    moved: bool = False,
) -> list[Finding]:
    """Exactly-once over the joined parts, and where they first leave the straight run.

    Resumed at another layout (``moved``), a rank's share of the rest of the epoch is
    cut anew, so its batches differ from the straight run's even when the loader
    re-shards its position exactly (MosaicML streaming does): there the divergence
    is expected as long as the joined parts saw every sample exactly once. A batch
    must hold the straight run's samples and their contents: a loader that forgets
    its RNG resumes with the right samples and other masks.
    """
    merged = Ledger.merge_runs(*parts)
    problems = [
        p
        for p in check_records(
            merged.records, n, universe=None if universe is None else set(universe)
        )
        if p.kind in ("dp_duplicate", "never_seen", "rank_duplicate")
    ]
    # The ledger's general advice (drop_last, a DistributedSampler's padding) is about a
    # straight run; here the joined parts broke the rule, so the cause is the resume.
    out = [
        replace(
            f,
            message=f"[{scenario}] {fact(f.message)}",
            hint="the resumed run's parts do not join into the straight run's epoch: see this "
            "scenario's resume finding for where the resumed loader left it",
        )
        for f in findings_from(problems, merged, ev.names)
    ]
    diverged = []
    for epoch in straight.epochs():
        for rank in straight.ranks():
            found = _first_divergence(
                scenario, epoch, rank, straight.steps(rank, epoch), merged.steps(rank, epoch), ev
            )
            if found is not None:
                diverged.append(found)
                break  # the first rank that diverges in this epoch; later epochs still count
    if moved and not problems:
        why = (
            "resumed at another layout: each rank's share of the rest of the epoch is cut "
            "anew, and the joined parts still saw every sample exactly once"
        )
        diverged = [replace(f, expected=why, hint="") for f in diverged]
    return out + diverged


#: Scenarios whose own hint (a replay at that save only) holds only if the others resume.
_ONLY_THERE = ("right after a resume", "after an epoch's last batch")


def one_cause(findings: list[Finding]) -> list[Finding]:
    """One bug, one cause: a scenario-specific hint yields to a mid-epoch scenario's evidence.

    A replay after the epoch's last batch reads as a position taken modulo the epoch's
    length, and a replay right after a resume as a forgotten loaded offset, only if a
    mid-epoch save resumes right; when a mid-epoch scenario restarted its epoch too,
    the position was never carried, and that scenario's hint is the cause for all.
    """

    def specific(f: Finding) -> bool:
        return any(f.message.startswith(f"[{s}]") for s in _ONLY_THERE)

    restarted = next(
        (
            f
            for f in findings
            if f.kind == "divergence" and not specific(f) and "started the epoch over" in f.hint
        ),
        None,
    )
    if restarted is None:
        return findings
    return [
        replace(f, hint=restarted.hint)
        if f.kind == "divergence" and specific(f) and f.hint != restarted.hint
        and (f.hint == MODULO or "lost when the state was saved again" in f.hint)
        else f
        for f in findings
    ]  # fmt: skip
