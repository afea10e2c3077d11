"""Rank functions for the plot and widget tests (importable, so ranks can load them)."""

from __future__ import annotations

import torch.distributed as dist

from ezpz_nb.data import get_random_dataset_fsdp_tp
from ezpz_nb.groups import make_layout
from ezpz_nb.ledger import record


def stop_early(bad_rank: int, steps_before: int, hang: bool = False) -> object:
    """Every rank records its steps; ``bad_rank`` raises (or skips the last barrier) early.

    No collective runs per step, so the good ranks finish their epoch and the
    ledger (published live) shows exactly where ``bad_rank`` stopped.
    """
    layout = make_layout(1)
    loader = get_random_dataset_fsdp_tp(1, 64, 4, num_samples=24, dp_group=layout.dp_group,
                                        drop_last=True)["dataloader"]
    rec = record(loader, layout)
    for step, _ in enumerate(rec):
        if dist.get_rank() == bad_rank and step + 1 == steps_before:
            if hang:
                return rec.ledger()  # leaves without the barrier below: the others hang
            raise RuntimeError(f"rank {bad_rank} gave up at step {step}")
    dist.barrier()
    return rec.ledger()
