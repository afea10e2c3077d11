"""Evaluation that counts every sample exactly once, on any dataset size and DP degree.

``DistributedSampler`` makes ranks equal by repeating the first indices (a metric
then counts them twice) or, with ``drop_last``, by dropping the last ones. Two
ways are exact:

* :class:`WeightedShard`: pad every replica's shard to the same length, and mark
  the padding with ``weight`` 0. Every rank takes as many steps (what FSDP's
  forward, whose all-gathers pair by call order, needs), and a weighted sum
  skips the padding;
* uneven shards (:func:`eval_indices` with ``pad=False``): some replicas take one
  step fewer, which is safe only when the eval step makes no collective.

Either way each rank sums its metric and its weight, and :func:`global_mean`
all-reduces the two sums once: the mean of per-rank means is not the global mean
when the shards differ in size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from ezpz_nb._dist import collective_device
from ezpz_nb.errors import EzpzError

__all__ = [
    "ShardError",
    "WeightedShard",
    "eval_indices",
    "global_mean",
    "tagged",
    "weighted_sums",
]


class ShardError(EzpzError, ValueError):
    """A shard (for evaluation or a stepped loader) asked for with impossible arguments (says which and how to fix it)."""


def _check_replica(num_samples: int, dp_rank: int, dp_size: int) -> None:
    for name, value in (("num_samples", num_samples), ("dp_rank", dp_rank), ("dp_size", dp_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ShardError(f"{name} must be an int, got {value!r}")
    if num_samples < 1:
        raise ShardError(f"num_samples must be at least 1, got {num_samples}")
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ShardError(
            f"dp_rank must be in 0..dp_size-1, got dp_rank={dp_rank}, dp_size={dp_size}: pass "
            "the rank's data-parallel rank and size (layout.dp_rank, layout.dp_size)"
        )


def eval_indices(
    num_samples: int, dp_rank: int, dp_size: int, *, pad: bool = True
) -> tuple[list[int], list[float]]:
    """This replica's evaluation indices and their weights.

    Sample ``i`` goes to replica ``i % dp_size`` (the strided split
    ``DistributedSampler`` uses without shuffling), so together the replicas hold
    each sample once.

    Args:
        num_samples: The dataset's length.
        dp_rank: This replica's data-parallel rank.
        dp_size: The number of replicas.
        pad: Pad to ``ceil(num_samples / dp_size)`` entries on every replica with
            index 0 at weight 0 (equal steps); False gives uneven shards.

    Returns:
        ``(indices, weights)``: weight 1.0 for a real sample, 0.0 for padding.

    Raises:
        ShardError: A size below 1 or a rank outside ``0..dp_size-1``.
    """
    _check_replica(num_samples, dp_rank, dp_size)
    indices = list(range(dp_rank, num_samples, dp_size))
    weights = [1.0] * len(indices)
    if pad:
        missing = math.ceil(num_samples / dp_size) - len(indices)
        # Index 0 exists in every dataset; its weight 0 keeps it out of every sum.
        indices += [0] * missing
        weights += [0.0] * missing
    return indices, weights


def tagged(sample: Any, **tags: Any) -> dict[str, Any]:
    """A sample's fields (a dict's own, else ``{"sample": sample}``) with ``tags`` added.

    The one shape of an item that says where it came from: :class:`WeightedShard`'s
    (``index``, ``weight``) and :class:`~ezpz_nb.data.stepped.SteppedLoader`'s
    (``index``, ``epoch``), so that the default collate batches either.
    """
    fields = dict(sample) if isinstance(sample, Mapping) else {"sample": sample}
    return {**fields, **tags}


class WeightedShard(Dataset[dict[str, Any]]):
    """One replica's evaluation shard, padded to equal length, each item with its weight.

    Every replica has ``ceil(len(dataset) / dp_size)`` items, so every rank takes
    as many steps; an item is the sample (a dict's fields, or ``{"sample": ...}``)
    plus ``"index"`` (the dataset index) and ``"weight"`` (0.0 on padding)::

        shard = WeightedShard(ds, layout.dp_rank, layout.dp_size)
        # On the loss's device (no host sync per step), float64 (exact counts past 2**24)
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = torch.zeros_like(total)
        for batch in DataLoader(shard, batch_size=8):
            w = batch["weight"].to(device)
            total += (loss_per_sample(batch) * w).sum()
            count += w.sum()
        mean = global_mean(total, count, layout.dp_group)  # one all-reduce, on the group's device

    Args:
        dataset: A map-style dataset (``len`` and ``[i]``).
        dp_rank: This replica's data-parallel rank.
        dp_size: The number of replicas.
    """

    def __init__(self, dataset: Any, dp_rank: int, dp_size: int) -> None:
        try:
            n = len(dataset)
        except TypeError:
            raise ShardError(
                f"WeightedShard needs a dataset with a length, got {type(dataset).__name__}: "
                "for a stream without one, evaluate a fixed number of steps instead"
            ) from None
        self.dataset = dataset
        self.indices, self.weights = eval_indices(n, dp_rank, dp_size)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = self.indices[k]
        return tagged(self.dataset[i], index=i, weight=self.weights[k])


def global_mean(
    total: float | torch.Tensor,
    count: float | torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> float:
    """The metric over every sample of every replica: all-reduce the sum and the count, divide.

    One collective (sum and count travel in one float64 tensor); every rank of
    ``group`` must call it, once, whatever its shard's size. The tensor is made where
    the group's collectives run: the rank's GPU under NCCL (which raises on a CPU
    tensor), the CPU under gloo. float64 because a float32 sum stops counting exactly
    past 2**24 (16.7 M) samples; NCCL reduces float64 like any other dtype.

    Args:
        total: This rank's sum of the metric (weighted: padding adds 0).
        count: This rank's number of samples (the sum of its weights).
        group: The data-parallel group; None is the default group.

    Raises:
        ShardError: No replica counted a sample (every count was 0).
    """
    device = collective_device(group)
    pair = torch.tensor([float(total), float(count)], dtype=torch.float64, device=device)
    dist.all_reduce(pair, group=group)
    if pair[1] <= 0:
        raise ShardError(
            "global_mean: the count summed over the replicas is 0: add each sample's weight "
            "(1 for a real sample) to count"
        )
    return float(pair[0] / pair[1])


def weighted_sums(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    """``(sum of value * weight, sum of weight)``: a rank's share for :func:`global_mean`."""
    return (
        math.fsum(v * w for v, w in zip(values, weights, strict=True)),
        math.fsum(weights),
    )
