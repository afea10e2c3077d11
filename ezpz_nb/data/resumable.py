"""A loader whose place in an epoch is one global number: it resumes at any DP size.

:class:`GlobalOrderLoader` walks one global order of the dataset per epoch (a
permutation seeded by ``seed + epoch``, the same on every rank). Global step
``s`` covers ``order[s*B*D : (s+1)*B*D]`` (``B`` the batch size per replica,
``D`` the DP size), and DP rank ``r`` takes every ``D``-th of those. Its place
is then ``consumed_samples``, a count of the whole job, not of one rank: a job
restarted at another DP size cuts the rest of the same order anew and sees no
sample twice and none never (Megatron-LM keeps ``consumed_samples`` for this
reason; MosaicML streaming and Grain keep a global position too).

The loader can also draw randomness, as augmentations do: ``mask_rate`` hides
tokens of ``input_ids``. With ``rng="per-rank"`` the draws come from one
``torch.Generator`` per rank, seeded ``seed + dp_rank``: its state must be saved
per DP rank and cannot be split over another DP size. With ``rng="per-sample"``
each sample's draw is seeded by ``(seed, epoch, sample index)``: nothing to save,
and it re-shards (what Grain and MosaicML do).

Nothing here communicates; :mod:`ezpz_nb.data.checkpoint` puts the state into a
``torch.distributed.checkpoint`` save.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, get_args

import torch

from ezpz_nb.errors import EzpzError

__all__ = [
    "RNG_MODES",
    "GlobalOrderLoader",
    "LoaderStateError",
    "RngMode",
    "ShardStream",
    "collate",
]

RngMode = Literal["per-rank", "per-sample"]
RNG_MODES: tuple[str, ...] = get_args(RngMode)
MASK_TOKEN = 0


class LoaderStateError(EzpzError, ValueError):
    """A state given to ``load_state_dict`` that this loader cannot resume from."""


def masked(item: dict[str, Any], g: torch.Generator, rate: float) -> dict[str, Any]:
    """``item`` with a share ``rate`` of its ``input_ids`` replaced by token 0, drawn from ``g``."""
    item = dict(item)
    if rate > 0:
        ids = item["input_ids"].clone()
        ids[torch.rand(ids.shape, generator=g) < rate] = MASK_TOKEN
        item["input_ids"] = ids
    return item


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack a list of sample dicts into one batch dict (ints become a tensor)."""
    out: dict[str, Any] = {}
    for k in items[0]:
        vals = [it[k] for it in items]
        out[k] = torch.stack(vals) if isinstance(vals[0], torch.Tensor) else torch.tensor(vals)
    return out


