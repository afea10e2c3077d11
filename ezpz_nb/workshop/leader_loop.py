"""Notebook 05, exercise 6 (after notebook 04): a leader reads the loader, its peers receive.

``check_leader_batches(fn)``: ``fn(loader, group)`` yields the leader's batches on every
rank of ``group``. Its job hands every rank of 4 real gloo ranks (dp 2 x tp 2) a
DataLoader over a filtered stream whose ``len()`` lies and which counts the items read
from it (DataLoader workers included): the checker judges who read the data and
what each rank yielded, not what the learner's code says about itself.
"""

from __future__ import annotations

import random
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, CheckStopped, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_leader_batches"]


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


def _round_setting(k: int, actual: int, claimed: int, workers: int) -> str:
    batches, said = -(-actual // LOOP_BATCH), -(-claimed // LOOP_BATCH)
    also = f", {workers} DataLoader workers" if workers else ""
    return (
        f"round {k + 1}: the leader's loader yields {batches} batches, its len() says {said}{also}"
    )


def _loop_round(got: list[Any], actual: int, setting: str) -> None:
    setting = f" ({setting})"
    for r, (tp_rank, mine, loads, want) in enumerate(got):
        leader = r - tp_rank
        sent = got[leader][1]
        bad = [b for b in mine if isinstance(b, str)]
        if bad:
            raise wrong(
                f"rank {r} yielded {bad[0]}{setting}: yield the batches (dicts) themselves."
            )
        if tp_rank == 0:
            if [ids for ids, _ in mine] != want:
                raise wrong(
                    f"the leader, rank {r}, yielded {len(mine)} batches, but its "
                    f"loader has {len(want)}{setting}: iterate the loader itself "
                    "to its end: len() is only an estimate."
                )
            if loads != actual:
                raise wrong(
                    f"rank {r}'s stream was read {loads} times for {actual} "
                    f"items{setting}: the leader reads each item once."
                )
        else:
            if loads:
                raise wrong(
                    f"rank {r} (a TP peer) read its stream {loads} times, itself or "
                    f"through its DataLoader workers{setting}: only the leader loads; "
                    "peers must not iterate the loader, only receive."
                )
            if mine != sent:
                n_same = sum(1 for a, b in zip(mine, sent, strict=False) if a == b)
                raise wrong(
                    f"rank {r} (a TP peer) yielded {len(mine)} batches, {n_same} of "
                    f"them its leader's; the leader (rank {leader}) yielded "
                    f"{len(sent)}{setting}: peers must yield exactly the leader's "
                    "batches and stop when the leader says the epoch ended. Nothing "
                    "but reading the stream tells how many batches it holds."
                )


def check_leader_batches(
    fn: Callable[[Any, Any], Iterable[Any]],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 6: ``fn(loader, group)`` yields the leader's batches on every rank of ``group``.

    4 ranks as dp 2 x tp 2; every rank gets a DataLoader over a filtered stream
    (an ``IterableDataset``) that counts the items read from it (workers
    included): how many batches it holds is known only by reading it, and its
    ``len()`` lies: first it claims more batches than come, then fewer (with 2
    workers), in amounts drawn per check. Judged by the counts and by what each rank
    yielded: the leader yields every batch of its loader and reads each
    sample once; its peers read nothing and yield exactly the leader's
    batches, byte for byte; no rank waits for a batch that never comes.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        # Drawn here, after the answers were sent (see verdicts.judge).
        rounds = leader_loop_rounds(fresh_seed())
        for k, (actual, claimed, workers) in enumerate(rounds):
            setting = _round_setting(k, actual, claimed, workers)
            try:  # one launch per round, so that a hang says which lie caused it
                got = run_learner(
                    job_leader_loop, fn, actual, claimed, workers, timeout=timeout, cluster=cluster
                )
            except CheckStopped as v:
                if v.status != "wrong":
                    raise
                raise wrong(f"In {setting}: {v.message}") from None
            each_returned(got, "an iterable of batches")
            _loop_round(got, actual, setting)
        return (
            "In both rounds only the leaders (ranks 0 and 2) read their streams, once "
            "per item, and every peer yielded its leader's batches, ending with it, "
            "whether len() claimed more batches or fewer."
        )

    return judge("leader_batches", body)
