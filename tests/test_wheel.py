"""The built wheel ships the tutorial notebooks, and the installed package finds them.

Guards against a wheel that installs fine but has no notebooks (the tour, or a
workshop laptop installing from the wheel, would find nothing), against shipping
other files than the stored notebooks (sources, the build script), against a
build that silently ships none, and against an accessor that only works in a
checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _wheel import build_wheel, copy_checkout, notebook_imports, pip_wheel

import ezpz_nb.cli.resources as resources

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def _stored(*patterns: str) -> list[Path]:
    """The checkout's notebooks (and notes) that ship: these patterns, and ``solutions/``."""
    found = [p for g in (*patterns, "solutions/*.ipynb") for p in NOTEBOOKS.glob(g)]
    return sorted(found)


def _notebook(path: Path, *cells: str) -> Path:
    """A stored notebook of these code cells, and a markdown cell that imports nothing."""
    code = [
        {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
        for c in cells
    ]
    text = {"cell_type": "markdown", "metadata": {}, "source": "import not_code"}
    path.write_text(
        json.dumps({"cells": [*code, text], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


def test_the_wheel_pass_takes_each_import_a_notebook_needs(tmp_path):
    """Guards `make wheel-test`'s reading of the notebooks, which replaced running 13 and
    14 there: every unguarded import counts (in a function, a %%ranks cell, an `else:`
    and a written .py file too); magics, shell lines and non-Python cells do not; an
    import in a try that catches a failed import (and its fallback) is optional in that
    notebook, wherever it recurs there, but a try that catches something else guards
    nothing; the notebooks' own files are not asked of the install."""
    nb = _notebook(
        tmp_path / "a.ipynb",
        "%matplotlib inline\nimport numpy as np\n!pip list\nx = !ls\n"
        "from torch.utils.data import X\n",
        "def f():\n    import json\n    from . import sibling\n",
        "try:\n    import streaming\nexcept Exception:\n    streaming = None\n"
        "if streaming is not None:\n    from streaming.base import x\n",
        "try:\n    import fast_json\nexcept ImportError:\n    import slow_json\n"
        "else:\n    import csv\n",
        "try:\n    import torch\nexcept ValueError:\n    pass\n",
        "%%ranks\nimport pickle\n",
        "%%writefile worker.py\nimport argparse\n",
        "%%writefile -a worker.py\nimport signal\n",
        "%%writefile notes.txt\nimport not_python\n",
        "%%bash\nimport not_python_either\n",
        "import worker\n",
    )
    other = _notebook(tmp_path / "b.ipynb", "import streaming\n")
    assert notebook_imports([nb]) == [
        "argparse",
        "csv",
        "json",
        "numpy",
        "pickle",
        "signal",
        "torch",
        "torch.utils.data",
    ]
    # Guarded in a.ipynb only: b.ipynb imports it plainly, so the install must have it.
    assert "streaming" in notebook_imports([nb, other])


def test_the_wheel_pass_reads_the_stored_notebooks():
    """The real notebooks: 13's extras are asked of the install, its optional streaming
    is not, nor the worker file 14 writes."""
    modules = notebook_imports(_stored("*.ipynb"))
    assert {"datasets", "torchdata.stateful_dataloader", "ezpz_nb.agents.by_hand"} <= set(modules)
    assert not [m for m in modules if m.split(".")[0] in ("streaming", "torchrun_worker")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built, as a user would, from a copy of this checkout."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory) -> Path:
    """The wheel installed without its dependencies (this venv has them) into a folder."""
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return site


@pytest.mark.system
def test_wheel_ships_the_stored_notebooks(wheel):
    assert len(list(NOTEBOOKS.glob("*.ipynb"))) >= 7
    # The notes beside them (the cheat sheet, the instructor's guide) ship with them, and the
    # solutions in their own folder (issue 45: not one click from the exercise).
    stored = _stored("*.ipynb", "*.md")
    names = [p.relative_to(NOTEBOOKS).as_posix() for p in stored]
    assert {"CHEATSHEET.md", "INSTRUCTOR.md", "solutions/05_workshop_solutions.ipynb"} <= set(names)
    with zipfile.ZipFile(wheel) as zf:
        shipped = sorted(n for n in zf.namelist() if n.startswith("ezpz_nb/_notebooks/"))
        assert shipped == [f"ezpz_nb/_notebooks/{n}" for n in names]
        for p, n in zip(stored, names, strict=True):
            assert zf.read(f"ezpz_nb/_notebooks/{n}") == p.read_bytes(), n
        # Every subpackage (a wheel listing them by hand once left out launcher/).
        for init in sorted((ROOT / "ezpz_nb").rglob("__init__.py")):
            assert init.relative_to(ROOT).as_posix() in zf.namelist()
        # Sources and the build script are the repository's, not the package's.
        assert not [n for n in zf.namelist() if "_cells" in n or n.endswith("_build.py")]


@pytest.mark.system
def test_installed_wheel_finds_its_notebooks(site, tmp_path):
    away = tmp_path / "elsewhere"  # no notebooks/ in the working directory
    away.mkdir()
    probe = (
        "import sys, ezpz_nb, ezpz_nb.cli.tour as t\n"
        "print(ezpz_nb.__file__)\n"
        "print(sorted({m.__file__.split('/ezpz_nb/')[0] for n, m in sys.modules.items()\n"
        "              if n.startswith('ezpz_nb.') and getattr(m, '__file__', None)}))\n"
        "print(t.default_notebook_dir())\n"
        "print(len(t.find_notebooks(t.default_notebook_dir())))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    package, modules, folder, count = done.stdout.splitlines()
    assert Path(package).parent == site / "ezpz_nb"  # the installed copy, not the checkout
    # ...and so are its submodules (the checkout's editable install would fill any gap).
    assert modules == repr([str(site)])
    assert Path(folder) == site / "ezpz_nb" / "_notebooks"
    assert int(count) == len(list(NOTEBOOKS.glob("*.ipynb")))


@pytest.mark.system
def test_wheel_build_without_notebooks_fails_and_says_why(tmp_path):
    src = copy_checkout(tmp_path / "src")
    for nb in (src / "notebooks").rglob("*.ipynb"):
        nb.unlink()
    done = pip_wheel(src, tmp_path / "dist")
    assert done.returncode != 0
    assert "no notebooks in" in done.stdout + done.stderr
    assert not list(tmp_path.glob("dist/*.whl"))


def test_checkout_uses_the_repository_notebooks():
    # The tests run against the editable install: no copy, the checkout's notebooks/.
    assert resources.notebooks_dir() == NOTEBOOKS


def test_missing_notebooks_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "_PACKAGE", tmp_path / "ezpz_nb")
    with pytest.raises(FileNotFoundError, match="reinstall ezpz_nb"):
        resources.notebooks_dir()


@pytest.mark.system
def test_installed_wheel_runs_its_tutorial_away_from_the_repository(site, tmp_path, short_tmp):
    """The quick version of `make wheel-test` (which uses a fresh venv and checks more)."""
    away = tmp_path / "participant"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "TMPDIR": short_tmp}
    cli = [sys.executable, "-m", "ezpz_nb"]
    done = subprocess.run(
        [*cli, "doctor", "--budget", "120"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"at {site / 'ezpz_nb'}, {len(_stored('*.ipynb'))} notebooks" in done.stdout
    done = subprocess.run(
        [*cli, "notebooks", "tutorial"],
        cwd=away,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    tutorial = away / "tutorial"
    # Every notebook and the workshop kit beside them (CHEATSHEET.md, INSTRUCTOR.md), and the
    # solutions in solutions/.
    copied = [p.relative_to(tutorial).as_posix() for p in tutorial.rglob("*") if p.is_file()]
    assert sorted(copied) == [
        p.relative_to(NOTEBOOKS).as_posix() for p in _stored("*.ipynb", "*.md")
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--nbmake",
            "--nbmake-timeout=120",
            "00_setup_check.ipynb",
        ],
        cwd=tutorial,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


@pytest.mark.system
@pytest.mark.timeout(480)
def test_the_installed_wheel_gives_the_command_and_the_plugin(site, tmp_path):
    """Built as a wheel and installed into a folder (no checkout on the path): `ezpz-nb
    check` exits 1 on a violation and pytest finds the fixture through the entry point.

    Guards: a plugin package or entry point left out of the wheel (it would work in the
    editable checkout and nowhere else). It shares this module's wheel and install (it
    built its own in the quick tests: a third wheel build per `make test`).
    """
    away = tmp_path / "project"
    away.mkdir()
    (away / "loaders.py").write_text((ROOT / "tests" / "_verify_loaders.py").read_text())
    (away / "test_contract.py").write_text(
        "import ezpz_nb_pytest, loaders\n\n"
        "def test_where():\n    assert ezpz_nb_pytest.__file__.startswith("
        + repr(str(site))
        + ")\n\n"
        "def test_right(loader_contract):\n    loader_contract(loaders.right, 'dp=2', epochs=1)\n\n"
        "def test_wrong(loader_contract):\n    loader_contract(loaders.unsharded, 'dp=2', epochs=1)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{site}:{away}"}

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *cmd], cwd=away, env=env, capture_output=True, text=True, timeout=240
        )

    check = run("-m", "ezpz_nb", "check", "loaders:unsharded", "--epochs", "1")
    assert check.returncode == 1 and "dp_duplicate" in check.stdout, check.stderr[-2000:]
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_contract.py")
    assert "1 failed, 2 passed" in tests.stdout, tests.stdout[-3000:]
