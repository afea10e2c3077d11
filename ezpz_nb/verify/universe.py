"""Which samples an epoch must cover: the dataset's own universe, said in the report.

A ``Subset`` (what ``random_split`` returns), a shard wrapper holding ``.indices`` or a
``SubsetRandomSampler`` reads only its indices of the dataset under it: its epoch covers those, not the whole
dataset, so the held-out part of a split is never "never seen". Each rank reports
what its loader's dataset holds (:func:`dataset_ids`, indices composed through
nested wrappers); the judge takes the union over the ranks (a rank's own ``Subset``
is its shard) and checks that the ids the batches carry fall inside it
(:func:`universe_of`): a dataset whose ``index`` field numbers its own positions
is judged over those instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ezpz_nb.ledger import StepRecord
from ezpz_nb.ledger.problem import format_ids
from ezpz_nb.verify.lengths import dataset_len as _len
from ezpz_nb.verify.lengths import probe_beyond
from ezpz_nb.verify.report import Finding

__all__ = ["DatasetIds", "Universe", "beyond_declared", "beyond_len", "dataset_ids", "head_cut",
           "ordering_sampler", "prefix_cut", "probe_beyond", "universe_of"]  # fmt: skip

# A wrapper chain deeper than this is not followed (a cycle of .dataset attributes).
_DEPTH = 8


@dataclass(frozen=True)
class DatasetIds:
    """What one rank's loader reads, level by level down its chain of dataset wrappers.

    Attributes:
        maps: For each wrapper with ``.indices`` (a ``Subset``, a ``WeightedShard``),
            outermost first, the ids it reads in the dataset under it, composed down
            to there: the last entry is in the base dataset's numbering.
        kinds: The wrappers' type names, in the same order.
        lengths: ``len`` of each dataset of the chain, outermost first (None: no length).
        raws: Each wrapper's own indices, in the numbering of the dataset under it.
        under: ``len`` of the dataset under each wrapper (None: no length).
        beyond: What :func:`probe_beyond` found past a ``__len__`` of the chain ("" when
            nothing): the base dataset's, or a view's (a wrapper without ``.indices``
            whose ``__len__`` hides the tail of the dataset under it).
        beyond_at: The ``__len__`` that ``beyond`` is about.
    """

    maps: tuple[tuple[int, ...], ...] = ()
    kinds: tuple[str, ...] = ()
    lengths: tuple[int | None, ...] = ()
    raws: tuple[tuple[int, ...], ...] = ()
    under: tuple[int | None, ...] = ()
    beyond: str = ""
    beyond_at: int | None = None

    def whole(self, level: int) -> frozenset[int] | None:
        """What the outermost wrapper is cut from, in ``maps[level]``'s numbering.

        The dataset under the outermost wrapper holds the next wrapper's indices
        (composed down to ``level``), or all of itself when ``level`` is 0 (None:
        no length).
        """
        if level == 0:
            n = self.under[0] if self.under else None
            return None if n is None else frozenset(range(n))
        ids = list(self.raws[1])
        for raw in self.raws[2 : level + 1]:
            ids = [raw[i] for i in ids]
        return frozenset(ids)

    @property
    def length(self) -> int | None:
        """The base dataset's length (None for a stream)."""
        return self.lengths[-1] if self.lengths else None


def ordering_sampler(loader: Any) -> Any:
    """The sampler that orders and shards: the batch sampler's own, else ``loader.sampler``.

    ``DataLoader(batch_sampler=...)`` still makes a ``SequentialSampler`` at
    ``loader.sampler``; the one that shards sits inside the batch sampler (None for a
    custom batch sampler without one: unknown).
    """
    batcher = getattr(loader, "batch_sampler", None)
    if batcher is not None:
        return getattr(batcher, "sampler", None)
    return getattr(loader, "sampler", None)


def _ints(indices: Any) -> list[int] | None:
    """``indices`` as a list of ints, or None when it is not one (the wrapper reads all)."""
    if indices is None or isinstance(indices, (str, bytes)):
        return None
    try:
        return [int(i) for i in indices]
    except (TypeError, ValueError):
        return None


