"""The replicas' batch sizes at a step (``verify/shares.py``), without ranks: every honest way
of dealing an epoch over 1-4 replicas passes, and batches of other sizes at a step that is
no replica's last fail. The ranks' cases are rows of ``_verify_classes.CASES`` (the ninth
trial's), run by ``test_verify_corpus.py``."""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler, SubsetRandomSampler

from ezpz_nb.ledger import StepRecord
from ezpz_nb.verify.batches import batch_rows
from ezpz_nb.verify.epochs import loader_parts
from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.padding import Padding
from ezpz_nb.verify.reread import Reread
from ezpz_nb.verify.shares import share_findings, unvouched_rows

WIDTH = 6  # tokens a sample: a batch of k samples is k rows of 6


def _outs(shares: list[list[int]], sizes: list[int], drop_last: bool) -> list[Outcome]:
    """Two epochs of each replica's share cut into batches of its size (the last kept or
    dropped), as a DataLoader over a sampler deals them."""
    outs = []
    for dp, (share, size) in enumerate(zip(shares, sizes, strict=True)):
        o = Outcome(rank=dp)
        for epoch in range(2):
            cut = [share[k : k + size] for k in range(0, len(share), size)]
            if drop_last and cut and len(cut[-1]) < size:
                cut.pop()
            for step, ids in enumerate(cut):
                o.records.append(
                    StepRecord(epoch, step, dp, dp, len(shares), 0, 1, tuple(ids), "loaded", "")
                )
                o.rows[(epoch, step)] = (len(ids), WIDTH)
        outs.append(o)
    return outs


