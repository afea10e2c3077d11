"""The thirteenth trial's re-read cases (issue 45): a sample whose loss (or flag) is wrong in a
DataLoader worker, hidden from the re-read by an augmentation field drawn anew each read, by
persistent workers, or by a value no other sample carries (a default 0.0, a shared 0/1 flag);
with the right answers at each rule's edge (an augmented field beside honest ones, a loss a
collate rescales on every sample). The eval and steps rows are in ``_verify_classes.CASES``,
the contract rows in ``_verify_corpus.CASES``.
"""

from __future__ import annotations

from typing import Any

import _verify_twelfth as T
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

M = T.M


class Eval(Dataset):
    """T12's padded positions (``k`` is sample ``k % M``, weight 0 past M), with a worker bug
    on the last sample (``bad``: ``"other"``, sample 0's loss; ``"zero"``, a loss of 0.0;
    ``"flag"``, sample 0's 0/1 ``correct``), and a ``jitter`` drawn from the OS each read
    where ``tta``."""

    def __init__(self, bad: str = "", tta: bool = False) -> None:
        self.bad, self.tta = bad, tta

    def __len__(self) -> int:
        return M + 1

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = k % M
        worker = get_worker_info() is not None
        hit = bool(self.bad) and worker and i == M - 1
        loss = T._loss(0 if hit and self.bad == "other" else i)
        if self.bad == "next" and worker:  # every sample one place off: none reads its own
            loss = T._loss(min(i + 1, M - 1))
        x = {"index": i, "weight": float(k < M), "correct": int(i % 3 != 0 and not
             (hit and self.bad == "flag")),
             "loss": torch.tensor(0.0, dtype=torch.float64) if hit and self.bad == "zero" else loss}  # fmt: skip
        if self.tta:  # a test-time augmentation's draw: never alike twice
            x["jitter"] = torch.from_numpy(np.random.default_rng().random(2))
        return x


def _eval(layout: Any, ds: Dataset, **kw: Any) -> DataLoader:
    deal = DistributedSampler(range(M + 1), layout.dp_size, layout.dp_rank, shuffle=False)
    return DataLoader(ds, batch_size=2, sampler=deal, num_workers=1, **kw)


def eval_tta_misreads(layout: Any) -> DataLoader:
    """Dodge (d16eval_tta_field_hides_misread): sample 22 carries sample 0's loss in a worker
    beside a TTA draw that differs each read: the loss, read alike twice, is judged."""
    return _eval(layout, Eval("other", tta=True))


def eval_tta_reads(layout: Any) -> DataLoader:
    """Right: the same TTA draw beside honest fields; the loss is judged, not trusted."""
    return _eval(layout, Eval(tta=True))


def eval_worker_zero_loss(layout: Any) -> DataLoader:
    """Dodge (d16eval_worker_zero_loss): sample 22's loss is 0.0 in a worker, no sample's."""
    return _eval(layout, Eval("zero"))


def eval_worker_flag(layout: Any) -> DataLoader:
    """Dodge (d16eval_worker_shared_label): sample 22's 0/1 ``correct`` is sample 0's (0, a
    value many samples share) in a worker."""
    return _eval(layout, Eval("flag"))


def eval_worker_off_by_one(layout: Any) -> DataLoader:
    """Dodge (d16eval_worker_off_by_one): in a worker sample i carries sample i + 1's loss
    (sample 0 never counted): no kept sample matches, yet each is another kept id's."""
    return _eval(layout, Eval("next"))


def eval_persistent_misreads(layout: Any) -> DataLoader:
    """Dodge (d16eval_persistent_misreads): T12's worker misread with persistent workers."""
    return _eval(layout, Eval("other"), persistent_workers=True)


def _rescaled(batch: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    out = torch.utils.data.default_collate(batch)
    # Each loss scaled by the batch's size (a sum over the batch later): collated alone, as
    # the re-read does, a sample keeps its own, so no kept sample matches its loss.
    out["loss"] = out["loss"] * len(batch)
    return out


def eval_collate_rescales(layout: Any) -> DataLoader:
    """Right: a collate scales every sample's loss by the batch's size (2, every batch full):
    no kept sample matches its loss, so no loss is blamed; the flags are judged."""
    return _eval(layout, Eval(), collate_fn=_rescaled)


class Tagged(T.Tagged):
    """T12's endless positions (``k = epoch * M + i``), the last sample's loss 0.0 in a
    worker where ``zero``."""

    def __init__(self, bad: bool, zero: bool = False) -> None:
        super().__init__(bad and not zero)
        self.zero = zero

    def __getitem__(self, k: int) -> dict[str, Any]:
        x = super().__getitem__(k)
        if self.zero and get_worker_info() is not None and k % M == M - 1:
            x["loss"] = torch.tensor(0.0, dtype=torch.float64)
        return x


def steps_worker_stale_loss(layout: Any) -> DataLoader:
    """Dodge (d16steps_worker_stale_loss): an endless loader, sample 22's loss 0.0 in a
    worker."""
    return DataLoader(Tagged(True, zero=True), batch_size=2, sampler=T.Cycle(layout), num_workers=1)


def steps_persistent_misreads(layout: Any) -> DataLoader:
    """Dodge (d16steps_persistent_misreads): T12's endless misread with persistent workers."""
    return DataLoader(Tagged(True), batch_size=2, sampler=T.Cycle(layout), num_workers=1,
                      persistent_workers=True)  # fmt: skip


# ------------------------------------------------------------------ check_contract
N = 30


class Jittered(Dataset):
    """6 tokens from ``i`` and an augmentation field that changes every read (from a read
    counter, so TP peers, reading alike, agree); in a worker sample 29 holds sample 0's tokens
    where ``bad``."""

    def __init__(self, bad: bool) -> None:
        self.bad, self.reads, self.main_reads = bad, 0, 0

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        worker = get_worker_info() is not None
        if worker:  # workers are forked anew each epoch: every TP peer's count alike
            self.reads += 1
        else:
            self.main_reads += 1
        n = self.reads if worker else self.main_reads
        j = 0 if self.bad and worker and i == N - 1 else i
        jitter = [(i * 131 + n * 7919) % 1009 / 1009.0, n / 97.0]
        return {"input_ids": torch.arange(6) + 7 * j, "index": i,
                "jitter": torch.tensor(jitter, dtype=torch.float64)}  # fmt: skip


def _jittered(layout: Any, bad: bool) -> DataLoader:
    ds = Jittered(bad)
    deal = DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=True)
    return DataLoader(ds, batch_size=3, sampler=deal, num_workers=1)


def contract_aug_misreads(layout: Any) -> DataLoader:
    """Dodge (d13_worker_misreads_aug_field): sample 29 holds sample 0's tokens in a worker,
    beside a field drawn anew each read."""
    return _jittered(layout, True)


def contract_aug_reads(layout: Any) -> DataLoader:
    """Right: the same augmentation field beside honest tokens."""
    return _jittered(layout, False)


class Shifted(Dataset):
    """6 tokens from ``7 i``; in a worker sample i holds sample i + 1's (the last its own)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        j = min(i + 1, N - 1) if get_worker_info() is not None else i
        return {"input_ids": torch.arange(6) + 7 * j, "index": i}


def contract_off_by_one(layout: Any) -> DataLoader:
    """Dodge (d13_worker_off_by_one): every sample one place off in a worker: sample 0 never
    trained, 29 twice an epoch."""
    deal = DistributedSampler(Shifted(), num_replicas=layout.dp_size, rank=layout.dp_rank)
    return DataLoader(Shifted(), batch_size=3, sampler=deal, num_workers=1)
