"""What the workshop checkers run on each rank: the inputs they feed the learner's function.

:mod:`ezpz_nb.workshop.exercises` judges, in the notebook process, what these jobs
return. Kept apart so each side reads on its own: a job builds one rank's
inputs, calls the learner's function and sends back only plain values (tensors,
sample ids, digests, counts). Inputs that an answer could be fitted to (the
values to sum or share, the lengths of the data) come from a seed drawn per
check, so a hard-coded answer fails.

Where the lesson is *who* loads, the job does not ask the learner's code: it
hands over a dataset that counts its own ``__getitem__`` calls (DataLoader
workers included) and a sampler that records what it yielded, and reports
those counts and records.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

__all__: list[str] = []  # private: used by ezpz_nb.workshop.exercises only


def _draw(seed: int, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Integer-valued floats in ``[low, high)``, the same on every rank for one seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).float()


def _tensor_or_type(out: Any) -> Any:
    """A returned tensor as a detached copy; anything else as it is (the checker names it)."""
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


# ----------------------------------------------------------------- 1. all_reduce
def sum_inputs(world: int, seed: int | None) -> list[torch.Tensor]:
    """Each rank's input: the documented ``[r + 1, 10 r]``, or with a seed fresh values."""
    if seed is None:
        return [torch.tensor([r + 1.0, 10.0 * r]) for r in range(world)]
    # Values of 100 or more: their sum is never the first round's, so an answer
    # that ignores the ranks' data cannot pass both rounds.
    return list(_draw(seed, 100, 1000, (world, 2)).unbind(0))


def job_global_sum(fn: Callable, seed: int) -> Any:
    """Exercise 1: ``fn`` on the documented input, then on one drawn from ``seed``."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = [_tensor_or_type(fn(sum_inputs(world, s)[r].clone())) for s in (None, seed)]
    return None if outs[0] is None else outs


# ----------------------------------------------------------------- 2. group broadcast
def share_inputs(world: int, seed: int) -> list[torch.Tensor]:
    """Each rank's 3 values, drawn per check: a leader's values must really travel."""
    return list(_draw(seed, 100, 1000, (world, 3)).unbind(0))


def job_share(fn: Callable, seed: int) -> Any:
    """Exercise 2: rank ``r`` passes its drawn values and its TP group (tp 2)."""
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    x = share_inputs(dist.get_world_size(), seed)[dist.get_rank()]
    return _tensor_or_type(fn(x.clone(), lay.tp_group))


# ----------------------------------------------------------------- 3. DP sampler
#: Samples in exercise 3: odd, so they do not divide over the 2 DP replicas.
SAMPLER_SAMPLES = 27


def job_sampler(fn: Callable, num_samples: int) -> Any:
    """Exercise 3: the indices of the sampler ``fn`` builds, with this rank's DP/TP place."""
    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=num_samples)
    sampler = fn(ds, lay)
    if sampler is None:
        return None
    return (lay.dp_rank, lay.tp_rank, [int(i) for i in sampler])


# ----------------------------------------------------------------- 4. set_epoch
class RecordingSampler(Sampler):
    """A sampler's stand-in that records, per pass, the indices it yielded.

    ``set_epoch`` and the ``epoch`` and ``seed`` attributes reach the wrapped
    sampler, so whatever reshuffles a DistributedSampler reshuffles this one.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.passes: list[list[int]] = []

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.inner.epoch = value

    @property
    def seed(self) -> int:
        return self.inner.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.inner.seed = value

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        self.passes.append([])
        for i in self.inner:
            self.passes[-1].append(int(i))
            yield i


def job_epochs(fn: Callable, epochs: int, seed: int) -> Any:
    """Exercise 4: what ``fn`` returned, and what the loader really yielded, pass by pass.

    dp 2 x tp 2, 16 samples in batches of 2: each DP replica's share divides.
    """
    from torch.utils.data import DistributedSampler

    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=16)
    sampler = RecordingSampler(
        DistributedSampler(
            ds, num_replicas=lay.dp_size, rank=lay.dp_rank, shuffle=True, seed=seed, drop_last=True
        )
    )
    out = fn(DataLoader(ds, batch_size=2, sampler=sampler), epochs)
    if out is None:
        return None
    try:  # plain ints, so the notebook process never unpickles a learner's object
        out = [[int(i) for i in epoch] for epoch in out]
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return lay.dp_rank, lay.tp_rank, out, sampler.passes


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
    # them instead of receiving them fails here.
    g = torch.Generator().manual_seed(seed + dp_rank)
    rows, cols = (int(v) for v in torch.randint(3, 12, (2,), generator=g))
    return {
        "input_ids": torch.randint(0, 100, (rows, cols), generator=g),
        "mask": torch.rand(rows, cols, generator=g),
        "index": torch.arange(rows, dtype=torch.int32) + 100 * dp_rank,
    }


def batch_spec(batch: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shape and dtype of each tensor of ``batch``, by key."""
    return {
        k: (tuple(v.shape), str(v.dtype)) for k, v in batch.items() if isinstance(v, torch.Tensor)
    }


