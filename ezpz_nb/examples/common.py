"""What every walkthrough needs besides the idea it teaches.

* :func:`begin` and :func:`record_epochs`: the skeleton every walkthrough shares.
  ``begin`` joins torchrun's process group (nothing to do inside an ``ez.launch``
  rank), prepares the ledger folder and builds the DP x TP layout; the walkthrough
  builds its loader (its one idea); ``record_epochs`` records it over the epochs,
  one training step per batch, and returns the rank's ledger.
* :func:`ensure_distributed`, :func:`check_backend`, :func:`run_in_place` (from
  :mod:`ezpz_nb.launcher.torchrun`): join torchrun's process group, or do nothing
  inside an ``ez.launch`` rank; nccl without a GPU fails before any group exists.
* :func:`destroy_distributed` (from :mod:`ezpz_nb._dist`): tear the group down so
  that none of its threads outlives it (a gloo thread alive at interpreter exit
  can abort the process after all the work was done).
* :func:`device`: the rank's GPU under nccl, else the CPU.
* :func:`prepare_out` / :func:`ledger_file`: one ledger file per rank
  (``DIR/rank{r}.jsonl``), written step by step, merged later with
  ``Ledger.load(DIR)``.

The command line of each walkthrough (``cli_main``, ``parser_for``) is in
:mod:`ezpz_nb.examples.command`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

from ezpz_nb._dist import collective_device as device
from ezpz_nb._dist import destroy_distributed
from ezpz_nb.data.groups import Layout, make_layout
from ezpz_nb.data.tree import flatten_batch, unflatten_batch
from ezpz_nb.launcher.torchrun import (
    BACKENDS,
    TORCHRUN_VARS,
    check_backend,
    ensure_distributed,
    in_torchrun_env,
    run_in_place,
)
from ezpz_nb.ledger import Ledger, record

__all__ = [
    "BACKENDS",
    "SEQ_LENGTH",
    "SHARD_OVER",
    "TORCHRUN_VARS",
    "VOCAB_SIZE",
    "ShardOver",
    "begin",
    "check_backend",
    "destroy_distributed",
    "device",
    "ensure_distributed",
    "in_torchrun_env",
    "ledger_file",
    "ledger_path",
    "prepare_out",
    "record_epochs",
    "run_in_place",
    "to_device",
]

#: Size of the random-token samples: small, because the walkthroughs are about
#: which sample goes where, not about the tokens.
VOCAB_SIZE = 1024
SEQ_LENGTH = 16

#: What the sampler shards over: the DP replicas (right) or the whole world
#: (the pitfall of ``dp_group=None``: TP peers get different samples).
ShardOver = Literal["dp", "world"]
SHARD_OVER: tuple[str, ...] = get_args(ShardOver)

#: What a walkthrough does with each batch: ``step(batch, epoch, index)``; a float it
#: returns is the step's loss, logged in the ledger beside the batch.
Step = Callable[[Any, int, int], float | None]


def to_device(batch: Any, dev: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``dev``; other leaves are kept."""
    tree, tensors = flatten_batch(batch)
    return unflatten_batch(tree, [t.to(dev, non_blocking=True) for t in tensors])


def begin(tp_size: int, out: str | Path | None = None) -> Layout:
    """Start a walkthrough on this rank: join the group, prepare ``out``, lay out DP x TP.

    Joins torchrun's process group when run under torchrun (inside an
    ``ez.launch`` rank the group exists already), empties the ledger folder
    ``out`` of an earlier run's files, and returns this rank's layout.
    """
    ensure_distributed()
    prepare_out(out)
    return make_layout(tp_size)


def _move(batch: Any, epoch: int, index: int) -> None:
    # Stands in for a training step: where a model would take the batch; under nccl
    # it is the copy a TP leader's loaded batch needs.
    to_device(batch, device())


def record_epochs(
    loader: Any,
    layout: Layout,
    epochs: int,
    *,
    out: str | Path | None = None,
    set_epoch: bool = True,
    step: Step = _move,
) -> Ledger:
    """Run ``epochs`` passes over ``loader``, recording what every step held.

    Args:
        loader: This rank's loader (the walkthrough's idea).
        layout: This rank's place in the DP x TP layout (:func:`begin`).
        epochs: Number of passes.
        out: Ledger folder: the file ``rank{r}.jsonl`` there grows by one line per
            step, so a rank that is killed still leaves the steps it took.
        set_epoch: Call ``set_epoch(epoch)`` before each pass (forgetting it
            repeats the same order every epoch).
        step: Called as ``step(batch, epoch, index)`` for each batch; a float it
            returns is logged as the step's loss. Default: move the batch to
            :func:`device`.

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`; merge the ranks' with
        ``Ledger.from_results``.
    """
    with record(loader, layout, path=ledger_file(out)) as rec:
        for epoch in range(epochs):
            if set_epoch:
                rec.set_epoch(epoch)
            for index, batch in enumerate(rec):
                loss = step(batch, epoch, index)
                if loss is not None:
                    rec.log_loss(loss)
    return rec.ledger()


def ledger_path(out: str | Path, rank: int) -> Path:
    """The file rank ``rank`` writes its ledger to inside folder ``out``."""
    return Path(out) / f"rank{rank}.jsonl"


def prepare_out(out: str | Path | None) -> None:
    """Make ``out`` and remove ledger files of an earlier run (call on every rank).

    A stale ``rank7.jsonl`` from an 8-rank run would otherwise be merged into
    a later 4-rank run's ledger. One process per node cleans (nodes may not
    share the folder), and a barrier keeps every rank from writing before that.
    """
    if out is None:
        return
    rank = dist.get_rank()
    if int(os.environ.get("LOCAL_RANK", rank)) == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        for old in Path(out).glob("rank*.jsonl"):
            old.unlink(missing_ok=True)
    dist.barrier()


def ledger_file(out: str | Path | None) -> Path | None:
    """This rank's ledger file in folder ``out`` (None if ``out`` is None).

    Pass it to ``record(..., path=...)``: the file then grows by one line per
    step, so a rank that is killed still leaves the steps it took.
    """
    return None if out is None else ledger_path(out, dist.get_rank())
