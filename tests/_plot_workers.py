"""Rank functions for the plot and widget tests (importable, so ranks can load them)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import record


def stop_early(bad_rank: int, steps_before: int, hang: bool = False) -> object:
    """Every rank records its steps; ``bad_rank`` raises (or skips the last barrier) early.

    No collective runs per step, so the good ranks finish their epoch and the
    ledger (published live) shows exactly where ``bad_rank`` stopped.
    """
    layout = make_layout(1)
    loader = get_random_dataset_fsdp_tp(
        1, 64, 4, num_samples=24, dp_group=layout.dp_group, drop_last=True
    )["dataloader"]
    rec = record(loader, layout)
    for step, _ in enumerate(rec):
        if dist.get_rank() == bad_rank and step + 1 == steps_before:
            if hang:
                return rec.ledger()  # leaves without the barrier below: the others hang
            raise RuntimeError(f"rank {bad_rank} gave up at step {step}")
    dist.barrier()
    return rec.ledger()


def uneven_steps(rank: int) -> int:
    """Steps ``train_uneven`` gives ``rank``: even ranks 2, odd ranks 3."""
    return 2 if rank % 2 == 0 else 3


def train_uneven() -> object:
    """Hand-made uneven shards with an all_reduce per step: even ranks leave after 2 steps.

    The odd ranks then wait in their third all_reduce for ranks that have gone:
    a hang whose cause (the even ranks) took fewer steps than its victims.
    """
    layout = make_layout(1)
    rank, world = layout.rank, layout.world_size
    dataset = RandomTokenDataset(vocab_size=64, seq_length=4, num_samples=3 * world)
    mine = Subset(dataset, range(rank, rank + world * uneven_steps(rank), world))
    rec = record(DataLoader(mine, batch_size=1), layout)
    for _ in rec:
        dist.all_reduce(torch.ones(1))
    return rec.ledger()


def leave_before_barrier(steps: int = 3) -> object:
    """Every rank takes ``steps`` steps; odd ranks then wait in a barrier the even ranks skip.

    The even ranks caused the hang without taking fewer steps (like a TP leader
    whose loader ran dry while its peers wait for one more broadcast).
    """
    layout = make_layout(1)
    dataset = RandomTokenDataset(vocab_size=64, seq_length=4, num_samples=steps)
    rec = record(DataLoader(dataset, batch_size=1), layout)
    for _ in rec:
        pass
    if layout.rank % 2:
        dist.barrier()
    return rec.ledger()


def seeded_tokens(seed_by_rank: bool, broadcast: bool) -> object:
    """dp 2 x tp 2 over 8 samples; the dataset seeded by global rank (ezpz's pitfall) or not.

    Without the broadcast, rank-seeded TP peers hold the same sample ids and
    different tokens; with it they receive their leader's tokens.
    """
    layout = make_layout(2)
    seed = dist.get_rank() if seed_by_rank else 0
    dataset = RandomTokenDataset(vocab_size=64, seq_length=4, num_samples=8, seed=seed)
    loader = get_random_dataset_fsdp_tp(
        2,
        64,
        4,
        dp_group=layout.dp_group,
        tp_group=layout.tp_group,
        broadcast_within_tp=broadcast,
        dataset=dataset,
    )["dataloader"]
    rec = record(loader, layout)
    for _ in rec:
        pass
    return rec.ledger()
