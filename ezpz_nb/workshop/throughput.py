"""Exercise of notebook 12: find the straggler, then make its loader keep up.

The learner writes ``faster_loader(dataset, rank, world_size) -> DataLoader``.
:func:`check_faster_loader` starts real ranks; on each it trains the same tiny
model twice in one launch, first on :func:`slow_loader` (every rank loads in
its own process, and rank :data:`HEAVY_RANK`'s shard holds documents five
times longer), then on the learner's loader. Every document read is noted, by
whom (the rank's own training thread, or another thread or process: a worker)
and when, and the verdict is counted in words, on every rank, not timed: a
busy machine moves every clock, and two cores of one laptop run the same code
1.5x apart.

* correct: in the last epoch no rank's steps wait for more than half the words
  the heavy rank's waited for with the slow loader (a word is waited for when
  the training thread reads it inside a step, or another thread or worker
  starts reading it only after its step asked for the batch: the loading runs
  beside the steps, ahead of them: workers, a prefetching thread, a cache), or
  the work is rebalanced: every rank's samples in the last epoch hold at most
  1.5x the words of any other's (a shuffled or balanced sampler);
* wrong: samples changed, lost or repeated (checked against a fresh dataset
  by digest), or trained on without a read from the dataset the function got
  (read past it, or its notes wiped); loading moved out of the steps (before
  the first step or between epochs, by any thread or worker, or outside the steps by the training thread:
  hidden from the timings, not removed) or into the epoch's first wait; or the
  wait only moved to another rank (shards swapped, a rank slowed down).

A cache is a real fix and passes, filled as the first epoch reads or with the
whole shard at its first step: each document loads once, inside steps (where
the timings show it), and the last epoch loads nothing. The verdict names what
it costs: the shard in memory and, filled at once, a first step waiting for all.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.utils.data import DataLoader, default_collate

from ezpz_nb.ledger import Ledger, batch_digest, record
from ezpz_nb.models import TokenizingDataset
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["EXERCISE", "HEAVY_RANK", "check_faster_loader", "dataset", "slow_loader"]

EXERCISE = "faster_loader"
WORLD_SIZE = 2
#: The rank whose shard holds the long documents.
HEAVY_RANK = 1
NUM_SAMPLES, BATCH_SIZE, EPOCHS = 128, 8, 2
#: The model's width: its step (with the gradient all-reduce) takes about half as
#: long as a heavy batch's loading, so loader workers can hide most of it.
HIDDEN = 64
WORDS = 120
#: Rebalanced: the heavy rank loads at most this many times the others' words (a
#: shuffled sampler's last epoch here: 0.88x; any seed's stays within 1.5x with
#: near certainty; the slow loader's: 5x).
REBALANCED = 1.5


def dataset(world_size: int = WORLD_SIZE) -> TokenizingDataset:
    """The exercise's dataset: documents ``i % world_size == HEAVY_RANK`` are 5x longer."""
    return TokenizingDataset(
        NUM_SAMPLES, words=WORDS, heavy_rank=HEAVY_RANK, heavy_factor=5, world=world_size
    )


def slow_loader(dataset: Any, rank: int, world_size: int) -> DataLoader:
    """The starting point: each rank loads its (unshuffled) shard in its own process."""
    # Here, not at the top: the walkthrough's command line brings the launcher's torchrun
    # side, which a rank importing this module for its jobs must not load (see stops.py).
    from ezpz_nb.examples.throughput import make_loader

    return make_loader(dataset, batch_size=BATCH_SIZE)


class _Watched(TokenizingDataset):
    """The exercise's dataset, noting every document read: when, its words, and by whom.

    Reads go to a file, so DataLoader workers (other processes) and threads are
    counted too. ``main`` is the rank's training thread: it can only load in a step's
    wait for data, or outside every step, where it hides. The file's path is no public
    attribute; what a learner's code could still do to the file (empty it, read past
    this method) is caught by the ledger: every sample trained on must have been read
    here first.
    """

    def __init__(self, world_size: int, log: str) -> None:
        ref = dataset(world_size)
        super().__init__(
            ref.num_samples,
            words=ref.words,
            heavy_rank=ref.heavy_rank,
            heavy_factor=ref.heavy_factor,
            world=ref.world,
        )
        self._pid, self._log = os.getpid(), log

    def __getitem__(self, index: int) -> dict[str, Any]:
        main = os.getpid() == self._pid and threading.current_thread() is threading.main_thread()
        with open(self._log, "a") as f:  # one short append per read: whole lines
            f.write(f"{time.time()!r} {int(index)} {self.words_of(index)} {int(main)}\n")
        return super().__getitem__(index)


