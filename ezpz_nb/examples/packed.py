"""Walkthrough 6: real text, packed into full rows, trained on DP x TP ranks (notebook 11).

The corpus is the standard library's own ``.py`` files (nothing to download). One
process per machine (``LOCAL_RANK`` 0) trains a small BPE and writes every token once
to ``--cache``/tokens.npy; every rank on that machine memory-maps the same file. The
documents are packed with EOS into rows of ``--row-len`` tokens (documents longer than
a row continue in the next one; the last rows that do not divide over the DP replicas,
fewer than one row per replica, are left out), the rows are sharded over the DP replicas by
``DistributedSampler`` (equal step counts), and the TP leader broadcasts each batch to
its peers. A tiny one-layer attention model trains on them; with ``--masked`` (the
default) position ids restart per document and a block-diagonal causal mask keeps
each document's attention to itself.

Each rank's ledger (``--out``) holds, per step, the rows it held, their real and pad
tokens, and the documents in each row (ledger format 4).

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.packed --tp-size 2 --out /tmp/packed_ledger
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from ezpz_nb.data import TPBroadcastDataLoader
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import begin, device, record_epochs, to_device
from ezpz_nb.ledger import Ledger
from ezpz_nb.text import PackedRows, TokenCorpus, check_row_length, document_mask, stdlib_corpus
from ezpz_nb.text.model import TinyLM

__all__ = ["main", "run", "shared_corpus"]


def shared_corpus(cache: str | Path, max_docs: int = 64) -> TokenCorpus:
    """The stdlib corpus, built once per machine in ``cache`` and mapped by every rank.

    The first process of each machine (``LOCAL_RANK`` 0, or global rank 0 outside
    torchrun) builds it; building is deterministic, so every machine's file is the
    same. Global rank 0's :class:`~ezpz_nb.text.TokenCorpus` (path and offsets, a
    few KB) then goes to every rank.
    """
    first_here = int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0
    box: list[Any] = [None]
    if first_here:
        box[0] = stdlib_corpus(cache, max_docs=max_docs)[0]
    dist.barrier()  # the file exists on every machine before anyone maps it
    dist.broadcast_object_list(box, src=0)
    return box[0]


def run(
    tp_size: int = 1,
    row_len: int = 256,
    batch_size: int = 4,
    epochs: int = 1,
    masked: bool = True,
    max_docs: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    cache: str | None = None,
    out: str | None = None,
) -> Ledger:
    """Train a tiny model on packed stdlib text for ``epochs`` passes; return this rank's ledger.

    Args:
        tp_size: Ranks per TP group (the leader loads and broadcasts).
        row_len: Tokens per packed row (at least 2).
        batch_size: Rows per batch per DP replica.
        epochs: Passes over the rows.
        masked: Restart position ids per document and mask attention to it (else a
            plain causal mask over the whole row: attention leaks across documents).
        max_docs: Documents taken from the standard library.
        lr: Adam's learning rate.
        seed: Order of the documents in the rows, and of the rows each epoch.
        cache: Folder for the token file; default a temporary one, removed at the end.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`, with a loss per step.
    """
    check_row_length(row_len)
    layout = begin(tp_size, out)
    folder = cache or os.path.join(
        tempfile.gettempdir(), f"ezpz_nb_text_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    )
    corpus = shared_corpus(folder, max_docs)
    # A multiple of dp_size rows: the sampler neither pads nor drops, so every row is
    # seen once per epoch; the last partial batch stays (the broadcast sends its shape).
    rows = PackedRows(corpus, row_len, seed=seed, multiple_of=layout.dp_size)
    sampler: DistributedSampler[int] = DistributedSampler(
        rows, layout.dp_size, layout.dp_rank, shuffle=True, seed=seed
    )
    loader: Any = DataLoader(rows, batch_size=batch_size, sampler=sampler)
    if tp_size > 1:
        loader = TPBroadcastDataLoader(loader, layout.tp_group)
    dev = device()
    model = TinyLM(corpus.vocab_size, row_len, seed=seed).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def step(batch: Any, epoch: int, index: int) -> float:
        batch = to_device(batch, dev)
        pos = batch["position_ids"] if masked else None
        mask = document_mask(batch["doc_ids"]) if masked else None
        logits = model(batch["input_ids"], pos, mask)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # DDP's gradient all-reduce, over the DP replicas
            if p.grad is not None:
                dist.all_reduce(p.grad, group=layout.dp_group)
                p.grad /= layout.dp_size
        opt.step()
        return float(loss.detach())

    try:
        return record_epochs(loader, layout, epochs, out=out, step=step)
    finally:
        if cache is None:
            dist.barrier()  # nobody reads the file any more
            if int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0:
                shutil.rmtree(folder, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
