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
very same content (tokens, pixels, text, packed rows;
:func:`~ezpz_nb.verify.samples.sample_contents`) on two replicas are one sample read
twice, unless the data itself repeats: contents whose copies lie one per replica more
often than a true shard deals them fail (:func:`first_twin`), and so do contents one pair
of replicas shares more often than a true shard puts there (:mod:`~ezpz_nb.verify.pairs`:
two replicas alike out of four).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.pairs import PAIR_ALPHA, Pair, pair_twin, random_epochs
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.reread import misnamed, vouched
from ezpz_nb.verify.samples import ANY_ORDER, SEP, identifying_fields
from ezpz_nb.verify.universe import Universe, beyond_len, head_cut, prefix_cut
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = [
    "ALPHA",
    "MIN_SPREAD",
    "TWIN_HINT",
    "Read",
    "Shared",
    "content_findings",
    "first_twin",
    "prefix_finding",
    "same_bytes",
    "seen_twin",
    "Twin",
    "find_twin",
]


#: One sample as read: ``(digests, id, replica, rank, epoch, step)``; ``digests``: its
#: content fields' ``"<path>:<digest>"`` joined by :data:`~ezpz_nb.verify.samples.SEP`.
Read = tuple[str, int, int, int, int, int]

#: The chance under a true shard below which the copies' places blame the loader, and the
#: fewest distinct contents spread (one content of four rows spread in two epochs is
#: rare, yet a dataset may hold one such by chance: padding, a blank image).
ALPHA, MIN_SPREAD = 1e-2, 3


@dataclass(frozen=True)
class Shared:
    """Contents (of one field) that lie one copy per replica more often than chance allows."""

    a: Read  # a read of one such content ...
    b: Read  # ... and its copy on another replica, under another id
    field: str
    spread: int  # contents (per epoch) with one copy per replica, at most
    multi: int  # contents read under two ids or more, that a shard could spread so
    expected: float  # how many of them a true shard spreads, on average
    chance: float  # an upper bound of the chance of so many (or rarer) spreads
    pair: tuple[int, int] | None = None  # the two replicas, where one pair shares them


def _spread_chance(m: int, n: int, d: int) -> float:
    """The chance that ``m`` copies among ``n`` samples dealt at random to ``d`` replicas of
    ``n / d`` each lie on ``m`` distinct replicas."""
    p, size = 1.0, n / d
    for j in range(1, m):
        p *= max(0.0, n - j * size) / (n - j)
    return p


def _tail(items: list[tuple[float, bool]]) -> float:
    """A Chernoff bound of the chance that contents spread at random (chance ``p`` each) give
    at least the observed surprise (``-log p`` summed over the spread ones)."""
    p = np.array([max(x, 1e-12) for x, _ in items])
    w = -np.log(p)
    seen = float(sum(w[i] for i, (_, spread) in enumerate(items) if spread))
    logs = [
        -t * seen
        + float(np.sum(np.logaddexp(np.log1p(-np.minimum(p, 1 - 1e-12)), np.log(p) + t * w)))
        for t in np.linspace(0.0, 30.0, 121)
    ]
    return float(np.exp(min(logs)))


def _only(digests: str, keep: set[str]) -> str:
    return SEP.join(t for t in digests.split(SEP) if t.rpartition(":")[0] in keep)


