"""Fixtures and hooks shared by several test modules."""

from __future__ import annotations

import shutil
import tempfile

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Send the test modules' own functions and classes to the ranks by value.

    By reference, every rank of every run would import the test module, and with it
    pytest and hypothesis: about half a second per rank on a busy 2-core machine,
    paid again by each fresh rank. By value a rank needs only what a job uses.
    """
    import cloudpickle

    for module in {getattr(item, "module", None) for item in items} - {None}:
        cloudpickle.register_pickle_by_value(module)


@pytest.fixture()
def short_tmp():
    """A private TMPDIR with a short path: the forkserver's AF_UNIX socket lives there,
    and socket paths are limited to about 100 bytes."""
    path = tempfile.mkdtemp(prefix="ezpz-t", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