Load = tuple[float, int, int, bool]  # (wall-clock start, sample, words, by the training thread)


def _loads(path: str) -> list[Load]:
    with open(path) as f:
        return [(float(t), int(i), int(w), m == "1") for t, i, w, m in (line.split() for line in f)]


def _unread(loads: list[Load], ledger: Ledger) -> list[int]:
    """Samples the rank trained on that were not read from its dataset before that step ended.

    Loading is judged from the reads; a sample that reached a step without one was read
    past the recorder (through the parent class, another dataset) or its read was wiped.
    """
    first_read: dict[int, float] = {}
    for at, i, _, _ in loads:
        first_read[i] = min(at, first_read.get(i, at))
    ends = {(t.epoch, t.step): t.start_at + t.total_s + 0.01 for t in ledger.timings()}
    return sorted(
        {
            i
            for r in ledger.records
            for i in r.sample_ids
            if first_read.get(i, float("inf")) > ends.get((r.epoch, r.step), float("-inf"))
        }
    )


def _words_loaded(loads: list[Load], ledger: Ledger) -> dict[str, int]:
    """Words loaded where they hide and where they stall, from the reads and the steps.

    ``hidden``: by any thread or worker before the first step or between epochs, and
    by the training thread outside its steps (the function, ``set_epoch``);
    ``at_start``: by the training thread in the last epoch's first wait for data;
    ``in_steps``: waited for inside the last epoch's steps: read by the training thread
    there, or by any thread or worker after the step that trained on it asked for its
    batch (loaded on demand, not ahead: a helper that reads while the training thread
    waits runs nothing beside the steps). Counted per read from the order of two clock
    readings, asked and read, not from durations: a pipeline of workers reads ahead at
    any load, since each starts its next batch before the loop asks for it;
    ``last_epoch``: by any thread or worker within the last epoch (0: a cache).
    A step runs from asking for its batch to its end (the epoch's end included).
    """
    timings = ledger.timings()
    # Slack for the recorder's own hashing, which no part of a step counts.
    spans = [(t.start_at, t.start_at + t.total_s + 0.01) for t in timings]
    by_epoch: dict[int, list[tuple[float, float]]] = {}
    for span, t in zip(spans, timings, strict=True):
        by_epoch.setdefault(t.epoch, []).append(span)

    def window(s: list[tuple[float, float]]) -> tuple[float, float]:
        return min(a for a, _ in s), max(b for _, b in s)

    epochs = [window(s) for s in by_epoch.values()]

    def within(at: float, windows: list[tuple[float, float]]) -> bool:
        return any(a <= at <= b for a, b in windows)

    last = by_epoch.get(EPOCHS - 1, [])
    whole_last = [window(last)] if last else []
    asked = {t.step: t.start_at for t in timings if t.epoch == EPOCHS - 1}
    step_of = {i: r.step for r in ledger.records if r.epoch == EPOCHS - 1 for i in r.sample_ids}

    def waited(at: float, i: int, main: bool) -> bool:
        if main:
            return within(at, last)
        return within(at, whole_last) and i in step_of and at >= asked.get(step_of[i], at + 1)

    first = [
        (t.start_at, t.start_at + t.data_s + 0.01)
        for t in timings
        if t.epoch == EPOCHS - 1 and t.step == 0
    ]
    return {
        "hidden": sum(
            w
            for at, _, w, main in loads
            if not within(at, epochs) or (main and not within(at, spans))
        ),
        "at_start": sum(w for at, _, w, main in loads if main and within(at, first)),
        "in_steps": sum(w for at, i, w, main in loads if waited(at, i, main)),
        "last_epoch": sum(w for at, _, w, _ in loads if within(at, whole_last)),
    }


