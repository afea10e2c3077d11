"""Our own warnings issued on a rank are shown once in the notebook, at the launching line.

A ``DataLayoutWarning`` is issued by library code deep in a rank's run; printed there,
it pointed at the library's line, once per rank. Relayed (``ezpz_nb.events``), it is
reissued in the notebook at the caller's line, naming the ranks, under the notebook's
own filters.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.data import get_random_dataset_fsdp_tp


def _layout_mistake() -> int:
    # tp_group without dp_group: rank 0 warns, from inside ezpz_nb.data.
    get_random_dataset_fsdp_tp(2, 16, 4, tp_group=dist.group.WORLD, num_samples=8)
    return dist.get_rank()


def _warn_everywhere(tag: str) -> int:
    # The same text on every rank (the tag keeps each run's text new: a rank shows a
    # warning once per text and line, as Python does), and a warning not ours.
    warnings.warn(f"every rank {tag}", ez.DataLayoutWarning, stacklevel=1)
    warnings.warn(f"not ours {tag}", UserWarning, stacklevel=1)
    return dist.get_rank()


def _ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, ez.DataLayoutWarning)]


def test_library_warning_points_at_the_launching_line(capsys):
    """Guards issue 35 item 10: a DataLayoutWarning raised by ezpz_nb.data on a rank is
    shown once, with this file and the line of the ez.launch call, naming rank 0, and is
    not also printed as the rank's stderr with the library's file:line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
        assert ez.launch(_layout_mistake, world_size=2, timeout=60) == [0, 1]
    (shown,) = _ours(caught)
    assert (shown.filename, shown.lineno) == (__file__, line)
    text = str(shown.message)
    assert text.startswith("on rank 0:\n") and "without dp_group" in text
    assert "DataLayoutWarning" not in capsys.readouterr().err


def test_same_warning_from_every_rank_is_shown_once_and_filters_apply(capsys):
    """Guards the relay's notebook side: one warning for 3 ranks naming them all, at the
    caller's line; a warning not ours still comes as each rank's stderr; the notebook's
    "ignore" filter silences ours and its "error" filter raises it here (the run's
    results are then lost, as with any warning turned error)."""
    with ez.Cluster(world_size=3, timeout=60) as c:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            assert c.run(_warn_everywhere, "a") == [0, 1, 2]
        (shown,) = _ours(caught)
        assert str(shown.message) == "on ranks 0, 1, 2: every rank a"
        assert (shown.filename, shown.lineno) == (__file__, line)
        err = capsys.readouterr().err
        theirs = [ln for ln in err.splitlines() if "UserWarning: not ours a" in ln]
        assert sorted(ln.split("]")[0] for ln in theirs) == [f"[rank {r}" for r in range(3)]
        assert "every rank" not in err

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.simplefilter("ignore", ez.DataLayoutWarning)
            assert c.run(_warn_everywhere, "b") == [0, 1, 2]
        assert _ours(caught) == []

        with warnings.catch_warnings():
            warnings.simplefilter("error", ez.DataLayoutWarning)
            with pytest.raises(ez.DataLayoutWarning, match="on ranks 0, 1, 2: every rank c"):
                c.run(_warn_everywhere, "c")
        assert c.run(dist.get_rank) == [0, 1, 2]  # the ranks are kept
