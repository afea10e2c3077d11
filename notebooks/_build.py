"""Write the tutorial notebooks from the cell sources in ``_cells/``.

The notebooks are generated so that their cells stay tidy, their metadata
stays clean (kernel ``python3``, no outputs, no execution counts), and the
workshop and its solutions cannot drift apart: both come from one list of
exercises.

Usage (from the repository root)::

    .venv/bin/python notebooks/_build.py          # rewrite every notebook
    .venv/bin/python notebooks/_build.py --check  # exit 1 if a notebook is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
CELLS = HERE / "_cells"

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"name": "python"}


def parse(text: str, variant: str = "") -> list[tuple[str, str, list[str]]]:
    """Split a cell-source file into ``(kind, source, tags)`` triples.

    Cells start at lines ``# %% <kind> [tags=a,b]``:

    * ``md``: markdown; ``md-workshop`` / ``md-solutions``: only in that variant;
    * ``code``: code (tags, e.g. ``raises-exception``, go to the cell metadata);
    * ``blank``: an exercise cell: the part above a line ``# ---- solution ----``
      goes to the workshop, the part below to the solutions;
    * ``check NAME FN``: the checker cell of exercise ``NAME`` called on ``FN``;
      the solutions variant asserts that it passed.
    """
    cells: list[tuple[str, str, list[str]]] = []
    blocks = text.split("\n# %% ")
    for block in blocks[1:]:
        head, _, body = block.partition("\n")
        words = head.split()
        kind, rest = words[0], words[1:]
        tags = [t for w in rest if w.startswith("tags=") for t in w[5:].split(",")]
        args = [w for w in rest if not w.startswith("tags=")]
        if kind.startswith("md"):
            if kind in ("md", f"md-{variant}"):
                cells.append(("md", body, []))
        elif kind == "code":
            cells.append(("code", body, tags))
        elif kind == "blank":
            blank, _, solution = body.partition("# ---- solution ----\n")
            cells.append(("code", solution if variant == "solutions" else blank, tags))
        elif kind == "check":
            name, fn = args
            call = f"ex.check_{name}({fn})"
            src = (f"assert {call}.passed" if variant == "solutions" else f"{call};")
            cells.append(("code", src, tags))
        else:
            raise ValueError(f"unknown cell kind {kind!r} in {head!r}")
    return cells


def to_notebook(cells: list[tuple[str, str, list[str]]]) -> nbformat.NotebookNode:
    """Build a clean notebook from ``(kind, source, tags)`` triples."""
    nb = new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": dict(LANGUAGE_INFO)}
    for i, (kind, source, tags) in enumerate(cells):
        source = source.strip("\n")
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        # Stable ids keep regenerated notebooks byte-identical (readable diffs).
        cell.id = f"c{i:02d}"
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    return nb


def notebooks() -> dict[str, nbformat.NotebookNode]:
    """Every generated notebook, by file name."""
    out = {}
    for src in sorted(CELLS.glob("*.py")):
        text = src.read_text(encoding="utf-8")
        if src.stem == "05_workshop":
            out["05_workshop.ipynb"] = to_notebook(parse(text, "workshop"))
            out["05_workshop_solutions.ipynb"] = to_notebook(parse(text, "solutions"))
        else:
            out[f"{src.stem}.ipynb"] = to_notebook(parse(text))
    return out


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the notebooks next to this script."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale notebooks")
    args = parser.parse_args(argv)
    stale = []
    for name, nb in notebooks().items():
        path = HERE / name
        text = nbformat.writes(nb) + "\n"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print("stale (run notebooks/_build.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
