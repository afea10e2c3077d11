"""The twelfth trial's verify cases (issue 45): a sample carrying another's loss in a
DataLoader worker (check_eval, check_steps), and context-parallel slices that leave part of
each sequence untrained (check_contract); with the right answers near each boundary (the
same loaders reading right; CP splits contiguous, zigzag, whole rows, a next-token input,
TP and CP together). The eval and steps rows are in ``_verify_classes.CASES``, the CP rows
in ``_verify_corpus.CASES`` (check_contract) and ``_verify_classes.CASES`` (check_eval and
check_steps at ``dp=2,cp=2``: the same slices, through the loaders below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, get_worker_info

M = 23  # samples of the eval and steps cases: odd, so an even deal over 2 replicas pads one


def _loss(i: int) -> torch.Tensor:
    return torch.tensor(0.5 + ((i * 7919) % M) / 10, dtype=torch.float64)


def _misread(i: int, bad: bool) -> int:
    """The sample whose loss sample ``i`` carries: in a worker, the last one reads sample 0's
    (a worker-side cache bug) where ``bad``; a read in the rank is always right."""
    return 0 if bad and get_worker_info() is not None and i == M - 1 else i


class Marked(Dataset):
    """An even deal's padded positions: position ``k`` is sample ``k % M``, weight 0 past M."""

    def __init__(self, bad: bool) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return M + 1

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = k % M
        return {"index": i, "loss": _loss(_misread(i, self.bad)), "weight": float(k < M)}


def _eval(layout: Any, bad: bool) -> DataLoader:
    deal = DistributedSampler(range(M + 1), layout.dp_size, layout.dp_rank, shuffle=False)
    return DataLoader(Marked(bad), batch_size=2, sampler=deal, num_workers=1)


def eval_worker_misreads(layout: Any) -> DataLoader:
    """Dodge (d16eval_worker_misreads): ids and weights right, sample 22 carries sample 0's
    loss in a worker: the metric counts sample 0 twice and 22 never."""
    return _eval(layout, True)


def eval_worker_reads(layout: Any) -> DataLoader:
    """Right: the same deal, every sample its own loss in the worker too."""
    return _eval(layout, False)


def eval_positions_misread(layout: Any) -> DataLoader:
    """Dodge, a limit (d16eval_ids_lie): the same wrong loss made in a collate over a list of
    positions, nothing to read again: contents trusted, and the report says so."""
    mine = list(range(layout.dp_rank, M + 1, layout.dp_size))

    def collate(ks: list[int]) -> dict[str, torch.Tensor]:
        return {"index": torch.tensor([k % M for k in ks]),
                "loss": torch.stack([_loss(0 if k == M - 1 else k % M) for k in ks]),
                "weight": torch.tensor([float(k < M) for k in ks], dtype=torch.float64)}  # fmt: skip

    return DataLoader(mine, batch_size=2, collate_fn=collate)


