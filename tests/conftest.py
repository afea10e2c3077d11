"""Fixtures shared by several test modules."""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture()
def short_tmp():
    """A private TMPDIR with a short path: the forkserver's AF_UNIX socket lives there,
    and socket paths are limited to about 100 bytes."""
    path = tempfile.mkdtemp(prefix="ezpz-t", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)
