"""A step record: what one rank held at one step, and how long the step took.

The file format is :mod:`ezpz_nb.ledger.codec`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ezpz_nb.data.tree import find_in_batch, flatten_batch, sample_values

__all__ = ["StepRecord", "StepTimes", "batch_digest", "batch_ints", "batch_tokens", "with_times"]


@dataclass(frozen=True)
class StepTimes:
    """How one rank spent one step, as its recorder measured it (seconds).

    The four durations tile the step: ``data_s + compute_s + collective_s +
    other_s`` is the wall time from asking for this batch to asking for the next.

    Attributes:
        data_s: Waiting for the batch: the time inside the loader's ``next()``
            (for an epoch's first step also ``iter()``, where workers start).
        compute_s: The step's own work: the time in ``rec.compute()`` blocks,
            or, when the loop marks none, everything the loop did between two
            batches outside ``rec.collective()`` blocks.
        collective_s: Time inside ``rec.collective()`` blocks (waiting for the
            other ranks, then the transfer); 0 when the loop marks none.
        other_s: The rest of the loop's time when it marks ``rec.compute()``
            (logging, evaluation...); 0 otherwise.
        start_at: Wall-clock time (``time.time()``) when the rank asked for
            the batch.
        entered_at: Wall-clock time when the rank entered the step's first
            collective block; ``None`` without one. The ledger compares it
            across ranks: a rank's wait is the time to the last rank's entry.
        end_s: On an epoch's last step only: the time in the loader's final
            ``next()``, which found the epoch over (workers shut down there
            unless ``persistent_workers``); 0 on other steps.
        delay_s: Of the step's time outside its collective, how long the kernel kept
            the rank ready to run but off a CPU (its loop thread's wait, plus the longest
            wait of a loader worker, at most ``data_s``): the stretch a machine busy with
            other programs adds; 0 where the kernel does not say (not Linux).
    """

    data_s: float
    compute_s: float
    collective_s: float = 0.0
    other_s: float = 0.0
    start_at: float = 0.0
    entered_at: float | None = None
    end_s: float = 0.0
    delay_s: float = 0.0


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
        worker_ids: The DataLoader worker that produced each sample, in batch
            order (the batch's ``worker_id`` values, see
            :func:`~ezpz_nb.ledger.tag_worker`); ``-1`` for the loading process
            itself, ``()`` when the batch does not say.
        cp_rank: Position in the context-parallel group (CP peers hold the
            same samples, different slices of each sequence); 0 without CP.
        cp_size: Size of the CP group; 1 without CP.
        loss: The training loss of this step, when the loop reported one
            (:meth:`RecordingLoader.log_loss`); ``None`` otherwise.
        real_tokens: Tokens of real text in the batch; -1 when the batch does not
            say (see :func:`batch_tokens`). Format version 4.
        pad_tokens: Padding tokens in the batch; -1 when the batch does not say.
        row_docs: For packed rows (a batch with ``doc_ids``), the documents in each
            row, in the order they appear; ``()`` otherwise.
        dataset_ids: Which dataset of a mixture each sample came from, in batch order
            (the batch's ``dataset_id`` values, see :class:`ezpz_nb.data.mixture.MixedLoader`);
            ``()`` when the batch does not say. Format version 5.
        times: How long the step took (:class:`StepTimes`); ``None`` when not
            measured. Not part of a record's equality: two runs that held the
            same batches compare equal however long they took.

    The fields from ``worker_ids`` on have defaults, so older files load.
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
    # Added after format version 2 was out: it has a default, so files and
    # code that do not know it still load and build records.
    worker_ids: tuple[int, ...] = ()
    cp_rank: int = 0
    cp_size: int = 1
    loss: float | None = None
    real_tokens: int = -1
    pad_tokens: int = -1
    row_docs: tuple[tuple[int, ...], ...] = ()
    dataset_ids: tuple[int, ...] = ()
    times: StepTimes | None = field(default=None, compare=False)


def with_times(rec: StepRecord, times: StepTimes) -> StepRecord:
    """A copy of ``rec`` with ``times``, made without ``dataclasses.replace``.

    ``replace`` re-runs the frozen ``__init__`` (one ``object.__setattr__`` per
    field): 5-12 us here, most of the timings' budget of 20 us per step. The
    record has no ``__post_init__`` to skip, so a copy of its fields is the same
    record, in about 1 us.
    """
    new = object.__new__(StepRecord)
    new.__dict__.update(rec.__dict__)
    new.__dict__["times"] = times
    return new


def batch_digest(batch: Any) -> str:
    """Hex blake2b (16 bytes) of the bytes of every tensor leaf of ``batch``."""
    h = hashlib.blake2b(digest_size=16)
    for t in flatten_batch(batch)[1]:
        # Bytes as stored, so bit-different floats (or a different dtype of the
        # same values) give a different digest.
        flat = t.detach().cpu().contiguous().reshape(-1)
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy().data)  # buffer protocol: no copy
    return h.hexdigest()


def batch_ints(batch: Any, key: str) -> tuple[int, ...]:
    """Every sample's ``key`` in a (nested) batch, as a tuple of ints.

    ``batch_ints(batch, "index")`` gives the sample ids of a batch, ``"worker_id"``
    the DataLoader worker of each sample; ``()`` when the batch has no such key.
    Columns, lists of sample dicts and nestings of both are read
    (:func:`~ezpz_nb.data.tree.sample_values`).
    """
    return tuple(int(i) for i in sample_values(batch, key) or ())


def _find(batch: Any, key: str) -> torch.Tensor | None:
    """The first tensor under ``key`` in a (nested) batch, else ``None``."""
    return find_in_batch(batch, key, torch.is_tensor)


def batch_tokens(batch: Any) -> tuple[int, int, tuple[tuple[int, ...], ...]]:
    """``(real_tokens, pad_tokens, row_docs)`` of a batch of text, as far as it says.

    Read from, in this order: ``real_tokens`` and ``pad_tokens`` entries (what
    :mod:`ezpz_nb.text`'s collates add), ``doc_ids`` (-1 marks padding), or an
    ``attention_mask`` (0 marks padding). ``row_docs`` comes from a 2-D ``doc_ids``:
    each row's documents in order of appearance. A batch with none of these gives
    ``(-1, -1, ())``: a ledger of random tokens says nothing about text.
    """
    docs = _find(batch, "doc_ids")
    real_t, pad_t = _find(batch, "real_tokens"), _find(batch, "pad_tokens")
    if real_t is not None and pad_t is not None:
        real, pad = int(real_t.sum()), int(pad_t.sum())
    elif docs is not None:
        real = int((docs >= 0).sum())
        pad = docs.numel() - real
    elif (mask := _find(batch, "attention_mask")) is not None:
        real = int((mask != 0).sum())
        pad = mask.numel() - real
    else:
        return -1, -1, ()
    rows: tuple[tuple[int, ...], ...] = ()
    if docs is not None and docs.dim() == 2:
        rows = tuple(tuple(dict.fromkeys(d for d in row if d >= 0)) for row in docs.cpu().tolist())
    return real, pad, rows
