"""What the workshop checkers run on each rank: the inputs they feed the learner's function.

:mod:`ezpz_nb.workshop.exercises` judges, in the notebook process, what these jobs
return. Kept apart so each side reads on its own: a job builds one rank's
inputs, calls the learner's function and sends back only plain values (tensors,
digests, shapes). Where a check calls the function twice, the second call's
inputs come from a seed drawn per check, so an answer fitted to the first call
(a hard-coded result) fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__: list[str] = []  # private: used by ezpz_nb.workshop.exercises only


# ----------------------------------------------------------------- 1. all_reduce
def sum_inputs(world: int, seed: int | None) -> list[torch.Tensor]:
    """Each rank's input: the documented ``[r + 1, 10 r]``, or with a seed fresh values."""
    if seed is None:
        return [torch.tensor([r + 1.0, 10.0 * r]) for r in range(world)]
    g = torch.Generator().manual_seed(seed)
    # Values of 100 or more: their sum is never the first round's, so an answer
    # that ignores the ranks' data cannot pass both rounds.
    return list(torch.randint(100, 1000, (world, 2), generator=g).float().unbind(0))


def job_global_sum(fn: Callable, seed: int) -> Any:
    """Exercise 1: ``fn`` on the documented input, then on one drawn from ``seed``."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = []
    for s in (None, seed):
        out = fn(sum_inputs(world, s)[r].clone())
        outs.append(out.detach().clone() if isinstance(out, torch.Tensor) else out)
    return None if outs[0] is None else outs


# ----------------------------------------------------------------- 2. group broadcast
def job_share(fn: Callable) -> Any:
    """Exercise 2: rank ``r`` passes ``[r, r, r]`` and its TP group (tp 2)."""
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    x = torch.full((3,), float(dist.get_rank()))
    out = fn(x.clone(), lay.tp_group)
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


# ----------------------------------------------------------------- 3. DP sampler
def job_sampler(fn: Callable, num_samples: int) -> Any:
    """Exercise 3: the indices of the sampler ``fn`` builds, with this rank's DP/TP place."""
    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=num_samples)
    sampler = fn(ds, lay)
    if sampler is None:
        return None
    return (lay.dp_rank, lay.tp_rank, [int(i) for i in sampler])


# ----------------------------------------------------------------- 4. set_epoch
def job_epochs(fn: Callable, epochs: int) -> Any:
    """Exercise 4: what ``fn`` returned, and what DistributedSampler gives per epoch."""
    from torch.utils.data import DistributedSampler

    from ezpz_nb.data import get_random_dataset_fsdp_tp

    built = get_random_dataset_fsdp_tp(2, 64, 4, num_samples=16, seed=7)
    out = fn(built["dataloader"], epochs)
    ref = DistributedSampler(built["dataset"], shuffle=True, seed=7, drop_last=True)
    want = []
    for e in range(epochs):
        ref.set_epoch(e)
        want.append([int(i) for i in ref])
    return out, want


# ----------------------------------------------------------------- 5. TP loader
def job_tp_loader(fn: Callable) -> Any:
    """Exercise 5: the ledger of one epoch of the loader ``fn`` builds."""
    from ezpz_nb.data.groups import make_layout
    from ezpz_nb.ledger import record

    lay = make_layout(tp_size=2)
    loader = fn(lay)
    if loader is None:
        return None
    rec = record(loader, lay, publish=False)
    for _ in rec:
        pass
    return rec.ledger()


# ----------------------------------------------------------------- 6. step count
#: Batches per rank in the first call of exercise 6 (the numbers its text gives).
LOCAL_BATCHES = (5, 3, 4, 6)


def step_count_rounds(seed: int) -> list[tuple[int, ...]]:
    """Exercise 6's batches per rank: the documented counts, then distinct ones from 7 up."""
    return [LOCAL_BATCHES, tuple(random.Random(seed).sample(range(7, 40), len(LOCAL_BATCHES)))]


def job_steps(fn: Callable, rounds: list[tuple[int, ...]]) -> Any:
    """Exercise 6: ``fn(count)`` once per round, with this rank's count of that round."""
    first = fn(rounds[0][dist.get_rank()])
    return None if first is None else [first, *(fn(c[dist.get_rank()]) for c in rounds[1:])]


# ----------------------------------------------------------------- 7. send a batch
def leader_batch(dp_rank: int, seed: int | None) -> dict[str, torch.Tensor]:
    """The batch a TP leader sends: the documented one, or with a seed other shapes."""
    from ezpz_nb.data import RandomTokenDataset

    if seed is None:
        ds = RandomTokenDataset(100, 8, num_samples=16)
        items = [ds[2 * dp_rank + k] for k in range(2)]
        return {"input_ids": torch.stack([it["input_ids"] for it in items]),
                "index": torch.tensor([it["index"] for it in items])}
    # Other keys, shapes and dtypes than the first round: a peer that assumes
    # them instead of receiving them fails here.
    g = torch.Generator().manual_seed(seed + dp_rank)
    rows, cols = (int(v) for v in torch.randint(3, 12, (2,), generator=g))
    return {"input_ids": torch.randint(0, 100, (rows, cols), generator=g),
            "mask": torch.rand(rows, cols, generator=g),
            "index": torch.arange(rows, dtype=torch.int32) + 100 * dp_rank}


def batch_spec(batch: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shape and dtype of each tensor of ``batch``, by key."""
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in batch.items()
            if isinstance(v, torch.Tensor)}


def job_send(fn: Callable, seed: int) -> Any:
    """Exercise 7: per round, the leader's (digest, spec) sent and what this rank got."""
    from ezpz_nb.data.groups import make_layout
    from ezpz_nb.ledger import batch_digest

    lay = make_layout(tp_size=2)
    rounds = []
    for s in (None, seed):
        batch = leader_batch(lay.dp_rank, s) if lay.tp_rank == 0 else None
        out = fn(batch, lay.tp_group)
        sent = (batch_digest(batch), batch_spec(batch)) if batch is not None else None
        got = ((batch_digest(out), batch_spec(out)) if isinstance(out, dict)
               else "None" if out is None else f"a {type(out).__name__}")
        rounds.append((sent, got))
    return lay.tp_rank, rounds
