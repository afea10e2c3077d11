"""The built wheel ships the tutorial notebooks, and the installed package finds them.

Guards against a wheel that installs fine but has no notebooks (the tour, or a
workshop laptop installing from the wheel, would find nothing), against shipping
other files than the stored notebooks (sources, the build script), against a
build that silently ships none, and against an accessor that only works in a
checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import ezpz_nb.cli.resources as resources

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# Everything of the checkout but what is local to it (environments, caches, build output).
LOCAL = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__",
                               ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", "tour",
                               "test-artifacts", "_notebooks")


def _pip_wheel(src: Path, out: Path) -> subprocess.CompletedProcess:
    """The README's `pip wheel . --no-deps -w dist`, run in ``src``.

    Plus --no-build-isolation: the venv's setuptools (a dev extra) builds it, so the
    test does not download build requirements.
    """
    return subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps",
                           "--no-build-isolation", "-w", str(out)],
                          cwd=src, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built, as a user would, from a copy of this checkout.

    A copy, because building writes build/ and *.egg-info beside the sources.
    """
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=LOCAL)
    done = _pip_wheel(src, tmp / "dist")
    assert done.returncode == 0, done.stderr
    (found,) = (tmp / "dist").glob("ezpz_nb-*.whl")
    return found


def test_wheel_ships_the_stored_notebooks(wheel):
    assert len(list(NOTEBOOKS.glob("*.ipynb"))) >= 7
    # The notes beside them (the cheat sheet, the instructor's guide) ship with them.
    stored = sorted([*NOTEBOOKS.glob("*.ipynb"), *NOTEBOOKS.glob("*.md")])
    assert {"CHEATSHEET.md", "INSTRUCTOR.md"} <= {p.name for p in stored}
    with zipfile.ZipFile(wheel) as zf:
        shipped = sorted(n for n in zf.namelist() if n.startswith("ezpz_nb/_notebooks/"))
        assert shipped == [f"ezpz_nb/_notebooks/{p.name}" for p in stored]
        for p in stored:
            assert zf.read(f"ezpz_nb/_notebooks/{p.name}") == p.read_bytes(), p.name
        # Every subpackage (a wheel listing them by hand once left out launcher/).
        for init in sorted((ROOT / "ezpz_nb").rglob("__init__.py")):
            assert init.relative_to(ROOT).as_posix() in zf.namelist()
        # Sources and the build script are the repository's, not the package's.
        assert not [n for n in zf.namelist() if "_cells" in n or n.endswith("_build.py")]


def test_installed_wheel_finds_its_notebooks(wheel, tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--target", str(site), str(wheel)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    away = tmp_path / "elsewhere"  # no notebooks/ in the working directory
    away.mkdir()
    probe = ("import sys, ezpz_nb, ezpz_nb.cli.tour as t\n"
             "print(ezpz_nb.__file__)\n"
             "print(sorted({m.__file__.split('/ezpz_nb/')[0] for n, m in sys.modules.items()\n"
             "              if n.startswith('ezpz_nb.') and getattr(m, '__file__', None)}))\n"
             "print(t.default_notebook_dir())\n"
             "print(len(t.find_notebooks(t.default_notebook_dir())))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=away, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    package, modules, folder, count = done.stdout.splitlines()
    assert Path(package).parent == site / "ezpz_nb"  # the installed copy, not the checkout
    # ...and so are its submodules (the checkout's editable install would fill any gap).
    assert modules == repr([str(site)])
    assert Path(folder) == site / "ezpz_nb" / "_notebooks"
    assert int(count) == len(list(NOTEBOOKS.glob("*.ipynb")))


def test_wheel_build_without_notebooks_fails_and_says_why(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=LOCAL)
    for nb in (src / "notebooks").glob("*.ipynb"):
        nb.unlink()
    done = _pip_wheel(src, tmp_path / "dist")
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
