"""Notebooks are stored clean: no outputs, no execution counts, kernel ``python3``.

Guards against committing an executed notebook (stale outputs, noisy diffs) or one
saved with a local kernel name ("No such kernel" elsewhere), and against editing
a generated notebook by hand so that it drifts from its source in ``notebooks/_cells``.
The checker is ``notebooks/_build.py --check`` (what ``make lint`` runs).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# notebooks/ is not a package: load the build script as a module.
_spec = importlib.util.spec_from_file_location("nb_build", NOTEBOOKS / "_build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)
notebook_problems = build.notebook_problems


def _write(
    path: Path, *, kernel: str = "python3", output: bool = False, count: int | None = None
) -> Path:
    nb = new_notebook(
        metadata={"kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}}
    )
    cell = new_code_cell("print(1)")
    cell.execution_count = count
    if output:
        cell.outputs = [new_output("stream", name="stdout", text="1\n")]
    nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


def test_every_tutorial_notebook_is_clean():
    found = sorted([*NOTEBOOKS.glob("*.ipynb"), *NOTEBOOKS.glob("solutions/*.ipynb")])
    assert len(found) >= 7
    problems = {p.name: notebook_problems(p) for p in found}
    assert not any(problems.values()), problems


def test_generated_notebooks_match_their_sources(capsys):
    # `make lint`'s check, called here rather than in a second interpreter (which paid
    # for Python, nbformat and jupytext again).
    assert build.main(["--check"]) == 0, capsys.readouterr()


def test_problems_are_named(tmp_path):
    assert notebook_problems(_write(tmp_path / "ok.ipynb")) == []
    assert any(
        "kernelspec" in p for p in notebook_problems(_write(tmp_path / "k.ipynb", kernel="myenv"))
    )
    assert any("outputs" in p for p in notebook_problems(_write(tmp_path / "o.ipynb", output=True)))
    assert any(
        "execution counts" in p for p in notebook_problems(_write(tmp_path / "c.ipynb", count=3))
    )
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{not json")
    assert notebook_problems(bad)


def _built(folder: Path) -> Path:
    """``folder`` holding every generated notebook, written as the build writes them."""
    assert build.main(["--out", str(folder)]) == 0
    return folder


def test_cli_exits_nonzero_and_names_offenders(tmp_path, capsys):
    out = _built(tmp_path)
    _write(out / "clean.ipynb")
    _write(out / "dirty.ipynb", output=True, count=1)
    assert build.main(["--check", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "dirty.ipynb" in printed and "clean.ipynb" not in printed
    (out / "dirty.ipynb").unlink()
    assert build.main(["--check", "--out", str(out)]) == 0


def test_cli_names_stale_notebooks(tmp_path, capsys):
    out = _built(tmp_path)
    edited = out / "02_dp_sharding.ipynb"
    nb = nbformat.read(edited, as_version=4)
    nb.cells[1].source += "\nprint('edited by hand')"
    nbformat.write(nb, edited)
    (out / "06_explorer.ipynb").unlink()
    assert build.main(["--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "stale" in err and "02_dp_sharding.ipynb" in err and "06_explorer.ipynb" in err
    assert "01_process_groups.ipynb" not in err


def test_cli_skips_checkpoints(tmp_path):
    out = _built(tmp_path)
    (out / ".ipynb_checkpoints").mkdir()
    _write(out / ".ipynb_checkpoints" / "x-checkpoint.ipynb", output=True)
    _write(out / "x.ipynb")
    assert build.main(["--check", "--out", str(out)]) == 0
    # The notebooks the repository ships are what `make lint` checks.
    assert json.loads((NOTEBOOKS / "00_setup_check.ipynb").read_text())["nbformat"] == 4


SPLIT = """# %%
import math

# %% tags=["workshop"]
x = None

# %% tags=["workshop", "raises-exception"]
check(x)

# %% tags=["solutions"]
x = math.pi