def job_send(fn: Callable, seed: int) -> Any:
    """Exercise 5: per round, the leader's (digest, spec) sent and what this rank got."""
    from ezpz_nb.data.groups import make_layout
    from ezpz_nb.ledger import batch_digest

    lay = make_layout(tp_size=2)
    rounds = []
    for s in (None, seed):
        batch = leader_batch(lay.dp_rank, s) if lay.tp_rank == 0 else None
        out = fn(batch, lay.tp_group)
        sent = (batch_digest(batch), batch_spec(batch)) if batch is not None else None
        got = (
            (batch_digest(out), batch_spec(out))
            if isinstance(out, dict)
            else "None"
            if out is None
            else f"a {type(out).__name__}"
        )
        rounds.append((sent, got))
    return lay.tp_rank, rounds


# ----------------------------------------------------------------- 6. leader-announced loop
#: Worker slots of a CountingTokens: slot 0 is the rank itself, slot w + 1 its worker w.
_SLOTS = 65


class CountingTokens(Dataset):
    """A map-style dataset that counts its ``__getitem__`` calls, DataLoader workers included.

    The counts live in shared memory, one slot per process (the rank, each
    worker), so workers forked or spawned by a DataLoader add to the same total
    without racing each other.
    """

    def __init__(self, num_samples: int, seq_length: int = 4) -> None:
        self.num_samples, self.seq_length = num_samples, seq_length
        self.calls = torch.zeros(_SLOTS, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = get_worker_info()
        self.calls[min(_SLOTS - 1, 0 if info is None else info.id + 1)] += 1
        return {"input_ids": torch.arange(self.seq_length) + 100 * i, "index": i}

    def loads(self) -> int:
        """``__getitem__`` calls so far, by this process and its workers."""
        return int(self.calls.sum())


class EstimatedSampler(Sampler):
    """One DP replica's share of a filtered stream: ``actual`` indices, ``len()`` says ``claimed``.

    The length of data filtered while it is read is only an estimate; here
    it is wrong on purpose, in the direction the round asks for.
    """

    def __init__(self, dp_rank: int, dp_size: int, actual: int, claimed: int) -> None:
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.actual, self.claimed = actual, claimed

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.dp_rank, self.dp_size * self.actual, self.dp_size))

    def __len__(self) -> int:
        return self.claimed


#: Samples per batch in exercise 6.
LOOP_BATCH = 2


def leader_loop_rounds(seed: int) -> list[tuple[int, int, int]]:
    """Exercise 6's rounds: (samples per replica, what ``len`` claims, DataLoader workers).

    First fewer samples than claimed (peers that count wait for batches that
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


def job_leader_loop(fn: Callable, actual: int, claimed: int, workers: int) -> Any:
    """Exercise 6, one round: the batches ``fn`` gave this rank, its loads, its loader's batches."""
    from ezpz_nb.data.groups import make_layout
    from ezpz_nb.ledger import batch_digest

    lay = make_layout(tp_size=2)
    ds = CountingTokens(lay.dp_size * actual)
    sampler = EstimatedSampler(lay.dp_rank, lay.dp_size, actual, claimed)
    loader = DataLoader(
        ds,
        batch_size=LOOP_BATCH,
        sampler=sampler,
        num_workers=workers,
        multiprocessing_context=_worker_start() if workers else None,
    )
    out = fn(loader, lay.tp_group)
    if out is None:
        return None
    got: list[tuple[tuple[int, ...], str] | str] = []
    for batch in out:
        if isinstance(batch, dict) and "index" in batch:
            got.append((tuple(int(i) for i in batch["index"]), batch_digest(batch)))
        else:
            got.append(f"a {type(batch).__name__}")
    idx = list(sampler)
    want = [tuple(idx[k : k + LOOP_BATCH]) for k in range(0, len(idx), LOOP_BATCH)]
    return lay.tp_rank, got, ds.loads(), want


# ----------------------------------------------------------------- 7. step count over a stream
#: Batches a stream yields at full speed; an endless stream slows down after them.
_FAST = 50


def stream_counts(seed: int, world: int) -> list[int | None]:
    """Batches per rank for exercise 7: distinct small counts, and one endless stream (None)."""
    rng = random.Random(seed)
    counts: list[int | None] = list(rng.sample(range(3, 10), world - 1))
    counts.insert(rng.randrange(world), None)
    return counts


def _stream(count: int | None) -> Iterator[dict[str, torch.Tensor]]:
    """A generator of batches: no ``len()``, and with ``count=None`` no end either."""
    k = 0
    while count is None or k < count:
        if k >= _FAST:
            time.sleep(0.05)  # an endless stream read to its end hangs, without filling memory
        yield {"input_ids": torch.full((4,), k), "index": torch.tensor([k])}
        k += 1


def job_stream(fn: Callable, counts: list[int | None]) -> Any:
    """Exercise 7: what ``fn`` returned and how often it called ``train_step``."""
    calls: list[int] = []

    def train_step(batch: Any) -> None:
        """One training step: a gradient all-reduce over every rank."""
        if not isinstance(batch, dict) or "index" not in batch:
            raise TypeError(f"train_step needs a batch from the stream, got {batch!r}")
        grad = batch["index"].float()
        dist.all_reduce(grad)  # stands in for DDP's gradient all-reduce
        calls.append(int(batch["index"][0]))

    out = fn(_stream(counts[dist.get_rank()]), train_step)
    if out is None and not calls:
        return None
    try:
        out = int(out)
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return out, len(calls)
