"""Record what a loader yields, step by step, on every rank: :func:`record`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from torch.utils.data import Dataset, IterableDataset, Subset, get_worker_info

from ezpz_nb import events
from ezpz_nb.data.distributed import forward_set_epoch
from ezpz_nb.data.groups import Layout
from ezpz_nb.ledger import codec, fault
from ezpz_nb.ledger.book import Ledger
from ezpz_nb.ledger.clock import StepClock
from ezpz_nb.ledger.memory import BUDGET, MemorySample, MemorySampler, worker_pids
from ezpz_nb.ledger.records import (
    StepRecord,
    batch_digest,
    batch_ints,
    batch_tokens,
    with_times,
)

__all__ = ["RecordingLoader", "memory_budget", "record", "tag_worker"]


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
        layout: This rank's :class:`~ezpz_nb.data.groups.Layout`; ``None`` treats
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
        timings: Measure each step (:class:`~ezpz_nb.ledger.StepTimes`): the
            wait for the batch, the loop's own work, and the time in the
            blocks marked :meth:`collective`. False records no times and
            makes :meth:`compute` and :meth:`collective` do nothing.
        memory: Also sample the memory of this rank and of its DataLoader
            workers (:mod:`~ezpz_nb.ledger.memory`) into :attr:`memory_samples`:
            at the first step, then as often as a share of the wall time
            allows (True: 1%; a float: that share; 1.0: every step).
            :meth:`ledger` carries them; ``Ledger.memory_report()`` summarises them.

    Use it as a context manager to write the end record only when the block
    finishes without an exception, and mark the step's collective so the
    ledger can tell who waited for whom::

        with record(loader, layout, path=f"ledger/rank{layout.rank}.jsonl") as rec:
            for batch in rec:
                loss = model(batch).mean()      # the step's own work
                loss.backward()
                with rec.collective():          # where the ranks meet
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                opt.step()

    A step's times are taken when the loop comes back for the next batch: a
    loop that leaves early (``break``) records no times for its last step.
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
        timings: bool = True,
        memory: bool | float = False,
    ) -> None:
        self.loader = loader
        self.layout = layout if layout is not None else _default_layout()
        self.records: list[StepRecord] = []
        self.ledger_list = ledger_list
        self.publish = publish
        self._next_epoch: int | None = epoch
        self._last_epoch = epoch - 1
        self._file: IO[str] | None = None
        self._clock = StepClock() if timings else None
        self._idle: AbstractContextManager[object] = nullcontext()
        self.memory_samples: list[MemorySample] = []
        budget = memory_budget(memory)
        self.memory_sampler = MemorySampler(budget) if budget else None
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w", encoding="utf-8")
            self._write(
                codec.encode_header(
                    self.num_samples(),
                    rank=self.layout.rank,
                    world_size=self.layout.world_size,
                    pid=os.getpid(),
                    run_id=os.environ.get("TORCHELASTIC_RUN_ID"),
                )
            )

    def _write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
            # To the OS at every step: a SIGKILL loses nothing written so far
            # (the page cache outlives the process; no fsync needed for that).
            self._file.flush()

    def close(self, *, finished: bool = True) -> None:
        """Close the ledger file, after an end record if ``finished``; then a no-op."""
        if self._clock is not None:
            self._clock.delays.close()  # an epoch left early holds them still
        if self._file is None:
            return
        if finished:
            self._write(codec.encode_end(self.layout.rank, len(self.records)))
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

    def compute(self) -> AbstractContextManager[object]:
        """``with rec.compute():`` marks the step's own work (forward, backward, update).

        Optional: without it, all the loop does outside :meth:`collective`
        counts as compute. With it, the rest of the loop's time (logging,
        evaluation) is counted apart, as ``other_s``.
        """
        return self._clock.compute if self._clock is not None else self._idle

    def collective(self) -> AbstractContextManager[object]:
        """``with rec.collective():`` marks the step's collective (the gradient all-reduce).

        The rank's entry into the first such block of a step is stamped; the
        ledger's wait of each rank is the time from its entry to the last
        rank's entry, so the transfer itself is not counted as waiting.
        """
        return self._clock.collective if self._clock is not None else self._idle

    def __iter__(self) -> Iterator[Any]:
        epoch = self._next_epoch if self._next_epoch is not None else self._last_epoch + 1
        self._next_epoch, self._last_epoch = None, epoch
        lay = self.layout
        clock = self._clock
        if clock is not None:
            clock.asking()  # before iter(): starting the workers is the first step's wait
        it = iter(self.loader)
        sampler = self.memory_sampler
        workers = worker_pids(it) if sampler is not None else []
        step = 0
        while True:
            if clock is not None and step:
                clock.asking()
            try:
                batch = next(it)
            except StopIteration:
                if clock is not None and step:
                    # The epoch's end is the last step's: a second time line for it
                    # replaces the first (workers shutting down take time here).
                    last = self.records[-1]
                    assert last.times is not None
                    ended = replace(last.times, end_s=clock.ended())
                    self._amend(with_times(last, ended))
                    if self._file is not None:
                        self._write(codec.encode_times(self.records[-1]))
                if clock is not None:
                    clock.delays.close()  # its /proc files, open only while an epoch runs
                return
            if clock is not None:
                clock.got()
            real, pad, row_docs = batch_tokens(batch)
            rec = StepRecord(
                epoch=epoch,
                step=step,
                rank=lay.rank,
                dp_rank=lay.dp_rank,
                dp_size=lay.dp_size,
                tp_rank=lay.tp_rank,
                tp_size=lay.tp_size,
                sample_ids=batch_ints(batch, "index"),
                source=getattr(self.loader, "source", "loaded"),
                digest=batch_digest(batch),
                worker_ids=batch_ints(batch, "worker_id"),
                cp_rank=lay.cp_rank,
                cp_size=lay.cp_size,
                real_tokens=real,
                pad_tokens=pad,
                row_docs=row_docs,
                dataset_ids=batch_ints(batch, "dataset_id"),
            )
            self.records.append(rec)
            self._write(codec.encode_step(rec))
            if self.ledger_list is not None:
                self.ledger_list.append(rec)
            if self.publish:
                events.publish(rec)
            # In the recorder's own time (before handed()): counted in no part of the step.
            if sampler is not None and sampler.due(step, len(workers)):
                self.memory_samples += sampler.sample(lay.rank, epoch, step, workers)
            if clock is not None:
                clock.handed()
            fault.at_step(lay.rank, epoch, step)  # a checker's injected crash (fault.ENV)
            yield batch
            if clock is not None:
                timed = self._amend(with_times(self.records[-1], clock.finish()))
                if self._file is not None:
                    self._write(codec.encode_times(timed))
            step += 1

    def _amend(self, rec: StepRecord) -> StepRecord:
        """Put ``rec`` in place of the last record (and of its copy in ``ledger_list``)."""
        last = self.records[-1]
        if self.ledger_list and self.ledger_list[-1] is last:
            self.ledger_list[-1] = rec
        self.records[-1] = rec
        return rec

    def log_loss(self, loss: float) -> None:
        """Attach the loss of the step just taken to its record (and to the file).

        Call it once per step, after the step's batch was yielded, with a loss
        that is the same on every rank (averaged over the DP replicas) so that
        any rank's curve is the run's curve. The record published live at
        the step (``publish``) went out before the loss existed and has none.

        Raises:
            RuntimeError: No step has been taken yet.
        """
        if not self.records:
            raise RuntimeError("log_loss() before the first step: iterate the loader first")
        self._write(codec.encode_loss(self._amend(replace(self.records[-1], loss=float(loss)))))

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
        return Ledger(
            list(self.records), num_samples=self.num_samples(), memory=list(self.memory_samples)
        )


def record(
    loader: Iterable[Any],
    layout: Layout | None = None,
    *,
    epoch: int = 0,
    ledger_list: list[StepRecord] | None = None,
    publish: bool = True,
    path: str | Path | None = None,
    timings: bool = True,
    memory: bool | float = False,
) -> RecordingLoader:
    """Wrap ``loader`` in a :class:`RecordingLoader` (same arguments)."""
    return RecordingLoader(
        loader,
        layout,
        epoch=epoch,
        ledger_list=ledger_list,
        publish=publish,
        path=path,
        timings=timings,
        memory=memory,
    )


def memory_budget(memory: object) -> float:
    """The share of wall time ``record(..., memory=...)`` gives the readings (0: none).

    Checked here, where the learner passed it, so that ``memory="yes"`` says what
    ``memory=`` takes instead of failing inside ``float()``.

    Raises:
        TypeError: Not a bool or a number.
        ValueError: A number outside [0, 1].
    """
    what = (
        "memory= takes True (read within 1% of the wall time), False (no reading) or a "
        "fraction in [0, 1] of the wall time the readings may take (memory=1.0 reads at "
        "every step)"
    )
    if isinstance(memory, bool):
        return BUDGET if memory else 0.0
    if not isinstance(memory, int | float):
        raise TypeError(f"{what}, got {type(memory).__name__} {memory!r}")
    if not 0 <= memory <= 1:
        raise ValueError(f"{what}, got {memory!r}")
    return float(memory)


def _tagged(sample: Any) -> Any:
    if not isinstance(sample, dict):
        raise TypeError(
            f"tag_worker needs samples that are dicts (it adds a 'worker_id' key), "
            f"got {type(sample).__name__}: return {{'input_ids': ..., 'index': i}}"
        )
    info = get_worker_info()
    return {**sample, "worker_id": -1 if info is None else info.id}


class _Tagged:
    """Forwards what the wrapper does not define (``set_epoch``, ``seed``...) to the dataset."""

    dataset: Any

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not yet set (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _TaggedMap(_Tagged, Dataset):
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return _tagged(self.dataset[index])


class _TaggedIterable(_Tagged, IterableDataset):
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[Any]:
        for sample in self.dataset:
            yield _tagged(sample)


def tag_worker(dataset: Any) -> Dataset:
    """Wrap ``dataset`` so each sample (a dict) also says which DataLoader worker made it.

    Only the worker process knows its id (``torch.utils.data.get_worker_info()``),
    so the sample carries it: ``sample["worker_id"]`` is the worker's id, or
    ``-1`` when the loader has no workers. :func:`record` reads the batch's
    ``worker_id`` values into :attr:`StepRecord.worker_ids`, and the
    ``rank_duplicate`` check then names the workers that repeated a sample.

    An :class:`~torch.utils.data.IterableDataset` stays one (same stream, each
    sample tagged); anything else is treated as map-style (``len`` and ``[i]``).
    Other attributes (``set_epoch``...) are forwarded to ``dataset``.
    """
    if isinstance(dataset, IterableDataset):
        return _TaggedIterable(dataset)
    return _TaggedMap(dataset)
