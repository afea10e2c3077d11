"""The sample ledger: which rank held which samples at which step.

Wrap a loader with :func:`record` on every rank; each step appends one
:class:`StepRecord` (and publishes it live to the notebook when run by
``ezpz_nb.launcher``). Gather the records into a :class:`Ledger` and ask it what
went wrong, in plain words::

    def train(layout_tp):
        layout = make_layout(layout_tp)
        loader = get_random_dataset_fsdp_tp(4, 64, 16, dp_group=layout.dp_group,
                                            tp_group=layout.tp_group)["dataloader"]
        rec = record(loader, layout)
        for batch in rec:
            ...
        return rec.ledger()

    ledger = Ledger.from_results(ez.launch(train, 2, world_size=4))
    print(ledger.summary())

Ledger files (``record(..., path=...)``, :meth:`Ledger.save`, :meth:`Ledger.load`)
are JSON lines, format version 2, one object per line with a ``kind``:

* ``header`` (first line): ``{"ezpz_nb_ledger": 2, "kind": "header",
  "num_samples": 64, "rank": 3, "world_size": 4, "pid": 1234, "run_id": "..."}``
  (a file of one rank; :meth:`Ledger.save` of a merged ledger leaves out the
  per-process keys). ``run_id`` is torchrun's ``TORCHELASTIC_RUN_ID`` when there
  is one: it tells the files of two runs of one job apart.
* ``step``: the fields of one :class:`StepRecord`. A recording rank appends
  and flushes one per step, so a rank that is killed leaves every step it took.
* ``end``: ``{"kind": "end", "rank": 3, "steps": 32}``, written when the rank
  finished; a file without one was cut short (``Ledger.complete``).

Readers skip kinds they do not know and keys they do not know, so new kinds
of line (a loss per step) and new keys (a loader worker id, the coordinates of
a third parallel dimension) can be added without a new version; the version
goes up only when an older reader would misread a file. Version 1 files (a
header without ``kind`` and bare records, written once at the end) still load.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import torch
from torch.utils.data import Subset

from ezpz_nb.broadcast import flatten_batch
from ezpz_nb.checks import Problem, check_records
from ezpz_nb.data import forward_set_epoch
from ezpz_nb.groups import Layout

__all__ = ["FORMAT_VERSION", "Ledger", "Problem", "RecordingLoader", "StepRecord", "batch_digest",
           "record"]

#: Version of the ledger file format this module writes (see the module docstring).
FORMAT_VERSION = 2


@dataclass(frozen=True)
class StepRecord:
    """What one rank held at one step.

    Attributes:
        epoch: Epoch label (see :class:`RecordingLoader`).
        step: Step within the epoch, from 0.
        rank: Global rank.
        dp_rank: Data-parallel replica of the rank.
        dp_size: Number of DP replicas.
        tp_rank: Position in the TP group.
        tp_size: Size of the TP group.
        sample_ids: The batch's ``index`` values, in batch order.
        source: ``"loaded"`` (this rank ran the loader) or ``"received"`` (by
            broadcast from its TP leader).
        digest: Hex blake2b of the bytes of every tensor in the batch, in
            flattened order (dict insertion order, depth first).
    """

    epoch: int
    step: int
    rank: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int
    sample_ids: tuple[int, ...]
    source: str
    digest: str


def batch_digest(batch: Any) -> str:
    """Hex blake2b (16 bytes) of the bytes of every tensor leaf of ``batch``."""
    h = hashlib.blake2b(digest_size=16)
    for t in flatten_batch(batch)[1]:
        # Bytes as stored, so bit-different floats (or a different dtype of the
        # same values) give a different digest.
        flat = t.detach().cpu().contiguous().reshape(-1)
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy())  # buffer protocol: no copy
    return h.hexdigest()


def _sample_ids(batch: Any) -> tuple[int, ...]:
    if isinstance(batch, dict):
        if "index" in batch:
            ids = batch["index"]
            return tuple(int(i) for i in (ids.reshape(-1).tolist() if torch.is_tensor(ids) else ids))
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return ()
    for v in values:
        found = _sample_ids(v)
        if found:
            return found
    return ()


def _publish(item: Any) -> None:
    try:
        from ezpz_nb.events import publish
    except ImportError:  # the launcher is optional for recording
        return
    publish(item)


def _default_layout() -> Layout:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        r, w = dist.get_rank(), dist.get_world_size()
        return Layout(r, w, r, w, 0, 1)
    return Layout(0, 1, 0, 1, 0, 1)


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj) + "\n"


def _header(num_samples: int | None, **extra: Any) -> str:
    return _line({"ezpz_nb_ledger": FORMAT_VERSION, "kind": "header", "num_samples": num_samples,
                  **extra})


def _step_line(rec: StepRecord) -> str:
    return _line({"kind": "step", **asdict(rec)})


def _end_line(rank: int, steps: int) -> str:
    return _line({"kind": "end", "rank": rank, "steps": steps})


class RecordingLoader:
    """Yield a loader's batches unchanged and record one StepRecord per step.

    The epoch label of a pass is the one given by :meth:`set_epoch` (or
    ``epoch=``) before it; without one, the previous pass's label plus one. So
    labels count passes even when the sampler's epoch is (wrongly) never set.

    Args:
        loader: Any iterable of batches (DataLoader, TPBroadcastDataLoader...).
        layout: This rank's :class:`~ezpz_nb.groups.Layout`; ``None`` treats
            every rank as its own DP replica.
        epoch: Label of the first pass.
        ledger_list: Also append each record to this list (e.g. a global that
            survives a failing ``Cluster.run``).
        publish: Send each record live to the notebook (``ezpz_nb.events.publish``;
            a no-op outside a launcher rank).
        path: Also write this rank's ledger file there as the run goes: the
            header now, each step as it is taken (flushed), the end record on
            :meth:`close`. Whatever kills the process, the file keeps the
            steps taken so far.

    Use it as a context manager to write the end record only when the block
    finishes without an exception::

        with record(loader, layout, path=f"ledger/rank{layout.rank}.jsonl") as rec:
            for batch in rec:
                ...
    """

    def __init__(
        self,
        loader: Iterable[Any],
        layout: Layout | None = None,
        *,
        epoch: int = 0,
        ledger_list: list[StepRecord] | None = None,
        publish: bool = True,
        path: str | Path | None = None,
    ) -> None:
        self.loader = loader
        self.layout = layout if layout is not None else _default_layout()
        self.records: list[StepRecord] = []
        self.ledger_list = ledger_list
        self.publish = publish
        self._next_epoch: int | None = epoch
        self._last_epoch = epoch - 1
        self._file: IO[str] | None = None
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
            self._write(_header(self.num_samples(), rank=self.layout.rank,
                                world_size=self.layout.world_size, pid=os.getpid(),
                                run_id=os.environ.get("TORCHELASTIC_RUN_ID")))

    def _write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
            # To the OS at every step: a SIGKILL loses nothing written so far
            # (the page cache outlives the process; no fsync needed for that).
            self._file.flush()

    def close(self, *, finished: bool = True) -> None:
        """Close the ledger file, after an end record if ``finished``; then a no-op."""
        if self._file is None:
            return
        if finished:
            self._write(_end_line(self.layout.rank, len(self.records)))
        self._file.close()
        self._file = None

    def __enter__(self) -> RecordingLoader:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(finished=exc_type is None)

    def set_epoch(self, epoch: int) -> None:
        """Label the next pass ``epoch`` and forward it to the loader or its sampler."""
        self._next_epoch = epoch
        forward_set_epoch(self.loader, epoch)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch if self._next_epoch is not None else self._last_epoch + 1
        self._next_epoch, self._last_epoch = None, epoch
        lay = self.layout
        for step, batch in enumerate(self.loader):
            rec = StepRecord(
                epoch=epoch,
                step=step,
                rank=lay.rank,
                dp_rank=lay.dp_rank,
                dp_size=lay.dp_size,
                tp_rank=lay.tp_rank,
                tp_size=lay.tp_size,
                sample_ids=_sample_ids(batch),
                source=getattr(self.loader, "source", "loaded"),
                digest=batch_digest(batch),
            )
            self.records.append(rec)
            self._write(_step_line(rec))
            if self.ledger_list is not None:
                self.ledger_list.append(rec)
            if self.publish:
                _publish(rec)
            yield batch

    def num_samples(self) -> int | None:
        """Length of the loader's full dataset, if it has one.

        A :class:`~torch.utils.data.Subset` (a hand-made shard) is unwrapped:
        the ``never_seen`` check counts the samples of the whole dataset, not
        of this rank's share.
        """
        ds = getattr(self.loader, "dataset", None)
        while isinstance(ds, Subset):
            ds = ds.dataset
        try:
            return len(ds)  # type: ignore[arg-type]
        except TypeError:  # None, or an IterableDataset without __len__
            return None

    def ledger(self) -> Ledger:
        """This rank's records as a :class:`Ledger` (picklable: return it from a rank)."""
        return Ledger(list(self.records), num_samples=self.num_samples())


