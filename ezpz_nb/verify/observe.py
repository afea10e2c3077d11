"""What runs inside each rank: build the user's loader, iterate it, observe every batch.

The rank makes no collective call of its own while it iterates, so a loader that
would leave ranks with different step counts is *measured* (its ranks simply stop
at different steps) instead of hanging the check. Every failure of the user's code
is caught and returned (and published, so it survives another rank's hang) as an
:class:`Outcome` naming its phase.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.data.groups import Layout
from ezpz_nb.ledger import Allowance, StepRecord
from ezpz_nb.ledger.memory import MemorySampler, worker_pids
from ezpz_nb.ledger.records import batch_ints
from ezpz_nb.verify.batches import (
    NoSampleIds,
    batch_rows,
    field_digests,
    observe_batch,
    resolve_key,
    structure,
)
from ezpz_nb.verify.cp_slices import CpKeep
from ezpz_nb.verify.epochs import loader_parts
from ezpz_nb.verify.padding import Padding
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.reread import Reread
from ezpz_nb.verify.samples import sample_contents
from ezpz_nb.verify.stops import LATER, Stop
from ezpz_nb.verify.universe import DatasetIds, dataset_ids, ordering_sampler

__all__ = ["Grid", "Outcome", "rank_layout", "run_rank"]

# Seconds between two publications of a rank's new records (see run_rank).
_PUBLISH_S = 0.2


@dataclass(frozen=True)
class Grid:
    """A ``dp x cp x tp`` layout (TP innermost, then CP, DP outermost)."""

    dp: int
    tp: int = 1
    cp: int = 1

    @property
    def world_size(self) -> int:
        """Ranks the layout needs."""
        return self.dp * self.cp * self.tp

    def __post_init__(self) -> None:
        for axis in ("dp", "tp", "cp"):
            size = getattr(self, axis)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise VerifyError(
                    f"Grid: {axis}={size!r} is not a positive int; every axis needs at least "
                    f"one rank, e.g. Grid(dp=2, tp=2) (leave out an axis you do not use)"
                )

    def __str__(self) -> str:
        return f"dp={self.dp},tp={self.tp}" + (f",cp={self.cp}" if self.cp > 1 else "")


@dataclass
class Outcome:
    """What one rank observed, or how the user's code failed there."""

    rank: int
    records: list[StepRecord] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    structure: str = ""
    key: str = ""  # the field that identified samples ("index", "__key__"...)
    num_samples: int | None = None  # the length of the dataset under any Subset
    dataset: DatasetIds | None = None  # what the loader's dataset reads of it
    share: int | None = None  # len(sampler): the samples this rank's sampler gives an epoch
    iterable: bool = False  # an IterableDataset: no sampler applies, it shards itself
    sampled: bool = False  # the loader has a sampler (which could hold its position)
    allowance: Allowance | None = None
    shuffles: bool = False  # some part of the loader asked for a shuffle
    shufflers: list[str] = field(default_factory=list)  # "DistributedSampler at loader.sampler"
    unreached: list[str] = field(default_factory=list)  # shufflers without a set_epoch
    length: int | None = None  # len(loader) where it has one: batches it promises an epoch
    reiterable: bool = True  # iter(loader) is not the loader itself (not spent after one pass)
    phase: str = "done"  # "factory", "iterate", "structure", "timeout" or "done"
    error: str = ""
    loader_s: float = 0.0  # time spent inside the loader's __next__
    observe_s: float = 0.0  # time spent observing batches
    state: Any = None  # the loader's state_dict() where a resume check asked for it
    # Where two state_dict() calls at the stop differed (stops.state_difference): "" when none.
    state_note: str = ""
    load_note: str = ""  # what a DCP load skipped (keys missing from a fresh state_dict)
    fields: dict[tuple[int, int], dict[str, str]] = field(default_factory=dict)  # digests per field
    memory: list[Any] = field(default_factory=list)  # MemorySample of the rank and its workers
    # Per (epoch, step), a digest of each sample's data (contents.same_bytes reads them).
    contents: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)  # files the loader wrote (verify.writes)
    # Per (epoch, step), (rows holding data, *row shape) of the batch's largest field
    # (batches.batch_rows): a packer's fixed rows match another replica's with other samples.
    rows: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    # (id, epoch, step, field:digest, made-up) delivered with other data than dataset[id]
    # (verify.reread).
    misnamed: list[tuple[int, int, int, str, str]] = field(default_factory=list)
    reread_alike: int = 0  # kept samples re-read alike (verify.reread.Reread.alike)
    # (epoch, step, samples) of kept batches whose rows past their samples' own are padding
    # (verify.padding): shares counts such a rank's rows of data by its samples.
    padded: list[tuple[int, int, int]] = field(default_factory=list)
    # CP layouts (verify.cp_slices): (epoch, id) -> (step, {field: values delivered}) of a few
    # samples, and at a replica's leader (epoch, id) -> {field: dataset[id]'s values}.
    cp_kept: dict[tuple[int, int], tuple[int, dict[str, bytes]]] = field(default_factory=dict)
    cp_rows: dict[tuple[int, int], dict[str, list[Any]]] = field(default_factory=dict)
    # Kept batches whose rows past their samples held the samples' data, and those the
    # re-read could not judge (verify.padding): rows excuse unequal samples only if vouched.
    rows_vouched: int = 0
    rows_unsure: int = 0


