"""Check that notebooks are stored clean: no outputs, no execution counts, kernel python3.

Stored outputs go stale the moment the code changes and make diffs unreadable;
a kernel name other than ``python3`` fails elsewhere with "No such kernel".

Usage::

    python -m ezpz_nb.nbcheck notebooks      # exits 1 and names offending files
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["KERNEL_NAME", "notebook_problems", "main"]

#: The kernel every stored notebook must name.
KERNEL_NAME = "python3"


def notebook_problems(path: str | Path) -> list[str]:
    """Say what is not clean about one stored notebook.

    Args:
        path: A ``.ipynb`` file.

    Returns:
        One plain sentence per problem; empty when the notebook is clean.
    """
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [f"cannot be read as JSON ({exc})"]
    problems = []
    kernel = nb.get("metadata", {}).get("kernelspec", {}).get("name")
    if kernel != KERNEL_NAME:
        problems.append(f"kernelspec name is {kernel!r}, expected {KERNEL_NAME!r}")
    with_outputs, with_counts = [], []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            with_outputs.append(i)
        if cell.get("execution_count") is not None:
            with_counts.append(i)
    if with_outputs:
        problems.append(f"cells {with_outputs} have stored outputs")
    if with_counts:
        problems.append(f"cells {with_counts} have execution counts")
    if "widgets" in nb.get("metadata", {}):
        problems.append("metadata holds saved widget state")
    return problems


def _notebooks(paths: Iterable[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)
        else:
            found.append(p)
    return found


def main(argv: list[str] | None = None) -> int:
    """Check the notebooks in the given files or folders.

    Returns:
        0 when every notebook is clean, 1 otherwise (offenders are printed).
    """
    parser = argparse.ArgumentParser(prog="python -m ezpz_nb.nbcheck", description=__doc__.split(
        "\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks or folders holding them")
    args = parser.parse_args(argv)
    files = _notebooks(args.paths)
    bad = {f: notebook_problems(f) for f in files}
    bad = {f: p for f, p in bad.items() if p}
    for f, problems in bad.items():
        print(f"{f}: " + "; ".join(problems))
    if bad:
        print(f"{len(bad)} of {len(files)} notebook(s) not clean: clear outputs and set the "
              f"kernel to {KERNEL_NAME!r} (e.g. regenerate them with notebooks/_build.py).",
              file=sys.stderr)
        return 1
    print(f"{len(files)} notebook(s) clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
