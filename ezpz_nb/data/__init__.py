"""Distributed data loading: the ezpz API, the rank layout, and the TP broadcast.

* :mod:`.distributed`: ``RandomTokenDataset``, ``TPBroadcastDataLoader``,
  ``get_random_dataset_fsdp_tp`` (the names of ``ezpz.data.distributed``),
  importable from here;
* :mod:`.groups`: the DP x TP layout of the ranks (``make_layout``);
* :mod:`.evaluation`: exact evaluation on any size and DP degree (``WeightedShard``,
  ``global_mean``); :mod:`.stepped`: ``SteppedLoader``, N steps on every rank over an
  endless pass with per-rank epochs;
* :mod:`.broadcast`: the packed broadcast of a batch inside a TP group (its wire
  format), over :mod:`.tree` (a nested batch as tree + tensors).

Nothing here knows about notebooks or the launcher.
"""

from __future__ import annotations

from ezpz_nb.data.distributed import (
    DataLayoutWarning,
    RandomTokenDataset,
    TPBroadcastDataLoader,
    TPLeaderError,
    forward_set_epoch,
    get_random_dataset_fsdp_tp,
)
from ezpz_nb.data.evaluation import (
    ShardError,
    WeightedShard,
    eval_indices,
    global_mean,
    weighted_sums,
)
from ezpz_nb.data.stepped import SteppedLoader

__all__ = [
    "DataLayoutWarning",
    "RandomTokenDataset",
    "ShardError",
    "SteppedLoader",
    "TPBroadcastDataLoader",
    "TPLeaderError",
    "WeightedShard",
    "eval_indices",
    "forward_set_epoch",
    "get_random_dataset_fsdp_tp",
    "global_mean",
    "weighted_sums",
]
