"""The ninth trial's verify cases (issue 45): replicas batching unequal sizes, padded copies
under ids past ``num_samples=``, and a ``RandomSampler`` subclass; with the right answers
near each boundary (remainders that differ, packed rows with other sample counts, weight-0
copies under fresh ids). Their rows are in ``_verify_classes.CASES``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    random_split,
)
from torch.utils.data._utils.collate import default_collate

N = 32  # the contract cases' samples
M = 23  # the eval and steps cases': odd, so DistributedSampler pads at dp 2


class Tokens(Dataset):
    """Sample i: six tokens from 7 i, and its index."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"input_ids": torch.arange(6) + 7 * i, "index": i}


# ------------------------------------------------------------------ replicas' batch sizes
class Uneven(Sampler[int]):
    """A fresh permutation each epoch; replica 0 takes 20 of it, replica 1 the other 12."""

    shuffle = True

    def __init__(self, layout: Any, seed: int = 3) -> None:
        self.r, self.epoch, self.seed = layout.dp_rank, 0, seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(N).tolist()
        return iter(order[:20] if self.r == 0 else order[20:])

    def __len__(self) -> int:
        return 20 if self.r == 0 else 12


def uneven_batches(layout: Any, seed: int = 3) -> DataLoader:
    """Dodge: batches of 5 and 3, four steps each, a global batch of 8 every step: a sample
    of the 3-batch replica weighs 5/3 under DDP's mean of replica means."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed))


class Lopsided(Sampler[list[int]]):
    """A batch sampler: a fresh permutation each epoch, replica 0 takes 17 of the first 30
    samples and replica 1 the other 13, both in batches of 4 but the last (5 and 1)."""

    shuffle = True

    def __init__(self, layout: Any, seed: int = 3) -> None:
        self.r, self.epoch, self.seed = layout.dp_rank, 0, seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(30).tolist()
        mine = order[:17] if self.r == 0 else order[17:]
        cuts = [0, 4, 8, 12, len(mine)]
        return iter([mine[a:b] for a, b in zip(cuts, cuts[1:], strict=False)])

    def __len__(self) -> int:
        return 4


def lopsided_last_step(layout: Any, seed: int = 3) -> DataLoader:
    """Dodge (eleventh trial): shares of 17 and 13 hidden in the last step, batches of 5
    and 1 after batches of 4: a sample of replica 1 weighs 5x one of replica 0 there."""
    return DataLoader(Tokens(30), batch_sampler=Lopsided(layout, seed))


def _as_text(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {"text": [" ".join(map(str, x["input_ids"].tolist())) for x in items],
            "index": [x["index"] for x in items]}  # fmt: skip


def uneven_batches_text(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, each batch columns of raw text (no tensor: samples alone count)."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed), collate_fn=_as_text)


def _evened(
    items: list[dict[str, Any]], rows: bool, copies: bool = False, noise: bool = False
) -> dict[str, Any]:
    """Collate 3 samples so their field looks as large as 5: zero rows, copies of its own
    first rows, rows of random tokens, or each row padded."""
    ids = torch.stack([x["input_ids"] for x in items])
    if len(items) < 5 and noise:  # seeded by the batch, so TP peers agree
        g = torch.Generator().manual_seed(int(items[0]["index"]))
        ids = torch.cat(
            [ids, torch.randint(1000, 5000, (5 - len(items), ids.shape[1]), generator=g)]
        )
    elif len(items) < 5 and copies:
        ids = torch.cat([ids, ids[: 5 - len(items)]])
    elif len(items) < 5 and rows:
        ids = torch.cat([ids, ids.new_zeros(5 - len(items), ids.shape[1])])
    elif len(items) < 5:
        ids = torch.cat([ids, ids.new_zeros(len(items), 4)], dim=1)  # 3 x 10 = 30 = 5 x 6
    return {"input_ids": ids, "index": torch.tensor([x["index"] for x in items])}


def uneven_zero_rows(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, the 3-sample batches given 2 rows of zeros (the trial's next try)."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_evened, rows=True))  # fmt: skip


def uneven_copied_rows(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, the 3-sample batches given copies of their own first 2 rows (the
    tenth trial's d13_uneven_rows_padded_with_copies): rows of data, but no more data."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_evened, rows=True, copies=True))  # fmt: skip


def uneven_noise_rows(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, the 3-sample batches given 2 rows of random tokens (the tenth trial's
    d13_uneven_rows_padded_with_noise): rows unlike any other, yet no sample's."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_evened, rows=True, noise=True))  # fmt: skip


def _padded_to_six(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate, then add rows of random tokens (seeded by the batch: TP peers agree) up to 6
    rows, or one row where the batch holds 6 samples or more."""
    ids = torch.stack([x["input_ids"] for x in items])
    g = torch.Generator().manual_seed(int(items[0]["index"]))
    noise = torch.randint(1000, 5000, (max(6 - len(items), 1), ids.shape[1]), generator=g)
    return {
        "input_ids": torch.cat([ids, noise]),
        "index": torch.tensor([x["index"] for x in items]),
    }