def dataset_ids(loader: Any) -> DatasetIds | None:
    """What ``loader.dataset`` reads of the datasets under it; None when it has no dataset."""
    ds: Any = getattr(loader, "dataset", None)
    if ds is None:
        return None
    # Each wrapper's indices map its positions into the dataset under it; composed from
    # the outside in, they end in the base dataset's numbering.
    maps: list[tuple[int, ...]] = []
    kinds: list[str] = []
    raws: list[tuple[int, ...]] = []
    under: list[int | None] = []
    lengths = [_len(ds)]
    ids: list[int] | None = None
    # Every level without indices reads positions of the one under it up to its __len__:
    # a view whose __len__ stops short of the data under it hides that tail.
    beyond = probe_beyond(ds) if _ints(getattr(ds, "indices", None)) is None else ""
    beyond_at = lengths[0]
    # A sampler that reads chosen indices (SubsetRandomSampler: a split made by sampler)
    # is the outermost map; a sharding sampler (num_replicas) covers the whole dataset.
    sampler = ordering_sampler(loader)
    if not hasattr(sampler, "num_replicas") and (
        chosen := _ints(getattr(sampler, "indices", None))
    ):
        ids = chosen
        maps.append(tuple(ids))
        kinds.append(type(sampler).__name__)
        raws.append(tuple(chosen))
        under.append(lengths[0])
    for _ in range(_DEPTH):
        inner = getattr(ds, "dataset", None)
        if inner is None:
            break
        idx = _ints(getattr(ds, "indices", None))
        if idx is not None:
            ids = idx if ids is None else [idx[i] for i in ids]
            maps.append(tuple(ids))
            kinds.append(type(ds).__name__)
            raws.append(tuple(idx))
            under.append(_len(inner))
        ds = inner
        lengths.append(_len(ds))
        if not beyond and _ints(getattr(ds, "indices", None)) is None:
            beyond, beyond_at = probe_beyond(ds), lengths[-1]
    return DatasetIds(
        tuple(maps),
        tuple(kinds),
        tuple(lengths),
        tuple(raws),
        tuple(under),
        beyond,
        beyond_at if beyond else None,
    )


@dataclass(frozen=True)
class Universe:
    """The ids an epoch must cover, and how they were found (the report's first line says).

    Attributes:
        ids: The ids, or None when unknown (the epochs' union is used, or nothing).
        size: ``len(ids)``, the dataset length the allowances count with.
        how: ``"range(16) (len(loader.dataset))"``, ``"the Subset's 12 indices"``...;
            with ``ids`` None, why the universe is unknown ("" when nothing says).
        outside: With ``ids`` None, the dataset's length that the ids fall outside of.
    """

    ids: frozenset[int] | None
    size: int | None
    how: str
    outside: int | None = None

    @property
    def is_range(self) -> bool:
        """The ids are ``range(size)`` (the ledger's own ``num_samples``)."""
        return self.ids is not None and self.size is not None and self.ids == set(range(self.size))


def universe_of(
    parts: Sequence[DatasetIds | None], num_samples: int | None, seen: Iterable[int]
) -> Universe:
    """The universe of a run from each rank's :class:`DatasetIds`, the ``num_samples=`` given
    and the ids the batches carried.

    ``num_samples`` declares ``range(num_samples)``. Else the ranks' wrappers' indices,
    in the numbering the batches use (the base dataset's first, then each wrapper's: a
    ``WeightedShard`` numbers the ``Subset`` under it): one wrapper on every rank (sharded
    by a sampler) is the universe; each rank its own part (its ``random_split`` part, its
    ``SubsetRandomSampler``) makes the universe the whole the parts are cut from, the
    dataset under them, so a part read by no rank is missing; parts cut from different
    wholes leave it unknown (``how`` says why). Else the shortest ``range(len)`` of a
    dataset of the chain that holds every id seen; else unknown.
    """
    if num_samples is not None:
        return Universe(
            frozenset(range(num_samples)), num_samples, f"range({num_samples}) (num_samples=)"
        )
    known = [p for p in parts if p is not None]
    if not known:
        return Universe(None, None, "")
    seen_ids = set(seen)
    depth = {len(p.maps) for p in known}
    if len(depth) == 1 and (levels := depth.pop()):
        for level in reversed(range(levels)):
            ids = frozenset(i for p in known for i in p.maps[level])
            if seen_ids <= ids:
                return _over_parts(known, level, ids)
    lengths = sorted({n for p in known for n in p.lengths if n is not None})
    fit = next((n for n in lengths if seen_ids <= set(range(n))), None)
    if fit is None:  # ids outside every range(len): the dataset's length does not say
        return Universe(None, None, "", outside=max(lengths, default=None))
    which = "len(loader.dataset)" if fit == max(lengths) else "the length of a wrapped dataset"
    return Universe(frozenset(range(fit)), fit, f"range({fit}) ({which})")


