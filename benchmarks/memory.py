"""What a DataLoader worker costs in memory, per storage and start method. Prints two tables.

The same samples (``n`` rows of ``length`` int64 tokens) are held four ways on
each of 2 ranks, each rank iterating one epoch with 2 workers
(:func:`ezpz_nb.workshop.storages.measure_workers`): a list of Python dicts,
one numpy array, an Arrow table (HF ``datasets``, memory-mapped from disk) and a
memory-mapped file. For each, every worker's *private* memory (dirty pages it
owns, :mod:`ezpz_nb.ledger.memory`) is sampled at every step:

* with ``fork`` a worker starts sharing the rank's pages; reading Python objects
  writes their reference counts and copies page after page (pytorch #13246), so
  a list-of-dicts worker grows through the epoch while numpy and memory maps do not;
* with ``forkserver`` (or ``spawn``) the dataset is pickled into each worker:
  private from the start, and the worker's own ``import torch`` on top.

The second table is the sampler's cost at its default budget (1% of wall time)
in a loop whose steps take 20 ms: the readings, their cost per step, their share of
the loop, and that share without the first reading (taken whatever the budget: a
reading of a process with torch loaded costs milliseconds, tens on a loaded machine).

Done when (issue 49), with fork: a list-of-dicts worker grows by at least half
the data's size; numpy and a memory map by less than 5% of it. Memory figures
are counts of pages, not clocks: they hold on a loaded machine.

Measured here (2 cores, torch 2.13 CPU, 16384 x 256 tokens = 32 MiB), fork:
dicts +66 MiB per worker, numpy +0.6, memmap +0.8-1.0, arrow +1.3-1.6;
forkserver: every worker starts at ~150 MiB (its own torch) plus the pickled data.

Run: ``.venv/bin/python benchmarks/memory.py [--n 16384] [--length 256]
[--methods fork,forkserver]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import ezpz_nb as ez
from ezpz_nb.ledger.memory import MIB
from ezpz_nb.workshop.storages import STORAGES, Measured, measure_workers

RANKS, WORKERS = 2, 2
#: Done-when bounds, as shares of the data's size.
DICTS_AT_LEAST, FLAT_BELOW = 0.5, 0.05


def run(storage: str, method: str, n: int, length: int, **extra: object) -> list[Measured]:
    """One launch of ``RANKS`` ranks, each measuring ``storage`` with ``method`` workers."""
    with tempfile.TemporaryDirectory(prefix="ezpz-memory-") as folder:
        return ez.launch(
            measure_workers,
            storage,
            world_size=RANKS,
            timeout=300,
            n=n,
            length=length,
            folder=folder,
            worker_start=method,
            workers=WORKERS,
            **extra,
        )


def worker_rows(results: list[Measured]) -> tuple[list[float], list[float]]:
    """Every worker's private MiB at its first sample, and its growth, over all ranks."""
    start, growth = [], []
    for got in results:
        for g in got.ledger.memory_report().growth:
            if g.worker >= 0:
                start.append(g.start / MIB)
                growth.append(g.growth / MIB)
    return start, growth


def main(argv: list[str] | None = None) -> int:
    """Print both tables; exit 1 when a done-when bound is missed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384, help="samples")
    ap.add_argument("--length", type=int, default=256, help="tokens per sample")
    ap.add_argument("--methods", default="fork,forkserver", help="worker start methods")
    args = ap.parse_args(argv)
    data_mib = args.n * args.length * 8 / MIB
    print(
        f"{RANKS} ranks x {WORKERS} workers, {args.n} samples x {args.length} tokens: "
        f"data {data_mib:.1f} MiB; private memory per worker (MiB), mean [min, max]"
    )
    print(
        "| start | storage | held by the rank | worker at start | growth over the epoch "
        "| mean growth / data |\n|---|---|---|---|---|---|"
    )
    missed = []
    for method in args.methods.split(","):
        for storage in STORAGES:
            got = run(storage, method, args.n, args.length)
            start, growth = worker_rows(got)
            held = statistics.mean(m.held for m in got) / MIB
            share = statistics.mean(growth) / data_mib
            print(
                f"| {method} | {storage} | {held:.1f} | {statistics.mean(start):.1f} "
                f"| {statistics.mean(growth):+.1f} [{min(growth):+.1f}, {max(growth):+.1f}] "
                f"| {100 * share:.0f}% |",
                flush=True,
            )
            if method == "fork" and storage == "dicts" and min(growth) / data_mib < DICTS_AT_LEAST:
                missed.append(f"fork dicts: a worker grew {min(growth) / data_mib:.0%} of the data")
            worst = max(growth) / data_mib
            if method == "fork" and storage in ("numpy", "memmap") and worst >= FLAT_BELOW:
                missed.append(f"fork {storage}: a worker grew {100 * worst:.1f}% of the data")
    print("\nsampler cost at its default budget (1% of wall time), steps of 20 ms:")
    print(
        "| storage | steps | processes read | ms per step | share of the loop | after the first |"
    )
    print("|---|---|---|---|---|---|")
    for storage in ("dicts", "numpy"):
        got = run(storage, "fork", args.n, args.length, budget=0.01, step_s=0.02)
        for m in got:
            later = (m.sampled_s - m.first_s) / m.loop_s
            print(
                f"| {storage} | {m.steps} | {len(m.ledger.memory)} "
                f"| {1e3 * m.sampled_s / m.steps:.3f} | {100 * m.sampled_s / m.loop_s:.2f}% "
                f"| {100 * later:.2f}% |"
            )
            if later >= 0.01:
                missed.append(f"readings after the first took {100 * later:.1f}% of the loop")
    for line in missed:
        print("MISSED:", line)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
