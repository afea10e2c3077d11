"""What the workshop checkers of exercises 1-4 run on each rank: the inputs they feed the learner.

:mod:`ezpz_nb.workshop.exercises` judges, in the notebook process, what these jobs
return. Kept apart so each side reads on its own: a job builds one rank's
inputs, calls the learner's function and sends back only plain values (tensors,
sample ids, digests, counts). Inputs that an answer could be fitted to (the
values to sum or share, the lengths of the data) come from a seed drawn per
check, so a hard-coded answer fails.

Where the lesson is *who* loads, the job does not ask the learner's code: it
hands over a dataset that counts its own ``__getitem__`` calls (DataLoader
workers included) and a sampler that records what it yielded, and reports
those counts and records.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

__all__: list[str] = []  # private: used by ezpz_nb.workshop.exercises only


def _draw(seed: int, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Integer-valued floats in ``[low, high)``, the same on every rank for one seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).float()


def _tensor_or_type(out: Any) -> Any:
    """A returned tensor as a detached copy; anything else as it is (the checker names it)."""
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


# ----------------------------------------------------------------- 1. all_reduce
def sum_inputs(world: int, seed: int | None) -> list[torch.Tensor]:
    """Each rank's input: the documented ``[r + 1, 10 r]``, or with a seed fresh values."""
    if seed is None:
        return [torch.tensor([r + 1.0, 10.0 * r]) for r in range(world)]
    # Values of 100 or more: their sum is never the first round's, so an answer
    # that ignores the ranks' data cannot pass both rounds.
    return list(_draw(seed, 100, 1000, (world, 2)).unbind(0))


def job_global_sum(fn: Callable, seed: int) -> Any:
    """Exercise 1: ``fn`` on the documented input, then on one drawn from ``seed``."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = [_tensor_or_type(fn(sum_inputs(world, s)[r].clone())) for s in (None, seed)]
    return None if outs[0] is None else outs


# ----------------------------------------------------------------- 2. group broadcast
#: Exercise 2's layouts on 4 ranks: (groups as listed to ``new_group``, ``sort_ranks``).
#: Consecutive pairs (the documented one), strided pairs, and groups of other sizes
#: listed out of order with ``sort_ranks=False``, where the group's rank 0 is neither
#: its smallest global rank nor ``r - r % 2``: only asking the group finds the leader.
SHARE_LAYOUTS: tuple[tuple[tuple[tuple[int, ...], ...], bool], ...] = (
    (((0, 1), (2, 3)), True),
    (((0, 2), (1, 3)), True),
    (((3, 2, 1, 0),), False),
    (((2, 0, 3), (1,)), False),
)


def share_leader(groups: tuple[tuple[int, ...], ...], sort_ranks: bool, rank: int) -> int:
    """The global rank of ``rank``'s group leader: the group's rank 0 as torch numbers it."""
    members = next(g for g in groups if rank in g)
    return min(members) if sort_ranks else members[0]


def share_inputs(world: int, seed: int) -> list[torch.Tensor]:
    """Each rank's 3 values, drawn per check: a leader's values must really travel."""
    return list(_draw(seed, 100, 1000, (world, 3)).unbind(0))


def job_share(fn: Callable, seed: int) -> Any:
    """Exercise 2: per layout, rank ``r`` passes its drawn values and its group."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = []
    for k, (groups, sort_ranks) in enumerate(SHARE_LAYOUTS):
        # Every rank creates every group, in the same order (new_group's contract).
        made = [dist.new_group(list(g), sort_ranks=sort_ranks) for g in groups]
        mine = next(pg for g, pg in zip(groups, made, strict=True) if r in g)
        x = share_inputs(world, seed + k)[r]
        outs.append(_tensor_or_type(fn(x.clone(), mine)))
    return None if all(o is None for o in outs) else outs


# ----------------------------------------------------------------- 3. DP sampler
def sampler_samples(seed: int) -> int:
    """Samples in exercise 3, drawn per check: odd, so they never divide over 2 replicas."""
    return 2 * random.Random(seed).randrange(10, 20) + 1


#: Exercise 3's passes: (which seed, epoch given to ``set_epoch``). The same epoch twice
#: (the order is the epoch's, not the count of passes), and the first seed again on a
#: fresh sampler (the order is the seed's, reproducible).
SAMPLER_PASSES: tuple[tuple[int, int], ...] = ((0, 0), (0, 1), (0, 1), (1, 0), (2, 0))


def job_sampler(fn: Callable, num_samples: int, seeds: tuple[int, int, int]) -> Any:
    """Exercise 3: the indices each pass of ``fn``'s samplers yielded, with this rank's place.

    One sampler per seed, built by ``fn``; ``seeds[2] == seeds[0]``, a second sampler
    built from the first seed.
    """
    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=num_samples)
    samplers: dict[int, Any] = {}
    passes: list[list[int] | str] = []
    for which, epoch in SAMPLER_PASSES:
        if which not in samplers:
            samplers[which] = fn(ds, lay, seeds[which])
        sampler = samplers[which]
        if sampler is None:
            return None
        if not hasattr(sampler, "set_epoch"):
            passes.append(f"a {type(sampler).__name__} without set_epoch")
            continue
        sampler.set_epoch(epoch)
        passes.append([int(i) for i in sampler])
    return lay.dp_rank, lay.tp_rank, passes


# ----------------------------------------------------------------- 4. set_epoch
class RecordingSampler(Sampler):
    """A sampler's stand-in that records, per pass, the indices it yielded.

    ``set_epoch`` and the ``epoch`` and ``seed`` attributes reach the wrapped
    sampler, so whatever reshuffles a DistributedSampler reshuffles this one.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.passes: list[list[int]] = []

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.inner.epoch = value

    @property
    def seed(self) -> int:
        return self.inner.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.inner.seed = value

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        self.passes.append([])
        for i in self.inner:
            self.passes[-1].append(int(i))
            yield i


def job_epochs(fn: Callable, epochs: int, seed: int) -> Any:
    """Exercise 4: what ``fn`` returned, and what the loader really yielded, pass by pass.

    dp 2 x tp 2, 16 samples in batches of 2: each DP replica's share divides.
    """
    from torch.utils.data import DistributedSampler

    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=16)
    sampler = RecordingSampler(
        DistributedSampler(
            ds, num_replicas=lay.dp_size, rank=lay.dp_rank, shuffle=True, seed=seed, drop_last=True
        )
    )
    out = fn(DataLoader(ds, batch_size=2, sampler=sampler), epochs)
    if out is None:
        return None
    try:  # plain ints, so the notebook process never unpickles a learner's object
        out = [[int(i) for i in epoch] for epoch in out]
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return lay.dp_rank, lay.tp_rank, out, sampler.passes