def first_twin(reads: Iterable[Read]) -> Shared | None:
    """The field whose contents lie one copy per DP replica (under other ids) more often than
    a true shard places them, with one such pair of reads; else the pair of replicas that
    shares contents too often (:func:`~ezpz_nb.verify.pairs.pair_twin`); None: none.

    A content read under ``m`` ids (``m`` <= replicas) lies on ``m`` distinct replicas by
    chance ``p`` under a true shard (``m = 2`` at dp 4: 0.78; ``m = 4``: 0.12); the loader is
    blamed when the spread contents are surprising together (:func:`_tail` < :data:`ALPHA`),
    per field (a per-replica tag added to every sample cannot hide its tokens), every epoch
    pooled. A few duplicate rows, constant features (more copies than replicas) or one row
    repeated on purpose weigh nothing; the same data under sharded ids spreads every content.
    """
    reads = list(reads)
    # Only the fields that identify a sample: a small augmentation record (a crop's offsets)
    # beside the tokens repeats across alike-seeded workers, and is no twin.
    keep = identifying_fields([r[0] for r in reads], len({r[2] for r in reads}))
    if keep is not None:
        reads = [(_only(r[0], keep), *r[1:]) for r in reads]
    d = len({r[2] for r in reads})
    # (field, epoch) -> digest -> replica -> {id: read}
    groups: dict[tuple[str, int], dict[str, dict[int, dict[int, Read]]]] = {}
    for read in reads:
        for token in read[0].split(SEP):
            field, _, digest = token.rpartition(":")
            by = groups.setdefault((field, read[4]), {}).setdefault(digest, {})
            by.setdefault(read[2], {}).setdefault(read[1], read)
    items: dict[str, list[tuple[float, bool]]] = {}
    example: dict[str, tuple[Read, Read]] = {}
    kinds: dict[str, set[str]] = {}
    for (field, _), contents in groups.items():
        n = sum(len(ids) for by in contents.values() for ids in by.values())
        for digest, by in contents.items():
            m = sum(len(ids) for ids in by.values())
            if m < 2 or m > d:
                continue
            spread = len(by) == m
            items.setdefault(field, []).append((_spread_chance(m, n, d), spread))
            if spread:
                kinds.setdefault(field, set()).add(digest)
                first, second = (next(iter(ids.values())) for ids in list(by.values())[:2])
                example.setdefault(field, (first, second))
    found = []
    for field, got in sorted(items.items()):
        if len(kinds.get(field, ())) < MIN_SPREAD:
            continue
        chance = _tail(got)
        if chance < ALPHA:
            found.append(Shared(*example[field], field, sum(s for _, s in got), len(got),
                                sum(p for p, _ in got), chance))  # fmt: skip
    if found:
        return min(found, key=lambda x: (x.chance, x.field))
    pair = pair_twin(reads, PAIR_ALPHA, MIN_SPREAD)
    return None if pair is None else _of_pair(pair)


def _of_pair(p: Pair) -> Shared:
    return Shared(p.a, p.b, p.field, p.shared, p.shared, p.expected, p.chance, p.replicas)


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
    s = first_twin(reads)
    if s is None:
        return None
    a, b = s.a, s.b
    field = s.field.lstrip("/") or "the sample"
    # A field of values in any order: the same tokens, reversed or shuffled, not the same bytes.
    same = "the same values" if s.field.endswith(ANY_ORDER) else "the same bytes"
    how = (
        f"{s.spread} of the {s.multi} contents read under several ids lie one copy per "
        f"replica, where a true shard puts about {s.expected:.0f} so"
        if s.pair is None
        else f"DP replicas {s.pair[0]} and {s.pair[1]} share {s.spread} contents under other "
        f"ids, where a true shard puts about {s.expected:.1f} on that pair"
    )
    reason = (
        f"sample {names.get(b[1], b[1])} on rank {b[3]} (epoch {b[4]}, step {b[5]}) holds the "
        f"same data ({field}) as sample {names.get(a[1], a[1])} on rank {a[3]} (epoch {a[4]}, "
        f"step {a[5]}), and {how} (chance < {max(s.chance, 1e-9):.0e}): two DP replicas "
        f"read {same} under other ids"
    )
    return Twin(a, b, reason, str(names.get(b[1], b[1])))


#: What to do about a twin.
TWIN_HINT = (
    "the ids are dealt as if sharded but the data is not: read each sample by the id it "
    "carries (dataset[i] for the sampler's i), or shard the data itself; a dataset that "
    "truly holds duplicate samples needs key='digest'"
)


