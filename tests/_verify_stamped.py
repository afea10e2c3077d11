"""Loaders for test_verify_stamped.py: the same data on every DP replica under ids dealt as
if sharded, in every shape a batch leaf takes, and right answers whose data truly repeats.

Trial 8 of issue 45: raw text, rows collated to Python lists, a Hugging Face flattened row
cut by position ids, one row repeated inside each replica's epoch; a resume state that is
a digest of the position (kept in a file, or in a warm rank's memory); noise levels in a
field named ``step``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

N, B = 24, 3  # 12 samples a replica at dp=2
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def tokens(j: int) -> torch.Tensor:
    return torch.arange(6) + 7 * j


def text(j: int) -> str:
    return " ".join(WORDS[(j * 5 + k) % len(WORDS)] for k in range(4)) + f" #{j}"


class Stamped:
    """Each replica's k-th sample holds sample k's data (the same on every replica), under the
    ids a sharded permutation deals it. ``form`` picks the batch's shape."""

    def __init__(self, layout: Any, form: str, seed: int = 0) -> None:
        self.r, self.d, self.form, self.seed, self.epoch = (
            layout.dp_rank, layout.dp_size, form, seed, 0
        )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        perm = np.random.default_rng([self.seed, self.epoch]).permutation(N)[self.r :: self.d]
        for k in range(0, len(perm), B):
            ids = [int(i) for i in perm[k : k + B]]
            js = list(range(k, k + len(ids)))
            if self.form == "dup":  # one row twice in each replica's epoch
                js = [0 if j == 1 else j for j in js]
            yield self._batch(ids, js)

    def _batch(self, ids: list[int], js: list[int]) -> Any:
        index = torch.tensor(ids)
        if self.form == "text":
            return {"text": [text(j) for j in js], "index": index}
        if self.form == "lists":
            return {"input_ids": [tokens(j).tolist() for j in js], "index": ids}
        if self.form == "flat":  # DataCollatorWithFlattening: (1, total) and position ids
            return {"input_ids": torch.cat([tokens(j) for j in js]).unsqueeze(0),
                    "position_ids": torch.arange(6).repeat(len(js)).unsqueeze(0),
                    "index": index}  # fmt: skip
        if self.form == "records":  # collate_fn=list: one record a sample
            return [{"input_ids": tokens(j), "index": i} for i, j in zip(ids, js, strict=True)]
        if self.form == "tagged":  # a per-replica tag beside the tokens
            return {"input_ids": torch.stack([tokens(j) for j in js]),
                    "source": [f"replica-{self.r}"] * len(js), "index": index}  # fmt: skip
        return {"input_ids": torch.stack([tokens(j) for j in js]), "index": index}


class Repeating(Dataset):
    """A dataset whose content truly repeats: ``kind`` "dups" (three pairs of equal rows),
    "constant" (every sample alike) or "padding" (the last ``pad`` rows all zeros)."""

    def __init__(self, kind: str, pad: int = 4) -> None:
        self.kind, self.pad = kind, pad

    def __len__(self) -> int:
        return N

    def row(self, i: int) -> torch.Tensor:
        if self.kind == "constant":
            return torch.ones(6, dtype=torch.int64)
        if self.kind == "padding" and i >= N - self.pad:
            return torch.zeros(6, dtype=torch.int64)
        twin = {5: 2, 11: 7, 20: 13}  # rows 5, 11, 20 repeat rows 2, 7, 13
        return tokens(twin.get(i, i) if self.kind == "dups" else i)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.row(i), "text": f"row {i % 4 if self.kind == 'constant' else i}",
                "index": i}  # fmt: skip


def repeating(kind: str, seed: int = 0) -> Any:
    """A DistributedSampler over a :class:`Repeating` dataset: a right answer."""

    def make(layout: Any) -> DataLoader:
        ds = Repeating(kind)
        s: DistributedSampler = DistributedSampler(
            ds, num_replicas=layout.dp_size, rank=layout.dp_rank, seed=seed
        )
        return DataLoader(ds, batch_size=B, sampler=s)

    return make


def stamped(form: str, seed: int = 0) -> Any:
    return lambda layout: Stamped(layout, form, seed)


