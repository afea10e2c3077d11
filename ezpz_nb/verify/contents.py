"""What the ids alone cannot show: the same data under two ids, an unread tail.

:func:`same_bytes` (contract) and :func:`seen_twin` (eval, steps): the same data under
two ids on two DP replicas, sharded ids over unsharded bytes. :func:`content_findings`
adds a dataset longer than its ``__len__`` (:func:`~ezpz_nb.verify.lengths.probe_beyond`);
:func:`prefix_finding` names a ``Subset`` that cut the last partial global batch, and
fails one that cut the head.

The rules read the ids the batches carry. A loader that stamps ids dealt as if sharded
(``perm[rank::world]``) on data every replica reads alike (the first samples of the
dataset) passes them all while each replica trains on the same bytes. An id may hold
other bytes in another epoch (augmentation draws them anew), but two ids holding the
very same rows of numbers (tokens, pixels, features;
:func:`~ezpz_nb.verify.batches.sample_contents`) on two replicas are one sample read
twice, unless one replica also holds one content under two ids in an epoch: data with
duplicate rows, where a twin proves nothing (:func:`first_twin`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.universe import Universe, beyond_len, head_cut, prefix_cut
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = [
    "TWIN_HINT",
    "Read",
    "content_findings",
    "first_twin",
    "prefix_finding",
    "same_bytes",
    "seen_twin",
    "Twin",
    "find_twin",
]


#: One sample as read: ``(digest, id, replica, rank, epoch, step)``.
Read = tuple[str, int, int, int, int, int]


def first_twin(reads: Iterable[Read]) -> tuple[Read, Read] | None:
    """The first sample whose data another DP replica read under another id, with the read
    it repeats (None: none). Data that one replica holds under two ids in one epoch (a
    dataset with duplicate rows, constant features) cannot tell a sample read twice: None
    then too."""
    reads = list(reads)
    ids: dict[tuple[str, int, int], int] = {}
    for d, i, dp, _, epoch, _ in reads:
        if ids.setdefault((d, dp, epoch), i) != i:
            return None
    first: dict[str, Read] = {}
    for read in reads:
        seen = first.setdefault(read[0], read)
        if seen[1] != read[1] and seen[2] != read[2]:
            return seen, read
    return None


@dataclass(frozen=True)
class Twin:
    """A sample read under another id on another DP replica: ``b`` repeats ``a``'s data.

    Attributes:
        a: The first read of the data.
        b: The read that repeats it.
        reason: The two, in words.
        sample: ``b``'s id, named by its key where ids were hashed from keys.
    """

    a: Read
    b: Read
    reason: str
    sample: str


def find_twin(reads: Iterable[Read], names: Mapping[int, str]) -> Twin | None:
    """:func:`first_twin` in words (``names``: the keys of hashed ids)."""
    twin = first_twin(reads)
    if twin is None:
        return None
    a, b = twin
    reason = (
        f"sample {names.get(b[1], b[1])} on rank {b[3]} (epoch {b[4]}, step {b[5]}) holds the "
        f"same data as sample {names.get(a[1], a[1])} on rank {a[3]} (epoch {a[4]}, step "
        f"{a[5]}): two DP replicas read the same bytes under other ids"
    )
    return Twin(a, b, reason, str(names.get(b[1], b[1])))


#: What to do about a twin.
TWIN_HINT = (
    "the ids are dealt as if sharded but the data is not: read each sample by the id it "
    "carries (dataset[i] for the sampler's i), or shard the data itself; a dataset that "
    "truly holds duplicate samples needs key='digest'"
)


def same_bytes(outs: Sequence[Outcome]) -> Finding | None:
    """The first sample whose data another DP replica held under another id (None: none)."""
    reads = [
        (d, i, r.dp_rank, r.rank, r.epoch, r.step)
        for o in sorted(outs, key=lambda o: o.rank)
        for r in o.records
        if len(digests := o.contents.get((r.epoch, r.step), [])) == len(r.sample_ids)
        for i, d in zip(r.sample_ids, digests, strict=True)
    ]
    t = find_twin(reads, {k: v for x in outs for k, v in x.names.items()})
    if t is None:
        return None
    return Finding(
        "dp_disjoint", "dp_duplicate", t.b[4], f"Epoch {t.b[4]}: {t.reason}.", rank=t.b[3],
        step=t.b[5], sample=t.sample, ranks=[t.a[3], t.b[3]], hint=TWIN_HINT,
    )  # fmt: skip


def seen_twin(seen: Sequence[Any]) -> Judgement | None:
    """An eval or steps check's twin, as the ``counted_once``/``balanced_coverage`` failure
    ``rule`` is filled in by the caller; None: none. ``seen``: the ranks'
    :class:`~ezpz_nb.verify.seen.Seen` (only the first rank of each replica counts)."""
    reads = [
        (d, i, s.rank, s.rank, e, step)
        for s in seen
        if s.counts
        for step, (ids, digests) in enumerate(zip(s.ids, s.contents, strict=False))
        if len(digests) == len(ids)
        for i, d, e in zip(ids, digests, s.epochs[step] if s.epochs else [0] * len(ids),
                           strict=True)
    ]  # fmt: skip
    t = find_twin(reads, {k: v for x in seen for k, v in x.names.items()})
    if t is None:
        return None
    return Judgement("", Verdict.FAIL, f"{t.reason}: {TWIN_HINT}", rank=t.b[3], step=t.b[5],
                     sample=t.sample)  # fmt: skip


def content_findings(
    outs: Sequence[Outcome], universe: frozenset[int] | None, n: int | None, how: str,
    own_length: bool,
) -> list[Finding]:  # fmt: skip
    """What the ids alone cannot show: a dataset longer than its ``__len__`` (when the
    universe is that length), and the same bytes under two ids on two DP replicas."""
    out = []
    beyond = beyond_len([o.dataset for o in outs], Universe(universe, n, how)) if own_length else ""
    epoch = min((r.epoch for o in outs for r in o.records), default=0)
    if beyond:
        out.append(Finding("exactly_once", "never_seen", epoch, f"The universe {how} is short.",
                           hint=beyond))  # fmt: skip
    same = same_bytes(outs)
    if same is not None:
        out.append(same)
    return out


def prefix_finding(outs: Sequence[Outcome], global_batch: int, epoch: int) -> list[Finding]:
    """A wrapper that reads all but the last partial global batch: a remainder drop, named;
    one that reads all but the first few samples: never read, and no remainder rule says so."""
    r, n = head_cut([o.dataset for o in outs], global_batch)
    if r:
        return [
            Finding(
                "exactly_once", "never_seen", epoch,
                f"The loader's dataset reads samples {r} to {n - 1} of the {n} under it: "
                f"samples 0 to {r - 1} are never read, in any epoch.",
                sample="0",
                hint=f"a Subset(range({r}, {n})) cuts the head: a remainder is the tail of an "
                f"epoch's order (drop_last=True drops it, a fresh one each epoch); read all "
                f"{n}, or cut the tail (Subset(range({n - r}))) if a fixed cut is meant",
            )
        ]  # fmt: skip
    m, n = prefix_cut([o.dataset for o in outs], global_batch)
    if not m:
        return []
    return [
        Finding(
            "exactly_once", "never_seen", epoch,
            f"The loader's dataset reads the first {m} of the {n} samples under it: "
            f"samples {m} to {n - 1} are never read.",
            expected=f"a remainder drop: a Subset cut the {n - m} sample(s) past the last "
            f"whole global batch of {global_batch}, as drop_last=True would (pass "
            f"num_samples={n} to judge them as missing)",
            sample=str(m),
        )
    ]  # fmt: skip
