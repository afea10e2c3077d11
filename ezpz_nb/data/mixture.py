"""Mixing data sources by weight: three schedules, and a global-batch stream built on them.

A *schedule* says, for every position of the global sample stream, which source it comes
from. Three designs, each named for what it does here and compared with the library it
resembles (docs/mixing.md gives the sources):

* ``"multinomial"``: each position draws its source at random with the weights as
  probabilities, as HF ``interleave_datasets(probabilities=...)`` does. Right on average,
  off by a few samples in any one global batch. (Grain's ``mix``, which torchtitan's
  ``DatasetMixConfig`` uses, is *not* random: it scales the weights to integers and
  interleaves them by integer arithmetic, each DP rank mixing its own children.)
* ``"greedy"``: Megatron-LM's rule, as its ``build_blending_indices`` (helpers.cpp)
  computes it: sample ``i`` (from 0) goes to the source with the largest
  ``weight * max(i, 1) - count`` (ties: the lowest source), no randomness. It keeps every
  source near its target cumulatively, but not within one sample: :func:`cumulative_gap`
  measures it (1.2 samples at weights 0.9/0.05/0.05; notebook 17 measures it over many).
* ``"stratified"``: ezpz_nb's own. Every global batch gets ``floor`` or ``ceil`` of
  ``weight * batch`` samples of each source, the extra ones going to the sources furthest
  behind overall, shuffled within the batch: within one sample per batch and
  cumulatively. MosaicML streaming's ``batching_method="stratified"`` differs: it fixes one
  count per stream (floor plus largest remainder) for every batch and lays the streams'
  blocks side by side unshuffled, so its cumulative share drifts (0.5/0.3/0.2 at 16:
  8/5/3 every batch, 31.25% for a 30% target) and DP rank 0 reads stream 0 only.

Which sample of a source comes next is a fixed permutation per source and pass over it
(seeded by ``seed``, the source and the pass). So the whole ``(source, index)`` sequence
is a function of the mixture alone: it does not depend on the number of DP ranks or
DataLoader workers, and a resume needs only the number of global batches consumed
(Megatron keeps ``consumed_samples``, a count of samples, which survives a change of the
global batch size; a count of batches does not). :class:`MixedLoader` gives one DP rank
its slice of each global batch of that sequence; every epoch replays the same plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from ezpz_nb.errors import EzpzError

__all__ = [
    "METHODS",
    "MixError",
    "MixedLoader",
    "Mixture",
    "cumulative_gap",
    "realized_shares",
    "schedule",
]

#: The schedules :class:`Mixture` knows.
METHODS = ("multinomial", "greedy", "stratified")


class MixError(EzpzError, ValueError):
    """A mixture or its loader was asked for something impossible (raised before any rank starts)."""


def _weights(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(list(weights), dtype=np.float64)
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise MixError(
            f"weights {list(weights)!r}: give one non-negative number per source, not all zero "
            "(they are normalized to sum to 1)"
        )
    return w / w.sum()


def _greedy(w: np.ndarray, n: int) -> np.ndarray:
    """Megatron-LM's ``build_blending_indices`` rule for ``n`` positions (see the module)."""
    out = np.empty(n, dtype=np.int64)
    counts = np.zeros(len(w))
    for i in range(n):
        # argmax keeps the first of equal errors: Megatron's strict ">" over the sources.
        s = int(np.argmax(w * max(i, 1) - counts))
        out[i] = s
        counts[s] += 1
    return out


def cumulative_gap(sources: np.ndarray, weights: Sequence[float]) -> float:
    """The most any source's count strays from ``weight * n`` over every prefix of ``n``
    positions of a schedule, in samples: the bound a schedule keeps cumulatively."""
    w = _weights(weights)
    src = np.asarray(sources, dtype=np.int64).ravel()
    counts = np.cumsum(np.eye(len(w), dtype=np.int64)[src], axis=0)
    n = np.arange(1, src.size + 1)[:, None]
    return float(np.abs(counts - w * n).max()) if src.size else 0.0