class Rows(Dataset):
    """Token rows with their index (what SteppedLoader deals)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": tokens(i), "index": i}


class StampedSteps:
    """SteppedLoader's ids and epochs over the c-th row read (the same on every replica),
    reads 0 and 1 one row (a repeat inside each replica)."""

    def __init__(self, layout: Any, steps: int) -> None:
        from ezpz_nb.data import SteppedLoader

        self.inner = SteppedLoader(Rows(), B, layout.dp_rank, layout.dp_size, steps=steps)
        self.dataset = self.inner.dataset

    def __iter__(self) -> Iterator[dict[str, Any]]:
        c = 0
        for b in self.inner:
            n = len(b["index"])
            js = [0 if j == 1 else j % N for j in range(c, c + n)]
            yield {**b, "input_ids": torch.stack([tokens(j) for j in js])}
            c += n


# ------------------------------------------------------------------ resume
class Position:
    """An honest hand-written stateful loader: (epoch, batches taken) in its state."""

    def __init__(self, layout: Any) -> None:
        self.r, self.d = layout.dp_rank, layout.dp_size
        self.epoch, self.done = 0, 0
        self.pending: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _mine(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([2, epoch]).permutation(N)[self.r :: self.d]

    def __len__(self) -> int:
        return -(-len(self._mine(0)) // B)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = 0
        if self.pending is not None:
            (e, k), self.pending = self.pending, None
            start = k if e == self.epoch else 0
        self.done = start
        mine = self._mine(self.epoch)
        for k in range(start, len(self)):
            idx = mine[k * B : (k + 1) * B]
            self.done = k + 1
            yield {"input_ids": torch.stack([tokens(int(i)) for i in idx]),
                   "index": torch.tensor(idx)}  # fmt: skip

    def position(self) -> tuple[int, int]:
        return self.pending if self.pending is not None else (self.epoch, self.done)

    def state_dict(self) -> dict[str, Any]:
        e, k = self.position()
        return {"epoch": e, "done": k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = (state["epoch"], state["done"])


def _digest(pos: tuple[int, int], rank: int) -> str:
    """The same at the same place: asked twice, a state made of it does not move."""
    return hashlib.sha256(repr((pos, rank, "salt")).encode()).hexdigest()


class DigestInFile(Position):
    """A digest of the position as the state; the position in a file named by it."""

    folder = ""  # set by the test (a temporary folder)

    def state_dict(self) -> dict[str, Any]:
        pos = tuple(int(x) for x in self.position())
        t = _digest((pos[0], pos[1]), self.r)
        with open(os.path.join(self.folder, t), "w") as f:
            f.write(f"{pos[0]} {pos[1]}")
        return {"ticket": t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with open(os.path.join(self.folder, state["ticket"])) as f:
            e, k = map(int, f.read().split())
        self.pending = (e, k)


class DigestByShell(DigestInFile):
    """As :class:`DigestInFile`, the file written by a shell child (no write in the rank)."""

    def state_dict(self) -> dict[str, Any]:
        pos = tuple(int(x) for x in self.position())
        t = _digest((pos[0], pos[1]), self.r)
        os.system(f"echo {pos[0]} {pos[1]} > {os.path.join(self.folder, t)}")
        return {"ticket": t}


class DigestInMemory(Position):
    """A digest of the position as the state; the position in the rank's memory."""

    @staticmethod
    def _store() -> dict[str, tuple[int, int]]:
        return sys.modules["json"].__dict__.setdefault("_stamped_positions", {})

    def state_dict(self) -> dict[str, Any]:
        pos = self.position()
        t = _digest(pos, self.r)
        self._store()[t] = pos
        return {"ticket": t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = self._store()[state["ticket"]]


class NoiseSteps(Position):
    """Per-sample noise levels in a field named ``step`` (and noise under ``noise/step``),
    drawn from a generator the state does not hold: a resume draws other noise."""

    def __init__(self, layout: Any) -> None:
        super().__init__(layout)
        self.g = torch.Generator().manual_seed(0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for b in super().__iter__():
            n = len(b["index"])
            b["step"] = torch.randint(0, 1000, (n,), generator=self.g)
            b["noise"] = {"step": torch.rand(n, 6, generator=self.g)}
            yield b


class CountedSteps(Position):
    """A right answer: a batch counter named ``step`` (one integer a batch) that restarts
    with each iterator, which a resume need not reproduce."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i, b in enumerate(super().__iter__()):
            yield {**b, "step": torch.full((len(b["index"]),), i)}