def _train_on(fn: Callable[..., Any], seed: int) -> dict[str, Any] | None:
    from ezpz_nb.examples.throughput import train  # not at the top: see slow_loader

    rank, world = dist.get_rank(), dist.get_world_size()
    fd, path = tempfile.mkstemp(prefix="ezpz-nb12-reads-")
    os.close(fd)
    try:
        started = time.perf_counter()
        watched = _Watched(world, path)
        loader = fn(watched, rank, world)
        if loader is None:
            return None
        with record(loader, publish=False) as rec:
            train(rec, epochs=EPOCHS, hidden=HIDDEN)
        wall = time.perf_counter() - started
        loads = _loads(path)
    finally:
        os.remove(path)
    ledger = rec.ledger()
    steps = sum(t.total_s for t in ledger.timings())
    # Samples checked against a fresh dataset: a few steps per rank, drawn anew.
    reference = dataset(world)
    picks = random.Random(seed + rank).sample(ledger.records, min(3, len(ledger.records)))
    changed = [
        (r.epoch, r.step)
        for r in picks
        if batch_digest(default_collate([reference[i] for i in r.sample_ids])) != r.digest
    ]
    # Time outside every step: the function itself, set_epoch, the recorder's hashing.
    # Loading hidden there is judged on the words loaded there, which no other process
    # on the machine moves; the time only words the verdict.
    return {
        "ledger": ledger,
        "outside_s": wall - steps,
        "words": _words_loaded(loads, ledger),
        "unread": _unread(loads, ledger),
        "changed": changed,
    }


def job_faster_loader(fn: Callable[..., Any], seed: int) -> dict[str, Any] | None:
    """On each rank: train on :func:`slow_loader`, then on ``fn``'s loader (one launch)."""
    from ezpz_nb.examples.throughput import train  # not at the top: see slow_loader

    # An unwritten answer says so before anything is measured.
    if fn(dataset(dist.get_world_size()), dist.get_rank(), dist.get_world_size()) is None:
        return None
    # The first training in a process pays one-off costs (seconds on a busy
    # machine) outside its steps: pay them before anything is compared.
    warm = [dataset(dist.get_world_size())[dist.get_rank()]]
    with record([default_collate(warm)], publish=False) as rec:
        train(rec, hidden=HIDDEN)
    slow = _train_on(slow_loader, seed)
    yours = _train_on(fn, seed)
    return None if yours is None else {"slow": slow, "yours": yours}


def _words_per_rank(ledger: Ledger, epoch: int) -> dict[int, int]:
    """``{rank: words of the documents it loaded in epoch}``, from the ledger's sample ids."""
    data = dataset(len(ledger.ranks()))
    return {
        rank: sum(
            data.words_of(i)
            for r in ledger.records
            if r.rank == rank and r.epoch == epoch
            for i in r.sample_ids
        )
        for rank in ledger.ranks()
    }


