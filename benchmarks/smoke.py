"""Smoke run of the benchmarks: each script once, at its smallest, to show it still runs.

A benchmark that raises ImportError while a doc quotes its numbers (issue 47:
``dcp_state.py`` imported a renamed model) is found here, not by the next person who
wants a figure. Each script runs as a user runs it, in a child process with a time
limit, with the arguments of one repetition (:data:`SMOKE`); a run passes when it
exits 0 and prints something. The figures mean nothing at one repetition: only
that the script still gets to its table.

Every script in ``benchmarks/`` is in :data:`SMOKE` or in :data:`RUN_ELSEWHERE`
(tests/test_benchmarks.py checks it), so a new benchmark must say how it is smoked.

Run: ``make bench-smoke`` (or ``.venv/bin/python benchmarks/smoke.py [NAME ...]``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _procs import kill_tagged, new_tag, run_limited, tagged

HERE = Path(__file__).resolve().parent

#: Each script and the arguments of its smallest run (one repetition, fewest ranks).
SMOKE: dict[str, list[str]] = {
    "agents.py": ["--rounds", "1"],
    "broadcast.py": ["--blocks", "1", "--per-block", "2", "--tp", "2", "--loops", "1"],
    "compare.py": ["--base", "HEAD", "--rounds", "1", "--only", "doctor"],
    "cuda_timing.py": [],  # without a GPU it says so and exits 0
    "dcp_state.py": ["--repeats", "1"],
    "doctor.py": ["--runs", "1"],
    "launch.py": ["--reps", "1", "--sizes", "2", "--no-peers", "--scale", "--kernel-reps", "0"],
    "memory.py": ["--methods", "fork"],  # its checks need its default size (32 MiB)
    "packing.py": [],
    "pin_memory.py": [],  # without a GPU it says so and exits 0
    "plot_speed.py": ["--ranks", "4", "--tp", "2", "--steps", "10"],
    "preload.py": ["--ranks", "2", "--launches", "2"],
    "submodules.py": ["--repeats", "1"],
    "timings.py": ["--steps", "10", "--blocks", "1"],
    "verify.py": ["--repeat", "1", "--steps", "10"],  # two epochs: a reshuffle to judge
}

#: Scripts whose one-repetition run is part of another step already, and where.
RUN_ELSEWHERE: dict[str, str] = {
    "soak.py": "its short form (one run) is tests/test_benchmarks.py, in make test",
    "notebooks.py": "it times one run of every notebook: make notebooks is that run",
    "slurm.py": "it needs a local Slurm cluster (root, apt): make slurm-long",
}

#: Seconds one script may take before the smoke run calls it hung.
LIMIT_S = 300.0


def scripts() -> list[str]:
    """Every runnable script in benchmarks/ (a file with a ``__main__`` block)."""
    return sorted(
        p.name
        for p in HERE.glob("*.py")
        if p.name != "smoke.py" and 'if __name__ == "__main__"' in p.read_text()
    )


def main(argv: list[str] | None = None) -> int:
    """Run the scripts, print one row each; exit 1 if any failed."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="only these scripts (default: all of SMOKE)")
    args = ap.parse_args(argv)
    names = args.names or sorted(n for n in SMOKE if (HERE / n).exists())
    rows, failed = [], []
    start = time.monotonic()
    for name in names:
        tag = new_tag()
        status, out, seconds = run_limited(
            [sys.executable, str(HERE / name), *SMOKE[name]],
            tag=tag,
            limit_s=LIMIT_S,
            cwd=str(HERE.parent),
        )
        grace = time.monotonic() + 5.0  # a forkserver leaves once the script has gone
        while tagged(tag) and time.monotonic() < grace:
            time.sleep(0.1)
        left = kill_tagged(tag)
        ok = status == 0 and out.strip() != "" and not left
        if not ok:
            failed.append(name)
            print(f"--- {name}: status {status}, {left} process(es) left\n{out[-3000:]}")
        rows.append(f"| {name} | {'ok' if ok else 'FAILED'} | {seconds:.1f} s |")
        print(rows[-1], flush=True)  # as it goes: the whole run takes minutes
    print("\n| benchmark | one repetition | wall |\n|---|---|---|")
    print("\n".join(rows))
    print(
        f"| all | {len(names) - len(failed)} of {len(names)} ok | {time.monotonic() - start:.0f} s |"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
