"""Walkthrough 1: shard the data over the DP replicas, never over the whole world.

Every rank loads for itself. ``DistributedSampler`` gives DP replica ``d`` the
indices ``perm[d::dp_size]`` of a permutation seeded with ``seed + epoch``; TP
peers share a replica, so they get the same shard and, because the dataset is
the same on every rank, the same batches.

Try the ways it goes wrong and read the ledger's verdict:

* ``--shard-over world``: the sampler shards over all ranks (``dp_group=None``),
  so TP peers hold different samples.
* ``--no-set-epoch``: every epoch repeats the first epoch's order.
* ``--no-drop-last --num-samples 11``: the last shard is padded with repeats.

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.dp_sharding --out /tmp/dp_ledger

or from a notebook: ``ez.launch(dp_sharding.run, world_size=4, tp_size=2)``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ezpz_nb.data import get_random_dataset_fsdp_tp
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import (
    SEQ_LENGTH,
    SHARD_OVER,
    VOCAB_SIZE,
    ShardOver,
    begin,
    record_epochs,
)
from ezpz_nb.ledger import Ledger

__all__ = ["main", "run"]


def run(
    tp_size: int = 2,
    num_samples: int = 64,
    batch_size: int = 4,
    epochs: int = 2,
    drop_last: bool = True,
    set_epoch: bool = True,
    shard_over: ShardOver = "dp",
    seed: int = 1337,
    out: str | None = None,
) -> Ledger:
    """Load sharded by DP rank on every rank and record which samples each step held.

    Call it on every rank (``ez.launch(run, world_size=4)`` or torchrun).

    Args:
        tp_size: Ranks per TP group; must divide the world size. One that also
            divides --nproc_per_node keeps each group on one node (rank 0 warns
            when a group spans nodes).
        num_samples: Dataset length.
        batch_size: Samples per batch per DP replica.
        epochs: Passes over the data.
        drop_last: Drop what does not divide evenly (else pad with repeats).
        set_epoch: Reshuffle each epoch with ``set_epoch``.
        shard_over: ``"dp"`` (right) or ``"world"`` (pitfall: ``dp_group=None``).
        seed: Shuffle seed, the same on every rank.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`; merge the ranks' with
        ``Ledger.from_results``.
    """
    if shard_over not in SHARD_OVER:
        raise ValueError(f"shard_over must be one of {SHARD_OVER}, got {shard_over!r}")
    layout = begin(tp_size, out)
    built = get_random_dataset_fsdp_tp(
        batch_size,
        VOCAB_SIZE,
        SEQ_LENGTH,
        dp_group=layout.dp_group if shard_over == "dp" else None,
        tp_group=layout.tp_group,
        drop_last=drop_last,
        seed=seed,
        num_samples=num_samples,
    )
    # The file grows step by step: after an error, or a kill, it still shows how far
    # this rank got; the end record says it finished.
    return record_epochs(built["dataloader"], layout, epochs, out=out, set_epoch=set_epoch)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
