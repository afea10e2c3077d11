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

A stream without a length (an ``IterableDataset``) is repeated the same way: each
pass deals its ``k``-th sample to replica ``k % dp_size``, and a rank starts the
next pass when its share of this one ends. Its position is ``(epoch, offset)``,
counted as it goes, since a stream's length is known only at a pass's end.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset, default_collate

from ezpz_nb.data.evaluation import ShardError, tagged

__all__ = ["SteppedLoader"]

# Where a stream is in its passes: the state_dict keys that move as it iterates.
_POSITION = {"step", "epoch", "offset"}


def _is_stream(dataset: Any) -> bool:
    return isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__")


class SteppedLoader:
    """Exactly ``steps`` batches of ``batch_size`` on this rank, wrapping epochs as needed.

    Each batch is the collated samples (a dict sample's fields, else ``"sample"``)
    plus ``"index"`` (dataset indices) and ``"epoch"`` (this rank's epoch of each
    sample: a batch can straddle the wrap)::

        loader = SteppedLoader(ds, 8, layout.dp_rank, layout.dp_size, steps=1000)
        for batch in loader:          # 1000 batches on every rank, whatever len(ds)
            ...
        state = loader.state_dict()   # {"step": ..., ...}; load_state_dict(state) resumes

    Over a stream (an ``IterableDataset`` or any re-iterable without ``[i]``),
    ``"index"`` is the sample's own ``index`` field where it has one, else its
    position in the pass. The stream must give every rank the same order for the
    same epoch: before each pass the loader calls ``dataset.set_epoch(epoch)``
    where it has one (that is where a stream shuffles). Resuming re-reads the
    resumed pass up to the saved offset.

    Args:
        dataset: A map-style dataset (``len`` and ``[i]``) with at least ``dp_size``
            samples, or a stream with at least ``dp_size`` samples a pass.
        batch_size: Samples per batch on this rank.
        dp_rank: This replica's data-parallel rank.
        dp_size: The number of replicas.
        steps: Batches every rank yields in all (a resumed loader yields the rest).
        seed: Epoch ``e`` is shuffled with ``seed + e``; the same on every rank.
        shuffle: False keeps each epoch in index order (default: shuffle a
            map-style dataset; a stream keeps its own order).
        collate_fn: Turns a list of samples into a batch (default: torch's).

    Raises:
        ShardError: A non-positive size or step count, fewer samples than
            replicas, a generator (spent after one pass) or ``shuffle=True`` on a
            stream; while iterating, a pass that gives this rank no sample.
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
        shuffle: bool | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("steps", steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ShardError(f"{name} must be a positive int, got {value!r}")
        #: True over a stream without ``[i]``: repeated pass by pass.
        self.stream = _is_stream(dataset)
        n = None if self.stream else len(dataset)
        if not 0 <= dp_rank < dp_size or (n is not None and n < dp_size):
            raise ShardError(
                f"SteppedLoader needs 0 <= dp_rank < dp_size <= len(dataset), got dp_rank="
                f"{dp_rank}, dp_size={dp_size}, len(dataset)={n}: every replica needs a sample"
            )
        if self.stream and isinstance(dataset, Iterator):
            raise ShardError(
                f"SteppedLoader got a {type(dataset).__name__}, which is spent after one pass: "
                "pass an object whose __iter__ starts a new pass (an IterableDataset)"
            )
        if self.stream and shuffle:
            raise ShardError(
                "a stream without [i] cannot be shuffled here: shuffle inside it (a buffer "
                "seeded by its set_epoch(epoch), which this loader calls) and leave shuffle unset"
            )
        self.dataset, self.batch_size, self.steps = dataset, batch_size, steps
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.shuffle = not self.stream if shuffle is None else shuffle
        self.collate_fn = collate_fn or default_collate
        self.num_samples = n
        #: Samples this replica takes per epoch (replicas differ by at most one);
        #: over a stream, None until a pass has ended.
        self.share = None if n is None else len(range(dp_rank, n, dp_size))
        #: Batches yielded so far (the resumable position).
        self.step = 0
        # A stream's position: its epoch, and samples of this rank's share taken in it.
        self._epoch, self._offset = 0, 0
        self._wraps: list[int] = []  # a stream's wrap steps, as seen
        self._cache: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return self.steps

    def _shard(self, epoch: int) -> list[int]:
        if self._cache[0] != epoch:
            n = len(self.dataset)  # map-style only: a stream never gets here
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                order = torch.randperm(n, generator=g).tolist()
            else:
                order = list(range(n))
            self._cache = (epoch, order[self.dp_rank :: self.dp_size])
        return self._cache[1]

    def _map_share(self) -> int:
        if self.share is None:
            raise ShardError(
                "a stream's length is known only as it is read: ask wrap_steps() or .epoch"
            )
        return self.share

    def position(self, step: int) -> tuple[int, int]:
        """``(epoch, offset in this rank's share)`` of the first sample of batch ``step``.

        Raises:
            ShardError: Over a stream (its shares are unknown ahead).
        """
        return divmod(step * self.batch_size, self._map_share())

    @property
    def epoch(self) -> int:
        """This rank's epoch: the one its next sample comes from.

        Over a stream, the pass it is in (a pass that just ran out is noticed at
        the next sample).
        """
        return self._epoch if self.stream else self.position(self.step)[0]

    def wrap_steps(self) -> list[int]:
        """The steps whose batch holds the first sample of a new epoch (epoch 1, 2, ...).

        Over a stream, those this loader has reached so far (since it was made or loaded).
        """
        if self.stream:
            return list(self._wraps)
        share = self._map_share()
        last = (self.steps * self.batch_size - 1) // share
        return [(e * share) // self.batch_size for e in range(1, last + 1)]

    def _indexed(self) -> Iterator[Any]:
        """This rank's samples from its step on, over a map-style dataset."""
        for flat in itertools.count(self.step * self.batch_size):
            epoch, offset = divmod(flat, self._map_share())
            i = self._shard(epoch)[offset]
            yield tagged(self.dataset[i], index=i, epoch=epoch)

    def _streamed(self) -> Iterator[Any]:
        """This rank's samples from its (epoch, offset) on, pass after pass of the stream."""
        while True:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self._epoch)
            mine = itertools.islice(iter(self.dataset), self.dp_rank, None, self.dp_size)
            taken = -1
            for taken, sample in enumerate(mine):
                if taken < self._offset:
                    continue  # resumed: taken before the state was saved
                if taken == 0 and self._epoch > 0:
                    self._wraps.append(self.step)
                self._offset = taken + 1
                where = self.dp_rank + taken * self.dp_size
                own = sample.get("index") if isinstance(sample, Mapping) else None
                yield tagged(sample, index=where if own is None else own, epoch=self._epoch)
            if taken < 0:
                raise ShardError(
                    f"pass {self._epoch} of the stream gave rank {self.dp_rank} no sample: a "
                    f"pass needs at least dp_size={self.dp_size} samples (one per replica)"
                )
            self.share = taken + 1
            self._epoch, self._offset = self._epoch + 1, 0

    def __iter__(self) -> Iterator[Any]:
        samples = self._streamed() if self.stream else self._indexed()
        while self.step < self.steps:
            batch = self.collate_fn([next(samples) for _ in range(self.batch_size)])
            self.step += 1  # before the yield: a state_dict taken now resumes after it
            yield batch

    def state_dict(self) -> dict[str, int]:
        """The position and what it is valid for (another layout or seed is refused on load).

        Over a stream the position also holds ``epoch`` and ``offset`` (samples of
        this rank's share taken in that epoch), and there is no ``num_samples``.
        """
        where = {"epoch": self._epoch, "offset": self._offset} if self.stream else {}
        size = {} if self.num_samples is None else {"num_samples": self.num_samples}
        return {
            "step": self.step,
            **where,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            **size,
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
        if set(state) != set(mine):
            saved = "a stream" if "offset" in state else "a map-style dataset"
            raise ShardError(
                f"this state was saved by a SteppedLoader over {saved} (keys {sorted(state)}); "
                f"this one expects {sorted(mine)}: build the loader over the same dataset"
            )
        odd = [k for k in mine if k not in _POSITION and state.get(k) != mine[k]]
        if odd:
            raise ShardError(
                f"this state was saved by another loader ({', '.join(f'{k}={state.get(k)}' for k in odd)}"
                f"; this one has {', '.join(f'{k}={mine[k]}' for k in odd)}): load each "
                "rank's own state into a loader built with the same arguments"
            )
        self.step = int(state["step"])
        if self.stream:
            self._epoch, self._offset = int(state["epoch"]), int(state["offset"])
            self._wraps = []
