"""check_eval and check_steps judge every rank, and every step: the eighth trial's dodges.

Two dodges passed both checks (issue 45): at dp=2 x tp=2 each TP peer read the OTHER
replica's shard while the leaders (whose samples alone are counted) read their own; and a
steps loader yielded an EMPTY batch after every real one, so half the steps trained on
nothing while every rank yielded the steps asked for and each epoch dealt every sample once.
Each dodge here is run in several variants beside the right answers, on one warm 4-rank
Cluster.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import ezpz_nb as ez
from ezpz_nb.data import SteppedLoader, WeightedShard
from ezpz_nb.verify import check_contract, check_eval, check_steps

N = 14  # over 2 replicas: 7 each; over 4: 4, 4, 3, 3


class Rows(torch.utils.data.Dataset):
    """Token rows (content the checks digest), one per index, with a loss to average."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < N:
            raise IndexError(i)
        return {"index": i, "input_ids": torch.arange(5) + 7 * i, "loss": torch.tensor(0.1 * i)}


def shard_of(layout, how: str) -> int:
    """The replica whose shard this rank reads: its own, or (a dodge) another one on peers."""
    if layout.tp_rank == 0 or how != "other":
        return layout.dp_rank
    return (layout.dp_rank + 1) % layout.dp_size  # "other": the peer reads the next replica's


def eval_loader(layout, how: str = "right"):
    """Weighted eval shards; ``how`` says what the TP peers read (see :func:`shard_of`)."""
    shard = WeightedShard(Rows(), shard_of(layout, how), layout.dp_size)
    if how == "reversed" and layout.tp_rank == 1:  # the leader's samples, in another order
        return DataLoader(torch.utils.data.Subset(shard, range(len(shard) - 1, -1, -1)), 2)
    if how == "extra" and layout.tp_rank == 1:  # the leader's batches, then one more step
        return [*DataLoader(shard, batch_size=2), next(iter(DataLoader(shard, batch_size=2)))]
    return DataLoader(shard, batch_size=2)


def stepped_loader(layout, how: str = "right"):
    """SteppedLoader over the replica's shard; ``how`` makes the dodges (see below)."""
    return SteppedLoader(Rows(), 2, shard_of(layout, how), layout.dp_size, steps=12, seed=3)


def half_empty(layout):
    """DODGE: the SteppedLoader's batches, each followed by an EMPTY one (no sample)."""
    for batch in SteppedLoader(Rows(), 2, layout.dp_rank, layout.dp_size, steps=6, seed=3):
        yield batch
        yield {k: v[:0] for k, v in batch.items()}


def evened_by_empty(layout):
    """DODGE: one pass of each replica's shard, the short replicas evened out with EMPTY
    batches at the end (shares 4, 4, 3, 3 at batch 1: 4 steps each), then repeated."""
    mine = list(range(layout.dp_rank, N, layout.dp_size))
    for epoch in range(4):
        for i in mine:
            yield {"index": torch.tensor([i]), "epoch": torch.tensor([epoch]),
                   "input_ids": (torch.arange(5) + 7 * i)[None]}  # fmt: skip
        for _ in range(4 - len(mine)):
            yield {"index": torch.zeros(0, dtype=torch.int64),
                   "epoch": torch.zeros(0, dtype=torch.int64),
                   "input_ids": torch.zeros(0, 5, dtype=torch.int64)}  # fmt: skip


class EvenedContract:
    """DODGE (13 contract): :func:`evened_by_empty`'s epochs, one per ``set_epoch``."""

    def __init__(self, layout) -> None:
        self.layout, self.epoch, self.dataset = layout, 0, Rows()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        batches = itertools.islice(evened_by_empty(self.layout), 4)  # one epoch: 4 steps
        return ({k: v for k, v in b.items() if k != "epoch"} for b in batches)


def padded_contract(layout):
    sampler = DistributedSampler(Rows(), layout.dp_size, layout.dp_rank, shuffle=False)
    return DataLoader(Rows(), batch_size=1, sampler=sampler)


