"""Write the tutorial notebooks from their jupytext sources in ``_cells/``, or check them.

Each ``_cells/NN_name.py`` is a notebook in jupytext's percent format (valid Python:
ruff lints it, any editor or jupytext opens it). This script reads it with jupytext
and writes ``NN_name.ipynb`` with clean metadata (kernel ``python3``, as JupyterLab
writes it, so opening a notebook does not mark it modified; no outputs, no execution
counts) and stable cell ids, so regenerated notebooks are byte-identical.

One source, two notebooks: when cells of a source are tagged ``workshop`` or
``solutions``, it becomes ``NN_name.ipynb`` (untagged and ``workshop`` cells) and
``solutions/NN_name_solutions.ipynb`` (untagged and ``solutions`` cells): in a folder of
their own, since JupyterLab's file browser cuts both names to the same ``NN_name...`` at
its default width, and a learner should not open the answers by accident. Tagged cells come in
runs of k ``workshop`` cells followed by k ``solutions`` cells (for an exercise: the
blank and its checker call, then the solution and the checker's assert), so both
notebooks have the same cells at the same positions, with the same ids, and cannot
drift apart. Other tags (e.g. ``raises-exception``) are kept in the notebook.

Usage (from the repository root)::

    .venv/bin/python notebooks/_build.py          # rewrite every notebook
    .venv/bin/python notebooks/_build.py --check  # exit 1 if a notebook is stale or not clean
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import jupytext
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
CELLS = HERE / "_cells"

#: The kernel every stored notebook must name ("No such kernel" elsewhere otherwise).
KERNEL_NAME = "python3"
#: The metadata JupyterLab 4 writes when it opens a notebook on a python3 (ipykernel)
#: kernel, stored as it writes it: a notebook that lacks it shows as modified on opening,
#: before any edit, and a saved run then differs in metadata, not only in outputs.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": KERNEL_NAME}
#: The Python the project is tested with (CI, `make test`): on another one JupyterLab
#: writes that version instead, the one line a saved notebook differs by besides outputs.
TESTED_PYTHON = "3.11.7"
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
    "version": TESTED_PYTHON,
}
#: Cell tags that pick the notebook a cell goes to; the first one names the main notebook.
VARIANTS = ("workshop", "solutions")
#: The folder (under ``notebooks/``) of the solutions notebooks; setup.py and
#: ``ezpz-nb notebooks`` ship and copy it with the notebooks.
SOLUTIONS_DIR = "solutions"


def read_source(path: Path) -> nbformat.NotebookNode:
    """One jupytext percent-format source, as a notebook."""
    return jupytext.read(path, fmt="py:percent")


def _variant(cell: nbformat.NotebookNode) -> str | None:
    tags = [t for t in cell.metadata.get("tags", []) if t in VARIANTS]
    if len(tags) > 1:
        raise ValueError(f"a cell is tagged {tags}; it may be in one variant only")
    return tags[0] if tags else None


def check_pairs(source: nbformat.NotebookNode, name: str) -> None:
    """Raise unless every run of tagged cells is k ``workshop`` then k ``solutions`` cells."""
    runs: list[list[str]] = []
    previous = None
    for cell in source.cells:
        variant = _variant(cell)
        # A run starts after an untagged cell, or where a workshop cell follows a solutions one.
        if variant is not None and (previous is None or (previous, variant) == VARIANTS[::-1]):
            runs.append([])
        if variant is not None:
            runs[-1].append(variant)
        previous = variant
    for run in runs:
        k = len(run) // 2
        if run != [VARIANTS[0]] * k + [VARIANTS[1]] * k:
            raise ValueError(
                f"{name}: tagged cells {run} are not k {VARIANTS[0]!r} cells "
                f"followed by k {VARIANTS[1]!r} cells"
            )


def to_notebook(source: nbformat.NotebookNode, variant: str | None = None) -> nbformat.NotebookNode:
    """The clean notebook of one variant (``None``: a source without variants)."""
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": copy.deepcopy(LANGUAGE_INFO),
    }
    for cell in source.cells:
        if _variant(cell) not in (None, variant):
            continue
        text = cell.source.strip("\n")
        new = new_markdown_cell(text) if cell.cell_type == "markdown" else new_code_cell(text)
        # Stable ids keep regenerated notebooks byte-identical (readable diffs).
        new.id = f"c{len(nb.cells):02d}"
        tags = [t for t in cell.metadata.get("tags", []) if t not in VARIANTS]
        if tags:
            new.metadata["tags"] = tags
        if cell.metadata.get("jupyter", {}).get("source_hidden"):
            # JupyterLab shows such a cell collapsed (the Colab install cell of 00).
            new.metadata["jupyter"] = {"source_hidden": True}
        nb.cells.append(new)
    return nb


def notebooks() -> dict[str, nbformat.NotebookNode]:
    """Every generated notebook, by path relative to ``notebooks/`` (POSIX form)."""
    out = {}
    for path in sorted(CELLS.glob("*.py")):
        source = read_source(path)
        if any(_variant(c) for c in source.cells):
            check_pairs(source, path.name)
            main, other = VARIANTS
            out[f"{path.stem}.ipynb"] = to_notebook(source, main)
            out[f"{SOLUTIONS_DIR}/{path.stem}_{other}.ipynb"] = to_notebook(source, other)
        else:
            out[f"{path.stem}.ipynb"] = to_notebook(source)
    return out


def notebook_problems(path: str | Path) -> list[str]:
    """Say what is not clean about one stored notebook.

    Stored outputs go stale the moment the code changes and make diffs unreadable;
    a kernel name other than ``python3`` fails elsewhere with "No such kernel".

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


def _stored(folder: Path) -> list[Path]:
    """Every notebook under ``folder`` except JupyterLab's checkpoints."""
    return sorted(f for f in folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare and check) the notebooks; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a notebook is stale or not clean",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE,
        help="folder of the notebooks (default: next to this script)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    stale = []
    built = notebooks()
    for name, nb in built.items():
        path = out / name
        text = nbformat.writes(nb) + "\n"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if not args.check:
        return 0
    # Also notebooks that no source writes: a hand-made one must be stored clean too.
    found = _stored(out)
    # A notebook of a generated name in another folder is a copy left behind by a move (the
    # solutions were once beside the notebooks): it would ship twice, once stale.
    generated = {Path(name).name: out / name for name in built}
    left = [f for f in found if f.name in generated and f != generated[f.name]]
    for f in left:
        print(f"{f}: left behind; {generated[f.name]} is the notebook now: delete this copy")
    unclean = {f: p for f in found if (p := notebook_problems(f))}
    for f, problems in unclean.items():
        print(f"{f}: " + "; ".join(problems))
    if stale:
        print(
            "stale (edit notebooks/_cells/, then run notebooks/_build.py): " + ", ".join(stale),
            file=sys.stderr,
        )
    if unclean:
        print(
            f"{len(unclean)} of {len(found)} notebook(s) not clean: clear outputs and set the "
            f"kernel to {KERNEL_NAME!r} (or regenerate them with notebooks/_build.py).",
            file=sys.stderr,
        )
    if stale or unclean or left:
        return 1
    print(f"{len(found)} notebook(s) up to date and clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
