"""The environment switches read in one way: ``is_off`` for those on by default, ``is_on``
for those off by default (issue 47 item 8: ``EZPZ_NB_PLAIN=0`` turned plain output on)."""

from __future__ import annotations

import pytest

from ezpz_nb.launcher.settings import PLAIN_ENV, is_off, is_on
from ezpz_nb.viz import progress


@pytest.mark.parametrize(
    ("value", "on", "off"),
    [
        (None, False, False),
        ("", False, False),
        ("0", False, True),
        (" Off ", False, True),
        ("false", False, True),
        ("no", False, True),
        ("1", True, False),
        ("yes", True, False),
    ],
)
def test_a_switch_reads_the_same_words_either_way(value, on, off):
    assert (is_on(value), is_off(value)) == (on, off)


@pytest.mark.parametrize(("value", "bars"), [(None, True), ("0", True), ("1", False)])
def test_plain_zero_keeps_the_bars_in_a_kernel(monkeypatch, value, bars):
    """Guards: EZPZ_NB_PLAIN=0 means widgets (it turned plain text on, as any non-empty
    value did); =1 means text."""
    monkeypatch.setattr(progress, "in_jupyter_kernel", lambda: True)  # as in a kernel
    if value is None:
        monkeypatch.delenv(PLAIN_ENV, raising=False)
    else:
        monkeypatch.setenv(PLAIN_ENV, value)
    assert progress._widget_frontend() is bars
