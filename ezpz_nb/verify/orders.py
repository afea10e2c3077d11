"""A shuffle that only looks like one: the same batches in another order, or the last order rotated.

``reshuffle`` asks more than "the order changed": a shuffle deals each epoch anew, so the
samples that share a batch change too (the gradient of a batch is the mean of its
samples: the same batches in another order train on the same means), and an epoch is
not the previous one started some places later. Either pattern is a finding only when
a true shuffle would give it by chance less than :data:`CHANCE` of the time on every DP
replica together (:func:`_frozen_chance`, :func:`_rotation_chance`): a replica of two
samples in batches of one shows both patterns half the time and is never blamed.
An epoch that keeps most of an earlier epoch's batches (two samples swapped in one
permutation, a replica handed another's fixed shard: the ninth trial) is blamed the same
way, its shared batches counted per global step and per replica (:mod:`.overlap`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ezpz_nb.ledger import StepRecord
from ezpz_nb.verify.neighbours import Kept, kept_neighbours
from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.overlap import global_shared, replica_shared, together
from ezpz_nb.verify.report import Finding

__all__ = ["CHANCE", "order_findings"]

#: How rarely a true shuffle would show the pattern on every replica for it to be blamed.
CHANCE = 1e-5


def _frozen_chance(batches: Sequence[tuple[int, ...]]) -> float:
    """The chance that a fresh permutation of these samples, cut into batches of these
    sizes, makes the same batches (in any order of the batches of one size)."""
    sizes = [len(b) for b in batches]
    log = sum(math.lgamma(k + 1) for k in sizes)
    log += sum(math.lgamma(c + 1) for c in Counter(sizes).values())
    return math.exp(log - math.lgamma(sum(sizes) + 1))


def _rotation_chance(n: int) -> float:
    """The chance that a fresh permutation of ``n`` samples is a given one rotated (not 0)."""
    return math.exp(math.log(max(n - 1, 0) or 1) - math.lgamma(n + 1)) if n > 1 else 1.0


def _rotated(before: list[int], after: list[int]) -> int:
    """``k`` (0 < k < n) when ``after`` is ``before`` started ``k`` places later; else 0."""
    n = len(before)
    if n < 2 or len(after) != n or sorted(before) != sorted(after):
        return 0
    k = before.index(after[0]) if after[0] in before else 0
    return k if k and before[k:] + before[:k] == after else 0


def _replicas(outs: Sequence[Outcome]) -> dict[int, dict[int, list[tuple[int, ...]]]]:
    """Per DP replica (its first rank), per epoch, its batches in step order."""
    first: dict[int, int] = {}
    recs: list[StepRecord] = [r for o in outs for r in o.records]
    for r in recs:
        first[r.dp_rank] = min(first.get(r.dp_rank, r.rank), r.rank)
    out: dict[int, dict[int, list[tuple[int, ...]]]] = {}
    for r in sorted(recs, key=lambda r: (r.epoch, r.step)):
        if r.rank == first[r.dp_rank]:
            out.setdefault(r.dp_rank, {}).setdefault(r.epoch, []).append(tuple(r.sample_ids))
    return out


def _earlier(epochs: list[int], after: int) -> list[int]:
    """The epochs ``after`` is compared with: the one before it first, then the others."""
    before = [e for e in epochs if e < after]
    return before[-1:] + before[:-1]


def order_findings(outs: Sequence[Outcome]) -> list[Finding]:
    """Epochs that repeat an earlier one's batches in another order, or its order rotated,
    or (past the one before, which the ledger compares) its order exactly, on every DP
    replica (judged only where a shuffle was asked for). Each epoch is compared with every
    earlier one: a shuffle seeded by ``epoch % 2`` repeats epoch 0 at epoch 2 (the eighth
    trial). One finding an epoch; the chance bound is divided among the pairs compared."""
    replicas = _replicas(outs)
    epochs = sorted({e for by in replicas.values() for e in by})
    bound = CHANCE / max(1, len(epochs) * (len(epochs) - 1) // 2)
    out = []
    for after in epochs:
        for before in _earlier(epochs, after):
            adjacent = before == _earlier(epochs, after)[0]
            found = _pair_finding(outs, replicas, before, after, adjacent, bound)
            if found is not None:
                out.append(found)
                break
    if not out:  # small replicas: one epoch pair says too little, all of them together can
        found = _never_reshuffled(outs, replicas, epochs, CHANCE)
        out += [found] if found is not None else []
    return out


def _pattern(x: list[tuple[int, ...]], y: list[tuple[int, ...]]) -> tuple[float, str, str] | None:
    """``(chance, what, hint)`` of the pattern ``y`` repeats of ``x`` (the same order,
    reversed, rotated, or the same batches), the chance that a fresh shuffle of ``x``'s
    samples shows it; None: no pattern."""
    a, b = [i for t in x for i in t], [i for t in y for i in t]
    if len(a) < 2 or sorted(a) != sorted(b):
        return None
    fresh = math.exp(-math.lgamma(len(a) + 1))
    if a == b:
        return fresh, *_EXACT
    if b == a[::-1]:
        return fresh, *_REVERSED
    if _rotated(a, b):
        return _rotation_chance(len(a)), *_ROTATED
    if Counter(map(frozenset, x)) == Counter(map(frozenset, y)):
        return _frozen_chance(x), *_SAME_BATCHES
    return None


def _never_reshuffled(
    outs: Sequence[Outcome],
    replicas: dict[int, dict[int, list[tuple[int, ...]]]],
    epochs: list[int],
    bound: float,
) -> Finding | None:
    """A replica whose every epoch repeats the one before it (a pattern of
    :func:`_pattern`), where the chances of all its epochs together fall below the
    bound shared among the replicas: 7 samples fixed over 3 epochs (the eleventh trial's
    replica that never heard ``set_epoch``, at dp 4) is 1/5040 an epoch pair, 4e-8 both."""
    for dp in sorted(replicas):
        found = [
            _pattern(replicas[dp].get(e, []), replicas[dp].get(f, []))
            for e, f in zip(epochs, epochs[1:], strict=False)
        ]
        if len(found) < 2 or any(p is None for p in found):
            continue
        if math.prod(p[0] for p in found if p is not None) < bound / len(replicas):
            before, after = epochs[0], epochs[1]
            rank = min(
                r.rank for o in outs for r in o.records if r.epoch == after and r.dp_rank == dp
            )
            what = (
                "epoch {0}'s order again: every epoch repeats the one before it (the same "
                "order, reversed, rotated, or the same batches)"
            )
            return _finding(outs, before, after, what, _SAME_ORDER, f", on DP replica {dp}", rank)
    return None


def _pair_finding(
    outs: Sequence[Outcome],
    replicas: dict[int, dict[int, list[tuple[int, ...]]]],
    before: int,
    after: int,
    adjacent: bool,
    bound: float,
) -> Finding | None:
    """What epoch ``after`` repeats of epoch ``before`` on every replica, or None."""
    pairs = [(by.get(before, []), by.get(after, [])) for by in replicas.values()]
    flat = [([i for b in x for i in b], [i for b in y for i in b]) for x, y in pairs]
    if not pairs or not all(x for x, _ in flat):
        return None
    if all(x == y for x, y in flat):
        if adjacent:  # an unchanged order from one epoch to the next: the ledger's finding
            return None
        if math.prod(math.exp(-math.lgamma(len(x) + 1)) for x, _ in flat) >= bound:
            return None
        what = "epoch {0}'s order exactly (sample for sample)"
        hint = (
            "each epoch's permutation must be drawn from the epoch itself (seed + epoch), not "
            "from a value that comes back (epoch % 2, a counter reset): every epoch a new order"
        )
        return _finding(outs, before, after, what, hint)
    if not any(x == y for x, y in flat):  # an unchanged order on some replica: not reordered
        pattern = _reordered(pairs, flat, bound)
        if pattern is not None:
            return _finding(outs, before, after, *pattern)
    for rule in (_shared_finding, _one_replica, _neighbours):
        found = rule(outs, replicas, before, after, bound)
        if found is not None:
            return found
    return None


def _neighbours(
    outs: Sequence[Outcome],
    replicas: dict[int, dict[int, list[tuple[int, ...]]]],
    before: int,
    after: int,
    bound: float,
) -> Finding | None:
    """Half or more of the neighbouring pairs in each replica's order kept from epoch
    ``before`` (over every replica, else on one): an order read backwards, or samples
    glued in pairs whose pairs alone are shuffled (the eleventh trial); counted and bounded
    by :mod:`~ezpz_nb.verify.neighbours`. Half the pairs is far above what a shuffle
    buffer keeps (a buffer of 2 over 100 samples, 200 streams: never blamed)."""
    each: list[tuple[int, Kept]] = []
    for dp in sorted(replicas):
        a = [i for b in replicas[dp].get(before, []) for i in b]
        b = [i for t in replicas[dp].get(after, []) for i in t]
        each.append((dp, kept_neighbours(a, b)))
    groups = [each] + [[x] for x in each]  # every replica together, then each alone
    for k, group in enumerate(groups):
        got = sum((g for _, g in group), Kept(0, 0, 0.0))
        chance = got.chance()
        if got.half() and chance < bound / (2 * len(groups)):
            where = ", on every DP replica" if k == 0 else f", on DP replica {group[0][0]}"
            what = (
                f"{got.kept} of its {got.out_of} neighbouring pairs of samples as epoch {{0}}'s "
                "order had them (read backwards, or samples kept in pairs)"
            )
            return _finding(outs, before, after, what, _SAME_ORDER, where + _rare(chance))
    return None


#: Epoch ``after`` is epoch ``before`` read backwards: ``(what, hint)``.
_REVERSED = (
    "epoch {0}'s order reversed: the samples keep their neighbours",
    "one permutation is drawn once and read forwards, then backwards: draw a fresh "
    "permutation each epoch (seed + epoch)",
)


def _one_replica(
    outs: Sequence[Outcome],
    replicas: dict[int, dict[int, list[tuple[int, ...]]]],
    before: int,
    after: int,
    bound: float,
) -> Finding | None:
    """One replica whose order repeats epoch ``before``'s (exactly, reversed, rotated, or its
    batches reordered) where the others reshuffle: the replica-wide rules above ask it of
    every replica together (the eleventh trial: replica 0 ignored ``set_epoch``). Blamed
    where a fresh shuffle of that replica alone shows it less often than the bound shared
    among the replicas."""
    each = bound / max(1, len(replicas))
    for dp in sorted(replicas):
        found = _pattern(replicas[dp].get(before, []), replicas[dp].get(after, []))
        if found is None or found[0] >= each:
            continue
        _, what, hint = found
        rank = min(r.rank for o in outs for r in o.records if r.epoch == after and r.dp_rank == dp)
        return _finding(outs, before, after, what, hint, f", on DP replica {dp}", rank)
    return None


_SAME_ORDER = (
    "this replica's sampler draws its order without the epoch (set_epoch not called on "
    "it, or its seed fixed): every replica's permutation must come from (seed, epoch)"
)
#: One replica's patterns: ``(what, hint)``.
_EXACT = ("epoch {0}'s order exactly (sample for sample)", _SAME_ORDER)
_ROTATED = ("epoch {0}'s order rotated: the samples keep their neighbours", _SAME_ORDER)
_SAME_BATCHES = ("the same batches as epoch {0}, only in another order", _SAME_ORDER)


def _reordered(
    pairs: list[tuple[list[tuple[int, ...]], list[tuple[int, ...]]]],
    flat: list[tuple[list[int], list[int]]],
    bound: float,
) -> tuple[str, str] | None:
    """Every replica's batches exactly the earlier ones reordered, or its order rotated."""
    frozen = all(Counter(map(frozenset, x)) == Counter(map(frozenset, y)) for x, y in pairs)
    if frozen and math.prod(_frozen_chance(x) for x, _ in pairs) < bound:
        what = (
            "the same batches as epoch {0}, only in another order: the samples that share "
            "a batch never change, so each step's gradient is one of the same means"
        )
        hint = (
            "the batches are cut once and only their order is shuffled: draw a fresh "
            "permutation of the samples each epoch (seed + epoch) and cut the batches from it"
        )
        return what, hint
    if all(len(x) > 1 and y == x[::-1] for x, y in flat) and (
        math.prod(math.exp(-math.lgamma(len(x) + 1)) for x, _ in flat) < bound
    ):
        return _REVERSED
    if all(_rotated(x, y) for x, y in flat) and (
        math.prod(_rotation_chance(len(x)) for x, _ in flat) < bound
    ):
        shift = {_rotated(x, y) for x, y in flat}
        what = (
            "epoch {0}'s order started "
            + (f"{shift.pop()} place(s)" if len(shift) == 1 else "some places")
            + " later (rotated): the samples keep their neighbours"
        )
        hint = (
            "one permutation is drawn once and each epoch starts it elsewhere: draw a "
            "fresh permutation each epoch (seed + epoch)"
        )
        return what, hint
    return None