class Ready:
    """Published once a rank's factory returned: a later hang is the loader's, not the factory's."""

    def __init__(self, rank: int) -> None:
        self.rank = rank


# ------------------------------------------------------------------ the rank's job
def _sources(batch: Any) -> tuple[int, ...]:
    """Each sample's ``dataset_id`` (its source in a mixture); () when absent or not ints."""
    try:
        return batch_ints(batch, "dataset_id")
    except (TypeError, ValueError):
        return ()


def rank_layout(grid: Grid) -> Layout:
    """This rank's :class:`Layout` in ``grid``, with DP and TP groups (CP peers share no group)."""
    import torch.distributed as dist

    from ezpz_nb.data.groups import make_layout

    if grid.cp == 1:
        return make_layout(tp_size=grid.tp)
    rank, world = dist.get_rank(), dist.get_world_size()
    tp_rank, cp_rank, dp_rank = (
        rank % grid.tp,
        (rank // grid.tp) % grid.cp,
        rank // (grid.tp * grid.cp),
    )
    tp_group = dp_group = None
    # new_group is collective over the world: every rank makes every group, in order.
    for start in range(0, world, grid.tp):
        g = dist.new_group(list(range(start, start + grid.tp)))
        if start <= rank < start + grid.tp:
            tp_group = g
    inner = grid.tp * grid.cp
    for offset in range(inner):
        members = list(range(offset, world, inner))
        g = dist.new_group(members)
        if rank in members:
            dp_group = g
    return Layout(
        rank, world, dp_rank, grid.dp, tp_rank, grid.tp, dp_group, tp_group, cp_rank, grid.cp
    )


def _unwrap(loader: Any) -> Any:
    """The DataLoader inside common wrappers (``.loader``, ``.dataloader``...), for its settings."""
    for _ in range(4):
        if hasattr(loader, "sampler") or hasattr(loader, "dataset"):
            return loader
        inner = next(
            (
                getattr(loader, a)
                for a in ("loader", "dataloader", "inner", "_loader")
                if hasattr(loader, a)
            ),
            None,
        )
        if inner is None:
            return loader
        loader = inner
    return loader


def _allowance(loader: Any) -> Allowance:
    """``drop_last`` from wherever it is set: the batch sampler (the DataLoader's own, a
    ``BatchSampler`` passed in, a custom one with the attribute), else the loader."""
    sampler = ordering_sampler(loader)
    sampler_drop = getattr(sampler, "drop_last", None) if hasattr(sampler, "num_replicas") else None
    batcher = getattr(loader, "batch_sampler", None)
    drop = getattr(batcher, "drop_last", None)
    return Allowance(
        sampler_drop_last=sampler_drop,
        loader_drop_last=drop if drop is not None else getattr(loader, "drop_last", None),
        batch_size=getattr(loader, "batch_size", None) or getattr(batcher, "batch_size", None),
    )


def _share(loader: Any) -> int | None:
    try:
        return len(ordering_sampler(loader))
    except Exception:  # noqa: BLE001 - no sampler, or one without __len__: unknown
        return None


def _publish(item: Any) -> None:
    from ezpz_nb.events import publish

    publish(item)


def _fail(out: Outcome, phase: str, error: str) -> Outcome:
    out.phase, out.error = phase, error
    _publish(out)  # another rank may hang: the notebook still learns this one failed
    return out


def run_rank(
    make_loader: Callable[[Layout], Any],
    grid: Grid,
    epochs: int,
    key: str,
    budget_s: float,
    *,
    start_epoch: int = 0,
    stop: tuple[int, int] | None = None,
    states: list[Any] | None = None,
    options: dict[str, Any] | None = None,
    publish_steps: bool = True,
    keep_fields: bool = False,
    memory_budget: float | None = None,
    salt: int = 0,
) -> Outcome:
    """Build, iterate and observe the loader on this rank (run by the launcher).

    Args:
        make_loader: The user's factory, called with this rank's layout.
        grid: The layout to build.
        epochs: Epochs to run, counted from ``start_epoch``.
        key: See :func:`observe_batch`.
        budget_s: Stop iterating (phase ``"timeout"``) after this many seconds.
        start_epoch: The first epoch's label (a resumed run starts mid-way).
        stop: ``(epoch, steps)``: take ``loader.state_dict()`` after ``steps``
            steps of ``epoch``, go on :data:`~ezpz_nb.verify.stops.LATER` step(s), ask for the state again
            and return the first (a resume check; :class:`~ezpz_nb.verify.stops.Stop`).
        states: One ``state_dict`` per rank, to load into this rank's new loader
            (after ``set_epoch``) before iterating.
        options: Keyword arguments for ``make_loader`` (e.g. ``num_workers``).
        publish_steps: Publish the records live, in bunches (they survive a hang).
        keep_fields: Keep each batch's digest per field (a resume check names the
            field that differs).
        memory_budget: Sample the private memory of the rank and its DataLoader
            workers into ``out.memory`` within this share of wall time
            (:class:`~ezpz_nb.ledger.memory.MemorySampler`); None: not at all.
        salt: Picks the samples a CP layout's ranks keep (:func:`.cp_slices.picked`): the
            same on every rank of a check.
    """
    deadline = time.monotonic() + budget_s
    layout = rank_layout(grid)
    out = Outcome(rank=layout.rank)
    try:
        loader = make_loader(layout, **(options or {}))
    except BaseException:  # noqa: BLE001 - the user's code: any failure is reported, never raised here
        return _fail(out, "factory", traceback.format_exc())
    if not hasattr(loader, "__iter__"):
        return _fail(
            out,
            "factory",
            f"make_loader returned {type(loader).__name__!s}, which is not iterable: return "
            "the DataLoader (or any iterable of batches), not a batch or a dataset's length",
        )
    _publish(Ready(layout.rank))
    inner = _unwrap(loader)
    out.allowance, out.dataset, out.share = _allowance(inner), dataset_ids(inner), _share(inner)
    out.num_samples = out.dataset.length if out.dataset is not None else None
    from torch.utils.data import IterableDataset

    out.iterable = isinstance(getattr(inner, "dataset", inner), IterableDataset)
    out.sampled = ordering_sampler(inner) is not None and not out.iterable
    parts = loader_parts(loader)
    try:
        out.length = len(loader)
    except Exception:  # noqa: BLE001 - no __len__, or an IterableDataset's TypeError: unknown
        out.length = None
    out.shuffles = bool(parts.shufflers)
    out.shufflers = [f"{type(o).__name__} at {p}" for p, o in parts.shufflers.items()]
    out.unreached = parts.unreached()
    published, published_at = 0, time.monotonic()
    at = Stop()
    # A resumed run's epochs are cut short, and TP/CP peers receive what a leader loaded.
    leader = layout.tp_rank == 0 and layout.cp_rank == 0
    reread = Reread(inner, leader and stop is None and states is None and key != "digest"
                    and not out.iterable)  # fmt: skip
    padding = Padding(reread)
    cp = CpKeep(layout, reread, salt, out.num_samples)
    out.cp_kept, out.cp_rows = cp.kept, cp.rows
    sampler = MemorySampler(memory_budget) if memory_budget is not None else None
    try:
        for epoch in range(start_epoch, start_epoch + epochs):
            parts.set_epoch(epoch)
            if states is not None and epoch == start_epoch:
                loader.load_state_dict(states[layout.rank])
                out.load_note = getattr(loader, "load_note", "")
            it = iter(loader)
            out.reiterable = out.reiterable and it is not loader
            procs = worker_pids(it) if sampler is not None else []
            step = 0
            while True:
                if at.kept < 0 and (epoch, step) == stop:
                    at.take(loader, out)
                if at.kept >= 0 and at.later >= LATER:
                    return at.finish(loader, out)
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                ids, names, digest, workers = observe_batch(batch, key)
                if not out.structure:
                    out.structure, out.key = structure(batch), resolve_key(batch, key)
                rec = StepRecord(
                    epoch, step, layout.rank, layout.dp_rank, layout.dp_size, layout.tp_rank,
                    layout.tp_size, tuple(ids), "loaded", digest, tuple(workers),
                    layout.cp_rank, layout.cp_size,
                    # The source of each sample of a mixture: ledger_stream pairs them.
                    dataset_ids=_sources(batch),
                )  # fmt: skip
                out.records.append(rec)
                out.rows[(epoch, step)] = batch_rows(batch, out.key, len(ids))
                if key != "digest":  # with ids from the bytes, one content is one id
                    out.contents[(epoch, step)] = sample_contents(batch, out.key, len(ids))
                    reread.see(batch, ids, out.key, epoch, step)
                    cp.see(batch, ids, out.key, epoch, step)
                    held = out.rows[(epoch, step)]
                    padding.see(batch, ids, out.key, held[0] if held else 0, epoch, step)
                out.names.update(names)
                if keep_fields:
                    out.fields[(epoch, step)] = field_digests(batch)
                if sampler is not None and sampler.due(step, len(procs)):  # counted as observing
                    out.memory += sampler.sample(layout.rank, epoch, step, procs)
                # Published in bunches: one message per step doubled the cost of
                # observing (measured, benchmarks/verify.py); a hang loses at most
                # the last _PUBLISH_S of records, which the report counts as "at least".
                if publish_steps and time.monotonic() - published_at > _PUBLISH_S:
                    _publish(out.records[published:])
                    published, published_at = len(out.records), time.monotonic()
                out.observe_s += time.perf_counter() - t1
                out.loader_s += t1 - t0
                step += 1
                at.later += at.kept >= 0
                if time.monotonic() > deadline:
                    out.phase = "timeout"
                    return out
            out.misnamed += reread.judge(deadline)  # before the next set_epoch
            out.padded += padding.judge(deadline)
            cp.read(epoch, deadline)
            out.reread_alike = reread.alike
            out.rows_vouched, out.rows_unsure = padding.vouched, padding.unsure
            if at.kept < 0 and stop == (epoch + 1, 0):
                at.take(loader, out)
        if at.kept >= 0:  # the epochs ended before the later step
            return at.finish(loader, out)
    except NoSampleIds as exc:
        return _fail(out, "key", str(exc))
    except BaseException:  # noqa: BLE001 - the user's loader: reported, never raised here
        return _fail(out, "iterate", traceback.format_exc())
    if publish_steps and published < len(out.records):
        # The last records too: if another rank hangs, the report still has this one's.
        _publish(out.records[published:])
    return out