def uneven_all_padded(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, every batch padded with rows of random tokens to 6 rows, the full
    ones too (5 + 1 and 3 + 3; the eleventh trial's d13_uneven_all_padded): no batch holds a
    row per sample, so the counts alone cannot tell the padding from a packer's rows."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=_padded_to_six)  # fmt: skip


def even_all_padded(layout: Any, seed: int = 3) -> DataLoader:
    """Right: batches of 4 on both replicas, each padded with 2 rows of random tokens (a
    loader that pads to a fixed row count): the same samples a step on every replica."""
    shard = DistributedSampler(Tokens(), layout.dp_size, layout.dp_rank, seed=seed)
    return DataLoader(Tokens(), batch_size=4, sampler=shard, collate_fn=_padded_to_six)


# The twelfth trial's ways around the padding rule: the same 5 and 3 samples padded to 6 rows,
# through workers that persist, rows rolled by the batch, a list of rows, a stream, a dataset
# that masks a token per read; and a chunker's right answer the counts alone rejected.
def _six_rows(items: list[dict[str, Any]], roll: bool = False, as_list: bool = False) -> Any:
    """:func:`_padded_to_six`, the rows then rolled by the batch's first id (a sample alone is
    rolled by its own) or handed over as a list of 1-D rows."""
    out = _padded_to_six(items)
    if roll:
        out["input_ids"] = out["input_ids"].roll(int(items[0]["index"]) % 5 + 1, dims=1)
    if as_list:
        out["input_ids"] = list(out["input_ids"])
    return out


def uneven_padded_persistent(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=_padded_to_six, num_workers=1, persistent_workers=True)  # fmt: skip


def uneven_padded_rolled(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_six_rows, roll=True))  # fmt: skip


def uneven_padded_list(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_six_rows, as_list=True))  # fmt: skip


class _Masking(Tokens):
    """Sample i with one token zeroed at a place that moves with every read (augmentation):
    two reads differ, so no re-read vouches for its rows."""

    reads = 0

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.reads += 1
        out = super().__getitem__(i)
        out["input_ids"][(self.reads * 5 + i) % 6] = 0
        return out


