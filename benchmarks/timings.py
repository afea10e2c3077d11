"""What do the ledger's step times cost? Prints one table.

One process, no torch.distributed: the loader yields ready-made batches
(a ``(8, 32)`` int64 ``input_ids`` and an ``index``, what the notebooks use)
and the loop does nothing else, so every microsecond measured is the
recorder's. Per step, the median over interleaved blocks of:

* bare:        ``for batch in loader: pass`` (no recorder);
* no timings:  ``record(loader, timings=False)``: the sample ids, the digest
               (blake2b of the batch's bytes), the record;
* timings:     ``record(loader)`` with the loop marking ``rec.compute()`` and
               ``rec.collective()`` every step.

The timings' own cost is ``timings - no timings`` (hashing and publishing are
in both), the median of the differences of blocks run side by side; the goal
is under 20 us a step. Beside it, the whole recorder's
cost (``timings - bare``), and the clock alone: the same calls the recorder
makes per step (stamps, two marks, the record's replacement, the time line
encoded) timed without a loader, a cross-check that the difference of two
noisy medians is not all noise. Nothing is published (``publish=False``) and
no file is written (the file is one line per step, flushed, in both
recorders).

Run: ``.venv/bin/python benchmarks/timings.py`` (about 20 s here).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ezpz_nb.ledger import StepRecord, record
from ezpz_nb.ledger.clock import StepClock
from ezpz_nb.ledger.records import with_times


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(0, 1024, (8, 32), generator=g),
            "index": torch.arange(8) + 8 * i,
        }
        for i in range(n)
    ]


def bare(batches: list) -> float:
    t = time.perf_counter()
    for _ in batches:
        pass
    return time.perf_counter() - t


def untimed(batches: list) -> float:
    rec = record(batches, publish=False, timings=False)
    t = time.perf_counter()
    for _ in rec:
        pass
    return time.perf_counter() - t


def timed(batches: list) -> float:
    rec = record(batches, publish=False)
    t = time.perf_counter()
    for _ in rec:
        with rec.compute():
            pass
        with rec.collective():
            pass
    return time.perf_counter() - t


def clock_alone(n: int) -> float:
    """The per-step calls the recorder makes for timings, without a loader or hashing."""
    clock = StepClock()
    rec = StepRecord(0, 0, 0, 0, 1, 0, 1, tuple(range(8)), "loaded", "0" * 32)
    t = time.perf_counter()
    for _ in range(n):
        clock.asking()
        clock.got()
        clock.handed()
        with clock.compute:
            pass
        with clock.collective:
            pass
        with_times(rec, clock.finish())
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per block")
    p.add_argument("--blocks", type=int, default=60, help="interleaved blocks per method")
    args = p.parse_args()
    batches = _batches(args.steps)
    methods = {"bare": bare, "no timings": untimed, "timings": timed}
    per_step: dict[str, list[float]] = {k: [] for k in methods}
    alone: list[float] = []
    for f in methods.values():  # warm-up: imports, allocator, first-call costs
        f(batches[:20])
    for _ in range(args.blocks):
        for name, f in methods.items():
            per_step[name].append(f(batches) / args.steps * 1e6)
        alone.append(clock_alone(args.steps) / args.steps * 1e6)
    med = {k: statistics.median(v) for k, v in per_step.items()}
    # Paired: each block's difference against its neighbour of the same round, so
    # that load drifting between rounds (other processes) cancels.
    own = statistics.median(
        t - u for t, u in zip(per_step["timings"], per_step["no timings"], strict=True)
    )
    whole = statistics.median(
        t - b for t, b in zip(per_step["timings"], per_step["bare"], strict=True)
    )
    print(f"{args.blocks} interleaved blocks of {args.steps} steps; median us per step\n")
    print("| loop | us/step |")
    print("|---|---|")
    for name in methods:
        print(f"| {name} | {med[name]:.1f} |")
    print(f"| clock's calls alone | {statistics.median(alone):.1f} |")
    goal = "meets" if own < 20 else "MISSES"
    print(
        f"\ntimings' own cost (timings - no timings, paired by round): {own:.1f} us/step "
        f"({goal} the < 20 us goal)"
    )
    print(f"whole recorder against the bare loop (paired by round): {whole:.1f} us/step")


if __name__ == "__main__":
    main()
