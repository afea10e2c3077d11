"""A step record and the ledger file's lines: what one rank held at one step.

The file format itself is described in :mod:`ezpz_nb.ledger`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from ezpz_nb.data.tree import flatten_batch

__all__ = ["FORMAT_VERSION", "StepRecord", "batch_digest"]

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
        worker_ids: The DataLoader worker that produced each sample, in batch
            order (the batch's ``worker_id`` values, see
            :func:`~ezpz_nb.ledger.tag_worker`); ``-1`` for the loading process
            itself, ``()`` when the batch does not say.
        cp_rank: Position in the context-parallel group (CP peers hold the
            same samples, different slices of each sequence); 0 without CP.
        cp_size: Size of the CP group; 1 without CP.
        loss: The training loss of this step, when the loop reported one
            (:meth:`RecordingLoader.log_loss`); ``None`` otherwise.

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


def _batch_ints(batch: Any, key: str) -> tuple[int, ...]:
    """The first ``key`` entry found in a (nested) batch, as a tuple of ints."""
    if isinstance(batch, dict):
        if key in batch:
            ids = batch[key]
            return tuple(
                int(i) for i in (ids.reshape(-1).tolist() if torch.is_tensor(ids) else ids)
            )
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        return ()
    for v in values:
        found = _batch_ints(v, key)
        if found:
            return found
    return ()


def _sample_ids(batch: Any) -> tuple[int, ...]:
    return _batch_ints(batch, "index")


def _worker_ids(batch: Any) -> tuple[int, ...]:
    return _batch_ints(batch, "worker_id")


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj) + "\n"


def _header(num_samples: int | None, **extra: Any) -> str:
    return _line(
        {"ezpz_nb_ledger": FORMAT_VERSION, "kind": "header", "num_samples": num_samples, **extra}
    )


def _step_line(rec: StepRecord) -> str:
    return _line({"kind": "step", **asdict(rec)})


def _loss_line(rec: StepRecord) -> str:
    # A step's line is written when its batch is yielded, before any loss
    # exists: the loss follows in a line of its own, naming its step.
    return _line(
        {"kind": "loss", "rank": rec.rank, "epoch": rec.epoch, "step": rec.step, "loss": rec.loss}
    )


def _end_line(rank: int, steps: int) -> str:
    return _line({"kind": "end", "rank": rank, "steps": steps})


_STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


def _step_from(d: dict[str, Any]) -> StepRecord:
    # Keys a newer writer added are skipped (see the module docstring); keys
    # an older writer did not know take their defaults.
    known = {k: d[k] for k in _STEP_FIELDS if k in d}
    for k in ("sample_ids", "worker_ids"):
        if k in known:
            known[k] = tuple(known[k])
    return StepRecord(**known)