# %% tags=["solutions"]
assert x > 3
"""


def test_tags_split_one_source_into_two_notebooks(tmp_path):
    src = tmp_path / "99_split.py"
    src.write_text(SPLIT)
    source = build.read_source(src)
    work, sol = (build.to_notebook(source, v) for v in ("workshop", "solutions"))
    assert [c.source for c in work.cells] == ["import math", "x = None", "check(x)"]
    assert [c.source for c in sol.cells] == ["import math", "x = math.pi", "assert x > 3"]
    assert [c.id for c in work.cells] == [c.id for c in sol.cells] == ["c00", "c01", "c02"]
    # The variant tags pick the notebook; other tags stay on the cell.
    assert work.cells[2].metadata == {"tags": ["raises-exception"]}
    assert sol.cells[1].metadata == {}


def test_unpaired_variant_cells_are_refused(tmp_path):
    src = tmp_path / "99_unpaired.py"
    src.write_text(SPLIT.replace('tags=["workshop"]', 'tags=["solutions"]'))
    with pytest.raises(ValueError, match="99_unpaired.py"):
        build.check_pairs(build.read_source(src), src.name)


def test_workshop_and_solutions_line_up():
    """The stored pair has the same cells at the same places; only variant cells differ."""
    work, sol = (
        nbformat.read(NOTEBOOKS / name, as_version=4)
        for name in ("05_workshop.ipynb", "solutions/05_workshop_solutions.ipynb")
    )
    assert [(c.id, c.cell_type) for c in work.cells] == [(c.id, c.cell_type) for c in sol.cells]
    differ = [c.id for c, d in zip(work.cells, sol.cells, strict=True) if c.source != d.source]
    # Title and summary, and per exercise its function and its checker call.
    assert len(differ) == 2 + 7 * 2, differ


def test_solutions_are_in_a_folder_of_their_own(tmp_path, capsys):
    """Guards issue 45 item 7: beside the exercise, JupyterLab's file browser cuts both names
    to the same ``15_data_in_the...``, so a learner opened the answers by accident."""
    names = list(build.notebooks())
    solutions = [n for n in names if n.endswith("_solutions.ipynb")]
    assert len(solutions) >= 7 and all(n.startswith("solutions/") for n in solutions)
    assert not list(NOTEBOOKS.glob("*_solutions.ipynb"))
    # A copy left at the old place by a move would ship twice, once stale: --check names it.
    out = tmp_path / "nbs"
    assert build.main(["--out", str(out)]) == 0
    (out / "05_workshop_solutions.ipynb").write_bytes(
        (out / "solutions" / "05_workshop_solutions.ipynb").read_bytes()
    )
    capsys.readouterr()
    assert build.main(["--check", "--out", str(out)]) == 1
    assert "05_workshop_solutions.ipynb: left behind" in capsys.readouterr().out
    (out / "05_workshop_solutions.ipynb").unlink()
    assert build.main(["--check", "--out", str(out)]) == 0


def test_the_width_check_under_nbmake_finds_a_wide_line(tmp_path):
    """Guards notebooks/conftest.py's check (issue 45: 16's table of 109 columns broke on every
    row): a printed line over 100 columns is found, with its cell; an error output (a
    traceback, nbmake's own failure), a line of 100 columns and torch's own log lines (as
    torchrun relays a worker's) are not."""
    spec = importlib.util.spec_from_file_location("nb_conftest", NOTEBOOKS / "conftest.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    nb = nbformat.read(_write(tmp_path / "w.ipynb", output=True), as_version=4)
    cell = nb.cells[0]
    assert hook.wide_lines(nb) == []
    cell.outputs = [
        new_output("stream", name="stdout", text="x" * 100 + "\n" + "y" * 101 + "\n"),
        # torch's own words, as torchrun relays them: not ours to wrap.
        new_output("stream", name="stderr", text="[default0]:[rank0]: " + "w" * 120 + "\n"),
        new_output("execute_result", data={"text/plain": "z" * 120}, execution_count=1),
        new_output("error", ename="E", evalue="e", traceback=["t" * 300]),
    ]
    found = hook.wide_lines(nb)
    assert len(found) == 2 and all(f.startswith("code cell 0:") for f in found), found
    assert "(101 columns)" in found[0] and "(120 columns)" in found[1], found


def test_the_slowest_notebooks_named_first_exist():
    """notebooks/conftest.py's SLOW_FIRST puts the slowest notebooks first under nbmake: a
    name that is no notebook (one renamed, or moved to solutions/) would quietly stop doing so."""
    spec = importlib.util.spec_from_file_location("nb_conftest", NOTEBOOKS / "conftest.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    names = {p.name for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts}
    assert set(hook.SLOW_FIRST) <= names, set(hook.SLOW_FIRST) - names
