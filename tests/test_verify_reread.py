"""check_contract re-reads a few delivered samples: an id must name the data it carries.

The eighth trial's last dodge of the contract (issue 45): honest shards, but each replica's
first sample of an epoch carried sample 0's data under its own id. One content spread per
epoch is too few for the twin statistic (it looks like a dataset's duplicate rows), and
every id rule passed. Each rank now reads ``dataset[i]`` again for a few of each
epoch's samples and compares (:mod:`ezpz_nb.verify.reread`). The right loaders beside the
dodges carry what makes a re-read differ without a fault: augmentation, a collate that pads
to the batch's longest, a ``Subset`` chain, an ``index`` field that is not the position, a
wrapper that changes whole batches, a dataset whose ``set_epoch`` changes its samples.
All on one warm 4-rank Cluster.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

import ezpz_nb as ez
from ezpz_nb.verify import check_contract

N = 30  # over 4 replicas: 8, 8, 7, 7 (every sample of a replica's epoch is kept)


class Tokens(Dataset):
    """Token rows, one per index; ``scale``: the ``index`` field is ``scale * i % n``, not the
    position ``i`` (a bijection: every id once an epoch)."""

    def __init__(self, n: int = N, scale: int = 1) -> None:
        self.n, self.scale, self.epoch = n, scale, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"input_ids": torch.arange(6) + 7 * i, "index": self.scale * i % self.n}


class Misnamed:
    """DODGE: each replica reads its true shard (a fresh order each epoch), but one sample an
    epoch carries another sample's data under its own id: ``where`` picks it ("first": the
    epoch's first sample holds sample 0's data; "drawn": a sample at a position drawn per
    epoch holds the data of the replica's next sample; "epoch 0": as "first", in epoch 0
    only)."""

    def __init__(self, layout, where: str) -> None:
        self.r, self.d, self.epoch, self.where = layout.dp_rank, layout.dp_size, 0, where
        self.dataset = Tokens()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = np.random.default_rng([11, self.epoch])
        mine = g.permutation(N)[self.r :: self.d].tolist()
        data = list(mine)
        if self.where == "drawn":
            at = int(g.integers(len(mine) - 1))
            data[at] = mine[at + 1]
        elif self.where == "first" or self.epoch == 0:
            data[0] = 0
        for k in range(0, len(mine), 4):
            yield {
                "input_ids": torch.stack([self.dataset[j]["input_ids"] for j in data[k : k + 4]]),
                "index": torch.tensor(mine[k : k + 4]),
            }


def sharded(dataset, layout, **kw):
    sampler = DistributedSampler(dataset, layout.dp_size, layout.dp_rank, shuffle=True, seed=2)
    return DataLoader(dataset, batch_size=4, sampler=sampler, **kw)


class Augmented(Tokens):
    """Noise drawn anew at every read: the re-read differs, so the sample is not judged."""

    def __getitem__(self, i: int) -> dict:
        s = super().__getitem__(i)
        return {**s, "input_ids": s["input_ids"] + torch.randint(0, 3, (6,))}


class EpochTokens(Tokens):
    """Samples that change with the epoch (``set_epoch`` on the dataset)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, i: int) -> dict:
        s = super().__getitem__(i)
        return {**s, "input_ids": s["input_ids"] * (self.epoch + 1)}


class Ragged(Tokens):
    """Rows of 3 to 6 tokens: the collate pads each batch to its longest."""

    def __getitem__(self, i: int) -> dict:
        s = super().__getitem__(i)
        return {**s, "input_ids": s["input_ids"][: 3 + i % 4]}


def pad(items):
    width = max(len(x["input_ids"]) for x in items)
    rows = [
        torch.nn.functional.pad(x["input_ids"], (0, width - len(x["input_ids"]))) for x in items
    ]
    return {"input_ids": torch.stack(rows), "index": torch.tensor([x["index"] for x in items])}


class Halved:
    """A wrapper that changes whole batches (a cast, a normalisation) after the DataLoader."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)

    def __iter__(self):
        for b in self.loader:
            yield {**b, "input_ids": b["input_ids"].double() / 2}


class Masked:
    """Honest shards, with a few tokens of some rows masked in the loader's own loop (MLM
    without a collate_fn): those rows differ from ``dataset[i]``, the others match."""

    def __init__(self, layout) -> None:
        self.r, self.d, self.epoch = layout.dp_rank, layout.dp_size, 0
        self.dataset = Tokens()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = np.random.default_rng([12, self.r, self.epoch])
        mine = np.random.default_rng([11, self.epoch]).permutation(N)[self.r :: self.d].tolist()
        for k in range(0, len(mine), 4):
            x = torch.stack([self.dataset[j]["input_ids"] for j in mine[k : k + 4]])
            hide = torch.from_numpy(g.random(x.shape) < 0.15)
            yield {"input_ids": torch.where(hide, 103, x), "index": torch.tensor(mine[k : k + 4])}


RIGHT = {
    "masked in the loader's loop": Masked,
    "plain": lambda layout: sharded(Tokens(), layout),
    "augmented": lambda layout: sharded(Augmented(), layout),
    "set_epoch on the dataset": lambda layout: sharded(EpochTokens(), layout),
    "padded to the batch's longest": lambda layout: sharded(Ragged(), layout, collate_fn=pad),
    "index field off the position": lambda layout: sharded(Tokens(scale=7), layout),
    "a wrapper halving whole batches": lambda layout: Halved(sharded(Tokens(), layout)),
    "a Subset of a reversed Subset, base ids": lambda layout: sharded(
        Subset(Subset(Tokens(), range(N - 1, -1, -1)), np.random.default_rng(1).permutation(N)),
        layout,
    ),
}


@pytest.fixture(scope="module")
def four():
    with ez.Cluster(world_size=4, timeout=60) as c:
        yield c


@pytest.mark.parametrize("where", ["first", "drawn", "epoch 0"])
@pytest.mark.parametrize("layout", ["dp=4", "dp=2,tp=2"])
def test_an_id_stamped_on_other_data_fails_dp_disjoint(four, where, layout):
    """Guards the re-read: an honest shard with one sample an epoch holding another sample's
    data under its own id fails ``dp_disjoint`` at that id, in words a learner can act on,
    whether the sample is the epoch's first (sample 0's data), at a drawn position, or
    misnamed in the first epoch only (each epoch is re-read right after it).

    Guards: one content spread per epoch stayed under the twin rule's MIN_SPREAD, so the
    contract passed (issue 45, the eighth trial)."""
    r = check_contract(lambda lay: Misnamed(lay, where), layout, epochs=2, shuffle=True,
                       cluster=four)  # fmt: skip
    bad = r.first("dp_disjoint")
    assert not r.ok and bad is not None and bad.violation, r.table()
    assert f"under id {bad.sample} on rank {bad.rank}" in bad.message, r.table()
    assert "ids must name the data" in bad.message and "input_ids" in bad.message, r.table()
    assert bad.epoch == 0 and r.rule_verdicts()["exactly_once"] == "pass", r.table()


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_right_loaders_pass_the_re_read(four, name):
    """Guards against false fails of the re-read: augmentation, masking in the loader's own
    loop (some rows differ, with new data), a dataset's set_epoch, a padding collate, an
    ``index`` that is not the position, a wrapper changing whole batches and a Subset chain
    whose ids are the base dataset's all pass the contract."""
    r = check_contract(RIGHT[name], "dp=4", epochs=2, shuffle=True, cluster=four)
    assert r.ok, (name, r.table())
