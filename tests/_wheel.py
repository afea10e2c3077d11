"""The tutorial as a participant gets it from the wheel, far from this checkout.

``make wheel-test`` runs this file: it builds the wheel the way the README says,
installs it with its dependencies into a fresh virtual environment in a temporary
folder outside the repository, and there checks what only the wheel can break:

* the package itself: every module imports from the installed copy (a subpackage
  left out of the wheel fails here, whichever notebook would have found it);
* the entry points: ``ezpz-nb doctor``, ``ezpz-nb notebooks DIR`` (every stored
  notebook and note, as package data), ``ezpz-nb check`` and the pytest plugin's
  fixture on a loader of its own, a one-notebook ``ezpz-nb tour`` (notebook 00);
* what the notebooks reach beyond the package, from DIR: every module that a
  notebook's code cells import (and the files its ``%%writefile`` cells write) imports
  in the install, so an extra that lacks a notebook's dependency fails here, whichever
  notebook it is (13's datasets and torchdata among them); and notebook 14's torchrun
  worker, written from its ``%%writefile`` cells beside the notebook, passes the
  notebook's own checker (``check_worker``: real torchrun agents, one node and two,
  ranks that import the installed ezpz_nb);
* the README's course-CI step (``pytest --nbmake``) from DIR on :data:`NBMAKE_NOTEBOOK`,
  whose ranks import the workshop's checkers from the install.

Every notebook runs once, from the repository (``make notebooks`` and the browser
test); nbmake reruns only 05 here: what the others do beyond their imports and 14's
worker reads nothing the wheel adds (running 13 and 14 here took 61 s). ``--all`` runs
every notebook here too (before a release).
It prints how long each step took. ``tests/test_wheel.py`` uses its helpers to
build the wheel.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Everything of the checkout but what is local to it (environments, caches, build output).
LOCAL = shutil.ignore_patterns(
    ".venv",
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
    "tour",
    "test-artifacts",
    "_notebooks",
)
# What a course repository's CI adds to run notebooks (the wheel does not depend on them).
TEST_TOOLS = ("pytest>=7.4", "nbmake>=1.5")
# The README's course-CI steps, run here against the built wheel.
DOCTOR = ("ezpz-nb", "doctor", "--budget", "60")  # a shared runner may be slow
NBMAKE = ("pytest", "--nbmake")  # then --nbmake-timeout=S and the notebooks
# The notebook the course-CI nbmake step runs here (every one with --all).
NBMAKE_NOTEBOOK = "05_workshop.ipynb"
# Every module of the installed package imports, from the install (not from a checkout).
IMPORT_ALL = """\
import importlib, pkgutil, sys
import ezpz_nb, ezpz_nb_pytest
names = [m.name for m in pkgutil.walk_packages(ezpz_nb.__path__, "ezpz_nb.")]
for name in names:
    importlib.import_module(name)
where = {m.__file__.rsplit("/ezpz_nb", 1)[0] for n, m in sys.modules.items()
         if n.split(".")[0] in ("ezpz_nb", "ezpz_nb_pytest") and getattr(m, "__file__", None)}
assert len(where) == 1 and "site-packages" in where.pop(), where
print(len(names), "modules imported from the install")
"""
# Each module named on the command line imports here; all failures are named at once.
IMPORT_EACH = """\
import importlib, sys
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        failed.append(f"{name}: {exc}")
assert not failed, "a notebook imports what the install lacks:\\n" + "\\n".join(failed)
print(len(sys.argv) - 1, "modules the notebooks import, imported from the install")
"""
# Notebook 14's worker file, written as its cells write it, judged by its own checker.
CHECK_WORKER = """\
from ezpz_nb.agents.by_hand import check_worker, worker_from_notebook
with open("torchrun_worker.py", "w") as f:
    f.write(worker_from_notebook("14_torchrun_by_hand.ipynb"))
runs = check_worker("torchrun_worker.py")
print(len(runs), "torchrun jobs of notebook 14's worker passed its checker")
"""
# A project's own test of its loader, through the wheel's pytest plugin: a right loader
# passes, a wrong one raises ContractViolation (an AssertionError) naming the rule.
CONTRACT_TESTS = """\
import pytest

import loaders


def test_right(loader_contract):
    loader_contract(loaders.right, "dp=2", epochs=1)


def test_wrong_is_caught(loader_contract):
    with pytest.raises(AssertionError, match="dp_duplicate"):
        loader_contract(loaders.unsharded, "dp=2", epochs=1)