class GlobalOrderLoader:
    """Batches of ``dataset`` for one DP rank, from one global order per epoch.

    Args:
        dataset: A map-style dataset of dicts with ``"input_ids"`` (and any
            other fields, e.g. ``"labels"``, ``"index"``).
        batch_size: Samples per batch on this DP rank.
        dp_rank, dp_size: This rank's DP replica and the number of replicas.
        seed: Seed of the order (and of the masks).
        mask_rate: Share of ``input_ids`` tokens replaced by token 0 (0: none).
        rng: ``"per-rank"`` or ``"per-sample"`` (see the module docstring).

    An epoch ends when fewer than ``batch_size * dp_size`` samples are left (the
    tail is dropped, as ``drop_last`` does, and counted in :attr:`dropped`).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        dp_rank: int,
        dp_size: int,
        *,
        seed: int = 0,
        mask_rate: float = 0.0,
        rng: RngMode = "per-rank",
    ) -> None:
        if rng not in RNG_MODES:
            raise LoaderStateError(f"rng must be one of {RNG_MODES}, got {rng!r}")
        if not 0 <= dp_rank < dp_size or batch_size < 1:
            raise LoaderStateError(
                f"need 0 <= dp_rank < dp_size and batch_size >= 1, got dp_rank={dp_rank}, "
                f"dp_size={dp_size}, batch_size={batch_size}"
            )
        self.dataset, self.batch_size = dataset, batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.seed, self.mask_rate, self.rng = seed, mask_rate, rng
        self.epoch = 0
        self.consumed_samples = 0  # of the whole job, in this epoch's global order
        self.generator = torch.Generator().manual_seed(seed + dp_rank)

    @property
    def global_batch(self) -> int:
        """Samples one step takes over all DP replicas."""
        return self.batch_size * self.dp_size

    @property
    def reshardable(self) -> bool:
        """True when the state holds nothing of one rank's own: no masks, or per-sample masks."""
        return self.mask_rate == 0 or self.rng == "per-sample"

    @property
    def dropped(self) -> int:
        """Samples at the end of an epoch that no step takes (fewer than a global batch)."""
        return (len(self.dataset) - self.consumed_samples) % self.global_batch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a loaded state keeps its place if it is that epoch)."""
        if epoch != self.epoch:
            self.epoch, self.consumed_samples = epoch, 0

    def order(self) -> list[int]:
        """This epoch's global order of sample indices (the same on every rank)."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=g).tolist()

    def __len__(self) -> int:
        return (len(self.dataset) - self.consumed_samples) // self.global_batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = self.order()
        while self.consumed_samples + self.global_batch <= len(order):
            step = order[self.consumed_samples : self.consumed_samples + self.global_batch]
            mine = step[self.dp_rank :: self.dp_size]
            # Counted before the yield: a state saved after the step holds the next place.
            self.consumed_samples += self.global_batch
            yield collate([self._item(i) for i in mine])
        self.epoch, self.consumed_samples = self.epoch + 1, 0

    def _item(self, index: int) -> dict[str, Any]:
        g = self.generator
        if self.rng == "per-sample":
            g = torch.Generator().manual_seed((self.seed << 32) ^ (self.epoch << 20) ^ index)
        return masked(self.dataset[index], g, self.mask_rate)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "consumed_samples", "generator"}``: the place and this rank's RNG.

        ``consumed_samples`` counts the whole job's samples of the epoch; the
        generator state (a ``uint8`` tensor) is this rank's alone.
        """
        return {
            "epoch": self.epoch,
            "consumed_samples": self.consumed_samples,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s place; a missing ``"generator"`` keeps this rank's fresh one.

        Raises:
            LoaderStateError: ``state`` lacks the place.
        """
        try:
            epoch, consumed = int(state["epoch"]), int(state["consumed_samples"])
        except (KeyError, TypeError, ValueError) as exc:
            raise LoaderStateError(
                f"not a GlobalOrderLoader state (needs 'epoch' and 'consumed_samples'): "
                f"{state!r:.200}"
            ) from exc
        self.epoch, self.consumed_samples = epoch, consumed
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])


class ShardStream:
    """A stream over this DP rank's own shard, as a sharded streaming dataset reads files.

    DP rank ``r`` reads samples ``r, r + D, r + 2D ...`` (``D`` the DP size) in
    batches, masking tokens with its own generator (seeded ``seed + r``). Its
    state names the shard it reads and the offset in it, as the state of a
    split streaming dataset does (the iterator of shard ``r`` at position ``k``),
    and ``load_state_dict`` trusts it: a rank given another rank's state
    continues *that* rank's shard. This is the loader in which one key for all
    ranks makes them replay each other's samples (torchtitan #291, SimpleTuner #2986).
    """

    def __init__(
        self, dataset: Any, batch_size: int, dp_rank: int, dp_size: int, *,
        seed: int = 0, mask_rate: float = 0.25,
    ) -> None:  # fmt: skip
        self.dataset, self.batch_size, self.mask_rate = dataset, batch_size, mask_rate
        self.shard, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.offset = 0  # samples of the shard handed out
        self.generator = torch.Generator().manual_seed(seed + dp_rank)

    def _indices(self) -> list[int]:
        return list(range(self.shard, len(self.dataset), self.dp_size))

    def __len__(self) -> int:
        return (len(self._indices()) - self.offset) // self.batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        mine = self._indices()
        while self.offset + self.batch_size <= len(mine):
            take = mine[self.offset : self.offset + self.batch_size]
            self.offset += self.batch_size
            yield collate([masked(self.dataset[i], self.generator, self.mask_rate) for i in take])

    def state_dict(self) -> dict[str, Any]:
        """``{"shard", "offset", "generator"}``: which shard, how far, this rank's RNG."""
        return {"shard": self.shard, "offset": self.offset, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved shard at the saved offset (a missing generator stays fresh)."""
        self.shard, self.offset = int(state["shard"]), int(state["offset"])
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])
