"""Replies read as plain data inside a check (``launcher/plain.py``), on real ranks.

Guards issue 45's fourth trial: a value a learner's function returns was unpickled in the
notebook with plain ``pickle.loads``, so an ``int`` subclass whose ``__reduce__`` calls
``exec`` ran there and could rewrite the checker judging it.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

import ezpz_nb as ez
from ezpz_nb.workshop.stops import CheckStopped
from ezpz_nb.workshop.verdicts import run_job

MARK = Path("/tmp") / "ezpz-nb-plain-test-ran"


class _Runs(int):
    """An int that, unpickled, writes MARK: what a dodge would do to the checker."""

    def __reduce__(self):
        return (exec, (f"open({str(MARK)!r}, 'w').write('ran')",))


class _Mine:
    """A learner's own class: travels in ez.launch, not in a check's reply."""

    def __init__(self) -> None:
        self.x = 1


def _plain() -> list:
    return [
        1, 2.5, "x", b"y", None, True, {1, 2}, (1, (2,)), {"a": [1]}, np.arange(3),
        np.float64(2.0), np.int32(4), torch.arange(4), torch.ones(2, dtype=torch.bfloat16),
        torch.float32, torch.Size([2]), OrderedDict(a=1), Counter("ab"),
    ]  # fmt: skip


def _runs_code() -> list:
    return [_Runs(3)]


def _mine() -> _Mine:
    return _Mine()


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(2) as c:
        yield c


def test_plain_data_comes_back_whole(cluster):
    got = run_job(_plain, world_size=2, cluster=cluster)[1]
    assert got[:9] == _plain()[:9] and torch.equal(got[12], torch.arange(4))
    assert got[13].dtype == torch.bfloat16 and got[14] is torch.float32
    assert isinstance(got[16], OrderedDict) and got[17] == Counter("ab")
    assert np.array_equal(got[9], np.arange(3)) and got[10] == 2.0


def test_a_reply_that_would_run_code_is_refused_and_named(cluster):
    MARK.unlink(missing_ok=True)
    with pytest.raises(CheckStopped, match=r"builtins\.exec.*plain data"):
        run_job(_runs_code, world_size=2, cluster=cluster)
    assert not MARK.exists(), "the reply ran code in the notebook"
    with pytest.raises(
        CheckStopped, match=r"a class or function defined in your notebook.*plain data"
    ):
        run_job(_mine, world_size=2, cluster=cluster)


def test_outside_a_check_a_rank_returns_its_own_objects(cluster):
    # ez.launch and Cluster.run keep returning what users define (the rule is a check's)
    assert cluster.run(_mine)[0].x == 1
