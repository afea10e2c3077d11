"""Notebook 12's straggler diagnosis, run again and again on a busy machine: ``make stress``.

A diagnosis that flips with the machine's load is a wrong answer (issue 45: "No straggler"
for a rank 2.9x slower, under load, in a fresh clone's ``make test``). This script keeps
every core busy with spinning processes (``--busy``, default: two, as on a 2-core laptop
running something else), then runs notebook 12's straggler run (rank 1's shard five
times longer) and a balanced run on three ranks (``test_timing``'s, which named a balanced
rank in CI) ``--runs`` times each, and fails unless every run gives the right verdict:
rank 1, then no one. It prints each run's ratio and counts, so a near miss shows before a
flip does.

Not part of ``make test``: it measures the machine as much as the code (about a minute
on 2 cores). Run: ``make stress`` or ``python tests/_stress_straggler.py --runs 20``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys

import ezpz_nb as ez
from ezpz_nb.examples import throughput
from ezpz_nb.ledger import Ledger

#: Notebook 12's straggler run (section 3), as its cell launches it.
STRAGGLER = {"num_samples": 128, "words": 240, "heavy_rank": 1}
#: test_timing's balanced run: three ranks on 2 cores, the same work each.
BALANCED = {"num_samples": 384, "words": 300}


def _spin(stop: mp.synchronize.Event) -> None:
    while not stop.is_set():
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each case (20)")
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside (2)")
    args = parser.parse_args(argv)
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    wrong = 0
    try:
        for i in range(args.runs):
            for world, case, want in ((2, STRAGGLER, 1), (3, BALANCED, None)):
                ledger = Ledger.from_results(
                    ez.launch(throughput.run, world_size=world, timeout=120, **case)
                )
                d = ledger.diagnose()
                ok = d.straggler == want
                wrong += not ok
                shares = {r: round(v, 2) for r, v in d.waited_share.items()}
                print(
                    f"run {i + 1:2}, {world} ranks: straggler {d.straggler}, ratio {d.ratio:.2f}, "
                    f"the one waited for in {shares} of the steps{'' if ok else '  <- WRONG'}",
                    flush=True,
                )
    finally:
        stop.set()
        for p in spinners:
            p.join(timeout=5)
    print(f"{2 * args.runs - wrong} of {2 * args.runs} verdicts right, {args.busy} busy beside")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