def record(
    loader: Iterable[Any],
    layout: Layout | None = None,
    *,
    epoch: int = 0,
    ledger_list: list[StepRecord] | None = None,
    publish: bool = True,
    path: str | Path | None = None,
) -> RecordingLoader:
    """Wrap ``loader`` in a :class:`RecordingLoader` (same arguments)."""
    return RecordingLoader(loader, layout, epoch=epoch, ledger_list=ledger_list, publish=publish,
                           path=path)


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


def _step_from(d: dict[str, Any]) -> StepRecord:
    # Keys a newer writer added are skipped (see the module docstring).
    known = {k: d[k] for k in _STEP_FIELDS}
    known["sample_ids"] = tuple(known["sample_ids"])
    return StepRecord(**known)


def _read_file(file: Path) -> Ledger:
    """One ledger file, version 1 or 2; a torn last line (a kill mid-write) is dropped."""
    text = file.read_text(encoding="utf-8")
    lines = text.splitlines()
    objs: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break  # the write in progress when the process died
            raise ValueError(f"{file}, line {i + 1}: not a ledger line: {line[:80]!r}") from None
    head = objs[0] if objs and "ezpz_nb_ledger" in objs[0] else {}
    version = head.get("ezpz_nb_ledger", 1)
    if version > FORMAT_VERSION:
        raise ValueError(f"{file} is a version {version} ledger; this ezpz_nb reads up to "
                         f"version {FORMAT_VERSION}: upgrade ezpz_nb to read it")
    recs, ended = [], set()
    for d in objs:
        kind = d.get("kind", "header" if "ezpz_nb_ledger" in d else "step")
        if kind == "step":
            recs.append(_step_from(d))
        elif kind == "end":
            ended.add(d["rank"])
    complete: dict[int, bool] = {}
    if version >= 2:  # version 1 files say nothing about how the run ended
        ranks = {r.rank for r in recs} | ended
        if "rank" in head:
            ranks.add(head["rank"])
        complete = {r: r in ended for r in ranks}
    return Ledger(recs, head.get("num_samples"), complete)