@pytest.fixture(scope="module")
def four():
    with ez.Cluster(world_size=4, timeout=60) as c:
        yield c


def test_eval_judges_every_tp_peer_against_its_leader(four):
    """Guards the eval mode under TP: a peer must read its leader's very batches. Peers that
    read the other replica's shard, the leader's samples in another order, or one batch more,
    fail ``tp_identical`` at the peer, while the leaders' counts stay exact; the right
    loader passes with the rule shown; a layout without peers has no such rule.

    Guards: only the DP leaders judged, so peers reading another replica passed (issue 45)."""
    right = check_eval(eval_loader, "dp=2,tp=2", cluster=four)
    assert right.ok and right.judgement("tp_identical").verdict == "pass", right.table()
    for how, step, said in (
        ("other", 0, "read samples [1, 3"),
        ("reversed", 0, "in another order"),
        ("extra", 4, "took 5 steps, its leader 4"),
    ):
        r = check_eval(lambda layout, how=how: eval_loader(layout, how), "dp=2,tp=2", cluster=four)
        peer = r.judgement("tp_identical")
        assert peer.verdict == "fail" and (peer.rank, peer.step) == (1, step), (how, r.table())
        assert said in peer.reason and r.judgement("counted_once").verdict == "pass", r.table()
    flat = check_eval(eval_loader, "dp=4", cluster=four)
    assert flat.ok and [j.rule for j in flat.rules] == ["counted_once", "equal_steps"]


def test_steps_fail_an_empty_step_and_a_peer_off_its_leader(four):
    """Guards the steps mode: a step holding no sample fails ``steps`` at the first one (an
    empty batch after every real one; short replicas evened out with empty batches), while
    coverage alone passes them; a TP peer stepping through the other replica's shard fails
    ``tp_identical``; SteppedLoader passes every rule at dp=4 and at dp=2 x tp=2.

    Guards: the steps rule counting batches, not samples, so empty steps passed (issue 45)."""
    for layout in ("dp=4", "dp=2,tp=2"):
        r = check_steps(stepped_loader, layout, steps=12, cluster=four)
        assert r.ok and "none of them empty" in r.judgement("steps").reason, r.table()
    # Generators, no .dataset: the length told (num_samples=), or coverage is not judged.
    r = check_steps(half_empty, "dp=4", steps=12, num_samples=N, cluster=four)
    st = r.judgement("steps")
    assert st.verdict == "fail" and (st.rank, st.step) == (0, 1), r.table()
    assert "6 of its 12 steps are empty" in st.reason, r.table()
    assert r.judgement("balanced_coverage").verdict == "pass", r.table()
    r = check_steps(evened_by_empty, "dp=4", steps=12, num_samples=N, cluster=four)
    st = r.judgement("steps")
    assert st.verdict == "fail" and (st.rank, st.step) == (2, 3), r.table()
    assert r.judgement("balanced_coverage").verdict == "pass", r.table()
    r = check_steps(
        lambda layout: stepped_loader(layout, "other"), "dp=2,tp=2", steps=12, cluster=four
    )
    peer = r.judgement("tp_identical")
    assert peer.verdict == "fail" and peer.rank == 1 and peer.step == 0, r.table()


def test_contract_fails_steps_evened_out_with_empty_batches(four):
    """Guards the contract's equal steps: short replicas padded with an EMPTY batch (every rank
    takes 4 steps, shares 4, 4, 3, 3) fail it at the first empty step, while
    DistributedSampler's padding (repeated samples, equal steps) leaves the rule passed.

    Guards: equal step counts made of empty batches passed the contract (issue 45)."""
    r = check_contract(EvenedContract, "dp=4", epochs=2, shuffle=False, cluster=four)
    empty = r.first("equal_steps")
    assert empty is not None and empty.kind == "no_data", r.table()
    assert (empty.rank, empty.step) == (2, 3) and "holds no sample" in empty.message, r.table()
    r = check_contract(padded_contract, "dp=4", epochs=2, shuffle=False, cluster=four)
    assert r.rule_verdicts()["equal_steps"] == "pass", r.table()