def same_bytes(outs: Sequence[Outcome], shuffled: bool = False) -> Finding | None:
    """The first sample whose data another DP replica held under another id (None: none, or
    the ranks vouch for their ids (:func:`~ezpz_nb.verify.reread.vouched`) over a placement
    in the dataset's order: no shuffle asked, and none moved)."""
    reads = [
        (d, i, r.dp_rank, r.rank, r.epoch, r.step)
        for o in sorted(outs, key=lambda o: o.rank)
        for r in o.records
        if len(digests := o.contents.get((r.epoch, r.step), [])) == len(r.sample_ids)
        for i, d in zip(r.sample_ids, digests, strict=True)
    ]
    fixed = not random_epochs(reads)
    if fixed and shuffled and reads:
        # A shuffling loader whose placement never moved (each replica shuffles its own
        # fixed shard) dealt once: its first epoch is the one draw, counted once (each
        # epoch again would multiply the evidence of one deal).
        first = min(r[4] for r in reads)
        reads = [r for r in reads if r[4] == first]
    t = find_twin(reads, {k: v for x in outs for k, v in x.names.items()})
    # A shard in the dataset's order puts a repeated dataset's copies on distinct replicas,
    # rightly (DistributedSampler(shuffle=False) over ConcatDataset([a] * 4), len(a) odd, at
    # dp 4), where the random-shard chance blames them: the ranks' re-read vouches there.
    # Not where a shuffle was asked: a replica that shuffles its own fixed copy of the data
    # (ids i + n * r, the tenth trial's) trains on what the others do.
    if t is None or (fixed and not shuffled and vouched(outs)):
        return None
    return Finding(
        "dp_disjoint", "dp_duplicate", t.b[4], f"Epoch {t.b[4]}: {t.reason}.", rank=t.b[3],
        step=t.b[5], sample=t.sample, ranks=[t.a[3], t.b[3]], hint=TWIN_HINT,
    )  # fmt: skip


def seen_twin(seen: Sequence[Any]) -> Judgement | None:
    """An eval or steps check's twin, as the ``counted_once``/``balanced_coverage`` failure
    ``rule`` is filled in by the caller; None: none. ``seen``: the ranks'
    :class:`~ezpz_nb.verify.seen.Seen` (only the first rank of each replica counts)."""
    # A sample of weight 0 (an eval's padding row) is not counted: it proves nothing.
    reads = [
        (d, i, s.rank, s.rank, e, step)
        for s in seen
        if s.counts
        for step, (ids, digests) in enumerate(zip(s.ids, s.contents, strict=False))
        if len(digests) == len(ids)
        for i, d, e, w in zip(ids, digests, s.epochs[step] if s.epochs else [0] * len(ids),
                              s.weights[step] if step < len(s.weights) else [1.0] * len(ids),
                              strict=True)
        if w != 0
    ]  # fmt: skip
    t = find_twin(reads, {k: v for x in seen for k, v in x.names.items()})
    if t is None:
        return None
    return Judgement("", Verdict.FAIL, f"{t.reason}: {TWIN_HINT}", rank=t.b[3], step=t.b[5],
                     sample=t.sample)  # fmt: skip


def content_findings(
    outs: Sequence[Outcome], universe: frozenset[int] | None, n: int | None, how: str,
    own_length: bool, shuffled: bool = False,
) -> list[Finding]:  # fmt: skip
    """What the ids alone cannot show: a dataset longer than its ``__len__`` (when the
    universe is that length), the same bytes under two ids on two DP replicas, else an id
    that does not name its data (:func:`~ezpz_nb.verify.reread.misnamed`)."""
    out = []
    beyond = beyond_len([o.dataset for o in outs], Universe(universe, n, how)) if own_length else ""
    epoch = min((r.epoch for o in outs for r in o.records), default=0)
    if beyond:
        out.append(Finding("exactly_once", "never_seen", epoch, f"The universe {how} is short.",
                           hint=beyond))  # fmt: skip
    same = same_bytes(outs, shuffled)
    if same is not None:
        out.append(same)
    elif (wrong := misnamed(outs)) is not None:
        out.append(wrong)
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
