"""How long ``ezpz-nb doctor`` makes an instructor wait, against its 10 s budget.

Runs the installed ``ezpz-nb doctor`` a few times as a user would and times, from
the moment the command starts: its first line (Python start and ``import torch``),
the first launch (2 ranks, which starts the forkserver and its ``import torch``),
the verdict line, and the exit. The doctor's own figure is printed beside them.

Usage::

    .venv/bin/python benchmarks/doctor.py [--runs N]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from ezpz_nb.cli.doctor import BUDGET_S

EZPZ_NB = Path(sys.executable).with_name("ezpz-nb")


def one_run() -> dict[str, float]:
    """Seconds from the start of ``ezpz-nb doctor`` to each milestone of its output."""
    start = time.monotonic()
    proc = subprocess.Popen([str(EZPZ_NB), "doctor"], stdout=subprocess.PIPE, text=True)
    marks: dict[str, float] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.monotonic() - start
        if line.startswith("ezpz-nb doctor: checking"):
            marks["first line"] = now
        elif "gloo on loopback" in line:
            marks["2 ranks done"] = now
        elif "4-rank launch" in line:
            marks["4 ranks done"] = now
        elif line.startswith("ezpz-nb doctor: ") and "READY" in line:
            marks["verdict"] = now
            found = re.search(r"\(([\d.]+) s\)$", line.strip())
            marks["doctor says"] = float(found.group(1)) if found else float("nan")
            marks["ok"] = float("NOT READY" not in line)
    proc.wait()
    marks["exit"] = time.monotonic() - start
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cols = ["first line", "2 ranks done", "4 ranks done", "verdict", "doctor says", "exit"]
    print(
        f"ezpz-nb doctor, seconds from the command's start (budget for the verdict: "
        f"{BUDGET_S:.0f} s)"
    )
    print(f"{'run':>4} " + " ".join(f"{c:>13}" for c in cols) + "  verdict")
    for i in range(args.runs):
        marks = one_run()
        cells = " ".join(f"{marks.get(c, float('nan')):13.2f}" for c in cols)
        state = "READY" if marks.get("ok") else "NOT READY"
        within = "within budget" if marks.get("verdict", 1e9) <= BUDGET_S else "OVER BUDGET"
        print(f"{i + 1:>4} {cells}  {state}, {within}")


if __name__ == "__main__":
    main()