class Flagged(Dataset):
    """22 samples padded to 24 (a full global batch of 2 x 2 at dp 2): the pads repeat
    samples 0 and 1 at weight 0, flagged ``is_pad``."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = k % 22
        return {"index": i, "loss": _loss(i), "weight": float(k < 22), "is_pad": int(k >= 22)}


def eval_pads_flagged(layout: Any) -> DataLoader:
    """Right: a pad's flag differs from its sample's, and its value (1) is another padded
    sample's only some of the time: no sample's own value, so no misread."""
    deal = DistributedSampler(range(24), layout.dp_size, layout.dp_rank, shuffle=False)
    return DataLoader(Flagged(), batch_size=2, sampler=deal)


class Tagged(Dataset):
    """Position ``k = epoch * M + i``: sample ``i`` tagged with its epoch."""

    def __init__(self, bad: bool) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return M * 100

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = k % M
        return {"index": i, "epoch": k // M, "loss": _loss(_misread(i, self.bad))}


class Cycle(Sampler[int]):
    """The replica's strided share, epoch after epoch, without end."""

    def __init__(self, layout: Any) -> None:
        self.mine = list(range(layout.dp_rank, M, layout.dp_size))

    def __iter__(self) -> Iterator[int]:
        k = 0
        while True:
            yield (k // len(self.mine)) * M + self.mine[k % len(self.mine)]
            k += 1


def steps_worker_misreads(layout: Any) -> DataLoader:
    """Dodge (d16steps_worker_misreads): an endless DataLoader, sample 22 carrying sample 0's
    loss in a worker."""
    return DataLoader(Tagged(True), batch_size=2, sampler=Cycle(layout), num_workers=1)


def steps_worker_reads(layout: Any) -> DataLoader:
    """Right: the same endless loader, every sample its own loss."""
    return DataLoader(Tagged(False), batch_size=2, sampler=Cycle(layout), num_workers=1)


# ------------------------------------------------------------------ context parallel
class Tok(Dataset):
    """30 samples of ``width`` tokens, ``9 i + k`` (``labels``: with labels, the tokens + 1)."""

    def __init__(self, width: int = 8, labels: bool = False) -> None:
        self.width, self.labels = width, labels

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = torch.arange(self.width) + 9 * i
        return {"input_ids": x, "index": i, **({"labels": x + 1} if self.labels else {})}


def _cp(cols: Callable[[int, int], Any], width: int = 8, cut: int = 0) -> Callable[..., Any]:
    """A factory: DistributedSampler over the replicas, batches of 3, each rank keeping the
    columns ``cols(cp_rank, cp_size)`` of input_ids (after dropping its last ``cut``)."""

    def make(layout: Any) -> DataLoader:
        ds = Tok(width)
        deal = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=3)
        mine = cols(layout.cp_rank, layout.cp_size)

        def collate(xs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            rows = torch.stack([x["input_ids"] for x in xs])
            rows = rows[:, : rows.shape[1] - cut]
            return {"input_ids": rows[:, mine], "index": torch.tensor([x["index"] for x in xs])}

        return DataLoader(ds, batch_size=3, sampler=deal, collate_fn=collate)

    return make


def _halves(r: int, n: int) -> slice:
    return slice(r * 8 // n, (r + 1) * 8 // n)


def _zigzag(r: int, n: int) -> torch.Tensor:
    c = 8 // (2 * n)
    return torch.cat(
        [torch.arange(r * c, (r + 1) * c), torch.arange((2 * n - 1 - r) * c, (2 * n - r) * c)]
    )


#: Dodge (d13_cp_same_slice): every CP rank the first half (the cp_rank offset forgotten).
cp_same_slice = _cp(lambda r, n: slice(0, 8 // n))
#: Dodge (d13_cp_gap): CP rank 0 tokens 0-2, rank 1 tokens 4-7: token 3 on no CP rank.
cp_gap = _cp(lambda r, n: slice(0, 3) if r == 0 else slice(4, 8))
#: Right: contiguous halves.
cp_halves = _cp(_halves)
#: Right (r13_cp_zigzag): Megatron's load-balanced chunks r and 2 cp - 1 - r.
cp_zigzag = _cp(_zigzag)
#: Right (d13_cp_full_rows_both): every CP rank the whole row (context_parallel() shards it).
cp_full_rows = _cp(lambda r, n: slice(0, 8))
#: Right: rows of 9 tokens, the input of a next-token loss (the first 8) cut in halves.
cp_next_token_input = _cp(_halves, width=9, cut=1)


#: Dodge (d13_cp_reversed_slice): each rank its half, rank 1's reversed (trained backwards).
cp_reversed = _cp(lambda r, n: slice(0, 4) if r == 0 else torch.arange(7, 3, -1))
#: Dodge (d13_cp_half_rotated): rank 1's half rolled by 2: two runs, the second first.
cp_half_rotated = _cp(lambda r, n: slice(0, 4) if r == 0 else torch.tensor([6, 7, 4, 5]))
#: Dodge, at the order rule's edge: rank 1's half with its last two tokens swapped (3 runs).
cp_swapped_pair = _cp(lambda r, n: slice(0, 4) if r == 0 else torch.tensor([4, 5, 7, 6]))


def cp_labelled(parts: Callable[[int, torch.Tensor, torch.Tensor], Any]) -> Callable[..., Any]:
    """A factory: :class:`Tok` with labels, batches of 3, each rank's ``(input_ids, labels)``
    of a sample ``parts(cp_rank, x, y)``."""

    def make(layout: Any) -> DataLoader:
        ds = Tok(labels=True)
        deal = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=3)

        def collate(xs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            got = [parts(layout.cp_rank, x["input_ids"], x["labels"]) for x in xs]
            return {"input_ids": torch.stack([g[0] for g in got]),
                    "labels": torch.stack([g[1] for g in got]),
                    "index": torch.tensor([x["index"] for x in xs])}  # fmt: skip

        return DataLoader(ds, batch_size=3, sampler=deal, collate_fn=collate)

    return make


_PAD = torch.tensor([-100])
#: Dodge (d13_cp_gap_padded_labels_ok): token 3 on no rank, rank 0's part padded with -100
#: to an equal length (the pad is left out, so the gap shows); labels cut right.
cp_gap_padded = cp_labelled(
    lambda r, x, y: (torch.cat([x[:3], _PAD]), y[:4]) if r == 0 else (x[4:], y[4:])
)
#: Right, not judged: halves of input_ids, labels scaled by 10 (values the sample lacks, more
#: than one pad): labels stay not judged though input_ids are judged whole.
cp_scaled_labels = cp_labelled(lambda r, x, y: (x[4 * r : 4 * r + 4], 10 * y[4 * r : 4 * r + 4]))
#: Right: halves, the labels' first two (a prompt's) masked with -100 in the collate, as a
#: fine-tuning collate does (the loss ignores them): masking, not a gap.
cp_masked_labels = cp_labelled(
    lambda r, x, y: (x[4 * r : 4 * r + 4], torch.cat([_PAD, _PAD, y[2:4]]) if r == 0 else y[4:])
)
#: Dodge: the same shape in input_ids: the prompt's tokens replaced by -100 (never trained).
cp_masked_inputs = cp_labelled(
    lambda r, x, y: (torch.cat([_PAD, _PAD, x[2:4]]) if r == 0 else x[4:], y[4 * r : 4 * r + 4])
)


def cp_padded_halves(layout: Any) -> DataLoader:
    """Right (r13_cp_padded_halves): rows of 7 padded with -1 to 8, then cut in halves: the
    pad is no value of any sample, so it is left out and the halves hold the sample."""
    ds = Tok(7)
    deal = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=3)
    mine = _halves(layout.cp_rank, layout.cp_size)

    def collate(xs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        rows = torch.stack([torch.cat([x["input_ids"], torch.tensor([-1])]) for x in xs])
        return {"input_ids": rows[:, mine], "index": torch.tensor([x["index"] for x in xs])}

    return DataLoader(ds, batch_size=3, sampler=deal, collate_fn=collate)


# ------------------------------------------------------------------ context parallel, eval and steps
class TokPositions(Dataset):
    """Position ``k`` of an eval deal (``M + 1``, weight 0 past ``M``) or of an endless
    stepped one (``epoch * M + i``): sample ``k % M``'s 8 tokens, named by its index."""

    def __init__(self, length: int, epoch: bool) -> None:
        self.length, self.epoch = length, epoch

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k: int) -> dict[str, Any]:
        i = k % M
        tagged = {"epoch": k // M} if self.epoch else {"weight": float(k < M)}
        return {"index": i, "input_ids": torch.arange(8) + 9 * i, **tagged}


def _sliced(cols: Callable[[int, int], Any], layout: Any) -> Callable[[list[Any]], Any]:
    """torch's default collate, then the rank's columns ``cols(cp_rank, cp_size)`` of input_ids
    (or, where ``cols`` gives a function, what it makes of the rows)."""
    mine = cols(layout.cp_rank, layout.cp_size)

    def collate(xs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = torch.utils.data.default_collate(xs)
        rows = batch["input_ids"]
        return {**batch, "input_ids": mine(rows) if callable(mine) else rows[:, mine]}

    return collate


def cp_eval(cols: Callable[[int, int], Any]) -> Callable[..., DataLoader]:
    """A factory: an even eval deal with a weight-0 pad, every CP rank of a replica the same
    samples, each keeping ``cols`` of every row."""

    def make(layout: Any) -> DataLoader:
        deal = DistributedSampler(range(M + 1), layout.dp_size, layout.dp_rank, shuffle=False)
        return DataLoader(TokPositions(M + 1, False), batch_size=2, sampler=deal,
                          collate_fn=_sliced(cols, layout))  # fmt: skip

    return make


def cp_steps(cols: Callable[[int, int], Any]) -> Callable[..., DataLoader]:
    """A factory: an endless stepped loader (each replica's strided share, an epoch field),
    every CP rank of a replica the same samples, each keeping ``cols`` of every row."""

    def make(layout: Any) -> DataLoader:
        return DataLoader(TokPositions(M * 100, True), batch_size=2, sampler=Cycle(layout),
                          collate_fn=_sliced(cols, layout))  # fmt: skip

    return make


#: Dodge: every CP rank the first half of each sequence in eval (the cp_rank offset forgotten).
cp_eval_same_slice = cp_eval(lambda r, n: slice(0, 8 // n))
#: Right: the load-balanced zigzag chunks in eval.
cp_eval_zigzag = cp_eval(_zigzag)
#: Dodge: CP rank 0 tokens 0-2, rank 1 tokens 4-7 in a steps run: token 3 never trained.
cp_steps_gap = cp_steps(lambda r, n: slice(0, 3) if r == 0 else slice(4, 8))
#: Right: the load-balanced zigzag chunks in a steps run.
cp_steps_zigzag = cp_steps(_zigzag)
#: Dodges (d16eval_cp_reversed, d16steps_cp_reversed): CP rank 1's half reversed.
cp_eval_reversed = cp_eval(lambda r, n: slice(0, 4) if r == 0 else torch.arange(7, 3, -1))
cp_steps_reversed = cp_steps(lambda r, n: slice(0, 4) if r == 0 else torch.arange(7, 3, -1))
#: Dodge (d16eval_cp_gap_padded): token 3 on no CP rank, rank 0's part padded with -100.
cp_eval_gap_padded = cp_eval(
    lambda r, n: (
        (lambda x: torch.cat([x[:, :3], torch.full((len(x), 1), -100)], 1))
        if r == 0
        else slice(4, 8)
    )
)


def cp_steps_listed(layout: Any) -> list[dict[str, torch.Tensor]]:
    """Dodge, not judged (d16steps_cp_gap_positions): a list of batches (nothing to read
    again), each replica's strided share, CP rank 0 tokens 0-2 and rank 1 tokens 4-7."""
    mine = list(range(layout.dp_rank, M, layout.dp_size))
    cols = slice(0, 3) if layout.cp_rank == 0 else slice(4, 8)
    at = [(2 * step, 2 * step + 1) for step in range(8)]
    ids = [[mine[k % len(mine)] for k in ks] for ks in at]
    return [{"index": torch.tensor(i), "epoch": torch.tensor([k // len(mine) for k in ks]),
             "input_ids": torch.stack([torch.arange(8) + 9 * j for j in i])[:, cols]}
            for i, ks in zip(ids, at, strict=True)]  # fmt: skip