def _honest_shares(n: int, dp: int) -> dict[str, list[list[int]]]:
    """Every way an honest sampler or stream deals ``n`` samples over ``dp`` replicas."""
    perm = np.random.default_rng(n * 10 + dp).permutation(n).tolist()
    per = -(-n // dp)
    padded = (perm + perm)[: per * dp]
    return {
        "DistributedSampler(drop_last=False)": [padded[r::dp] for r in range(dp)],
        "DistributedSampler(drop_last=True)": [perm[: n - n % dp][r::dp] for r in range(dp)],
        "stream perm[r::dp]": [perm[r::dp] for r in range(dp)],
        "numpy.array_split blocks": [b.tolist() for b in np.array_split(perm, dp)],
    }


def test_honest_deals_never_fail_and_unequal_batches_do():
    """Guards: a remainder (each replica's last batch, of shares that differ by one) taken for
    unequal batches, and batches of other sizes at a middle step left unseen."""
    honest = flagged = dodges = 0
    false = []
    for n, dp, size, drop in itertools.product(range(1, 41), range(1, 5), range(1, 7), (0, 1)):
        for how, shares in _honest_shares(n, dp).items():
            honest += 1
            if share_findings(_outs(shares, [size] * dp, bool(drop))):
                false.append((how, n, dp, size, drop))
        if dp < 2:
            continue
        # The dodge: replica r batches size + r samples, shares cut so steps stay equal.
        steps = max(2, n // (dp * size))
        sizes = [size + r for r in range(dp)]
        at, shares = 0, []
        for s in sizes:
            shares.append(list(range(at, at + steps * s)))
            at += steps * s
        dodges += 1
        found = share_findings(_outs(shares, sizes, bool(drop)))
        flagged += bool(found) and found[0].rule == "global_batch" and found[0].step == 0
    assert false == [], false[:5]
    assert flagged == dodges, (flagged, dodges)
    assert honest == 40 * 4 * 6 * 2 * 4 and dodges == 40 * 3 * 6 * 2


def test_packed_rows_count_values_and_text_counts_samples():
    """Rows of one shape holding other numbers of samples pass (the rows match); the same
    sizes with no numeric field (raw text) fail on the samples alone, and so do rows of
    zeros added to even out the rows, or rows padded wider.

    Guards: a packer's fixed rows failed for their sample counts, text batches never judged
    because their rows are unknown, and padding counted as data (the ninth trial's
    d13_uneven_padded_rows)."""
    for rows, fails in [
        ({0: (2, 12), 1: (2, 12)}, False),  # packed: 2 rows of 12 tokens on each replica
        ({0: (), 1: ()}, True),  # raw text
        ({0: (4, 6), 1: (3, 6)}, True),  # 4 rows and 3 of data (zero rows added to the 3)
        ({0: (4, 6), 1: (3, 8)}, True),  # 3 samples padded to 8 tokens: 24 values each
    ]:
        outs = _outs([list(range(0, 16)), list(range(16, 28))], [4, 3], False)
        for dp, o in enumerate(outs):
            o.rows = dict.fromkeys(o.rows, rows[dp])
        found = share_findings(outs)
        assert bool(found) == fails, rows
        if fails:
            assert [f.epoch for f in found] == [0, 1], found
            assert "replica 0: 4, replica 1: 3" in found[0].message, found[0].message


class _EpochRandom(RandomSampler):
    def set_epoch(self, epoch: int) -> None:
        self.generator = torch.Generator().manual_seed(epoch)


def test_a_random_sampler_subclass_shuffles():
    """Guards: samplers matched by their own class name, so a RandomSampler subclass (the
    usual way to give it set_epoch) read as no shuffle ("not judged" for a false reason)."""
    ds = list(range(10))
    for sampler in (_EpochRandom(ds), RandomSampler(ds), SubsetRandomSampler(range(5))):
        parts = loader_parts(DataLoader(ds, sampler=sampler))
        assert list(parts.shufflers) == ["loader.sampler"], type(sampler).__name__
    assert "loader.sampler" in loader_parts(DataLoader(ds, sampler=_EpochRandom(ds))).reached


def test_rows_alike_count_once_and_rows_of_one_value_not_at_all():
    """Guards the tenth trial's dodge (a short batch given copies of its own rows to look as
    large as the others'): rows alike are one row of data; a packer's distinct rows count."""
    from ezpz_nb.verify.batches import batch_rows

    ids = torch.arange(18).reshape(3, 6)
    padded = torch.cat([ids, ids[:2], torch.zeros(1, 6, dtype=torch.int64)])
    assert batch_rows({"input_ids": padded, "index": torch.arange(3)}, "index") == (3, 6)
    assert batch_rows({"input_ids": ids, "index": torch.arange(3)}, "index") == (3, 6)
    assert batch_rows({"x": np.arange(20.0).reshape(5, 4), "index": np.arange(5)}, "index") == (
        5,
        4,
    )


def _padding_of(rows: torch.Tensor, ids: list[int], dataset: Any = None) -> tuple[int, int, int]:
    """``(padded, vouched, unsure)`` batches after :class:`Padding` judged one batch of
    ``rows`` holding the samples ``ids`` of ``dataset`` (default: sample i is 8 tokens from
    8 i + 1), re-read through a real :class:`Reread` over a DataLoader of it."""
    loader = DataLoader(dataset if dataset is not None else _Eights(), batch_size=2)
    reread = Reread(loader, True)
    batch = {"input_ids": rows, "index": torch.tensor(ids)}
    reread.see(batch, ids, "index", 0, 0)
    padding = Padding(reread)
    padding.see(batch, ids, "index", batch_rows(batch, "index", len(ids))[0], 0, 0)
    padded = padding.judge(time.monotonic() + 30)
    return len(padded), padding.vouched, padding.unsure


class _Eights(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.arange(8) + 8 * i + 1, "index": i}


class _Augmenting(_Eights):
    def __getitem__(self, i: int) -> dict[str, Any]:
        out = super().__getitem__(i)
        out["input_ids"][int(torch.randint(8, ()))] = 0  # a new place each read
        return out


def test_rows_past_the_samples_are_data_only_where_the_samples_hold_them():
    """The twelfth trial's padding escapes, read by value (a multiset), not by row bytes.

    Guards: rows rolled or cut unlike a sample alone taken for padding (a chunker rejected);
    rows of noise beside the samples' rows vouched for (rolled rows, a copy of 80% of a row);
    a row half copied, half noise, or a dataset whose reads differ, judged either way."""
    a, b = (torch.arange(8) + 8 * i + 1 for i in (3, 5))
    g = torch.Generator().manual_seed(0)
    noise = torch.randint(1000, 5000, (2, 8), generator=g)
    bos = torch.full((1,), 999)
    cases = {
        # two samples, each cut in halves over 4 rows, rolled: all data
        "halves, rolled": (torch.stack([a[:4], a[4:], b[:4], b[4:]]).roll(3, 1), "data"),
        # the same tokens packed in rows of 4 with a BOS each (1 value in 5 from no sample)
        "a BOS a row": (torch.cat([bos.expand(4, 1), torch.cat([a, b]).view(4, 4)], 1), "data"),
        "noise rows": (torch.cat([torch.stack([a, b]), noise]), "padded"),
        "noise rows, rolled": (torch.cat([torch.stack([a, b]), noise]).roll(2, 1), "padded"),
        # a row of 6 of a's tokens and 2 of noise: one row of a's data is now short
        "80% of a row copied": (torch.stack([a, b, torch.cat([a[:6], noise[0, :2]])]), "padded"),
        # the half copied was taken by a's own row: the copy's values are found nowhere
        "half a row copied": (torch.stack([a, b, torch.cat([a[:4], noise[0, :4]])]), "padded"),
        # a row half its sample's, half noise: neither clearly data nor clearly padding
        "half noise": (torch.stack([torch.cat([a[:4], noise[0, :4]]), b, noise[1]]), "unsure"),
        # the thirteenth trial: a row of pads holding one of a's values, put first; a row
        # pieced from halves of a and b, put first; windows of 4 by a stride of 2 (data)
        "one value copied": (
            torch.stack([torch.cat([torch.zeros(7, dtype=a.dtype), a[7:]]), a, b]),
            "padded",
        ),
        "pieced from halves": (torch.stack([torch.cat([a[:4], b[4:]]), a, b]), "padded"),
        "windows": (torch.stack([x[k : k + 4] for x in (a, b) for k in (0, 2, 4)]), "data"),
        # each row one value short, rows of pads each holding a dropped value: 16 values in 4
        # rows of 8 (runs of one sample, each adding a value)
        "spread thin": (
            torch.stack(
                [torch.cat([x[:7], -torch.ones(1, dtype=x.dtype)]) for x in (a, b)]
                + [torch.cat([-torch.ones(7, dtype=x.dtype), x[7:]]) for x in (a, b)]
            ),
            "padded",
        ),
        "only noise": (torch.cat([noise, noise[:1] + 7]), "unsure"),
    }
    for name, (rows, want) in cases.items():
        padded, vouched, unsure = _padding_of(rows, [3, 5])
        got = "padded" if padded else "data" if vouched else "unsure" if unsure else "none"
        assert got == want, name
    assert _padding_of(torch.stack([a, b, a + 1]), [3, 5], _Augmenting()) == (0, 0, 1)


def test_unvouched_rows_leave_unequal_samples_not_judged():
    """Rows past the samples (3 samples in 6 rows beside 5 in 6) excuse the unequal samples
    only where a re-read vouched for them: else the step is not judged, with why.

    Guards: the twelfth trial's stream padded with noise rows passing on its row counts."""
    outs = _outs([list(range(0, 20)), list(range(20, 32))], [5, 3], False)
    for o in outs:
        o.rows = dict.fromkeys(o.rows, (6, WIDTH))
    assert share_findings(outs) == []
    why = unvouched_rows(outs)
    assert "replica 0: 5, replica 1: 3 samples" in why and "not shown to hold" in why, why
    for o in outs:
        o.rows_vouched = 1
    assert unvouched_rows(outs) == ""
    outs[1].rows_unsure = 1
    assert unvouched_rows(outs) != ""
