"""Fixtures and hooks shared by several test modules."""

from __future__ import annotations

import shutil
import tempfile

import pytest

# The files that take longest, slowest first (measured with --durations on 2 cores).
# `make unit` and `make system` hand whole files to their workers in collection order, so
# a long file collected last would run alone at the end while the other workers idle;
# longest first lets the short ones fill in. Order only: every test still runs.
SLOW_FIRST = (
    # system and browser files
    "test_browser.py",
    "test_agents.py",
    "test_slurm.py",
    "test_memory.py",
    "test_benchmarks.py",
    "test_dcp_torchrun.py",
    "test_torchrun.py",
    # make unit's, by their seconds in a fresh clone's run (3 workers, 2 cores)
    "test_mix_exercise.py",
    "test_memory_exercise.py",
    "test_mix_fresh.py",
    "test_throughput_exercise.py",
    "test_eval_exercise.py",
    "test_exercises.py",
    "test_dcp_exercise.py",
    "test_verify.py",
    "test_text_exercises.py",
    "test_verify_corpus.py",
    "test_verify_dcp.py",
    "test_errors_shown.py",
    "test_pool.py",
    "test_cell_shapes.py",
    "test_launch_notebook.py",
    "test_launch.py",
    "test_timing.py",
    "test_text.py",
    "test_dodges_eighth.py",
    "test_examples.py",
    "test_tp_plan.py",
    "test_widgets.py",
    "test_plot.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Send the test modules' own functions and classes to the ranks by value, and put
    the slowest files first (SLOW_FIRST).

    By reference, every rank of every run would import the test module, and with it
    pytest and hypothesis: about half a second per rank on a busy 2-core machine,
    paid again by each fresh rank. By value a rank needs only what a job uses.
    """
    import cloudpickle

    for module in {getattr(item, "module", None) for item in items} - {None}:
        cloudpickle.register_pickle_by_value(module)

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: a file's own tests keep their order


@pytest.fixture()
def short_tmp():
    """A private TMPDIR with a short path: the forkserver's AF_UNIX socket lives there,
    and socket paths are limited to about 100 bytes."""
    path = tempfile.mkdtemp(prefix="ezpz-t", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def two():
    """Two warm ranks shared by every check of a module (their imports paid once)."""
    import ezpz_nb as ez

    with ez.Cluster(2) as cluster:
        yield cluster
