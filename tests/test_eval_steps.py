"""ezpz_nb.data's exact evaluation and stepped loader, on real gloo ranks.

One launch of 4 ranks runs every evaluation case (DP groups of 2, 3 and 4 made
inside it); the stepped loader runs on 3 ranks whose shares differ in size, over a
map-style dataset and over a stream without a length.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from _batches import Stream
from torch.utils.data import DataLoader, DistributedSampler

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import ShardError, SteppedLoader, WeightedShard, eval_indices, global_mean
from ezpz_nb.ledger import Ledger, record

BASE = 9  # sizes BASE .. BASE+dp-1: every remainder modulo dp


def _value(i: int) -> float:
    return float((i * 7919) % 101) / 7.0 + i


class Values(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"value": torch.tensor(_value(i), dtype=torch.float64)}


def _eval_grid() -> list[tuple[int, int, float, float, int]]:
    """On each rank: (dp, n, weighted mean, padded-sampler mean, steps) for every case."""
    rank = dist.get_rank()
    out = []
    for dp in (2, 3, 4):
        group = dist.new_group(list(range(dp)))  # collective: every rank makes every group
        if rank >= dp:
            continue
        for n in range(BASE, BASE + dp):
            shard = WeightedShard(Values(n), rank, dp)
            total = count = 0.0
            steps = 0
            for batch in DataLoader(shard, batch_size=2):
                total += float((batch["value"] * batch["weight"]).sum())
                count += float(batch["weight"].sum())
                steps += 1
            exact = global_mean(total, count, group)
            sampler = DistributedSampler(Values(n), num_replicas=dp, rank=rank, shuffle=False)
            vals = [_value(i) for i in sampler]
            padded = global_mean(sum(vals), len(vals), group)
            out.append((dp, n, exact, padded, steps))
    return out


def test_weighted_shard_and_global_mean_are_exact_on_every_size_and_dp():
    """Guards the exact-eval helper: on sizes n..n+dp-1 for dp 2, 3, 4 every rank takes as many
    steps and the all-reduced weighted mean equals one process's mean, while DistributedSampler's
    padding (the contrast) is off wherever dp does not divide n."""
    per_rank = ez.launch(_eval_grid, world_size=4, timeout=120)
    for dp in (2, 3, 4):
        for n in range(BASE, BASE + dp):
            truth = math.fsum(_value(i) for i in range(n)) / n
            rows = [next(c for c in per_rank[r] if c[:2] == (dp, n)) for r in range(dp)]
            assert {row[4] for row in rows} == {math.ceil(math.ceil(n / dp) / 2)}, (dp, n, rows)
            for row in rows:
                assert row[2] == pytest.approx(truth, rel=1e-12), (dp, n, row)
            padded_wrong = abs(rows[0][3] - truth) > 1e-9
            assert padded_wrong == (n % dp != 0), (dp, n, rows[0][3], truth)


def test_eval_indices_cover_each_sample_once_with_weight():
    """Guards the shard arithmetic the helper rests on: weights summed per index over the
    replicas are exactly 1, padded shards have equal length, unpadded ones differ by <= 1."""
    for dp in (1, 2, 3, 4, 7):
        for n in range(1, 15):
            weight: dict[int, float] = {}
            lengths = set()
            for r in range(dp):
                idx, w = eval_indices(n, r, dp)
                lengths.add(len(idx))
                for i, x in zip(idx, w, strict=True):
                    weight[i] = weight.get(i, 0.0) + x
                assert len(eval_indices(n, r, dp, pad=False)[0]) in (n // dp, -(-n // dp))
            assert weight == dict.fromkeys(range(n), 1.0) and len(lengths) == 1, (n, dp)


def test_bad_shard_arguments_say_what_to_pass():
    """Guards the rule that bad input gets our own error, saying what to do, before any rank."""
    with pytest.raises(ShardError, match="dp_rank must be in 0..dp_size-1"):
        eval_indices(10, 2, 2)
    with pytest.raises(ShardError, match="num_samples must be at least 1"):
        eval_indices(0, 0, 2)
    with pytest.raises(ShardError, match="needs a dataset with a length"):
        WeightedShard(iter(range(3)), 0, 2)
    with pytest.raises(ShardError, match="every replica needs a sample"):
        SteppedLoader(Values(2), 1, 2, 3, steps=4)
    with pytest.raises(ShardError, match="steps must be a positive int"):
        SteppedLoader(Values(5), 1, 0, 2, steps=0)
    a = SteppedLoader(Values(10), 2, 0, 2, steps=4)
    b = SteppedLoader(Values(10), 2, 1, 2, steps=4)
    with pytest.raises(ShardError, match="dp_rank=0"):
        b.load_state_dict(a.state_dict())


N_STREAM, BATCH, STEPS, STOP = 10, 2, 9, 4


def _stepped() -> dict:
    """On each rank: a straight run's batches, its epochs, and a run stopped and resumed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    straight = SteppedLoader(Values(N_STREAM), BATCH, rank, world, steps=STEPS, seed=3)
    with record(straight) as rec:
        batches = [(b["index"].tolist(), b["epoch"].tolist()) for b in rec]
    first = SteppedLoader(Values(N_STREAM), BATCH, rank, world, steps=STEPS, seed=3)
    head = [b["index"].tolist() for _, b in zip(range(STOP), first, strict=False)]
    state = first.state_dict()
    second = SteppedLoader(Values(N_STREAM), BATCH, rank, world, steps=STEPS, seed=3)
    second.load_state_dict(state)
    tail = [b["index"].tolist() for b in second]
    # Every rank ends together: one collective after the loop would hang otherwise.
    dist.barrier()
    return {
        "batches": batches,
        "resumed": head + tail,
        "state_step": state["step"],
        "wraps": straight.wrap_steps(),
        "share": straight.share,
        "ledger": rec.ledger(),
    }