def _over_parts(known: Sequence[DatasetIds], level: int, ids: frozenset[int]) -> Universe:
    """The universe when the batches number samples as ``maps[level]`` does."""
    kinds = {p.kinds[0] for p in known}
    kind = kinds.pop() if len(kinds) == 1 else "wrapper"
    if len({frozenset(p.maps[level]) for p in known}) == 1:
        # One wrapper on every rank: a sampler shards it, it is the whole epoch.
        return Universe(ids, len(ids), f"the {kind}'s {len(ids)} indices")
    # Each rank reads its own part: the union would hide a part no rank reads (the
    # remainder of a split), so the parts are judged against what they are cut from.
    wholes = {p.whole(level) for p in known}
    whole = wholes.pop() if len(wholes) == 1 else None
    if whole is None or not ids <= whole:
        return Universe(
            None, None,
            f"each rank reads its own {kind}, cut from different datasets (or one of unknown "
            "length): which samples a rank should have read cannot be told; pass num_samples= "
            "(ids range(n)) to declare the whole",
        )  # fmt: skip
    if whole == frozenset(range(len(whole))):
        return Universe(
            whole, len(whole), f"range({len(whole)}) (the dataset the ranks' {kind}s are cut from)"
        )
    return Universe(whole, len(whole), f"the {len(whole)} indices the ranks' {kind}s are cut from")


def beyond_len(parts: Sequence[DatasetIds | None], universe: Universe) -> str:
    """A rank's :attr:`DatasetIds.beyond`, when the universe is the ``range(len)`` it is about.

    A declared ``num_samples`` or a ``Subset``'s indices set another universe: there the
    base's ``__len__`` is not what the epoch is judged against.
    """
    return next(
        (p.beyond for p in parts
         if p is not None and p.beyond and universe.is_range and p.beyond_at == universe.size),
        "",
    )  # fmt: skip


def _read_of(parts: Sequence[DatasetIds | None]) -> tuple[set[int], int] | None:
    """The base ids the ranks' wrappers read and the base's length (None: no wrapper, no length)."""
    known = [p for p in parts if p is not None]
    if not known or any(not p.maps or p.length is None for p in known):
        return None
    return {i for p in known for i in p.maps[-1]}, known[0].length or 0


def prefix_cut(parts: Sequence[DatasetIds | None], global_batch: int | None) -> tuple[int, int]:
    """``(m, n)`` when the ranks' wrappers read the first ``m`` of the base's ``n`` samples
    and the rest is less than one global batch: a ``Subset`` that drops the remainder as
    ``drop_last`` would, without saying so. ``(0, 0)`` otherwise.
    """
    got = _read_of(parts) if global_batch else None
    if got is None or not global_batch:
        return 0, 0
    read, n = got
    m = len(read)
    if 0 < n - m < global_batch and m and read == set(range(m)):
        return m, n
    return 0, 0


def head_cut(parts: Sequence[DatasetIds | None], global_batch: int | None) -> tuple[int, int]:
    """``(r, n)`` when the ranks' wrappers read samples ``r`` to ``n - 1`` of the base's ``n``,
    ``r`` less than one global batch: the remainder cut from the head, where no remainder
    rule drops it (``drop_last`` drops the tail of an epoch). ``(0, 0)`` otherwise.
    """
    got = _read_of(parts) if global_batch else None
    if got is None or not global_batch:
        return 0, 0
    read, n = got
    r = n - len(read)
    if 0 < r < global_batch and read == set(range(r, n)):
        return r, n
    return 0, 0


def beyond_declared(records: Iterable[StepRecord], num_samples: int | None) -> list[Finding]:
    """Ids past a declared ``num_samples=`` (ids are indices, not hashed keys): one
    ``exactly_once`` finding an epoch. A padded copy under a fresh id repeats its sample
    where no id shows it (the ninth trial, in eval); an honest loader's ids stay inside."""
    if num_samples is None:
        return []
    found: dict[int, dict[int, StepRecord]] = {}
    for r in records:
        for i in r.sample_ids:
            if not 0 <= i < num_samples:
                found.setdefault(r.epoch, {}).setdefault(i, r)
    out = []
    for epoch, where in sorted(found.items()):
        ids = sorted(where)
        at = min(where.values(), key=lambda r: (r.step, r.rank))
        out.append(Finding(
            "exactly_once", "outside_universe", epoch,
            f"Epoch {epoch}: {len(ids)} sample id(s) outside range({num_samples}) were dealt, "
            f"{format_ids(ids)}; num_samples={num_samples} says there are {num_samples} "
            "samples, so each is a sample beyond them (a padded copy under a fresh id repeats "
            "its sample where no id shows it).",
            rank=at.rank, step=at.step, sample=str(ids[0]),
            hint="deal each sample once under its own id (a repeat that pads keeps its id), "
            "or declare num_samples= the number of samples there are",
        ))  # fmt: skip
    return out
