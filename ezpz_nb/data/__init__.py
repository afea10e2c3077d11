"""Distributed data loading: the ezpz API, the rank layout, and the TP broadcast.

* :mod:`.distributed`: ``RandomTokenDataset``, ``TPBroadcastDataLoader``,
  ``get_random_dataset_fsdp_tp`` (the names of ``ezpz.data.distributed``),
  importable from here;
* :mod:`.groups`: the DP x TP layout of the ranks (``make_layout``);
* :mod:`.resumable`: ``GlobalOrderLoader``, a loader whose place is one global
  ``consumed_samples`` (it resumes at any DP size);
* :mod:`.checkpoint`: ``LoaderCheckpoint``, the loader's state in a
  ``torch.distributed.checkpoint`` save, keyed per DP rank, with every generator of each
  process beside it (:mod:`.rng_state`; docs/checkpoint.md);
* :mod:`.evaluation`: exact evaluation on any size and DP degree (``WeightedShard``,
  ``global_mean``); :mod:`.stepped`: ``SteppedLoader``, N steps on every rank over an
  endless pass with per-rank epochs;
* :mod:`.broadcast`: the packed broadcast of a batch inside a TP group (its wire
  format), over :mod:`.tree` (a nested batch as tree + tensors);
* :mod:`.mixture`: sources mixed by weight into one global-batch stream that
  does not depend on the DP size or the workers (``Mixture``, ``MixedLoader``).

Nothing here knows about notebooks or the launcher.
"""

from __future__ import annotations

from ezpz_nb.data.checkpoint import CheckpointLayoutError, CheckpointStateError, LoaderCheckpoint
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
from ezpz_nb.data.mixture import MixedLoader, MixError, Mixture
from ezpz_nb.data.resumable import GlobalOrderLoader, LoaderStateError, ShardStream
from ezpz_nb.data.stepped import SteppedLoader

__all__ = [
    "CheckpointLayoutError",
    "CheckpointStateError",
    "GlobalOrderLoader",
    "LoaderCheckpoint",
    "LoaderStateError",
    "ShardStream",
    "DataLayoutWarning",
    "MixError",
    "MixedLoader",
    "Mixture",
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