def schedule(
    weights: Sequence[float], num_batches: int, global_batch: int, method: str, seed: int = 0
) -> np.ndarray:
    """The source of every position of ``num_batches`` global batches (a 1-D int64 array).

    Batch ``b`` holds positions ``b * global_batch`` to ``(b + 1) * global_batch - 1``. A
    shorter run's schedule is the start of a longer one's.

    Raises:
        MixError: Bad weights, an unknown method, or sizes below 1.
    """
    w = _weights(weights)
    if method not in METHODS:
        raise MixError(f"method={method!r}: use one of {', '.join(METHODS)}")
    for name, v in (("num_batches", num_batches), ("global_batch", global_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MixError(f"{name}={v!r}: use an int of at least 1")
    if method == "greedy":
        return _greedy(w, num_batches * global_batch)
    out = []
    counts = np.zeros(len(w))
    for b in range(num_batches):
        # One generator per batch: batch b's draws do not depend on how many came before.
        rng = np.random.default_rng([seed, b])
        if method == "multinomial":
            out.append(rng.choice(len(w), size=global_batch, p=w))
            continue
        quota = np.floor(w * global_batch)
        behind = w * (b + 1) * global_batch - (counts + quota)
        for s in np.argsort(-behind, kind="stable")[: global_batch - int(quota.sum())]:
            quota[s] += 1
        counts += quota
        out.append(rng.permutation(np.repeat(np.arange(len(w)), quota.astype(np.int64))))
    return np.concatenate(out).astype(np.int64)


@dataclass(frozen=True)
class Mixture:
    """Sources mixed by weight into a stream of global batches.

    Attributes:
        sizes: Samples in each source.
        weights: Target share of each source, in samples (normalized).
        global_batch: Samples in one global batch (all DP ranks together).
        method: One of :data:`METHODS`.
        seed: Seeds the source draws (``"multinomial"``), the order within a batch
            (``"stratified"``) and the permutation of each source.
    """

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    global_batch: int
    method: str = "stratified"
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.weights) or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.sizes
        ):
            raise MixError(
                f"sizes {self.sizes!r} for {len(self.weights)} weights: give one size of at "
                "least 1 per source, in the order of the weights"
            )
        schedule(self.weights, 1, self.global_batch, self.method, self.seed)  # checks the rest

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each source starts in one numbering of all samples (the stream's keys)."""
        return tuple(int(x) for x in np.concatenate([[0], np.cumsum(self.sizes)])[:-1])

    def plan(self, num_batches: int) -> np.ndarray:
        """``(num_batches * global_batch, 2)`` rows of ``(source, index within the source)``.

        The ``k``-th draw of source ``s`` takes ``perm[k % size]``, where ``perm`` is the
        permutation of that source for pass ``k // size``: a source drawn more often
        than it has samples repeats, in a new order each pass.
        """
        src = schedule(self.weights, num_batches, self.global_batch, self.method, self.seed)
        idx = np.empty_like(src)
        for s, size in enumerate(self.sizes):
            where = np.flatnonzero(src == s)
            k = np.arange(where.size)
            for p in range(math.ceil(where.size / size)):
                perm = np.random.default_rng([self.seed, 1 + s, p]).permutation(size)
                part = slice(p * size, (p + 1) * size)
                idx[where[part]] = perm[k[part] - p * size]
        return np.stack([src, idx], axis=1)


def realized_shares(
    sources: np.ndarray, num_sources: int, *, amounts: np.ndarray | None = None, cumulative: bool
) -> np.ndarray:
    """Each source's share of each global batch (or of everything up to it): ``batches x sources``.

    Args:
        sources: ``batches x global_batch`` source ids.
        num_sources: How many sources (columns).
        amounts: What each sample counts for, shaped like ``sources`` (its tokens); one
            sample each when ``None``.
        cumulative: Shares of all batches up to each one, instead of each batch alone.
    """
    src = np.asarray(sources, dtype=np.int64)
    amt = np.ones(src.shape) if amounts is None else np.asarray(amounts, dtype=np.float64)
    per = np.stack(
        [np.bincount(r, weights=a, minlength=num_sources) for r, a in zip(src, amt, strict=True)]
    )
    if cumulative:
        per = np.cumsum(per, axis=0)
    return per / np.maximum(per.sum(axis=1, keepdims=True), 1e-12)


def _check_rank(dp_rank: int, dp_size: int, global_batch: int) -> int:
    if not 0 <= dp_rank < dp_size or global_batch % dp_size:
        raise MixError(
            f"dp_rank={dp_rank}, dp_size={dp_size}, global batch {global_batch}: the global "
            "batch must split evenly over the DP ranks, and 0 <= dp_rank < dp_size"
        )
    return global_batch // dp_size


class _Keyed:
    """Collate a rank's slice of positions: the source collate's batch plus ``dataset_id``."""

    def __init__(self, plan: np.ndarray, offsets: tuple[int, ...], collate: Callable) -> None:
        self.plan, self.offsets, self.collate = plan, offsets, collate

    def __call__(self, positions: list[int]) -> Any:
        rows = self.plan[positions]
        batch = self.collate([self.offsets[s] + int(i) for s, i in rows])
        batch["dataset_id"] = torch.as_tensor(rows[:, 0])
        return batch


class MixedLoader:
    """One DP rank's slice of every global batch of a :class:`Mixture`.

    Rank ``r`` of ``dp_size`` gets positions ``r * m`` to ``(r + 1) * m - 1`` of each
    global batch (``m = global_batch // dp_size``), so the global batches, put back
    together in DP-rank order, are the same at every ``dp_size`` and ``num_workers``.

    Args:
        mixture: The mixture.
        collate: Turns a list of sample keys (``offsets[source] + index``) into a batch
            dict (e.g. :class:`ezpz_nb.text.PadCollate` over all sources' pieces in
            order); the loader adds ``dataset_id`` (the source of each sample).
        num_batches: Global batches in an epoch.
        dp_rank: This rank's DP replica.
        dp_size: Number of DP replicas.
        num_workers: DataLoader workers (they change nothing in the order).

    Raises:
        MixError: A global batch that does not split over ``dp_size``, or a bad rank.
    """

    def __init__(
        self,
        mixture: Mixture,
        collate: Callable[[list[int]], dict[str, Any]],
        *,
        num_batches: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        num_workers: int = 0,
    ) -> None:
        self.per_rank = _check_rank(dp_rank, dp_size, mixture.global_batch)
        self.mixture, self.num_batches = mixture, num_batches
        self.dp_rank, self.dp_size, self.num_workers = dp_rank, dp_size, num_workers
        self._keyed = _Keyed(mixture.plan(num_batches), mixture.offsets, collate)
        self._next = 0  # global batches handed out (the whole resume state)

    def __len__(self) -> int:
        return self.num_batches - self._next

    def _slices(self, start: int) -> list[list[int]]:
        g, m = self.mixture.global_batch, self.per_rank
        lo = self.dp_rank * m
        return [list(range(b * g + lo, b * g + lo + m)) for b in range(start, self.num_batches)]

    def __iter__(self) -> Iterator[Any]:
        positions: Any = range(self.num_batches * self.mixture.global_batch)
        loader: DataLoader[Any] = DataLoader(
            positions,  # the items are the positions: the collate makes the batch
            batch_sampler=self._slices(self._next),
            collate_fn=self._keyed,
            num_workers=self.num_workers,
        )
        for batch in loader:
            # Counted when handed over, not when a worker made it: prefetched batches
            # the training loop never took are not consumed.
            self._next += 1
            yield batch
        self._next = 0  # a finished epoch: the next one starts over

    def state_dict(self) -> dict[str, int]:
        """Global batches consumed: the same number at any ``dp_size`` or ``num_workers``."""
        return {"global_batches": self._next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue after ``state["global_batches"]`` (saved at this or another DP size)."""
        done = state.get("global_batches") if isinstance(state, dict) else None
        if isinstance(done, bool) or not isinstance(done, int) or not 0 <= done <= self.num_batches:
            raise MixError(
                f"state {state!r}: expected {{'global_batches': n}} with 0 <= n <= "
                f"{self.num_batches}, as MixedLoader.state_dict() gives"
            )
        self._next = done
