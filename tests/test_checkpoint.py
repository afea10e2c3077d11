"""The loader's state in a torch.distributed.checkpoint save, on real gloo ranks.

What DCP does with a non-tensor value saved under one key by every rank is read
from torch 2.13 (``_dedup_save_plans.py``) and pinned here, so a change upstream
is noticed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.data.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointLayoutError,
    LoaderCheckpoint,
    sub_layout,
)
from ezpz_nb.data.groups import Layout
from ezpz_nb.data.resumable import GlobalOrderLoader
from ezpz_nb.examples.capstone import RuleTokenDataset

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ez.Cluster]:
    """Four warm ranks for every test here (a launch per test would cost more than the test)."""
    with ez.Cluster(world_size=4, timeout=120) as c:
        yield c


@pytest.fixture()
def ckpt_dir() -> Iterator[str]:
    """A checkpoint folder that is removed after the test."""
    path = tempfile.mkdtemp(prefix="ezpz-dcp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _loader(lay: Layout, rng: str = "per-rank") -> GlobalOrderLoader:
    ds = RuleTokenDataset(num_samples=48)
    return GlobalOrderLoader(ds, 2, lay.dp_rank, lay.dp_size, seed=7, mask_rate=0.25, rng=rng)  # type: ignore[arg-type]


def _part(
    path: str, dp: int, tp: int, steps: int | None, *, load: bool, save: bool,
    rng: str = "per-rank", design: str = "refuse",
) -> Any:  # fmt: skip
    """Optionally load, take ``steps`` steps (None: to the end of the epoch), optionally save.

    Returns ``(indices seen, input_ids digests)`` or the refusal's text, None off the layout.
    """
    made = sub_layout(dp, tp)
    if made is None:
        return None
    lay, group = made
    loader = _loader(lay, rng)
    ck = LoaderCheckpoint(loader, lay, on_new_layout=design)  # type: ignore[arg-type]
    if load:
        try:
            ck.prepare_load(path, group)
            import torch.distributed.checkpoint as dcp

            dcp.load({"data": ck}, checkpoint_id=path, process_group=group)
        except CheckpointLayoutError as exc:
            return str(exc)
    seen, digests = [], []
    it = iter(loader)
    # Stop before asking for the next batch: the loader counts a batch once it hands it out.
    for batch in it if steps is None else (next(it) for _ in range(steps)):
        seen += batch["index"].tolist()
        digests.append(int(batch["input_ids"].sum()))
    if save:
        import torch.distributed.checkpoint as dcp

        dcp.save({"data": ck}, checkpoint_id=path, process_group=group)
    return seen, digests


def test_one_key_for_every_rank_comes_back_as_one_ranks_value(cluster, ckpt_dir):
    """Every rank saves ``{"pos": 100 + rank}`` under the same key; load gives all one value.

    Guards: the premise of the per-DP-rank keys (pytorch PR #125334): DCP keeps one
    copy of a non-tensor value per key, from the rank whose plan is smallest so far,
    so which rank wins depends on what was planned before it (not always rank 0).
    """

    def job(path: str, model_first: bool) -> int:
        import torch.distributed.checkpoint as dcp

        r = dist.get_rank()
        model = {f"w{r}": torch.full((64,), float(r))}  # a per-rank tensor, planned per rank
        state = {"model": model, "loader": {"pos": 100 + r}}
        if not model_first:
            state = {"loader": {"pos": 100 + r}, "model": model}
        dcp.save(state, checkpoint_id=os.path.join(path, str(model_first)))
        back = {"loader": {"pos": -1}}
        dcp.load(back, checkpoint_id=os.path.join(path, str(model_first)))
        return back["loader"]["pos"]

    assert cluster.run(job, ckpt_dir, False) == [100] * 4  # nothing planned before it: rank 0
    assert cluster.run(job, ckpt_dir, True) == [101] * 4  # rank 0's plan already holds w0


def test_same_layout_resume_gives_the_straight_runs_batches_bit_for_bit(cluster, ckpt_dir):
    """dp 2 x tp 2: 3 steps, dcp.save, fresh loaders, dcp.load, the rest of the epoch.

    Guards: per-DP-rank keys and the loader's RNG in the same save: the resumed
    batches (indices and masked tokens) equal a straight run's, on every rank.
    """
    straight = cluster.run(_part, ckpt_dir, 2, 2, None, load=False, save=False)
    first = cluster.run(_part, ckpt_dir, 2, 2, 3, load=False, save=True)
    rest = cluster.run(_part, ckpt_dir, 2, 2, None, load=True, save=False)
    for r in range(4):
        assert first[r][0] + rest[r][0] == straight[r][0]
        assert first[r][1] + rest[r][1] == straight[r][1]
    assert straight[0] == straight[1] and straight[0] != straight[2]  # TP peers agree, DP differ


def test_forgetting_the_rng_changes_the_masks_after_the_resume(cluster, ckpt_dir):
    """The same resume, but the saved generator is dropped before the load.

    Guards: that the RNG is what makes the resumed batches equal (the test above
    would pass without it if the loader drew nothing).
    """

    def job(path: str) -> tuple[list[int], list[int]]:
        import torch.distributed.checkpoint as dcp

        lay, group = sub_layout(2, 2)  # type: ignore[misc]  # every rank is on a 2 x 2 layout
        loader = _loader(lay)
        dcp.load({"data": LoaderCheckpoint(loader, lay)}, checkpoint_id=path, process_group=group)
        loader.generator.manual_seed(7 + lay.dp_rank)  # the RNG forgotten
        batches = list(loader)
        return [i for b in batches for i in b["index"].tolist()], [
            int(b["input_ids"].sum()) for b in batches
        ]

    straight = cluster.run(_part, ckpt_dir, 2, 2, None, load=False, save=False)
    cluster.run(_part, ckpt_dir, 2, 2, 3, load=False, save=True)
    forgot = cluster.run(job, ckpt_dir)
    for r in range(4):
        assert forgot[r][0] == straight[r][0][6:]  # the same samples...
    assert any(forgot[r][1] != straight[r][1][3:] for r in range(4))  # ...other masks


def test_tp_peers_with_different_states_refuse_to_save(cluster, ckpt_dir):
    """One TP peer a step ahead of the other: state_dict raises before DCP keeps one copy.

    Guards: "TP peers hold the same state" checked, not trusted.
    """

    def job(path: str) -> str:
        import torch.distributed.checkpoint as dcp

        lay, group = sub_layout(2, 2)  # type: ignore[misc]
        loader = _loader(lay)
        it = iter(loader)
        for _ in range(2 if lay.rank == 3 else 1):
            next(it)
        try:
            dcp.save({"data": LoaderCheckpoint(loader, lay)}, checkpoint_id=path)
        except Exception as exc:  # noqa: BLE001 - DCP wraps the rank's error
            return type(exc).__name__ + ": " + str(exc)
        return "saved"

    out = cluster.run(job, ckpt_dir)
    assert all("TP peers of DP rank 1 hold different loader states" in o for o in out[2:]), out


def test_a_tp_broadcast_peer_saves_its_leaders_state_and_refuses_another_step(cluster, ckpt_dir):
    """TPBroadcastDataLoader at dp 2 x tp 2: peers hold ``"loader": None`` and still save.

    Guards: the agreement check comparing what a peer does not track (a false
    refusal), the checkpoint keeping a peer's empty state instead of the leader's,
    and a peer at another step than its leader (rebuilt, nothing loaded) saved anyway.
    """

    def job(path: str, fresh_peer: bool) -> Any:
        import torch.distributed.checkpoint as dcp

        from ezpz_nb.data.distributed import TPBroadcastDataLoader

        lay, group = sub_layout(2, 2)  # type: ignore[misc]
        loader = TPBroadcastDataLoader(_loader(lay), lay.tp_group)
        it = iter(loader)
        for _ in range(2):
            next(it)
        if fresh_peer and lay.rank == 3:
            loader = TPBroadcastDataLoader(_loader(lay), lay.tp_group)  # rebuilt, not loaded
        try:
            dcp.save({"data": LoaderCheckpoint(loader, lay)}, checkpoint_id=path)
        except Exception as exc:  # noqa: BLE001 - DCP wraps the rank's error
            return str(exc)
        back = TPBroadcastDataLoader(_loader(lay), lay.tp_group)
        dcp.load({"data": LoaderCheckpoint(back, lay)}, checkpoint_id=path)
        return [b["index"].tolist() for b in back]

    straight = cluster.run(job, os.path.join(ckpt_dir, "a"), False)
    for r in range(4):
        assert straight[r] == straight[r ^ 1] and len(straight[r]) == 12 - 2, straight[r]
    out = cluster.run(job, os.path.join(ckpt_dir, "b"), True)
    assert all("TP peers of DP rank 1 hold different loader states" in o for o in out[2:]), out


def test_another_dp_size_refuses_saying_what_differs(cluster, ckpt_dir):
    """Saved at dp 4, resumed at dp 2 and at dp 3 under the "refuse" design.

    Guards: the silent drop of the old ranks 2 and 3 (torchtitan PR #816): a
    smaller DP size would load ``dp_rank_0/1`` without any DCP error.
    """
    cluster.run(_part, ckpt_dir, 4, 1, 2, load=False, save=True)
    for dp in (2, 3):
        out = cluster.run(_part, ckpt_dir, dp, 1, None, load=True, save=False)
        for msg in out[:dp]:
            assert f"saved at dp=4, tp=1 (refuse); this run is dp={dp}, tp=1" in msg
            assert "resume at dp=4" in msg


def test_reshard_4_to_2_to_3_sees_every_sample_once(cluster, ckpt_dir):
    """The "reshard" design with per-sample masks: dp 4 (2 steps) -> dp 2 (2 steps) -> dp 3.

    Guards: the global consumed_samples cut anew at each DP size: 0 repeated and
    0 skipped over both joins (48 samples: 16 + 8 + 24, nothing left over).
    """
    kw = dict(rng="per-sample", design="reshard")
    a = cluster.run(_part, ckpt_dir, 4, 1, 2, load=False, save=True, **kw)
    b = cluster.run(_part, ckpt_dir, 2, 1, 2, load=True, save=True, **kw)
    c = cluster.run(_part, ckpt_dir, 3, 1, None, load=True, save=False, **kw)
    seen = [i for part in (a, b[:2], c[:3]) for s, _ in part for i in s]
    assert sorted(seen) == list(range(48))


def test_a_per_rank_rng_refuses_to_reshard(cluster, ckpt_dir):
    """The "reshard" design with per-rank masks: the generators have no owner at dp 2.

    Guards: a re-shard that restores the place but silently restarts the RNG.
    """
    cluster.run(_part, ckpt_dir, 4, 1, 2, load=False, save=True, design="reshard")
    out = cluster.run(_part, ckpt_dir, 2, 1, None, load=True, save=False, design="reshard")
    assert "per-rank randomness" in out[0]


def test_another_version_refuses():
    """A state written by another checkpoint version (no ranks needed: the check is local).

    Guards: a silent misreading of another version's keys.
    """
    loader = GlobalOrderLoader(RuleTokenDataset(num_samples=8), 2, 0, 1)
    ck = LoaderCheckpoint(loader, Layout(0, 1, 0, 1, 0, 1))
    saved = {**ck.layout_info(), "version": CHECKPOINT_VERSION + 1}
    with pytest.raises(CheckpointLayoutError, match="resume with the code that saved it"):
        ck.load_state_dict({"layout": saved})
    with pytest.raises(CheckpointLayoutError, match="on_new_layout must be one of"):
        LoaderCheckpoint(loader, Layout(0, 1, 0, 1, 0, 1), on_new_layout="drop")  # type: ignore[arg-type]


def _device_round_trip(path: str) -> dict[str, Any]:
    """On one rank of any backend: global_mean, then the generators through a DCP save/load.

    Every generator this process has draws after the save; a fresh LoaderCheckpoint
    loads, and the same draws must come again. Returns what the test compares.
    """
    import random

    import numpy as np
    import torch.distributed.checkpoint as dcp

    from ezpz_nb._dist import collective_device
    from ezpz_nb.data import global_mean
    from ezpz_nb.data.rng_state import capture_rng

    rank, world = dist.get_rank(), dist.get_world_size()
    # 2**24 + 1 per rank: a float32 sum would round the count, float64 keeps it.
    mean = global_mean(float(rank) * (2**24 + 1), 2**24 + 1)
    device = collective_device()
    if device.type == "cuda":
        torch.cuda.manual_seed(11)
        torch.rand(1, device=device)  # CUDA is in use, as in a training step
    lay = Layout(rank, world, rank, world, 0, 1)
    loader = GlobalOrderLoader(RuleTokenDataset(num_samples=8), 2, rank, world)

    def draws() -> list[float]:
        got = [torch.rand(1).item(), random.random(), float(np.random.rand())]
        if device.type == "cuda":
            got.append(torch.rand(1, device=device).item())
        return got

    dcp.save({"data": LoaderCheckpoint(loader, lay)}, checkpoint_id=path)
    after_save = draws()
    draws()  # the generators move on, as the rest of a run would
    back = LoaderCheckpoint(loader, lay)
    dcp.load({"data": back}, checkpoint_id=path)
    return {
        "mean": mean,
        "captured": sorted(capture_rng()),
        "restored": back.restored_rng,
        "same draws": draws() == after_save,
    }


def _expect_round_trip(got: list[dict[str, Any]], world: int, generators: list[str]) -> None:
    exact = sum(range(world)) / world
    for r, out in enumerate(got):
        assert out["mean"] == exact, r
        assert out["restored"] == generators and sorted(generators) == out["captured"], r
        assert out["same draws"], r


def test_global_mean_and_rng_capture_on_cpu(cluster, ckpt_dir):
    """gloo on the CPU: global_mean over 4 ranks, and every generator this process has back.

    Guards: issue 46: the loader checkpoint restored torch's and Python's generators
    only (numpy's came back unrestored), and the counts global_mean sums stay exact.
    The same test on CUDA: test_global_mean_and_rng_capture_on_cuda (`make gpu-check`).
    """
    got = cluster.run(_device_round_trip, ckpt_dir)
    _expect_round_trip(got, 4, ["torch", "python", "numpy"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make gpu-check)")
def test_global_mean_and_rng_capture_on_cuda(ckpt_dir):
    """nccl, one GPU per rank: global_mean builds its tensor on the rank's GPU (a CPU tensor
    raises on an NCCL-only group), and the rank's CUDA generator comes back with the others.

    Guards: issue 46 items 4 and 5 on the machine a learner uses next.
    """
    world = min(torch.cuda.device_count(), 2)
    got = ez.launch(_device_round_trip, ckpt_dir, world_size=world, backend="nccl", timeout=120)
    _expect_round_trip(got, world, ["torch", "python", "numpy", "cuda"])