def uneven_padded_masking(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(_Masking(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=_padded_to_six)  # fmt: skip


class _PaddedStream(IterableDataset):
    """The same batches as a stream: 20 samples in batches of 5 on replica 0, 12 in 3s on
    replica 1, each padded to 6 rows (a stream is never read again)."""

    shuffle = True

    def __init__(self, layout: Any, seed: int = 3) -> None:
        self.order = Uneven(layout, seed)

    def set_epoch(self, epoch: int) -> None:
        self.order.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        mine, size = list(self.order), 5 if self.order.r == 0 else 3
        for k in range(0, len(mine), size):
            yield _padded_to_six([Tokens()[i] for i in mine[k : k + size]])


def uneven_padded_stream(layout: Any, seed: int = 3) -> DataLoader:
    return DataLoader(_PaddedStream(layout, seed), batch_size=None)


class _LongShort(Dataset):
    """24 samples: 0-11 of 16 tokens, 12-23 of 8."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.arange(16 if i < 12 else 8) + 20 * i + 1, "index": i}


def _cut_rows(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch's tokens cut into rows of 8: a long sample fills two."""
    rows = torch.cat([x["input_ids"] for x in items]).view(-1, 8)
    return {"input_ids": rows, "index": torch.tensor([x["index"] for x in items])}


class _TokenBudget(Sampler[list[int]]):
    """32 tokens a batch: 2 long samples, 1 long and 2 short, or 4 short; each replica 6 long
    and 6 short an epoch, its sample counts a step unlike the other's."""

    shuffle = True

    def __init__(self, layout: Any) -> None:
        self.r, self.epoch = layout.dp_rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.epoch)
        longs = rng.permutation(12)[6 * self.r : 6 * self.r + 6].tolist()
        shorts = (12 + rng.permutation(12))[6 * self.r : 6 * self.r + 6].tolist()
        lo, sh = longs, shorts
        if self.r == 0:
            return iter([lo[0:2], lo[2:4], lo[4:6], sh[0:4], sh[4:6]])
        return iter([[lo[0], *sh[0:2]], [lo[1], *sh[2:4]], lo[2:4], lo[4:6], sh[4:6]])

    def __len__(self) -> int:
        return 5


def token_budget_chunks(layout: Any) -> DataLoader:
    """Right: a chunker with a token budget (the twelfth trial's r13_chunker_token_budget):
    every step 4 rows of 8 tokens on each replica, 2 samples on one and 3 on the other."""
    return DataLoader(_LongShort(), batch_sampler=_TokenBudget(layout), collate_fn=_cut_rows)


# The thirteenth trial's: pad rows that each hold one value copied from a sample, put first;
# and two right answers, windows overlapping by a stride and a text dataset cut in the collate.
def _pads_holding_a_value(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of zeros up to 6 before the rows, pad row k holding sample k's last value: each
    distinct, none blank, each one value in no row's other places."""
    ids = torch.stack([x["input_ids"] for x in items])
    pads = ids.new_zeros(max(6 - len(items), 1), ids.shape[1])
    pads[:, -1] = ids[torch.arange(len(pads)) % len(items), -1]
    return {"input_ids": torch.cat([pads, ids]), "index": torch.tensor([x["index"] for x in items])}


def _spread_thin(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Each sample's row less its last value (-1 in its place), then rows of -1 up to 6 each
    holding a sample's last value: every row a run of one sample's values."""
    ids = torch.stack([x["input_ids"] for x in items])
    rows = torch.cat([ids[:, :-1], -torch.ones_like(ids[:, :1])], 1)
    pads = -torch.ones(max(6 - len(items), 1), ids.shape[1], dtype=ids.dtype)
    pads[:, -1] = ids[torch.arange(len(pads)) % len(items), -1]
    return {
        "input_ids": torch.cat([pads, rows]),
        "index": torch.tensor([x["index"] for x in items]),
    }


def uneven_spread_thin(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(
        Tokens(), batch_size=size, sampler=Uneven(layout, seed), collate_fn=_spread_thin
    )


def uneven_pads_holding_a_value(layout: Any, seed: int = 3) -> DataLoader:
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=_pads_holding_a_value)  # fmt: skip


def _windows(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Windows of 8 tokens by a stride of 4 (a tokenizer's overflowing tokens): a sample of 16
    gives 3 windows, one of 8 gives 1."""
    rows = [x["input_ids"][k : k + 8] for x in items for k in range(0, len(x["input_ids"]) - 7, 4)]
    return {"input_ids": torch.stack(rows), "index": torch.tensor([x["index"] for x in items])}


class _BudgetOfWindows(_TokenBudget):
    """6 windows a batch: 2 long samples, or 1 long and 3 short... as :class:`_TokenBudget`
    deals them, the short ones in fours or threes to fill 6 windows."""

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.epoch)
        lo = rng.permutation(12)[6 * self.r : 6 * self.r + 6].tolist()
        sh = (12 + rng.permutation(12))[6 * self.r : 6 * self.r + 6].tolist()
        if self.r == 0:
            return iter([lo[0:2], lo[2:4], lo[4:6], sh[0:6]])
        return iter([[lo[0], *sh[0:3]], [lo[1], *sh[3:6]], lo[2:4], lo[4:6]])

    def __len__(self) -> int:
        return 4


def token_budget_windows(layout: Any) -> DataLoader:
    """Right: overlapping windows, 6 a batch on each replica, 2 samples on one and 4 on the other."""
    return DataLoader(_LongShort(), batch_sampler=_BudgetOfWindows(layout), collate_fn=_windows)


class _Text(_LongShort):
    def __getitem__(self, i: int) -> dict[str, Any]:
        # ASCII from 33, no row of 8 alike in two samples (13 i mod 90 apart: 13 and 90 are
        # coprime), or the rows would count once
        values = (torch.arange(16 if i < 12 else 8) + 13 * i) % 90 + 33
        return {"text": bytes(values.tolist()).decode(), "index": i}


def _bytes_cut(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Each text's bytes as tokens, cut into rows of 8 (a tokenizer and group_texts)."""
    ids = torch.tensor([b for x in items for b in x["text"].encode()]).view(-1, 8)
    return {"input_ids": ids, "index": torch.tensor([x["index"] for x in items])}


def token_budget_text(layout: Any) -> DataLoader:
    """Right, not judged: the same chunker over text tokenized in the collate (dataset[i] holds
    no tokens to compare the rows with)."""
    return DataLoader(_Text(), batch_sampler=_TokenBudget(layout), collate_fn=_bytes_cut)


def _with_side_field(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate as is, plus a field of 5 fixed rows of 64 floats: larger than the tokens."""
    out = default_collate(items)
    out["extra"] = torch.arange(5 * 64, dtype=torch.float32).view(5, 64) + float(out["index"][0])
    return out


def uneven_side_field(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, every batch given a side field of 5 fixed rows, the largest field (the
    tenth trial's d13_uneven_with_big_dummy_field): rows not tied to the samples."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=_with_side_field)  # fmt: skip


def uneven_wider_rows(layout: Any, seed: int = 3) -> DataLoader:
    """The same dodge, the 3 samples padded to 10 tokens: 30 values, as 5 x 6."""
    size = 5 if layout.dp_rank == 0 else 3
    return DataLoader(Tokens(), batch_size=size, sampler=Uneven(layout, seed),
                      collate_fn=functools.partial(_evened, rows=False))  # fmt: skip


class Dealt(IterableDataset):
    """Right: a stream of 13 samples dealt ``perm[r::dp]`` each epoch, so the replicas' shares
    (7 and 6) leave last batches of 3 and 2 under batches of 4."""

    shuffle = True

    def __init__(self, layout: Any, seed: int = 4) -> None:
        self.r, self.d, self.epoch, self.seed = layout.dp_rank, layout.dp_size, 0, seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(13)[self.r :: self.d]
        for i in perm.tolist():
            yield {"input_ids": torch.arange(6) + 7 * i, "index": i}


def uneven_remainders(layout: Any, seed: int = 4) -> DataLoader:
    return DataLoader(Dealt(layout, seed), batch_size=4)


#: A packed step: two rows of 12 tokens, the documents' lengths in each row.
_FIVE = ((6, 6), (4, 4, 4))  # five documents
_FOUR = ((6, 6), (6, 6))
_THREE = ((12,), (6, 6))


class Packed(IterableDataset):
    """Right: every step two rows of 12 tokens on each replica, filled with however many
    documents fit (``PLANS``: per step, each replica's rows); here one replica's rows hold
    five documents and the other's three, in turn, so the global batch keeps eight. The
    documents are dealt from a fresh permutation of each length each epoch."""

    shuffle = True
    PLANS: tuple[tuple[Any, ...], ...] = ((_FIVE, _THREE), (_THREE, _FIVE)) * 2

    def __init__(self, layout: Any, seed: int = 6) -> None:
        self.r, self.epoch, self.seed = layout.dp_rank, 0, seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @classmethod
    def lengths(cls) -> list[int]:
        """Document i's length: as many documents of each length as the plans use."""
        used = sorted((n for step in cls.PLANS for plan in step for row in plan for n in row),
                      reverse=True)  # fmt: skip
        return used

    def __iter__(self) -> Iterator[dict[str, Any]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        lengths = self.lengths()
        pools = {
            n: iter(rng.permutation([i for i, k in enumerate(lengths) if k == n]).tolist())
            for n in set(lengths)
        }
        for step in self.PLANS:
            for dp, plan in enumerate(step):
                rows, ids = [], []
                for row in plan:
                    docs = [next(pools[n]) for n in row]
                    ids += docs
                    rows.append(torch.cat([torch.arange(lengths[i]) + 100 * i for i in docs]))
                if dp == self.r:
                    yield {"input_ids": torch.stack(rows), "index": torch.tensor(ids)}


class PackedVarying(Packed):
    """Right: the same rows, the documents per step varying on both replicas (10, 7, 7, 6
    over the two): the samples of a global batch vary, its tokens (48) do not."""

    PLANS = ((_FIVE, _FIVE), (_THREE, _FOUR), (_FOUR, _THREE), (_THREE, _THREE))


def packed_rows(layout: Any, seed: int = 6) -> DataLoader:
    return DataLoader(Packed(layout, seed), batch_size=None)


def packed_rows_varying(layout: Any, seed: int = 6) -> DataLoader:
    return DataLoader(PackedVarying(layout, seed), batch_size=None)


# ------------------------------------------------------------------ a RandomSampler subclass
class EpochRandom(RandomSampler):
    """A RandomSampler given a set_epoch (the usual way): reseeded each epoch."""

    def set_epoch(self, epoch: int) -> None:
        self.generator = torch.Generator().manual_seed(1000 + epoch)


def split_random_subclass(layout: Any, seed: int = 0) -> DataLoader:
    """Right: each replica's random_split part (one shared generator), shuffled each epoch."""
    parts = random_split(
        Tokens(30), [1 / layout.dp_size] * layout.dp_size, torch.Generator().manual_seed(seed)
    )
    mine = parts[layout.dp_rank]
    return DataLoader(mine, batch_size=4, sampler=EpochRandom(mine))


# ------------------------------------------------------------------ ids past num_samples
def _loss(i: int) -> float:
    return 0.5 + ((i * 7919) % M) / 10


class Padded(Dataset):
    """DistributedSampler's padded shard (its pad repeats sample 0...), each pad copy under
    a fresh id past ``M`` (``weight`` for it: 1, a dodge; 0, right)."""

    def __init__(self, layout: Any, weight: float, m: int = M) -> None:
        total = math.ceil(m / layout.dp_size) * layout.dp_size
        order = list(range(m)) + list(range(total - m))
        self.mine = list(enumerate(order))[layout.dp_rank :: layout.dp_size]
        self.weight, self.m = weight, m

    def __len__(self) -> int:
        return len(self.mine)

    def __getitem__(self, k: int) -> dict[str, Any]:
        slot, i = self.mine[k]
        pad = slot >= self.m
        return {"index": slot, "loss": torch.tensor(_loss(i), dtype=torch.float64),
                "weight": torch.tensor(self.weight if pad else 1.0, dtype=torch.float64)}  # fmt: skip


def pads_renumbered(layout: Any, m: int = M) -> DataLoader:
    """Dodge: the pad counted (weight 1) under id 23: no id twice, sample 0 twice."""
    return DataLoader(Padded(layout, 1.0, m), batch_size=2)


def pads_renumbered_weight_zero(layout: Any, m: int = M) -> DataLoader:
    """Right: the pad under id 23 with weight 0: it counts nothing."""
    return DataLoader(Padded(layout, 0.0, m), batch_size=2)


def _epochs(layout: Any, pad: bool, m: int, seed: int) -> Iterator[dict[str, Any]]:
    for e in itertools.count():
        perm = np.random.default_rng([seed, e]).permutation(m).tolist()
        if pad:  # DistributedSampler's pad (its first sample again) under a fresh id
            perm += [m + k for k in range(-m % layout.dp_size)]
        for i in perm[layout.dp_rank :: layout.dp_size]:
            yield {"index": torch.tensor([i]), "epoch": torch.tensor([e])}


def steps_pads_renumbered(layout: Any, m: int = M, seed: int = 8) -> Iterator[dict[str, Any]]:
    """Dodge: each epoch's pad trained on under id 23: every id once, sample 0 twice."""
    return _epochs(layout, True, m, seed)


def steps_unpadded(layout: Any, m: int = M, seed: int = 8) -> Iterator[dict[str, Any]]:
    """Right: each epoch's permutation dealt without a pad (shares 12 and 11)."""
    return _epochs(layout, False, m, seed)


# ------------------------------------------------------------------ split weights (eval)
class HalfWeighted(Dataset):
    """DistributedSampler's padded shard, each pad copy and its original at weight 0.5;
    ``zero``: the copy's loss made up (0) under the real id (a dodge), else its own (right)."""

    def __init__(self, layout: Any, zero: bool, m: int = M, tokens: bool = False) -> None:
        total = math.ceil(m / layout.dp_size) * layout.dp_size
        self.tokens = tokens
        self.halved = set(range(total - m))
        order = list(range(m)) + list(range(total - m))
        self.mine = [(k >= m, i) for k, i in enumerate(order)][layout.dp_rank :: layout.dp_size]
        self.zero = zero

    def __len__(self) -> int:
        return len(self.mine)

    def __getitem__(self, k: int) -> dict[str, Any]:
        pad, i = self.mine[k]
        loss = 0.0 if pad and self.zero else _loss(i)
        out = {"index": i, "loss": torch.tensor(loss, dtype=torch.float64),
               "weight": torch.tensor(0.5 if i in self.halved else 1.0, dtype=torch.float64)}  # fmt: skip
        return {**out, "tokens": torch.arange(4) + 10 * i} if self.tokens else out


def split_weight(layout: Any, m: int = M) -> DataLoader:
    """Right: the pad and its original weigh 0.5 each, both with the sample's loss."""
    return DataLoader(HalfWeighted(layout, False, m), batch_size=2)


def split_weight_zero_pad(layout: Any, m: int = M) -> DataLoader:
    """Dodge: as split_weight, but the pad's loss is made up (0) under the real id."""
    return DataLoader(HalfWeighted(layout, True, m), batch_size=2)


def split_weight_zero_pad_tokens(layout: Any, m: int = M) -> DataLoader:
    """Dodge: as split_weight_zero_pad, each sample with its tokens (the copy's alike)."""
    return DataLoader(HalfWeighted(layout, True, m, tokens=True), batch_size=2)


class HalfDocs(Dataset):
    """``m`` documents in 2 chunks each (weight 0.5, the doc's id), each chunk its own
    tokens and loss, dealt every ``dp_size``-th chunk: no padding (2 * m chunks, dp 2)."""

    def __init__(self, layout: Any, m: int = M) -> None:
        self.mine = list(range(2 * m))[layout.dp_rank :: layout.dp_size]

    def __len__(self) -> int:
        return len(self.mine)

    def __getitem__(self, k: int) -> dict[str, Any]:
        c = self.mine[k]
        return {"index": c // 2, "tokens": torch.arange(4) + 10 * c,
                "loss": torch.tensor(_loss(c), dtype=torch.float64),
                "weight": torch.tensor(0.5, dtype=torch.float64)}  # fmt: skip


def chunk_losses(layout: Any, m: int = M) -> DataLoader:
    """Right: each document's two chunks weigh 0.5, their tokens and losses their own."""
    return DataLoader(HalfDocs(layout, m), batch_size=2)


def _cp_half(layout: Any) -> slice:
    """This rank's half of an 8-token row: the slice its CP rank keeps."""
    h = 8 // layout.cp_size
    return slice(layout.cp_rank * h, (layout.cp_rank + 1) * h)


def cp_eval_slices(layout: Any) -> DataLoader:
    """Right (the twelfth trial's r16eval_cp_slices): an even deal with weight-0 pads, every
    CP rank of a replica the same samples in the same order, each keeping its half of the
    tokens, as a context-parallel eval step reads them."""
    padded = -(-M // layout.dp_size) * layout.dp_size
    deal = DistributedSampler(range(padded), layout.dp_size, layout.dp_rank, shuffle=False)
    cut = _cp_half(layout)

    def collate(ks: list[int]) -> dict[str, torch.Tensor]:
        ids = [k % M for k in ks]
        return {"index": torch.tensor(ids),
                "input_ids": torch.stack([torch.arange(8) + 9 * i for i in ids])[:, cut],
                "weight": torch.tensor([float(k < M) for k in ks], dtype=torch.float64)}  # fmt: skip

    return DataLoader(list(deal), batch_size=2, collate_fn=collate)


class CpStepped:
    """Right (the twelfth trial's r16steps_cp_slices): a stepped loader, each replica's strided
    share wrapping with an epoch field, every CP rank the same samples, each its half."""

    def __init__(self, layout: Any) -> None:
        self.mine, self.cut = list(range(layout.dp_rank, M, layout.dp_size)), _cp_half(layout)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for step in range(8):
            at = [2 * step + j for j in range(2)]
            ids = [self.mine[k % len(self.mine)] for k in at]
            yield {"index": torch.tensor(ids),
                   "epoch": torch.tensor([k // len(self.mine) for k in at]),
                   "input_ids": torch.stack([torch.arange(8) + 9 * i for i in ids])[:, self.cut]}  # fmt: skip
