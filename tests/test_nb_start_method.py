"""The repository's conftest.py: ``--spawn-notebook NAME`` gives that notebook's kernel
EZPZ_NB_START_METHOD=spawn and leaves every other notebook's kernel as it was.

`make notebooks SPAWN_NOTEBOOKS="..."` relies on it to run some notebooks with spawned
ranks in the same run as the others; if the option stopped reaching the kernel, such a run
would no longer run any notebook the way macOS and Windows start ranks, and nothing else
would notice. (`make test` spawns none: tests/test_cell_shapes.py runs the spawned
launch paths in a kernel.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ezpz_nb.launcher.settings import START_METHOD_ENV

ROOT = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]


def _notebook(path: Path, expected: str | None) -> None:
    """A one-cell notebook that fails unless its kernel sees ``expected``."""
    # The launcher's own name for the variable, which conftest.py imports too.
    source = (
        f"import os\ngot = os.environ.get({START_METHOD_ENV!r})\nassert got == {expected!r}, got"
    )
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
    nb = {
        "cells": [{**cell, "source": source}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


# Two Jupyter kernels under nbmake (~10 s of a quiet 2-core machine): the CI runner's own
# plumbing, run with the other kernel-starting tests in `make system`.
@pytest.mark.system
def test_spawn_notebook_reaches_that_kernel_only(pytester: pytest.Pytester, monkeypatch):
    """Guards: the named notebook's kernel gets spawn (a hook that set nothing, or set it
    too late for the kernel, fails the first notebook) and the next one in the same
    process does not (one that leaked it past its notebook fails the second)."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    _notebook(pytester.path / "a_spawned.ipynb", "spawn")
    _notebook(pytester.path / "b_as_before.ipynb", None)
    flags = ("-p", "no:cacheprovider", "-p", "no:xdist", "--nbmake", "--nbmake-kernel=python3")
    done = pytester.runpytest_subprocess(*flags, "--spawn-notebook=a_spawned.ipynb")
    done.assert_outcomes(passed=2)
