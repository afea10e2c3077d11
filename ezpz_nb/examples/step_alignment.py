"""Walkthrough 3: every rank must take the same number of steps.

Each training step ends in a collective over the DP replicas (the gradient
all-reduce of DDP or FSDP). If one replica runs out of batches first, the
others' extra collective pairs with whatever it calls next: with epochs to go,
its first step of the next epoch (steps silently mixed, no error); after the
last epoch, nothing, so they wait: with torch's default timeout, for 30
minutes on gloo or 10 on NCCL, as long as the finished ranks stay alive
(under torchrun they exit, and gloo then fails within seconds with
"Connection closed by peer", naming no step).

``--uneven`` shards by hand, ``range(dp_rank, num_samples, dp_size)``, as many
scripts do instead of using ``DistributedSampler``. With the default 65
samples and batches of 4, DP replica 0 gets 33 samples (9 batches) and
replica 1 gets 32 (8 batches). Here each step's all-reduce waits at most
``--step-timeout`` seconds, so the mismatch ends in an error that names it.

Two fixes, both in this module:

* the default sharding, ``DistributedSampler``, gives every replica the same
  count (dropping, or with ``--no-drop-last`` repeating, what does not divide);
* ``--guard`` makes the ranks agree before each step (one small all-reduce of
  "I still have a batch"), so all stop when the first runs out.

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.step_alignment --uneven --out /tmp/steps_ledger
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from ezpz_nb.data import RandomTokenDataset, forward_set_epoch, get_random_dataset_fsdp_tp
from ezpz_nb.errors import EzpzError
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import (
    SEQ_LENGTH,
    VOCAB_SIZE,
    begin,
    device,
    record_epochs,
)
from ezpz_nb.ledger import Ledger

__all__ = ["AgreedSteps", "StepTimeoutError", "main", "run"]


class StepTimeoutError(EzpzError, RuntimeError):
    """A step's DP collective waited longer than ``step_timeout``: steps out of line."""


class AgreedSteps:
    """Yield a loader's batches only while *every* rank of ``group`` still has one.

    Before each step the ranks all-reduce (MIN) a flag "I have a batch"; the
    first rank to run out stops them all at the same step. A rank's extra
    batches are skipped (the ledger shows them as never seen). The price is one
    collective per step, and under nccl ``have.item()`` is a device-to-host
    sync every step that stops the CPU running ahead of the GPU: agree on a
    gloo side group (``dist.new_group(backend="gloo")``) instead, or run a
    fixed number of steps over streams that never end.

    Args:
        loader: The rank's loader.
        group: Ranks that must agree (``None``: all of them).
    """

    def __init__(self, loader: Any, group: Any = None) -> None:
        self.loader = loader
        self.group = group
        # Read by the ledger's recorder, as on the wrapped loader.
        self.source = getattr(loader, "source", "loaded")

    @property
    def dataset(self) -> Any:
        """The wrapped loader's dataset."""
        return getattr(self.loader, "dataset", None)

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the wrapped loader or its sampler."""
        forward_set_epoch(self.loader, epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        dev = device()
        it = iter(self.loader)
        while True:
            batch = next(it, None)
            have = torch.tensor([0 if batch is None else 1], device=dev)
            dist.all_reduce(have, op=dist.ReduceOp.MIN, group=self.group)
            if not have.item():
                return
            yield batch


def _hand_made_shard(dataset: Any, dp_rank: int, dp_size: int, batch_size: int) -> DataLoader:
    # The common mistake: a strided split keeps every sample once, but the
    # shards differ in length by one whenever dp_size does not divide the data.
    shard = Subset(dataset, range(dp_rank, len(dataset), dp_size))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, drop_last=False)


def _sync(value: torch.Tensor, group: Any, timeout_s: float, where: str) -> None:
    work = dist.all_reduce(value, group=group, async_op=True)
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        ranks = dist.get_process_group_ranks(group) if group is not None else "all"
        raise StepTimeoutError(
            f"rank {dist.get_rank()} waited {timeout_s:g} s in the gradient all_reduce of "
            f"{where} with its DP group (ranks {ranks}): another replica took fewer steps "
            "and left the loop (with several epochs, the mismatch began in an earlier "
            "epoch: its extra steps paired with the next epoch's first ones). Give every "
            "replica the same number of batches (DistributedSampler) or agree on the steps "
            "(guard=True)."
        ) from exc


def run(
    tp_size: int = 2,
    num_samples: int = 65,
    batch_size: int = 4,
    epochs: int = 1,
    uneven: bool = False,
    guard: bool = False,
    drop_last: bool = True,
    step_timeout: float = 10.0,
    seed: int = 1337,
    out: str | None = None,
) -> Ledger:
    """Train-like loop with one DP all-reduce per step; record every rank's steps.

    Call it on every rank (``ez.launch(run, world_size=4)`` or torchrun).

    Args:
        tp_size: Ranks per TP group; must divide the world size. One that also
            divides --nproc_per_node keeps each group on one node (rank 0 warns
            when a group spans nodes).
        num_samples: Dataset length (65 makes the hand-made shards uneven).
        batch_size: Samples per batch per DP replica.
        epochs: Passes over the data.
        uneven: Shard by hand (``range(dp_rank, N, dp_size)``) instead of with
            ``DistributedSampler``.
        guard: Agree on every step across all ranks (:class:`AgreedSteps`).
        drop_last: For the sampler: drop (True) or pad (False) the remainder.
        step_timeout: Seconds a step's all-reduce may wait before
            :class:`StepTimeoutError` (gloo; NCCL's wait does not block the CPU,
            so there the group's timeout, torchrun's ``--timeout``, ends it).
        seed: Shuffle seed of the sampler, the same on every rank.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger` (records of steps taken).

    Raises:
        StepTimeoutError: On the ranks left waiting when step counts differ.
    """
    layout = begin(tp_size, out)
    dataset = RandomTokenDataset(VOCAB_SIZE, SEQ_LENGTH, num_samples=num_samples)
    if uneven:
        loader: Any = _hand_made_shard(dataset, layout.dp_rank, layout.dp_size, batch_size)
    else:
        loader = get_random_dataset_fsdp_tp(
            batch_size,
            VOCAB_SIZE,
            SEQ_LENGTH,
            dp_group=layout.dp_group,
            tp_group=layout.tp_group,
            drop_last=drop_last,
            seed=seed,
            dataset=dataset,
        )["dataloader"]
    if guard:
        loader = AgreedSteps(loader)
    dev = device()

    def step(batch: Any, epoch: int, index: int) -> None:
        # Stand-in for a gradient: any per-batch tensor the DP ranks reduce.
        grad = batch["input_ids"].to(dev).float().mean().reshape(1)
        _sync(grad, layout.dp_group, step_timeout, f"epoch {epoch} step {index}")

    return record_epochs(loader, layout, epochs, out=out, step=step)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