def _shared_finding(
    outs: Sequence[Outcome],
    replicas: dict[int, dict[int, list[tuple[int, ...]]]],
    before: int,
    after: int,
    bound: float,
) -> Finding | None:
    """Half or more of epoch ``after``'s batches (sample sets) already batched in
    ``before``: per global step (the union over the replicas), else per replica (any
    replica's earlier batch counts); each blamed where a fresh shuffle would share as
    many less often than half the bound (:mod:`~ezpz_nb.verify.overlap`)."""
    order = sorted(replicas)
    earlier = [replicas[r].get(before, []) for r in order]
    later = [replicas[r].get(after, []) for r in order]
    # Half the batches at least: a shuffle buffer smaller than the data (an honest
    # stream) keeps a few neighbours batched together more often than a full shuffle.
    g = global_shared(earlier, later)
    if 2 * g.shared >= g.out_of > 0 and g.chance < bound / 2:
        what = (
            f"{g.shared} of its {g.out_of} global batches (a step's samples over every DP "
            "replica: what the averaged gradient sees) as epoch {0} made them"
        )
        return _finding(outs, before, after, what, _MOVED, where=_rare(g.chance))
    every = [b for bs in earlier for b in bs]
    each = [replica_shared(every, bs) for bs in later]
    count, out_of = sum(s.shared for s in each), sum(s.out_of for s in each)
    chance = together([s.chance for s in each])
    if 2 * count >= out_of > 0 and chance < bound / 2:
        what = (
            f"{count} of its {out_of} batches (over the DP replicas) as sample sets that "
            "epoch {0} also batched (on any replica): the samples that share a batch "
            "hardly change, so most steps' gradients are the same means again"
        )
        return _finding(outs, before, after, what, _MOVED, where=_rare(chance))
    return None


def _rare(chance: float) -> str:
    return f" (a fresh shuffle shares as many with a chance under {max(chance, 1e-300):.0e})"


_MOVED = (
    "one order drawn once and only touched each epoch (a few samples swapped, a replica "
    "handed another's shard) keeps the batches: draw a fresh permutation of the dataset "
    "each epoch (seed + epoch) and deal it over the replicas (DistributedSampler with "
    "set_epoch does)"
)


def _finding(
    outs: Sequence[Outcome], before: int, after: int, what: str, hint: str,
    where: str = ", on every DP replica", rank: int | None = None,
) -> Finding:  # fmt: skip
    if rank is None:
        rank = min(r.rank for o in outs for r in o.records if r.epoch == after)
    return Finding(
        "reshuffle", "order_unchanged", after,
        f"Epoch {after} holds " + what.format(before) + where + ".",
        rank=rank, step=0, hint=hint, ranks=sorted({o.rank for o in outs}),
    )  # fmt: skip
