"""Notebooks are stored clean: no outputs, no execution counts, kernel ``python3``.

Guards against committing an executed notebook (stale outputs, noisy diffs) or one
saved with a local kernel name ("No such kernel" elsewhere), and against editing
a generated notebook by hand so that it drifts from ``notebooks/_cells``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from ezpz_nb.nbcheck import main, notebook_problems

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def _write(path: Path, *, kernel: str = "python3", output: bool = False,
           count: int | None = None) -> Path:
    nb = new_notebook(metadata={"kernelspec": {"name": kernel, "display_name": kernel,
                                               "language": "python"}})
    cell = new_code_cell("print(1)")
    cell.execution_count = count
    if output:
        cell.outputs = [new_output("stream", name="stdout", text="1\n")]
    nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def test_every_tutorial_notebook_is_clean():
    found = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert len(found) >= 7
    problems = {p.name: notebook_problems(p) for p in found}
    assert not any(problems.values()), problems


def test_generated_notebooks_match_their_sources():
    done = subprocess.run([sys.executable, str(NOTEBOOKS / "_build.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_problems_are_named(tmp_path):
    assert notebook_problems(_write(tmp_path / "ok.ipynb")) == []
    assert any("kernelspec" in p for p in
               notebook_problems(_write(tmp_path / "k.ipynb", kernel="myenv")))
    assert any("outputs" in p for p in
               notebook_problems(_write(tmp_path / "o.ipynb", output=True)))
    assert any("execution counts" in p for p in
               notebook_problems(_write(tmp_path / "c.ipynb", count=3)))
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{not json")
    assert notebook_problems(bad)


def test_cli_exits_nonzero_and_names_offenders(tmp_path, capsys):
    _write(tmp_path / "clean.ipynb")
    _write(tmp_path / "dirty.ipynb", output=True, count=1)
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "dirty.ipynb" in out and "clean.ipynb" not in out
    (tmp_path / "dirty.ipynb").unlink()
    assert main([str(tmp_path)]) == 0


def test_cli_skips_checkpoints(tmp_path):
    (tmp_path / ".ipynb_checkpoints").mkdir()
    _write(tmp_path / ".ipynb_checkpoints" / "x-checkpoint.ipynb", output=True)
    _write(tmp_path / "x.ipynb")
    assert main([str(tmp_path)]) == 0
    # The notebooks the repository ships are what `make lint` checks.
    assert json.loads((NOTEBOOKS / "00_setup_check.ipynb").read_text())["nbformat"] == 4
