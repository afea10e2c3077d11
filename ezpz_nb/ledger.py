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
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Subset

from ezpz_nb.broadcast import flatten_batch
from ezpz_nb.checks import Problem, check_records
from ezpz_nb.data import forward_set_epoch
from ezpz_nb.groups import Layout

__all__ = ["Ledger", "Problem", "RecordingLoader", "StepRecord", "batch_digest", "record"]


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
    """

    def __init__(
        self,
        loader: Iterable[Any],
        layout: Layout | None = None,
        *,
        epoch: int = 0,
        ledger_list: list[StepRecord] | None = None,
        publish: bool = True,
    ) -> None:
        self.loader = loader
        self.layout = layout if layout is not None else _default_layout()
        self.records: list[StepRecord] = []
        self.ledger_list = ledger_list
        self.publish = publish
        self._next_epoch: int | None = epoch
        self._last_epoch = epoch - 1

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
) -> RecordingLoader:
    """Wrap ``loader`` in a :class:`RecordingLoader` (same arguments)."""
    return RecordingLoader(loader, layout, epoch=epoch, ledger_list=ledger_list, publish=publish)


@dataclass
class Ledger:
    """All ranks' step records, and checks over them.

    Attributes:
        records: The :class:`StepRecord` s, in any order.
        num_samples: Dataset length, if known (needed for the ``never_seen`` check).
    """

    records: list[StepRecord] = field(default_factory=list)
    num_samples: int | None = None

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

        def take(item: Any) -> None:
            if isinstance(item, StepRecord):
                records.append(item)
            elif isinstance(item, Ledger):
                records.extend(item.records)
                if item.num_samples is not None:
                    sizes.append(item.num_samples)
            elif isinstance(item, (list, tuple)):
                for x in item:
                    take(x)
            else:
                raise TypeError(f"expected Ledger, StepRecord or a list of them, got {type(item).__name__}")

        take(list(results))
        return cls(records, num_samples if num_samples is not None else max(sizes, default=None))

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
        """Write JSON lines: a header line, then one record per line.

        Under torchrun give each rank its own file (e.g. ``f"{dir}/rank{rank}.jsonl"``);
        :meth:`load` merges a folder of them.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            f.write(json.dumps({"ezpz_nb_ledger": 1, "num_samples": self.num_samples}) + "\n")
            for r in self.records:
                f.write(json.dumps(asdict(r)) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Ledger:
        """Read a file written by :meth:`save`, or merge every ``*.jsonl`` in a folder."""
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"no *.jsonl ledger files in {path}")
        parts = []
        for file in files:
            lines = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
            head = lines[0] if lines and "ezpz_nb_ledger" in lines[0] else {}
            recs = [
                StepRecord(**{**d, "sample_ids": tuple(d["sample_ids"])})
                for d in lines
                if "ezpz_nb_ledger" not in d
            ]
            parts.append(cls(recs, head.get("num_samples")))
        return cls.from_results(parts)

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
        problems = self.check()
        lines += [f"- {p.kind}: {p.message}" for p in problems] or ["All checks passed."]
        return "\n".join(lines)
