"""Training by step count: exactly ``steps`` batches on every rank from an endless pass.

A job that trains "for N epochs" over shards of different sizes, or over a stream
without a length, leaves its ranks with different step counts: the first rank to
run out leaves the others waiting in a collective. :class:`SteppedLoader` turns a
map-style dataset into an endless stream on each rank and stops every rank after
the same ``steps``. Each epoch deals one permutation of the dataset over the
replicas (sample ``perm[k]`` to replica ``k % dp_size``), so within an epoch no
sample goes to two replicas and the replicas' shares differ by at most one. Each
rank counts its own epochs: a replica with a shorter share wraps sooner. The
position is the step alone (the epoch and the offset follow from it), so a
resumed loader needs only ``state_dict()["step"]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import default_collate

from ezpz_nb.data.evaluation import ShardError

__all__ = ["SteppedLoader"]


class SteppedLoader:
    """Exactly ``steps`` batches of ``batch_size`` on this rank, wrapping epochs as needed.

    Each batch is the collated samples (a dict sample's fields, else ``"sample"``)
    plus ``"index"`` (dataset indices) and ``"epoch"`` (this rank's epoch of each
    sample: a batch can straddle the wrap)::

        loader = SteppedLoader(ds, 8, layout.dp_rank, layout.dp_size, steps=1000)
        for batch in loader:          # 1000 batches on every rank, whatever len(ds)
            ...
        state = loader.state_dict()   # {"step": ..., ...}; load_state_dict(state) resumes

    Args:
        dataset: A map-style dataset (``len`` and ``[i]``) with at least ``dp_size`` samples.
        batch_size: Samples per batch on this rank.
        dp_rank: This replica's data-parallel rank.
        dp_size: The number of replicas.
        steps: Batches every rank yields in all (a resumed loader yields the rest).
        seed: Epoch ``e`` is shuffled with ``seed + e``; the same on every rank.
        shuffle: False keeps each epoch in index order.
        collate_fn: Turns a list of samples into a batch (default: torch's).

    Raises:
        ShardError: A non-positive size or step count, or fewer samples than replicas.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        dp_rank: int,
        dp_size: int,
        *,
        steps: int,
        seed: int = 0,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("steps", steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ShardError(f"{name} must be a positive int, got {value!r}")
        n = len(dataset)
        if not 0 <= dp_rank < dp_size or n < dp_size:
            raise ShardError(
                f"SteppedLoader needs 0 <= dp_rank < dp_size <= len(dataset), got dp_rank="
                f"{dp_rank}, dp_size={dp_size}, len(dataset)={n}: every replica needs a sample"
            )
        self.dataset, self.batch_size, self.steps = dataset, batch_size, steps
        self.dp_rank, self.dp_size, self.seed, self.shuffle = dp_rank, dp_size, seed, shuffle
        self.collate_fn = collate_fn or default_collate
        self.num_samples = n
        #: Samples this replica takes per epoch (replicas differ by at most one).
        self.share = len(range(dp_rank, n, dp_size))
        #: Batches yielded so far (the resumable position).
        self.step = 0
        self._cache: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return self.steps

    def _shard(self, epoch: int) -> list[int]:
        if self._cache[0] != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                order = list(range(self.num_samples))
            self._cache = (epoch, order[self.dp_rank :: self.dp_size])
        return self._cache[1]

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, offset in this rank's share)`` of the first sample of batch ``step``."""
        return divmod(step * self.batch_size, self.share)

    @property
    def epoch(self) -> int:
        """This rank's epoch: the one its next sample comes from."""
        return self.position(self.step)[0]

    def wrap_steps(self) -> list[int]:
        """The steps whose batch holds the first sample of a new epoch (epoch 1, 2, ...)."""
        last = (self.steps * self.batch_size - 1) // self.share
        return [(e * self.share) // self.batch_size for e in range(1, last + 1)]

    def _sample(self, flat: int) -> Any:
        epoch, offset = divmod(flat, self.share)
        i = self._shard(epoch)[offset]
        sample = self.dataset[i]
        fields = dict(sample) if isinstance(sample, Mapping) else {"sample": sample}
        return {**fields, "index": i, "epoch": epoch}

    def __iter__(self) -> Iterator[Any]:
        while self.step < self.steps:
            first = self.step * self.batch_size
            batch = self.collate_fn([self._sample(first + j) for j in range(self.batch_size)])
            self.step += 1  # before the yield: a state_dict taken now resumes after it
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The position and what it is valid for (another layout or seed is refused on load)."""
        return {
            "step": self.step,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume at ``state["step"]``.

        Raises:
            ShardError: The state was taken with another rank, layout, dataset,
                batch size or seed (the step would point at other samples).
        """
        mine = self.state_dict()
        odd = [k for k in mine if k != "step" and state.get(k) != mine[k]]
        if odd:
            raise ShardError(
                f"this state was saved by another loader ({', '.join(f'{k}={state.get(k)}' for k in odd)}"
                f"; this one has {', '.join(f'{k}={mine[k]}' for k in odd)}): load each "
                "rank's own state into a loader built with the same arguments"
            )
        self.step = int(state["step"])
