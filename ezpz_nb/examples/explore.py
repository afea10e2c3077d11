"""The explorer's worker: load as ezpz does with the settings of the notebook's controls.

:class:`~ezpz_nb.viz.widgets.Explorer` runs :func:`explore_rank` on every rank of a
live cluster each time a control changes, and plots the ledgers it returns;
notebooks also call it directly: ``ez.launch(explore_rank, 2, world_size=4)``.
"""

from __future__ import annotations

import warnings

from ezpz_nb.data import DataLayoutWarning, get_random_dataset_fsdp_tp
from ezpz_nb.examples.common import begin, record_epochs
from ezpz_nb.ledger import Ledger

__all__ = ["explore_rank"]


def _nothing(batch: object, epoch: int, index: int) -> None:
    """No training step: the explorer shows only what each step held."""


def explore_rank(
    tp_size: int = 1,
    num_samples: int = 10,
    batch_size: int = 2,
    *,
    drop_last: bool = False,
    shuffle: bool = True,
    epochs: int = 2,
    set_epoch: bool = True,
    broadcast: bool = True,
    dp_group: bool = True,
    seed: int = 1337,
) -> Ledger:
    """Load like ezpz does on this rank and return what each step held.

    Call it on every rank: ``ez.launch(explore_rank, 2, world_size=4)``.

    Args:
        tp_size: Ranks per TP group; must divide the world size.
        num_samples: Dataset length.
        batch_size: Samples per batch on each DP replica.
        drop_last: Drop what does not divide evenly (else the sampler pads with repeats).
        shuffle: Shuffle with the sampler's seed (plus the epoch, if set).
        epochs: Passes over the data.
        set_epoch: Call ``set_epoch`` before each pass (else every pass repeats the order).
        broadcast: Only the TP leader loads; its peers receive each batch.
        dp_group: Pass ``dp_group`` to the sampler; ``False`` shards over the
            whole world (ezpz's pitfall: TP peers get different samples).
        seed: Shuffle seed, the same on every rank.

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger` (merge with ``Ledger.from_results``).
    """
    layout = begin(tp_size)
    with warnings.catch_warnings():
        if not dp_group:  # chosen on purpose here; the heatmap shows the result
            warnings.simplefilter("ignore", DataLayoutWarning)
        built = get_random_dataset_fsdp_tp(
            batch_size,
            64,
            8,
            num_samples=num_samples,
            dp_group=layout.dp_group if dp_group else None,
            tp_group=layout.tp_group,
            broadcast_within_tp=broadcast,
            drop_last=drop_last,
            shuffle=shuffle,
            seed=seed,
        )
    return record_epochs(built["dataloader"], layout, epochs, set_epoch=set_epoch, step=_nothing)
