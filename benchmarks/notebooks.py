"""Time each tutorial notebook under nbmake, as CI runs them, and the whole set.

One pytest run over ``notebooks/`` (kernel python3, per-cell timeout), the way
the README's test command runs them; per-notebook times come from pytest's
JUnit report, the total is the wall time of the whole run (kernel starts
included). Targets from the issue: each notebook under 60 s, the set under 3 min.

Usage::

    .venv/bin/python benchmarks/notebooks.py [--notebooks DIR] [--timeout S]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PER_NOTEBOOK_TARGET_S = 60.0
TOTAL_TARGET_S = 180.0


def run(
    folder: Path, timeout: float, names: list[str] | None = None
) -> tuple[list[tuple[str, float, str]], float, int]:
    """Run nbmake over ``folder`` (or only its notebooks ``names``).

    Returns:
        ``([(name, seconds, outcome)], wall, returncode)``.
    """
    with tempfile.TemporaryDirectory(prefix="ezpz_nb-nbbench-") as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbmake",
            "--nbmake-kernel=python3",
            f"--nbmake-timeout={int(timeout)}",
            f"--junitxml={report}",
            *(names or ["."]),
        ]
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
        wall = time.monotonic() - start
        if not report.exists():
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit("pytest wrote no report; see its output above")
        rows = []
        for case in ET.parse(report).getroot().iter("testcase"):
            outcome = "ok"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "FAILED"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            name = Path(case.get("file") or case.get("name", "?")).name
            rows.append((name, float(case.get("time", 0.0)), outcome))
    return sorted(rows), wall, done.returncode


def main() -> int:
    """Print the table; exit 1 if a notebook failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebooks", default=str(ROOT / "notebooks"))
    parser.add_argument("--timeout", type=float, default=120.0, help="per-cell timeout (s)")
    args = parser.parse_args()
    rows, wall, code = run(Path(args.notebooks), args.timeout)
    print("| notebook | seconds under nbmake | result |")
    print("|---|---:|---|")
    for name, seconds, outcome in rows:
        flag = "" if seconds < PER_NOTEBOOK_TARGET_S else f" (over {PER_NOTEBOOK_TARGET_S:g} s)"
        print(f"| {name} | {seconds:.1f} | {outcome}{flag} |")
    summed = sum(s for _, s, _ in rows)
    print(f"| **sum of notebooks** | {summed:.1f} | |")
    flag = "" if wall < TOTAL_TARGET_S else f" (over {TOTAL_TARGET_S:g} s)"
    print(f"| **whole run, wall** | {wall:.1f} | {'ok' if code == 0 else 'FAILED'}{flag} |")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
