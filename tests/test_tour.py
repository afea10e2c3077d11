"""The headless tour executes notebooks and keeps their copies and figures.

Guards against a tour that reports success without running anything, loses the
figures, or stops at the first failing notebook without saying which one.
Uses two tiny notebooks so it stays fast; the tutorial notebooks themselves run
under nbmake.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from ezpz_nb.cli import main
from ezpz_nb.cli.tour import find_notebooks, run_tour

PLOT = """%matplotlib inline
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([0, 1], [1, 0])
plt.show()
fig2, ax2 = plt.subplots()
ax2.bar([0, 1], [3, 4])
plt.show()"""


def _notebook(path: Path, *sources: str) -> Path:
    nb = new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        }
    )
    nb.cells = [new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_tour_writes_copies_and_figures(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(
        src / "a_plots.ipynb",
        "import os\nprint(os.getcwd())",
        PLOT,
        "print(os.environ.get('EZPZ_NB_PLAIN'))",
    )
    _notebook(src / "b_fails.ipynb", "x = 1", "raise ValueError('boom')", "print('never')")
    _notebook(src / "_private.ipynb", "print('skipped')")
    out = tmp_path / "out"

    stops = run_tour(out, src, timeout=60)

    assert [s.notebook.name for s in stops] == ["a_plots.ipynb", "b_fails.ipynb"]
    plots, fails = stops
    assert plots.ok and len(plots.figures) == 2
    for png in plots.figures:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    executed = nbformat.read(plots.executed, as_version=4)
    # Cells ran with the notebook's own folder as working directory.
    assert executed.cells[0].outputs[0]["text"].strip() == str(src)
    # Progress prints text in the tour's kernels: a widget would leave the copy blank.
    assert executed.cells[2].outputs[0]["text"].strip() == "1"
    assert not fails.ok and "boom" in fails.error
    assert fails.executed.exists()
    printed = capsys.readouterr().out
    assert str(plots.figures[0]) in printed and "FAILED" in printed


def test_cli_filters_and_reports_exit_status(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    _notebook(src / "01_ok.ipynb", "print('ok')")
    _notebook(src / "02_bad.ipynb", "1 / 0")
    out = tmp_path / "out"
    assert main(["tour", "--out", str(out), "--notebooks", str(src), "01"]) == 0
    assert (out / "01_ok.ipynb").exists() and not (out / "02_bad.ipynb").exists()
    assert main(["tour", "--out", str(out), "--notebooks", str(src)]) == 1
    assert main(["tour", "--out", str(out), "--notebooks", str(src), "nothing"]) == 2


def test_find_notebooks_orders_and_filters(tmp_path):
    for name in ("02_b.ipynb", "00_a.ipynb", "_draft.ipynb", "notes.txt"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in find_notebooks(tmp_path)] == ["00_a.ipynb", "02_b.ipynb"]
    assert [p.name for p in find_notebooks(tmp_path, ["02"])] == ["02_b.ipynb"]
