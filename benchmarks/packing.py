"""Can packing be the bottleneck? The collates' tokens per second beside a model's step time.

One process, one thread (what one DataLoader worker has), on the stdlib corpus of
notebook 11:

* the packed collate: ``packed_batch`` of 8 rows of 256 tokens (token ids, labels,
  position ids, document ids) from the memory-mapped cache, plus ``document_mask``;
* the padded collate: ``PadCollate`` of token-budget batches (4096 padded tokens);
* the capstone's tiny model (``ezpz_nb.examples.capstone.CapstoneLM``, 2 blocks, dim 32)
  taking a training step on its own batch of 8 x 16 tokens, and notebook 11's
  one-layer model on 8 packed rows of 256 with the document mask.

Each is timed as the median of repeated calls; the last column says how many such
models one worker's collate could feed (above 1: the collate keeps up).

A second table (Linux) measures what the shared token cache costs each of 4 ranks
started by ``ez.launch``: the growth of each rank's PSS (its share of the pages it maps)
after reading every token through the memory map, against after taking a private copy.

Run: ``.venv/bin/python benchmarks/packing.py`` (about 20 s).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.examples import capstone
from ezpz_nb.text import (
    PackedRows,
    PadCollate,
    document_mask,
    packed_batch,
    plan_then_shard,
    split_pieces,
    stdlib_corpus,
)
from ezpz_nb.text.model import TinyLM

ROW, ROWS, BUDGET = 256, 8, 4096


def median_s(fn: Callable[[], object], reps: int = 30) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls, after 3 warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_of: Callable) -> None:
    loss = loss_of()
    opt.zero_grad()
    loss.backward()
    opt.step()


def pss_kib() -> int:
    """This process's proportional set size (KiB): shared pages count 1/n each."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def rank_memory(corpus: object) -> tuple[int, int]:
    """PSS growth (KiB) of this rank after reading the map, then after a private copy."""
    toks = corpus.tokens  # type: ignore[attr-defined]
    int(toks[:8192].sum(dtype=np.int64))  # numpy's code paths loaded before the baseline
    dist.barrier()  # and gloo's first-collective buffers
    before = pss_kib()
    int(toks.sum(dtype=np.int64))  # every page of the file read through the map
    dist.barrier()  # every rank maps the pages before anyone measures its share
    mapped = pss_kib()
    copy = np.array(toks, copy=True)
    copy += 1  # every page of the copy written
    dist.barrier()
    return mapped - before, pss_kib() - before


def memory_table(corpus: object, nbytes: int) -> None:
    """Print each rank's PSS growth: memory-mapped cache against a copy per rank."""
    grown = ez.launch(rank_memory, corpus, world_size=4)
    print(f"\nToken file: {nbytes // 1024} KiB. PSS growth per rank (KiB), 4 ranks:\n")
    print("| rank | reading the shared map | + a private copy |")
    print("|---|---|---|")
    for r, (mapped, copied) in enumerate(grown):
        print(f"| {r} | {mapped} | {copied} |")


def main() -> int:
    torch.set_num_threads(1)  # one DataLoader worker's share
    with tempfile.TemporaryDirectory(prefix="ezpz-pack-") as tmp:
        corpus, tok = stdlib_corpus(tmp)
        rows = PackedRows(corpus, ROW)
        batches = [rows.rows[i : i + ROWS] for i in range(0, len(rows) - ROWS, ROWS)]
        k = iter(range(10**9))

        def packed() -> object:
            b = packed_batch(corpus, batches[next(k) % len(batches)], ROW)
            return document_mask(b["doc_ids"])

        pieces = split_pieces(corpus, 1024)
        plan = plan_then_shard([e - s for _, s, e in pieces], 1, BUDGET)[0]
        pad = PadCollate(corpus, pieces)
        j = iter(range(10**9))
        padded_tokens = statistics.mean(
            len(b) * max(pieces[i][2] - pieces[i][1] for i in b) for b in plan
        )

        def padded() -> object:
            return pad(plan[next(j) % len(plan)])

        cap = capstone.CapstoneLM()
        cap_opt = torch.optim.AdamW(cap.parameters(), lr=1e-3)
        cap_ids = torch.randint(0, capstone.VOCAB, (8, capstone.SEQ))

        def cap_loss() -> torch.Tensor:
            logits = cap(cap_ids)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), cap_ids.flatten())

        text = TinyLM(corpus.vocab_size, ROW)
        text_opt = torch.optim.Adam(text.parameters(), lr=1e-3)
        b = packed_batch(corpus, batches[0], ROW)
        mask = document_mask(b["doc_ids"])

        def text_loss() -> torch.Tensor:
            logits = text(b["input_ids"], b["position_ids"], mask)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), b["labels"].flatten())

        rows_out = [
            ("packed collate + mask (8 x 256)", ROWS * ROW, median_s(packed)),
            (f"padded collate (budget {BUDGET})", padded_tokens, median_s(padded)),
        ]
        models = [
            ("capstone CapstoneLM step (8 x 16)", 8 * capstone.SEQ, median_s(lambda: train_step(cap, cap_opt, cap_loss))),
            ("notebook 11 model step, masked (8 x 256)", ROWS * ROW, median_s(lambda: train_step(text, text_opt, text_loss), 10)),
        ]  # fmt: skip
        if sys.platform == "linux":
            memory_table(corpus, corpus.tokens.nbytes)
    print(f"\n{tok.note}; {corpus.num_docs} documents, {corpus.num_tokens} tokens; 1 thread\n")
    print("| what | tokens per call | ms per call | tokens/s | models one worker feeds |")
    print("|---|---|---|---|---|")
    slowest_collate = min(n / t for _, n, t in rows_out)
    for name, n, t in rows_out:
        print(f"| {name} | {n:.0f} | {1e3 * t:.2f} | {n / t:,.0f} | - |")
    for name, n, t in models:
        feeds = slowest_collate / (n / t)
        print(f"| {name} | {n:.0f} | {1e3 * t:.2f} | {n / t:,.0f} | {feeds:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
