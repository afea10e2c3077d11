"""What the batch checkers (exercises 5-7) run on each rank: a batch, a loader, a stream.

The rank side of :mod:`ezpz_nb.workshop.batch_exercises`, kept apart as
:mod:`ezpz_nb.workshop.jobs` is for exercises 1-4: each job builds one rank's
inputs, calls the learner's function and sends back only plain values. Where
the lesson is *who* reads the data, the data counts its own reads: a stream that
counts the items read from it (DataLoader workers included), and one that counts
the batches pulled from it.
"""

from __future__ import annotations

import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__: list[str] = []  # private: used by ezpz_nb.workshop.batch_exercises only


# ----------------------------------------------------------------- 5. send a batch
def leader_batch(dp_rank: int, seed: int | None) -> dict[str, torch.Tensor]:
    """The batch a TP leader sends: the documented one, or with a seed other shapes."""
    from ezpz_nb.data import RandomTokenDataset

    if seed is None:
        ds = RandomTokenDataset(100, 8, num_samples=16)
        items = [ds[2 * dp_rank + k] for k in range(2)]
        return {
            "input_ids": torch.stack([it["input_ids"] for it in items]),
            "index": torch.tensor([it["index"] for it in items]),
        }
    # Other keys, shapes and dtypes than the first round: a peer that assumes
    # them instead of receiving them fails here. Token ids above 2**24 do not
    # survive a trip through float32: packing every tensor into one float
    # buffer changes their bytes.
    g = torch.Generator().manual_seed(seed + dp_rank)
    rows, cols = (int(v) for v in torch.randint(3, 12, (2,), generator=g))
    return {
        "mask": torch.rand(rows, cols, generator=g),
        "input_ids": torch.randint(2**24, 2**40, (rows, cols), generator=g),
        "index": torch.arange(rows, dtype=torch.int32) + 100 * dp_rank,
    }


def batch_spec(batch: dict) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """Shape, dtype and digest of each tensor of ``batch``, by key (in no order)."""
    from ezpz_nb.ledger import batch_digest

    return {
        k: (tuple(v.shape), str(v.dtype), batch_digest(v))
        for k, v in batch.items()
        if isinstance(v, torch.Tensor)
    }


def job_send(fn: Callable, seed: int) -> Any:
    """Exercise 5: per round, the leader's batch spec sent and what this rank got."""
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    rounds = []
    for s in (None, seed):
        batch = leader_batch(lay.dp_rank, s) if lay.tp_rank == 0 else None
        sent = batch_spec(batch) if batch is not None else None  # before fn can touch it
        out = fn(batch, lay.tp_group)
        got = (
            batch_spec(out)
            if isinstance(out, dict)
            else "None"
            if out is None
            else f"a {type(out).__name__}"
        )
        rounds.append((sent, got))
    return lay.tp_rank, rounds


# ----------------------------------------------------------------- 6. leader-announced loop
#: Worker slots of a CountingStream: slot 0 is the rank itself, slot w + 1 its worker w.
_SLOTS = 65


