"""Notebooks under nbmake with a start method each: ``--spawn-notebook NAME`` runs that
notebook with its ranks spawned, as macOS and Windows start them.

The kernel that nbmake starts inherits this process's environment, so setting
``EZPZ_NB_START_METHOD`` around one notebook's run gives that kernel (and only it) spawned
ranks, while the other notebooks keep the platform's default. One pytest run, one set of
workers: spawned and forked notebooks share them instead of queueing in two runs. Only
``make notebooks SPAWN_NOTEBOOKS="..."`` passes the option (none by default); a plain
``pytest --nbmake`` is unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Loads no torch: the package's names are lazy, and the launcher's settings import nothing.
from ezpz_nb.launcher.settings import PRELOAD_ENV, START_METHOD_ENV

# Every forkserver of the run (each test worker's, each kernel's) imports DCP's modules once,
# instead of every fresh rank that saves or loads a checkpoint: the checkers start ranks of
# their own for each check (0.6 s of CPU a rank; benchmarks/preload.py). Not torch._dynamo,
# though it saves more (1 s a rank with an optimizer): its import makes a torchinductor_<user>
# folder in the temporary folder, which the tests that check nothing is left would find.
# Speed only: a rank imports the same modules either way. A value set by hand is kept.
os.environ.setdefault(PRELOAD_ENV, "torch.distributed.checkpoint")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--spawn-notebook",
        action="append",
        default=[],
        metavar="NAME",
        help="run this notebook (file name) with EZPZ_NB_START_METHOD=spawn; repeatable",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.path.name not in item.config.getoption("spawn_notebook"):
        return (yield)
    before = os.environ.get(START_METHOD_ENV)
    os.environ[START_METHOD_ENV] = "spawn"
    try:
        return (yield)
    finally:
        if before is None:
            del os.environ[START_METHOD_ENV]
        else:
            os.environ[START_METHOD_ENV] = before