def test_stepped_loader_takes_n_steps_with_per_rank_epochs_and_balanced_epochs():
    """Guards training by step count (and its figure): 10 samples over 3 ranks (shares 4, 3, 3) for 9 steps of 2
    (more than 5 epochs): every rank yields exactly 9 batches and reaches the barrier, each rank
    counts its own epochs (rank 0 wraps later), every epoch all ranks finished deals each sample
    to exactly one rank with shares within one, and a stop at step 4 resumes to the same batches."""
    got = ez.launch(_stepped, world_size=3, timeout=120)
    assert [len(g["batches"]) for g in got] == [STEPS] * 3
    assert [g["share"] for g in got] == [4, 3, 3]
    assert got[0]["wraps"] != got[1]["wraps"]  # per-rank epoch counters
    by_epoch: dict[int, dict[int, list[int]]] = {}
    for r, g in enumerate(got):
        for idx, eps in g["batches"]:
            for i, e in zip(idx, eps, strict=True):
                by_epoch.setdefault(e, {}).setdefault(r, []).append(i)
        flat = [e for _, eps in g["batches"] for e in eps]
        wraps = [p // BATCH for p in range(1, len(flat)) if flat[p] > flat[p - 1]]
        assert wraps == g["wraps"], (r, g["batches"], g["wraps"])
    done = min(max(e for _, eps in g["batches"] for e in eps) for g in got)  # oldest open epoch
    assert done >= 4
    for e in range(done):
        shares = by_epoch[e]
        seen = [i for r in range(3) for i in shares[r]]
        assert sorted(seen) == list(range(N_STREAM)), (e, shares)
        sizes = [len(shares[r]) for r in range(3)]
        assert max(sizes) - min(sizes) <= 1, (e, sizes)
    for g in got:
        assert g["state_step"] == STOP
        assert g["resumed"] == [idx for idx, _ in g["batches"]]
    # The figure draws the recorded ids and puts a bar at each rank's own wraps.
    fig = viz.epoch_wraps(Ledger.from_results([g["ledger"] for g in got]), epochs_of(got))
    for r, g in enumerate(got):
        assert fig.ezpz_data["ids"][r].tolist() == [i for idx, _ in g["batches"] for i in idx]
        assert [k // BATCH for k in fig.ezpz_data["wraps"][r]] == g["wraps"]


STREAM_STOP = 5  # mid-epoch on every rank (shares 4, 3, 3 with batches of 2)


def _streamed() -> dict:
    """On each rank: a straight run over the stream, and one stopped mid-epoch and resumed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    straight = SteppedLoader(Stream(N_STREAM, seed=100), BATCH, rank, world, steps=STEPS)
    batches = [(b["index"].tolist(), b["epoch"].tolist()) for b in straight]
    first = SteppedLoader(Stream(N_STREAM, seed=100), BATCH, rank, world, steps=STEPS)
    head = [b["index"].tolist() for _, b in zip(range(STREAM_STOP), first, strict=False)]
    state = first.state_dict()
    second = SteppedLoader(Stream(N_STREAM, seed=100), BATCH, rank, world, steps=STEPS)
    second.load_state_dict(state)
    tail = [b["index"].tolist() for b in second]
    dist.barrier()  # every rank took its STEPS and got here: no rank ran out first
    return {
        "batches": batches,
        "resumed": head + tail,
        "state": state,
        "epoch": straight.epoch,
        "wraps": straight.wrap_steps(),
        "share": straight.share,
        "passes": straight.dataset.passes,
    }


def test_stepped_loader_repeats_a_stream_without_length_per_rank():
    """Guards training by step count over an endless stream: an IterableDataset of 10 samples
    (reshuffled by set_epoch) over 3 ranks for 9 steps of 2: every rank yields exactly 9
    batches and reaches the barrier, counts its own epochs (rank 0's share is 4, the others' 3,
    so rank 0 wraps later), each epoch every rank finished deals each sample to exactly one
    rank, shares within one, and a state saved mid-epoch resumes to the same batches."""
    got = ez.launch(_streamed, world_size=3, timeout=120)
    assert [len(g["batches"]) for g in got] == [STEPS] * 3
    assert [g["share"] for g in got] == [4, 3, 3]
    assert got[0]["wraps"] != got[1]["wraps"]  # per-rank epoch counters
    by_epoch: dict[int, dict[int, list[int]]] = {}
    for r, g in enumerate(got):
        flat = [e for _, eps in g["batches"] for e in eps]
        assert flat == sorted(flat) and flat[-1] == g["epoch"]
        wraps = [p // BATCH for p in range(1, len(flat)) if flat[p] > flat[p - 1]]
        assert wraps == g["wraps"], (r, g["batches"], g["wraps"])
        assert g["passes"] == g["epoch"] + 1  # one pass of the stream per epoch of the rank
        for idx, eps in g["batches"]:
            for i, e in zip(idx, eps, strict=True):
                by_epoch.setdefault(e, {}).setdefault(r, []).append(i)
    done = min(g["epoch"] for g in got)
    assert done >= 4
    for e in range(done):
        shares = by_epoch[e]
        assert sorted(i for r in range(3) for i in shares[r]) == list(range(N_STREAM)), e
        sizes = [len(shares[r]) for r in range(3)]
        assert max(sizes) - min(sizes) <= 1, (e, sizes)
    for g in got:
        assert g["state"]["step"] == STREAM_STOP and 0 < g["state"]["offset"] < g["share"]
        assert g["resumed"] == [idx for idx, _ in g["batches"]]


def test_stepped_loader_refuses_what_a_stream_cannot_do():
    """Guards the stream's clear errors: a generator (spent after one pass), shuffle=True (a
    stream shuffles itself), a map-style state loaded into a stream loader, and a pass with
    fewer samples than replicas (raised at the first batch, the stream's length being unknown)."""
    with pytest.raises(ShardError, match="spent after one pass"):
        SteppedLoader((x for x in range(5)), 1, 0, 2, steps=3)
    with pytest.raises(ShardError, match="cannot be shuffled here"):
        SteppedLoader(Stream(N_STREAM, seed=100), 1, 0, 2, steps=3, shuffle=True)
    with pytest.raises(ShardError, match="over a map-style dataset"):
        SteppedLoader(Stream(N_STREAM, seed=100), 1, 0, 2, steps=3).load_state_dict(
            SteppedLoader(Values(4), 1, 0, 2, steps=3).state_dict()
        )
    with pytest.raises(ShardError, match="gave rank 1 no sample"):
        next(iter(SteppedLoader(Stream(1), 1, 1, 2, steps=3)))
    with pytest.raises(ShardError, match="known only as it is read"):
        SteppedLoader(Stream(N_STREAM, seed=100), 1, 0, 2, steps=3).position(0)


def epochs_of(got: list) -> dict:
    return {r: [eps for _, eps in g["batches"]] for r, g in enumerate(got)}
