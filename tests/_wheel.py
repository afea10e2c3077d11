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
  worker, assembled from its ``%%writefile`` cells beside the notebook, runs under
  torchrun with 2 ranks that import the installed ezpz_nb, and leaves a sound ledger;
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
# Notebook 14 writes this torchrun worker beside itself (%%writefile cells); its ranks
# import ezpz_nb from the install. Notebook 00 runs in the tour step.
WORKER_NOTEBOOK, WORKER = "14_torchrun_by_hand.ipynb", "torchrun_worker.py"
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
# The worker's ledger, read by the installed package: every rank wrote its file, sound.
LEDGER_SOUND = """\
import sys
from ezpz_nb.ledger import Ledger
ledger = Ledger.load(sys.argv[1])
assert ledger.ok and ledger.ranks() == list(range(int(sys.argv[2]))), ledger.summary()
print(ledger.summary())
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


def _written(cell: str) -> tuple[str, bool, str] | None:
    """``(file, append, body)`` of a ``%%writefile [-a] FILE`` cell, else None."""
    head, _, body = cell.lstrip().partition("\n")
    words = head.split()
    if not words or words[0] != "%%writefile":
        return None
    return words[-1], "-a" in words[1:-1], body


def notebook_imports(notebooks: list[Path]) -> list[str]:
    """The modules the notebooks import that must resolve where they run.

    Their code cells' and their ``%%writefile``-d Python files' import statements,
    wherever they stand (inside a function too), except those in a ``try`` block: a
    notebook that guards an import runs without it (07's private torch module, 13's
    streaming). Line magics and shell lines are left out; modules the notebooks write
    are too.
    """
    found: set[str] = set()
    optional: set[str] = set()
    own: set[str] = set()
    for notebook in notebooks:
        for cell in code_cells(notebook):
            written = _written(cell)
            if written is not None:
                own.add(Path(written[0]).stem)
                if not written[0].endswith(".py"):
                    continue
                cell = written[2]
            elif cell.lstrip().startswith("%%"):
                continue  # another cell magic: not this kernel's Python
            lines = [ln for ln in cell.splitlines() if not ln.lstrip().startswith(("%", "!"))]
            tree = ast.parse("\n".join(lines))
            in_try = {
                id(n)
                for t in ast.walk(tree)
                if isinstance(t, ast.Try)
                for b in t.body
                for n in ast.walk(b)
            }
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                (optional if id(node) in in_try else found).update(names)
    # A guarded module is optional wherever the notebook imports it (13 tests
    # `streaming is not None` before its later `from streaming... import`).
    return sorted(
        m
        for m in found
        if m.split(".")[0] not in own and not any(m == g or m.startswith(g + ".") for g in optional)
    )


def written_file(notebook: Path, name: str) -> str:
    """What the notebook's ``%%writefile [-a] name`` cells write, in the notebook's order."""
    text = ""
    for cell in code_cells(notebook):
        written = _written(cell)
        if written is not None and written[0] == name:
            # IPython runs a cell's source with a final newline, and the magic writes it.
            body = written[2] if written[2].endswith("\n") else written[2] + "\n"
            text = (text if written[1] else "") + body
    if not text:
        raise SystemExit(f"wheel test: {notebook.name} writes no {name}")
    return text


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
            [
                py,
                "-m",
                "pip",
                "install",
                "-q",
                f"{wheel}[notebook]",
                *TEST_TOOLS,
            ],
            home,
            900,
        )
        steps.run("import every module", [py, "-c", IMPORT_ALL], home, 300)
        steps.run("ezpz-nb doctor", [str(bin_dir / DOCTOR[0]), *DOCTOR[1:]], home, 120)
        steps.run(
            "ezpz-nb notebooks DIR", [str(bin_dir / "ezpz-nb"), "notebooks", "tutorial"], home, 120
        )
        nbs = home / "tutorial"
        # Every stored notebook and the notes beside them (CHEATSHEET.md, INSTRUCTOR.md).
        shipped = sorted(p.name for g in ("*.ipynb", "*.md") for p in (ROOT / "notebooks").glob(g))
        got = sorted(p.name for p in nbs.iterdir())
        if got != shipped:
            raise SystemExit(f"wheel test: ezpz-nb notebooks gave {got}, expected {shipped}")
        notebooks = sorted(nbs.glob("*.ipynb"))
        modules = notebook_imports(notebooks)
        steps.run(
            f"the notebooks' {len(modules)} imports",
            [py, "-c", IMPORT_EACH, *modules],
            nbs,
            300,
        )
        # Notebook 14's worker, as its cells write it beside the notebook, under torchrun:
        # its ranks import the installed ezpz_nb (from DIR, not from a checkout).
        (nbs / WORKER).write_text(written_file(nbs / WORKER_NOTEBOOK, WORKER))
        steps.run(
            "torchrun 14's worker, 2 ranks",
            [
                py,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                WORKER,
                "--out",
                "ledger",
                "--tp-size",
                "2",
            ],
            nbs,
            300,
        )
        # The worker writes one folder per attempt: one attempt here, no restart.
        steps.run("its ledger", [py, "-c", LEDGER_SOUND, "ledger/attempt0", "2"], nbs, 120)
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
