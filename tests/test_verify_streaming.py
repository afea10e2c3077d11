"""ezpz_nb.verify on MosaicML streaming's own sharding, replication and resumption.

Runs only where ``streaming`` imports (its extra lives in a virtual environment of its
own, see docs/verify.md); skipped elsewhere, with the reason. The outcomes pinned here
are what streaming 0.13 does with torch 2.13, so a change upstream is noticed.
"""

from __future__ import annotations

import functools
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import pytest

from ezpz_nb.verify import check_contract, check_resume

try:
    import streaming
except Exception as exc:  # noqa: BLE001 - a torchvision built for another torch raises RuntimeError
    pytest.skip(
        f"MosaicML streaming does not import here ({type(exc).__name__}: {exc}); its tests "
        "run in a virtual environment of their own (docs/verify.md)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.timeout(400)

M = 48  # divides over 2 and 4 replicas in batches of 4: no padding


def _mosaic(folder: str, layout: Any, replicate: bool = True) -> Any:
    """A StreamingDataLoader over the MDS files in ``folder``/mds, as a user's factory."""
    import logging
    import os

    import torch.distributed as dist

    # streaming reads the layout from torchrun's variables; these ranks have a group already.
    world = str(dist.get_world_size())
    os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=world,
                      LOCAL_RANK=str(dist.get_rank()), LOCAL_WORLD_SIZE=world)  # fmt: skip
    logging.getLogger("streaming.base.dataset").setLevel(logging.ERROR)
    ds = streaming.StreamingDataset(
        local=f"{folder}/mds", batch_size=4, shuffle=True, shuffle_seed=7,
        replication=layout.tp_size if replicate else None,
    )  # fmt: skip
    with open(f"{folder}/shm-prefixes", "a") as f:
        f.write(f"{ds._shm_prefix_int}\n")
    return streaming.StreamingDataLoader(ds, batch_size=4)


@pytest.fixture
def mds(tmp_path: Path):
    """MDS shards of M samples; afterwards the shared memory the ranks left is freed.

    streaming frees its shared memory in atexit handlers, which a rank leaving with
    os._exit never runs; the factory notes each dataset's prefix.
    """
    from streaming.base.constant import SHM_TO_CLEAN

    with streaming.MDSWriter(
        out=str(tmp_path / "mds"), columns={"index": "int", "tokens": "bytes"}, size_limit=256
    ) as w:
        for i in range(M):
            w.write({"index": i, "tokens": bytes([i]) * 8})
    yield str(tmp_path)
    prefixes = tmp_path / "shm-prefixes"
    for prefix in set(prefixes.read_text().split()) if prefixes.exists() else ():
        for name in SHM_TO_CLEAN:
            try:
                block = shared_memory.SharedMemory(f"{int(prefix):06}_{name}")
            except FileNotFoundError:
                continue
            block.close()
            block.unlink()


def _ids(report: Any, rank: int, epoch: int) -> list[tuple[int, ...]]:
    return [r.sample_ids for r in report.ledger.steps(rank, epoch)]


def test_replication_gives_tp_peers_the_same_samples_and_forgetting_it_is_caught(mds):
    """replication=tp: TP peers identical, replicas disjoint, a new order each epoch;
    without it, streaming shards over the whole world and TP peers differ.

    Guards: the contract check missing streaming's own sharding (samples told apart by
    the MDS `index` column), or passing a job whose TP peers get different data.
    """
    right = check_contract(functools.partial(_mosaic, mds), "dp=2,tp=2", epochs=2)
    assert not right.failed, right.table()
    for e in (0, 1):
        assert _ids(right, 0, e) == _ids(right, 1, e) and _ids(right, 2, e) == _ids(right, 3, e)
    assert _ids(right, 0, 0) != _ids(right, 0, 1)
    forgot = check_contract(
        functools.partial(_mosaic, mds, replicate=False), "dp=2,tp=2", epochs=1
    )  # fmt: skip
    assert forgot.rule_verdicts()["tp_identical"] == "fail", forgot.table()


def test_streaming_resumes_mid_epoch_and_at_another_world_size_not_after_an_epoch(mds):
    """Mid-epoch: exactly where it stopped. At an epoch's end: the saved position is the
    end of that epoch, so the resumed loader's first pass is empty. dp=2,tp=2 -> dp=4:
    exactly once, per-rank batches differ as expected.

    Guards: check_resume misjudging a loader whose state is a position in samples of
    the whole job, and an upstream change in what streaming 0.13 does.
    """
    make = functools.partial(_mosaic, mds)
    same = check_resume(make, "dp=2,tp=2", epochs=2, scenarios=["mid-epoch", "epoch boundary"])
    failed = {f.message.split("]")[0][1:]: f for f in same.violations}
    assert set(failed) == {"epoch boundary"}, same.table()
    assert "got no batch" in failed["epoch boundary"].message, same.table()
    assert "ended the epoch early" in failed["epoch boundary"].hint
    moved = check_resume(make, "dp=2,tp=2", resume_layout="dp=4", scenarios=["mid-epoch"])
    assert not moved.failed, moved.table()
    assert moved.rule_verdicts()["resume"] == "expected", moved.table()