def check_faster_loader(
    fn: Callable[[Any, int, int], DataLoader], *, timeout: float = 2 * CHECK_TIMEOUT
) -> CheckResult:
    """Judge ``fn(dataset, rank, world_size) -> DataLoader`` on the heavy rank's data wait.

    Args:
        fn: The learner's loader factory; it gets the dataset, the rank and the
            world size, and returns what the training loop iterates.
        timeout: Seconds before the ranks are reported as hung.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        got = run_learner(
            job_faster_loader, fn, fresh_seed(), world_size=WORLD_SIZE, timeout=timeout
        )
        for rank, out in enumerate(got):
            if out is None:
                raise wrong(f"rank {rank} got None from your function: return a DataLoader.")
            if out["yours"]["changed"]:
                epoch, step = out["yours"]["changed"][0]
                raise wrong(
                    f"rank {rank}'s batch at epoch {epoch} step {step} differs from the dataset's "
                    "samples: change how they are loaded, not what they are."
                )
        for rank, out in enumerate(got):
            if out["yours"]["unread"]:
                unread = out["yours"]["unread"]
                raise wrong(
                    f"rank {rank} trained on {len(unread)} samples (e.g. {unread[0]}) that were "
                    "never read from the dataset your function got, before their step: read "
                    "every sample through that dataset's own dataset[i] (a loader, a wrapper or "
                    "a cache over it), not past it, and leave what it notes alone."
                )
        yours = Ledger.from_results([o["yours"]["ledger"] for o in got], num_samples=NUM_SAMPLES)
        slow = Ledger.from_results([o["slow"]["ledger"] for o in got], num_samples=NUM_SAMPLES)
        problems = yours.check()
        if problems:
            raise wrong(f"every sample once per epoch, on one rank: {problems[0].message}")
        last = EPOCHS - 1
        slow_words = _words_per_rank(slow, last)[HEAVY_RANK]
        for rank, out in enumerate(got):
            hidden = out["yours"]["words"]["hidden"]
            if hidden > 0.5 * slow_words:
                hidden_s = out["yours"]["outside_s"] - out["slow"]["outside_s"]
                raise wrong(
                    f"rank {rank} loaded {hidden:,} words of documents outside its steps (in "
                    f"your function, set_epoch, or a thread or worker done before the steps "
                    f"began), {1e3 * max(hidden_s, 0.0):.0f} ms more than the slow loader "
                    f"spent there; an epoch of rank {HEAVY_RANK}'s shard holds {slow_words:,} "
                    "words. Loading ahead of the loop hides the wait from the timings, it does "
                    "not remove it. Let the loader work while the steps run (workers, "
                    "prefetch_factor, persistent_workers)."
                )
        for rank, out in enumerate(got):
            at_start = out["yours"]["words"]["at_start"]
            if at_start > 0.5 * slow_words:
                first = sum(t.data_s for t in yours.timings(last) if t.rank == rank and t.step == 0)
                raise wrong(
                    f"rank {rank}'s last epoch waited {1e3 * first:.0f} ms for its first batch: "
                    f"its own thread loaded {at_start:,} words then, of the {slow_words:,} of "
                    f"rank {HEAVY_RANK}'s epoch. The wait moved to the epoch's start, it did not "
                    "go away: load while the steps run (workers, prefetching)."
                )
        # Counted on every rank: the wait moved to another rank (shards swapped, a rank
        # slowed down) is no fix, and a rank's clock under load decides nothing. Waited-for
        # words as a share of the slow loader's, measured on a loaded 2-core machine (5-8
        # draws each): a helper thread reading on demand 1.00; two workers on the heavy rank
        # 0.20, on every rank 0.125 (the epoch's first batch); a prefetching thread 0.125-0.36
        # (one thread, GIL-bound: it halves the wait at best); caches 0. The bar: 0.5.
        stalls = {r: out["yours"]["words"]["in_steps"] for r, out in enumerate(got)}
        before = got[HEAVY_RANK]["slow"]["words"]["in_steps"]
        worst = max(stalls, key=lambda r: stalls[r])
        measured = (
            f"In the last epoch, rank {HEAVY_RANK}'s steps waited while {before:,} words "
            f"loaded with the slow loader; with yours the most any rank's waited for is "
            f"{stalls[worst]:,} (rank {worst})."
        )
        if stalls[worst] <= before / 2 and any(o["yours"]["words"]["last_epoch"] for o in got):
            return f"{measured} The loading runs beside the steps."
        if stalls[worst] <= before / 2:
            return (
                f"{measured} No rank loaded anything in the last epoch: a cache. It loads every "
                "document once, in the first epoch, and holds the whole shard in memory; filled "
                "at once at the first step, that step waits for the whole shard, and the other "
                "ranks wait for it in the all-reduce. A fix for several epochs over a shard "
                "that fits in memory; one epoch gains nothing."
            )

        # Rebalanced: judged on the work each rank loaded in the last epoch (the words of
        # the samples the ledger recorded), not on time. Two ranks' clocks do not compare
        # on the machines this runs on: here the two vCPUs ran the same loop up to 1.45x
        # apart in CPU time, and laptops mix fast and slow cores; a balanced loader's
        # ranks measured up to 1.7x apart, so a timing rule failed right answers.
        work = _words_per_rank(yours, last)
        # Sorted by words, then rank: two different ranks named even when the counts tie.
        order = sorted(work, key=lambda r: (work[r], r))
        least, most = order[0], order[-1]
        balance = (
            f"In the last epoch rank {most} loaded {work[most]:,} words, "
            f"rank {least} {work[least]:,}."
        )
        if work[most] <= REBALANCED * work[least]:
            return f"{measured} {balance} The work is rebalanced."
        raise wrong(
            f"{measured} {balance} Load beside the steps on every rank (more workers for the "
            "heavy rank, prefetching), or spread the long documents over the ranks, so that "
            "no rank stalls the others."
        )

    return judge(EXERCISE, body)