class CountingStream(IterableDataset):
    """One DP replica's filtered stream: ``actual`` items, ``len()`` says ``claimed``.

    How many items a filtered stream holds is known only by reading it: no
    sampler, no dataset size and no ``len()`` tells (``len()`` is an estimate,
    wrong on purpose in the direction the round asks for). Every item read is
    counted in shared memory, one slot per process (the rank, each DataLoader
    worker), so workers add to the same total without racing each other.
    Workers split the items between them, as a sharded stream does.
    """

    def __init__(self, dp_rank: int, dp_size: int, actual: int, claimed: int) -> None:
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self._actual, self.claimed = actual, claimed
        self.calls = torch.zeros(_SLOTS, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.claimed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        slot, step, first = (0, 1, 0) if info is None else (info.id + 1, info.num_workers, info.id)
        for k in range(first, self._actual, step):
            self.calls[min(_SLOTS - 1, slot)] += 1
            i = self.dp_rank + self.dp_size * k
            yield {"input_ids": torch.arange(4) + 100 * i, "index": i}

    def loads(self) -> int:
        """Items read so far, by this process and its workers."""
        return int(self.calls.sum())


#: Samples per batch in exercise 6.
LOOP_BATCH = 2


def leader_loop_rounds(seed: int) -> list[tuple[int, int, int]]:
    """Exercise 6's rounds: (items per replica, what ``len`` claims, DataLoader workers).

    First fewer items than claimed (peers that count wait for batches that
    never come), then more (peers that count stop early), with 2 workers.
    """
    rng = random.Random(seed)
    fewer = rng.randrange(5, 9)
    more = rng.randrange(7, 12)
    return [(fewer, fewer + 2 * LOOP_BATCH, 0), (more, more - 2 * LOOP_BATCH - 1, 2)]


def _worker_start() -> str | None:
    # DataLoader workers forked from the rank start in milliseconds; forkserver
    # or spawn (other platforms, Python 3.14's default) re-import torch in each.
    return "fork" if sys.platform.startswith("linux") else None


def _loop_loader(lay: Any, actual: int, claimed: int, workers: int) -> DataLoader:
    return DataLoader(
        CountingStream(lay.dp_rank, lay.dp_size, actual, claimed),
        batch_size=LOOP_BATCH,
        num_workers=workers,
        multiprocessing_context=_worker_start() if workers else None,
    )


def _index_and_digest(batch: Any) -> Any:
    from ezpz_nb.ledger import batch_digest

    if isinstance(batch, dict) and "index" in batch:
        return (tuple(int(i) for i in batch["index"]), batch_digest(batch))
    return f"a {type(batch).__name__}"


def job_leader_loop(fn: Callable, actual: int, claimed: int, workers: int) -> Any:
    """Exercise 6, one round: the batches ``fn`` gave this rank, its loads, its loader's batches."""
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    loader = _loop_loader(lay, actual, claimed, workers)
    stream = loader.dataset
    assert isinstance(stream, CountingStream)
    with warnings.catch_warnings():
        # The DataLoader warns when a stream outgrows its len(): the lie is the point here.
        warnings.filterwarnings("ignore", message="Length of IterableDataset", category=UserWarning)
        out = fn(loader, lay.tp_group)
        if out is None:
            return None
        got = [_index_and_digest(batch) for batch in out]
        # What the loader yields, read again on a fresh copy (its reads are not counted).
        want = [_index_and_digest(b)[0] for b in _loop_loader(lay, actual, claimed, workers)]
    return lay.tp_rank, got, stream.loads(), want


# ----------------------------------------------------------------- 7. step count over a stream
#: Batches an endless stream yields at full speed before it slows down: more than any
#: finite stream holds, so only reading ahead without end meets the slow part.
_FAST = 2000


def stream_counts(seed: int, world: int) -> list[int | None]:
    """Batches per rank for exercise 7: distinct counts, and one endless stream (None).

    Hundreds of batches: long enough that reading ahead up to a fixed cap before the
    ranks agree cannot stay within one batch beyond the steps taken.
    """
    rng = random.Random(seed)
    counts: list[int | None] = list(rng.sample(range(100, 300), world - 1))
    counts.insert(rng.randrange(world), None)
    return counts


class UnsizedBatches:
    """A generator of batches that counts the batches pulled from it.

    No ``len()``, and with ``count=None`` no end either.
    """

    def __init__(self, count: int | None) -> None:
        self.count, self.pulled = count, 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._batches()

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        while self.count is None or self.pulled < self.count:
            if self.pulled >= _FAST:
                time.sleep(0.05)  # an endless stream read to its end hangs, without filling memory
            k = self.pulled
            self.pulled += 1
            yield {"input_ids": torch.full((4,), k), "index": torch.tensor([k])}


def job_stream(fn: Callable, counts: list[int | None]) -> Any:
    """Exercise 7: what ``fn`` returned, how often it called ``train_step``, batches it
    pulled, and its furthest read ahead: ``(pulled, step)`` where pulled minus steps
    peaked (counted at every step, so reading ahead in chunks shows even when the last
    chunk happens to end one batch past the last step)."""
    calls: list[int] = []
    ahead = (0, 0)  # (batches pulled, at step), where the pulled batches led the steps most

    def train_step(batch: Any) -> None:
        """One training step: a gradient all-reduce over every rank."""
        nonlocal ahead
        if not isinstance(batch, dict) or "index" not in batch:
            raise TypeError(f"train_step needs a batch from the stream, got {batch!r}")
        step = len(calls) + 1
        if stream.pulled - step > ahead[0] - ahead[1]:
            ahead = (stream.pulled, step)
        grad = batch["index"].float()
        dist.all_reduce(grad)  # stands in for DDP's gradient all-reduce
        calls.append(int(batch["index"][0]))

    stream = UnsizedBatches(counts[dist.get_rank()])
    out = fn(iter(stream), train_step)
    if out is None and not calls:
        return None
    try:
        out = int(out)
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return out, len(calls), stream.pulled, ahead
