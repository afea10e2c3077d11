"""Walkthrough 2: only the TP leader loads; it broadcasts each batch to its TP peers.

TP peers must compute on the *same* batch. Two ways get there: every peer
loads the same shard of a dataset that is the same everywhere, or the leader
(TP rank 0) loads and sends. The second is what ezpz's
``TPBroadcastDataLoader`` does; ours announces every step in one packed
``dist.broadcast``, so peers never have to guess how many batches come. Under
nccl the buffer lives on the GPU: peers receive CUDA tensors.

Try the pitfall the broadcast fixes:

* ``--rank-seeded --no-broadcast``: each rank's dataset is seeded by its rank
  (as ezpz's random dataset is), so TP peers get different tokens for the same
  sample ids; the ledger reports a ``tp_mismatch``.
* ``--rank-seeded`` (with the broadcast): only the leader's tokens count, fixed.

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.tp_broadcast --out /tmp/tp_ledger

or from a notebook: ``ez.launch(tp_broadcast.run, world_size=4, tp_size=2)``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Literal, get_args

import torch.distributed as dist

from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import SEQ_LENGTH, VOCAB_SIZE, begin, record_epochs
from ezpz_nb.ledger import Ledger

__all__ = ["main", "run"]

Mode = Literal["tensor", "pickle"]
MODES: tuple[str, ...] = get_args(Mode)


def run(
    tp_size: int = 2,
    num_samples: int = 64,
    batch_size: int = 4,
    epochs: int = 2,
    broadcast: bool = True,
    mode: Mode = "tensor",
    rank_seeded: bool = False,
    drop_last: bool = True,
    set_epoch: bool = True,
    seed: int = 1337,
    out: str | None = None,
) -> Ledger:
    """Load on the TP leader, broadcast within TP, and record what every rank held.

    Call it on every rank (``ez.launch(run, world_size=4)`` or torchrun).

    Args:
        tp_size: Ranks per TP group; must divide the world size. One that also
            divides --nproc_per_node keeps each group on one node (rank 0 warns
            when a group spans nodes).
        num_samples: Dataset length.
        batch_size: Samples per batch per DP replica.
        epochs: Passes over the data.
        broadcast: Leader loads and broadcasts; False: every rank loads itself.
        mode: ``"tensor"`` (one packed collective per batch) or ``"pickle"``
            (ezpz's ``broadcast_object_list``).
        rank_seeded: Seed each rank's dataset with its global rank (pitfall).
        drop_last: Drop what does not divide evenly over DP (else pad).
        set_epoch: Reshuffle each epoch with ``set_epoch``.
        seed: Shuffle seed, the same on every rank.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`; each record's ``source``
        says whether the batch was ``loaded`` or ``received``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    layout = begin(tp_size, out)
    # Seeding by rank is the pitfall on show; seed 0 is what every rank would share.
    dataset = RandomTokenDataset(
        VOCAB_SIZE, SEQ_LENGTH, num_samples=num_samples, seed=dist.get_rank() if rank_seeded else 0
    )
    built = get_random_dataset_fsdp_tp(
        batch_size,
        VOCAB_SIZE,
        SEQ_LENGTH,
        dp_group=layout.dp_group,
        tp_group=layout.tp_group,
        broadcast_within_tp=broadcast,
        broadcast=mode,
        drop_last=drop_last,
        seed=seed,
        dataset=dataset,
    )
    return record_epochs(built["dataloader"], layout, epochs, out=out, set_epoch=set_epoch)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