"""


def code_cells(notebook: Path) -> list[str]:
    """The source of each code cell of a stored notebook, in order."""
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


# Cell magics whose body is not Python that the kernel (or a rank, for %%ranks) runs.
NOT_PYTHON = {"bash", "sh", "script", "html", "javascript", "js", "latex", "markdown", "svg"}
# An except clause that catches one of these makes the imports of its try optional.
IMPORT_GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _written(cell: str) -> str | None:
    """The file a ``%%writefile [-a] FILE`` (or ``%%file``) cell writes, else None."""
    words = cell.lstrip().partition("\n")[0].split()
    return words[-1] if words and words[0] in ("%%writefile", "%%file") else None


def _python_of(cell: str) -> str | None:
    """The Python a code cell runs (a cell magic's body too), or None where it runs none."""
    head, _, body = cell.lstrip().partition("\n")
    if head.startswith("%%"):
        written = _written(cell)
        if written is not None:
            return body if written.endswith(".py") else None
        if head[2:].split(" ")[0] in NOT_PYTHON:
            return None
        cell = body  # %%ranks, %%capture, %%time...: Python after the magic's line
    # Line magics and shell lines (`%time f()`, `!pip`, `x = !ls`) are IPython, not Python.
    lines = cell.splitlines()
    return "\n".join(
        ln for ln in lines if not ln.lstrip().startswith(("%", "!")) and "= !" not in ln
    )


def _guards_imports(node: ast.AST) -> bool:
    """A try statement with an except clause that catches a failed import."""
    if not isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
        return False
    for handler in node.handlers:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if caught is None or any(getattr(n, "id", None) in IMPORT_GUARDS for n in names):
            return True
    return False


def notebook_imports(notebooks: list[Path]) -> list[str]:
    """The modules the notebooks import that must resolve where they run.

    Their code cells' (a ``%%ranks`` cell's too) and their ``%%writefile``-d Python
    files' import statements, wherever they stand (inside a function too), except where
    the notebook guards them: an import in a ``try`` whose ``except`` catches a failed
    import (or in that ``except``: a fallback) is optional in that notebook, and so are
    its other imports of the same module or its submodules (13 tests ``streaming is not
    None`` before ``from streaming... import``). The notebooks' own files are left out.
    """
    found: set[str] = set()
    cells = [code_cells(notebook) for notebook in notebooks]
    own = {Path(f).stem for each in cells for c in each if (f := _written(c))}
    for each in cells:
        required: set[str] = set()
        optional: set[str] = set()
        for cell in each:
            source = _python_of(cell)
            if source is None:
                continue
            tree = ast.parse(source)
            guarded = {
                id(n)
                for t in ast.walk(tree)
                if _guards_imports(t)
                for part in (*t.body, *t.handlers)  # type: ignore[attr-defined]
                for n in ast.walk(part)
            }
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                (optional if id(node) in guarded else required).update(names)
        found |= {m for m in required if not any(m == g or m.startswith(g + ".") for g in optional)}
    return sorted(m for m in found if m.split(".")[0] not in own)


def copy_checkout(dest: Path) -> Path:
    """A copy of this checkout's sources: building writes build/ and *.egg-info beside them."""
    shutil.copytree(ROOT, dest, ignore=LOCAL)
    return dest


def pip_wheel(src: Path, out: Path) -> subprocess.CompletedProcess:
    """The README's ``pip wheel . --no-deps -w dist``, run in ``src``.

    Plus --no-build-isolation: this environment's setuptools (a dev extra) builds
    it, so no build requirement is downloaded.
    """
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
        ],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=240,
    )


def build_wheel(work: Path) -> Path:
    """Build the wheel from a copy of this checkout under ``work``; its path."""
    done = pip_wheel(copy_checkout(work / "src"), work / "dist")
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{done.stdout}\n{done.stderr}")
    (wheel,) = (work / "dist").glob("ezpz_nb-*.whl")
    return wheel


def outside_env(bin_dir: Path) -> dict[str, str]:
    """This environment without a trace of the checkout's: only ``bin_dir``'s Python is seen."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_", "JUPYTER")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


class Steps:
    """Runs commands one after the other, stops at the first failure, times each."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.times: list[tuple[str, float]] = []

    def run(self, name: str, cmd: list[str], cwd: Path, timeout: float) -> None:
        print(f"\n== {name}: {' '.join(cmd)}  (in {cwd})", flush=True)
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=cwd, env=self.env, timeout=timeout)
        self.times.append((name, time.monotonic() - start))
        if done.returncode != 0:
            raise SystemExit(f"wheel test: {name} failed (exit status {done.returncode})")

    def table(self) -> str:
        rows = [f"  {name:<28} {seconds:7.1f} s" for name, seconds in self.times]
        total = sum(s for _, s in self.times)
        return "\n".join(
            ["step                             time", *rows, f"  {'total':<28} {total:7.1f} s"]
        )


