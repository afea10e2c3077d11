"""Walkthrough 5: is data loading the bottleneck? Per-rank step times in the ledger.

Every sample costs real CPU work to make: a document is generated and
tokenized (pure Python, like a real tokenizer's pre-processing), so a
``DataLoader`` with ``num_workers=0`` makes the training loop wait for it. The
loop marks its collective (``with rec.collective():``), so the ledger knows
how long each rank waited for data, computed, and waited for the others.

Make a straggler: ``--heavy-rank 1`` gives that rank's shard documents
``--heavy-factor`` times longer (the sampler is not shuffled, so rank ``r``
holds the indices ``i % world == r``); every rank's step slows to it, and
``Ledger.diagnose()`` names it. Fix it with ``--shuffle`` (the heavy documents
spread over every rank) or with more loader workers on that rank
(``--heavy-rank-workers 2``).

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m ezpz_nb.examples.throughput --out /tmp/tp_ledger --heavy-rank 1

or from a notebook: ``ez.launch(throughput.run, world_size=2, heavy_rank=1)``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ezpz_nb.data.distributed import worker_context
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import (
    ensure_distributed,
    ledger_file,
    prepare_out,
)
from ezpz_nb.ledger import Ledger, RecordingLoader, record
from ezpz_nb.models.tokenizing import VOCAB_SIZE, TokenizingDataset, tokenize

__all__ = ["TokenizingDataset", "main", "make_loader", "run", "tokenize", "train"]


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int = 8,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    shuffle: bool = False,
    seed: int = 1337,
) -> DataLoader:
    """A DataLoader over this rank's DP shard (every rank is its own DP replica here).

    ``drop_last`` on the sampler: with a world that does not divide the dataset,
    padding would repeat samples on some ranks.
    """
    sampler: DistributedSampler = DistributedSampler(
        dataset, dist.get_world_size(), dist.get_rank(), shuffle=shuffle, seed=seed, drop_last=True
    )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        # Only meaningful with workers: DataLoader refuses it with num_workers=0.
        prefetch_factor=prefetch_factor if num_workers else None,
        persistent_workers=persistent_workers and num_workers > 0,
        # Ranks started by a forkserver would start workers the same way, each
        # importing torch again (seconds); fork is quick and safe before CUDA.
        multiprocessing_context=worker_context(num_workers),
    )


def train(rec: RecordingLoader, *, epochs: int = 1, hidden: int = 32, seed: int = 1337) -> None:
    """Train a tiny language model on ``rec``'s batches, data parallel, for ``epochs``.

    The gradient all-reduce is marked ``with rec.collective():`` so the ledger
    can tell who waited for whom; the rest of the loop is the step's compute,
    which grows with ``hidden`` (the model's width).
    """
    world = dist.get_world_size()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB_SIZE, hidden),
        torch.nn.Linear(hidden, 4 * hidden),
        torch.nn.GELU(),
        torch.nn.Linear(4 * hidden, VOCAB_SIZE),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        rec.set_epoch(epoch)
        for batch in rec:
            ids = batch["input_ids"]
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB_SIZE), ids[:, 1:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            with rec.collective():  # data parallelism's gradient all-reduce
                for p in model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                    p.grad /= world
            opt.step()


def run(
    num_samples: int = 256,
    batch_size: int = 8,
    words: int = 120,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    heavy_rank: int | None = None,
    heavy_factor: int = 5,
    heavy_rank_workers: int | None = None,
    shuffle: bool = False,
    epochs: int = 1,
    hidden: int = 32,
    seed: int = 1337,
    out: str | None = None,
) -> Ledger:
    """Train a tiny model on tokenized documents and record each step's times.

    Call it on every rank (``ez.launch(run, world_size=2)`` or torchrun).

    Args:
        num_samples: Documents in the dataset.
        batch_size: Samples per batch per rank.
        words: Words per (light) document.
        num_workers: DataLoader workers per rank.
        prefetch_factor: Batches each worker loads ahead (DataLoader's default
            2 when None); ignored without workers.
        persistent_workers: Keep the workers between epochs.
        heavy_rank: The rank whose shard holds the long documents (None: none).
        heavy_factor: How much longer those documents are.
        heavy_rank_workers: Workers for ``heavy_rank`` only (the fix that
            gives the slow shard more hands); None: ``num_workers``.
        shuffle: Shuffle the sampler (the fix that spreads the heavy documents).
        epochs: Passes over the data.
        hidden: The model's width: the step's compute grows with it.
        seed: Shuffle and model seed, the same on every rank.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`, with times.
    """
    ensure_distributed()
    prepare_out(out)
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = TokenizingDataset(num_samples, 32, words, heavy_rank, heavy_factor, world)
    workers = num_workers
    if rank == heavy_rank and heavy_rank_workers is not None:
        workers = heavy_rank_workers
    loader = make_loader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        shuffle=shuffle,
        seed=seed,
    )
    with record(loader, path=ledger_file(out)) as rec:
        train(rec, epochs=epochs, hidden=hidden, seed=seed)
    return rec.ledger()


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
