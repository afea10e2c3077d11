"""The resume gauntlet: minimal stateful loaders, each with the bug of a published resume report.

``Resumable`` is one right stateful loader (a shuffled, DP-sharded stream whose
state is the epoch and the position in the job's samples, as MosaicML streaming
keeps it). Each ``bug=`` breaks it the way one public report did; ``bug=""`` is the
correct twin every buggy one is measured against.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

N, BATCH = 16, 2

#: bug -> (the public report of its class, the check_resume scenario that exposes it).
BUGS: dict[str, tuple[str, str]] = {
    "frozen": ("state_dict() after a resume returns the loaded position (prime-rl #3332)",
               "steps after a resume"),
    "since_resume": ("the second resume restarts the epoch: the position counts only since "
                     "the last resume (datasets #8308)", "steps after a resume"),
    "skips": ("samples dropped on resume: one batch too far (datasets #7538)", "mid-epoch"),
    "repeats": ("a batch trained twice: one batch short on resume", "mid-epoch"),
    "rank0_state": ("only rank 0's state saved: every rank resumes rank 0's shard "
                    "(torchtitan #291, SimpleTuner #2986)", "mid-epoch"),
    "iter_before_load": ("iter() taken before load_state_dict: the iterator ignores the "
                         "loaded position", "mid-epoch"),
    "prefetch": ("prefetched batches counted as consumed", "mid-epoch"),
    "restarts": ("the epoch restarted: load_state_dict ignores the position", "mid-epoch"),
    "epoch_lost": ("the epoch not saved: a resumed epoch 1 replays epoch 0's order",
                   "epoch boundary"),
    "rng": ("RNG not restored: the shuffle's generator starts over on resume",
            "epoch boundary"),
}  # fmt: skip


class Resumable:
    """A shuffled stream sharded over DP replicas, with ``state_dict``/``load_state_dict``."""

    def __init__(self, layout: Any, bug: str = "") -> None:
        assert bug in ("", *BUGS), bug
        self.dp_rank, self.dp_size, self.bug = layout.dp_rank, layout.dp_size, bug
        self.epoch, self.start, self.taken = 0, 0, 0  # start, taken: samples of the job
        self.loaded: dict[str, int] | None = None
        self.gen = torch.Generator().manual_seed(11)  # the "rng" bug's unsaved state
        self._it: Iterator[dict[str, Any]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.bug == "iter_before_load":
            self._it = self._batches(self.start)

    def _order(self) -> list[int]:
        if self.bug == "rng":
            return torch.randperm(N, generator=self.gen).tolist()
        return torch.randperm(N, generator=torch.Generator().manual_seed(11 + self.epoch)).tolist()

    def _batches(self, start: int) -> Iterator[dict[str, Any]]:
        mine = self._order()[start:][self.dp_rank :: self.dp_size]
        self.taken = 0
        for b in range(0, len(mine), BATCH):
            ids = mine[b : b + BATCH]
            self.taken += len(ids) * self.dp_size
            yield {"x": torch.ones(len(ids), 2) * torch.tensor(ids)[:, None],
                   "index": torch.tensor(ids)}  # fmt: skip
        self.epoch, self.start, self.taken, self.loaded = self.epoch + 1, 0, 0, None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._it is not None:
            it, self._it = self._it, None
            return it
        return self._batches(self.start)

    def state_dict(self) -> dict[str, int]:
        if self.bug == "frozen" and self.loaded is not None:
            return dict(self.loaded)
        done = self.taken + (BATCH * self.dp_size if self.bug == "prefetch" and self.taken else 0)
        pos = done if self.bug == "since_resume" else self.start + done
        rank = 0 if self.bug == "rank0_state" else self.dp_rank
        return {
            "position": pos,
            "rank": rank,
            **({} if self.bug == "epoch_lost" else {"epoch": self.epoch}),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded = dict(state)
        self.epoch = state.get("epoch", 0)
        self.dp_rank = state["rank"]
        shift = {"skips": BATCH, "repeats": -BATCH}.get(self.bug, 0) * self.dp_size
        pos = state["position"]
        self.start = 0 if self.bug == "restarts" else max(0, pos + shift if pos else pos)


def make(bug: str) -> Any:
    """The factory of one gauntlet loader (``bug=""``: the correct twin)."""

    def make_loader(layout: Any) -> Resumable:
        return Resumable(layout, bug)

    make_loader.__qualname__ = f"Resumable[{bug or 'correct'}]"
    return make_loader