def main(argv: list[str] | None = None) -> int:
    """``make wheel-test``: build, install outside the repository, check what only it can break."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="python3", help="Python that makes the venv")
    parser.add_argument("--torch", default="torch==2.13.0", help="torch requirement to install")
    parser.add_argument("--timeout", type=int, default=120, help="seconds one cell may take")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--all", action="store_true", help="run every notebook under nbmake too")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="ezpz_nb-wheel-test-"))
    if ROOT in work.resolve().parents:
        raise SystemExit(f"wheel test: {work} must be outside the repository; set TMPDIR")
    try:
        start = time.monotonic()
        wheel = build_wheel(work)
        build_s = time.monotonic() - start
        print(f"built {wheel.name} in {build_s:.1f} s", flush=True)
        venv = work / "venv"
        subprocess.run([args.python, "-m", "venv", str(venv)], check=True, timeout=240)
        py, bin_dir = str(venv / "bin" / "python"), venv / "bin"
        steps = Steps(outside_env(bin_dir))
        steps.times.append(("build the wheel", build_s))
        home = work / "participant"  # the participant's own folder, not the checkout
        home.mkdir()
        steps.run("install torch", [py, "-m", "pip", "install", "-q", args.torch], home, 900)
        # With the notebook extra (torchdata, for notebook 09), as the README says.
        steps.run(
            "install the wheel",
            [py, "-m", "pip", "install", "-q", f"{wheel}[notebook]", *TEST_TOOLS],
            home,
            900,
        )
        steps.run("import every module", [py, "-c", IMPORT_ALL], home, 300)
        steps.run("ezpz-nb doctor", [str(bin_dir / DOCTOR[0]), *DOCTOR[1:]], home, 120)
        steps.run(
            "ezpz-nb notebooks DIR", [str(bin_dir / "ezpz-nb"), "notebooks", "tutorial"], home, 120
        )
        nbs = home / "tutorial"
        # Every stored notebook and the notes beside them (CHEATSHEET.md, INSTRUCTOR.md), and
        # the solutions in their own folder.
        source = ROOT / "notebooks"
        shipped = sorted(
            p.relative_to(source).as_posix()
            for g in ("*.ipynb", "*.md", "solutions/*.ipynb")
            for p in source.glob(g)
        )
        got = sorted(p.relative_to(nbs).as_posix() for p in nbs.rglob("*") if p.is_file())
        if got != shipped:
            raise SystemExit(f"wheel test: ezpz-nb notebooks gave {got}, expected {shipped}")
        notebooks = sorted(nbs.rglob("*.ipynb"))
        modules = notebook_imports(notebooks)
        steps.run(
            f"the notebooks' {len(modules)} imports",
            [py, "-c", IMPORT_EACH, *modules],
            nbs,
            300,
        )
        # Notebook 14's worker, as its %%writefile cells write it beside the notebook,
        # judged by the installed checker as the notebook's exercise does: real torchrun
        # agents (one node of 2 ranks, then two of 1), whose ranks import the install.
        steps.run("14's worker, its checker", [py, "-c", CHECK_WORKER], nbs, 300)
        # The README's course-CI step (docs/participants.md), on one notebook: 05 sends the
        # checkers' jobs by reference, so its ranks import ezpz_nb.workshop from the install.
        chosen = ["."] if args.all else [NBMAKE_NOTEBOOK]
        steps.run(
            "nbmake, " + ("every notebook" if args.all else NBMAKE_NOTEBOOK[:2]),
            [str(bin_dir / NBMAKE[0]), *NBMAKE[1:], f"--nbmake-timeout={args.timeout}", *chosen],
            nbs,
            1800,
        )
        # ezpz_nb.verify as a course or a library uses it: the command and the pytest
        # fixture, found through the wheel's entry points, on a loader of its own.
        checks = home / "loader_checks"
        checks.mkdir()
        shutil.copy(ROOT / "tests" / "_verify_loaders.py", checks / "loaders.py")
        (checks / "test_loaders.py").write_text(CONTRACT_TESTS)
        steps.run(
            "ezpz-nb check, a right loader",
            [str(bin_dir / "ezpz-nb"), "check", "loaders:right", "--epochs", "1"],
            checks,
            300,
        )
        steps.run(
            "pytest loader_contract fixture",
            [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_loaders.py"],
            checks,
            300,
        )
        steps.run(
            "ezpz-nb tour 00",
            [str(bin_dir / "ezpz-nb"), "tour", "00", "--out", str(home / "tour")],
            home,
            300,
        )
        print(
            f"\nwheel test passed: the installed wheel ran outside the repository\n{steps.table()}",
            flush=True,
        )
        return 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