@dataclass
class Ledger:
    """All ranks' step records, and checks over them.

    Attributes:
        records: The :class:`StepRecord` s, in any order.
        num_samples: Dataset length, if known (needed for the ``never_seen`` check).
        complete: ``{rank: finished}`` for the ranks whose files were read
            (:meth:`load`): False when a rank's file has no end record, because
            the rank was killed or stopped by an error. Empty when unknown.
    """

    records: list[StepRecord] = field(default_factory=list)
    num_samples: int | None = None
    # How a run ended is not what it recorded: two ledgers with the same
    # records compare equal whether or not they came from files.
    complete: dict[int, bool] = field(default_factory=dict, compare=False)

    # -------------------------------------------------------------- building
    @classmethod
    def from_results(cls, results: Iterable[Any], *, num_samples: int | None = None) -> Ledger:
        """Merge what the ranks returned from ``ez.launch``/``Cluster.run``.

        Args:
            results: One item per rank, each a :class:`Ledger` (from
                :meth:`RecordingLoader.ledger`), a :class:`StepRecord`, or a
                (nested) list/tuple of them.
            num_samples: Dataset length; defaults to the largest one the parts know.
        """
        records: list[StepRecord] = []
        sizes: list[int] = []
        complete: dict[int, bool] = {}

        def take(item: Any) -> None:
            if isinstance(item, StepRecord):
                records.append(item)
            elif isinstance(item, Ledger):
                records.extend(item.records)
                if item.num_samples is not None:
                    sizes.append(item.num_samples)
                for r, done in item.complete.items():
                    complete[r] = complete.get(r, True) and done
            elif isinstance(item, (list, tuple)):
                for x in item:
                    take(x)
            else:
                raise TypeError(f"expected Ledger, StepRecord or a list of them, got {type(item).__name__}")

        take(list(results))
        return cls(records, num_samples if num_samples is not None else max(sizes, default=None),
                   complete)

    @classmethod
    def from_events(cls, events: Iterable[Any], *, num_samples: int | None = None) -> Ledger:
        """Rebuild a (possibly partial) ledger from the launcher's published events.

        Args:
            events: Objects with ``.rank`` and ``.item`` (``RankError.events``,
                ``HangError.events``); items that are not StepRecords are skipped.
            num_samples: Dataset length, if known.
        """
        return cls([e.item for e in events if isinstance(getattr(e, "item", None), StepRecord)], num_samples)

    def save(self, path: str | Path) -> Path:
        """Write the ledger as one file (see the module docstring for the format).

        Every rank gets an end record unless :attr:`complete` says it did not
        finish. Under torchrun, let each rank write its own file as it goes
        instead (``record(..., path=f"{dir}/rank{rank}.jsonl")``); :meth:`load`
        merges a folder of them.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        steps: dict[int, int] = dict.fromkeys(self.complete, 0)
        with path.open("w", encoding="utf-8") as f:
            f.write(_header(self.num_samples))
            for r in self.records:
                f.write(_step_line(r))
                steps[r.rank] = steps.get(r.rank, 0) + 1
            for rank, n in sorted(steps.items()):
                if self.complete.get(rank, True):
                    f.write(_end_line(rank, n))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        """Read a ledger file, or merge every ``*.jsonl`` in a folder.

        A file cut short (its rank killed) loads with the steps it holds: a
        torn last line is dropped, and :attr:`complete` is False for its rank.

        Raises:
            FileNotFoundError: No such file, or no ``*.jsonl`` in the folder.
            ValueError: A line other than the last is not JSON, or the file
                is of a newer format version.
        """
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"no *.jsonl ledger files in {path}")
        return cls.from_results([_read_file(file) for file in files])

    # ------------------------------------------------------------- accessors
    def __len__(self) -> int:
        return len(self.records)

    def ranks(self) -> list[int]:
        """Global ranks that recorded anything, sorted."""
        return sorted({r.rank for r in self.records})

    def epochs(self) -> list[int]:
        """Epoch labels present, sorted."""
        return sorted({r.epoch for r in self.records})

    def layout(self) -> dict[int, tuple[int, int]]:
        """``{rank: (dp_rank, tp_rank)}`` as recorded."""
        return {r.rank: (r.dp_rank, r.tp_rank) for r in self.records}

    def last_step(self, rank: int) -> tuple[int, int] | None:
        """``(epoch, step)`` of the last step ``rank`` recorded, or None if it recorded none."""
        return max(((r.epoch, r.step) for r in self.records if r.rank == rank), default=None)

    def steps(self, rank: int, epoch: int) -> list[StepRecord]:
        """The records of ``rank`` in ``epoch``, by step."""
        return sorted((r for r in self.records if r.rank == rank and r.epoch == epoch), key=lambda r: r.step)

    def sample_ids(self, rank: int, epoch: int) -> list[int]:
        """Every sample id ``rank`` held in ``epoch``, in step order."""
        return [i for r in self.steps(rank, epoch) for i in r.sample_ids]

    def sample_matrix(self, epoch: int) -> Any:
        """Sample ids as a ``(ranks, steps, batch)`` int64 numpy array, -1 where absent.

        Rows follow :meth:`ranks`; ranks with fewer steps or smaller batches are padded.
        """
        import numpy as np

        # One pass over the records: plots call this on 64 ranks x 1000 steps.
        ranks = self.ranks()
        row = {r: i for i, r in enumerate(ranks)}
        recs = [r for r in self.records if r.epoch == epoch]
        n_steps = max((r.step + 1 for r in recs), default=0)
        width = max((len(r.sample_ids) for r in recs), default=0)
        out = np.full((len(ranks), n_steps, width), -1, dtype=np.int64)
        for r in recs:
            out[row[r.rank], r.step, : len(r.sample_ids)] = r.sample_ids
        return out

    # ---------------------------------------------------------------- checks
    def check(self) -> list[Problem]:
        """Look for the four ways DP/TP data loading goes wrong (see :mod:`ezpz_nb.checks`).

        Returns:
            One :class:`~ezpz_nb.checks.Problem` per kind and epoch found, empty
            when all is well.
        """
        return check_records(self.records, self.num_samples)

    @property
    def ok(self) -> bool:
        """True when :meth:`check` finds nothing."""
        return not self.check()

    def summary(self) -> str:
        """A few lines: what was recorded and what :meth:`check` found."""
        ranks = self.ranks()
        dp = max((r.dp_size for r in self.records), default=0)
        tp = max((r.tp_size for r in self.records), default=0)
        lines = [
            f"Ledger: {len(ranks)} rank(s) (dp {dp} x tp {tp}), epochs {self.epochs()}, "
            f"{len(self.records)} step records, "
            f"{len({i for r in self.records for i in r.sample_ids})} distinct samples"
            + (f" of {self.num_samples}" if self.num_samples is not None else "")
        ]
        cut = sorted(r for r, done in self.complete.items() if not done)
        for r in cut:
            last = self.last_step(r)
            where = f"its last step was epoch {last[0]} step {last[1]}" if last else "it took no step"
            lines.append(f"- incomplete: rank {r} wrote no end record ({where}): it was killed or "
                         "stopped by an error, see its output")
        problems = self.check()
        lines += [f"- {p.kind}: {p.message}" for p in problems] or [
            "All checks passed on what was recorded." if cut else "All checks passed."]
        return "\n".join(lines)
