"""Exercise of notebook 12: find the straggler, then make its loader keep up.

The learner writes ``faster_loader(dataset, rank, world_size) -> DataLoader``.
:func:`check_faster_loader` starts real ranks; on each it trains a tiny model for
:data:`EPOCHS` epochs on the learner's loader. The documents' text comes from the
notebook's process (:class:`~.read_log.ReadLog`), which numbers every read, every
finished load (``dataset[i]``: read and tokenized) and every mark of the training loop
in one order, and counts each load's words itself; at each event it also reads how many
steps' gradient all-reduces the rank has finished, from the kernel's byte counters of
its gloo connections (:mod:`.step_bytes`): what the verdict rests on never lives in the
rank, and it is counted, not timed (a busy machine moves every clock, and two cores of
one laptop run the same code 1.5x apart). With
:func:`slow_loader`, rank :data:`HEAVY_RANK` (whose documents are five times longer)
waits for every word of its shard, every epoch: that is the bar.

Every epoch is judged, on every rank:

* correct: no rank's steps wait for more than half the words the slow loader's heavy
  rank waits for (a word is waited for when the rank's own process finishes loading it
  while its loop waits for a batch, or a worker does and the DataLoader had not asked it
  for that word's batch (its ``worker_init_fn``, or other batches loaded with the one it
  was fetching: :func:`.read_log.fetching`), or a worker starts reading it after its step
  asked, or any reader loads step t's sample once the kernel counted t steps'
  all-reduces: loading beside the steps, ahead of them, is not: workers prefetching at
  any depth, a prefetching thread, a cache), or
  the work is rebalanced: every rank's samples hold at most 1.5x the words of any
  other's, and at every step too (a shuffled or balanced sampler): summed over the epoch's
  steps, each step's slowest rank holds at most 1.4x the ranks' mean words
  (:mod:`.work_balance`; the slow loader's, and heavy documents read by each rank in
  another half of the epoch, 1.67x: issue 45's twelfth trial);
* wrong: samples changed, lost or repeated (checked against the reference by digest),
  or trained on without a read and a load through the dataset the function got, or with
  a load logged before the text it was made from was read (its end sent ahead of its
  work, issue 45's seventh trial: the tokenizing done in the wait, unlogged); the
  loop's all-reduces held back or skipped (a batch came before the kernel counted the
  earlier steps' bytes, or fewer steps' bytes than steps); loading moved out of
  the steps (before the first step or between epochs: hidden from the steps, not
  removed) or into an epoch's first wait (a worker's included: the whole shard loaded
  in its ``worker_init_fn`` at every epoch, issue 45's sixth trial); or the wait only
  moved to another rank, or to another epoch.

A cache is a real fix and passes, filled as the first epoch reads or with the whole
shard at its first step: a read that feeds more than one epoch's step is a cache's fill,
loaded once inside the steps, and counts against no epoch. The verdict names what it
costs: the shard in memory and, filled at once, a first step waiting for all.

A cache of the documents' text (not of ``dataset[i]``'s samples) reads each document
once and tokenizes it again every epoch: each tokenizing is a load, counted where it
ends, so it waits as the slow loader does (issue 45's fifth trial passed it when reads
were counted). The rank's own threads share one interpreter: on a busy machine the
loop's thread can be starved while a prefetching thread runs on and ends its queue's
loads in the loop's wait (a queue of 3 ended 4.25 of the epoch's 8 batches in the first
wait, rejected by the load alone). So a load of the rank's own process for a later step,
up to :data:`.read_counts.PREFETCH_DEPTH` steps ahead, loaded after the awaited batch, is
a prefetch (never one by the loop's own thread); a wait that ends a load further ahead
counts whole, and a load begun beside the awaited batch's loads counts in that wait
wherever it ends. A load by the rank's own process (cache fills aside) that ends more
than that depth past the batches its loop had taken is the epoch loaded at once (a
thread per sample started at the first batch outruns the loop it starves): "moved to
the epoch's start".

Not judged: the rank's code can still send the loop's marks and run its all-reduces
when it likes, both held back to the epoch's end in step (patching torch.distributed and
the loop's wrapper in the rank); the log then shows every read made early, as a deep
prefetcher's are, and only a clock could tell the two apart. Bytes of the learner's own
collectives before the loop make every later read look later (stricter, never laxer).
Where the kernel's counters cannot be read (not Linux), only the loop's marks place the
reads. Which of the rank's threads loaded is what the rank says (the dataset tags a load
by the thread that runs the loop): a thread that loads up to that depth of batches at a
time while the loop joins it reads as a prefetching thread whose loop was starved, and so
does the loop's thread reading the next batch's text and sending its load's end untagged
as each batch comes, then tokenizing the kept text in the wait. Which
batch a worker was asked for is read from torch's worker loop in the worker: code there
that fakes that loop's frame is believed. The rank's CPU time, read from ``/proc`` here,
does not place the work either (measured for issue 45's seventh trial): the heavy rank's
tokenizing costs it 20-30 ms of CPU an epoch, no more than a right answer's loop spends
in its waits when it starts two fresh DataLoader workers every epoch (25-30 ms).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, default_collate

from ezpz_nb.ledger import Ledger, batch_digest, record
from ezpz_nb.models import TokenizingDataset
from ezpz_nb.workshop.read_counts import PREFETCH_DEPTH, loaded_unread, unread, words_loaded
from ezpz_nb.workshop.read_log import Marked, ReadLog, ServedDocuments, claim
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, fresh_seed, wrong
from ezpz_nb.workshop.work_balance import (
    STEP_BALANCED,
    StepWords,
    step_words,
    unequal_batches,
    words_per_rank,
)

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["EXERCISE", "HEAVY_RANK", "check_faster_loader", "dataset", "slow_loader"]

EXERCISE = "faster_loader"
WORLD_SIZE = 2
#: The rank whose shard holds the long documents.
HEAVY_RANK = 1
NUM_SAMPLES, BATCH_SIZE, EPOCHS = 128, 8, 2
#: The model's width. Wide enough that a step's time is spent mostly in torch's kernels,
#: which release the GIL, so a loader thread in the rank's own process (a prefetching
#: thread) reads beside the step. At 64 the step was mostly Python holding the GIL, and
#: such a thread's waited-for words under two busy spinners spread from 0.14 to 0.62 of the
#: slow loader's (3 of 16 checks over the bar of 0.5: a right answer judged by the
#: machine's load); at 256: 0.12-0.45 over 60 checks, none over, and a check took no longer.
HIDDEN = 256
WORDS = 120
#: Rebalanced: the heavy rank loads at most this many times the others' words (a
#: shuffled sampler's epoch here: 0.88x; any seed's stays within 1.5x with near
#: certainty; the slow loader's: 5x).
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


def job_faster_loader(fn: Callable[..., Any], address: str) -> Ledger | None:
    """On each rank: claim this rank's connections to the read log, then train on ``fn``'s loader.

    Before the learner's code: one step's gradient all-reduce (zeros of ``train``'s
    parameter shapes) between two syncs on the log, where the log's process measures its
    bytes (:mod:`.step_bytes`); the second sync also holds every rank's learner code back
    until every rank holds its connections, so no rank's code can claim another's. A third
    sync after the loop counts the loop's all-reduces.
    """
    from ezpz_nb.examples.throughput import train  # not at the top: see slow_loader
    from ezpz_nb.models.tokenizing import VOCAB_SIZE

    rank, world = dist.get_rank(), dist.get_world_size()
    served = ServedDocuments(dataset(world), address, rank)
    mark = claim(address, f"mark {rank}")
    mark("sync 0")
    h = HIDDEN  # train's parameters, in its model's order: embedding, two linear layers
    for shape in ((VOCAB_SIZE, h), (4 * h, h), (4 * h,), (VOCAB_SIZE, 4 * h), (VOCAB_SIZE,)):
        dist.all_reduce(torch.zeros(shape))
    mark("sync 1")
    loader = fn(served, rank, world)
    if loader is None:
        return None
    with record(Marked(loader, mark), publish=False, timings=False) as rec:
        train(rec, epochs=EPOCHS, hidden=HIDDEN)
    mark("sync 2")
    return rec.ledger()


def _skipped(log: ReadLog) -> list[str]:
    """Ranks whose loop's all-reduces the kernel did not count in full (held back, skipped)."""
    out = []
    for rank, unit in log.bytes.unit.items():
        steps, total = log.ranks[rank].gets, log.bytes.total.get(rank, 0)
        if unit > 0 and total < steps * unit:
            out.append(
                f"rank {rank}'s loop took {steps} steps; the kernel counted the bytes of "
                f"{total / unit:.1f} steps' all-reduces"
            )
    return out


def _changed(ledger: Ledger, seed: int) -> list[tuple[int, int, int]]:
    """``(rank, epoch, step)`` of batches that differ from the reference (a few drawn per rank)."""
    reference, rng, out = dataset(), random.Random(seed), []
    for rank in ledger.ranks():
        mine = [r for r in ledger.records if r.rank == rank]
        for r in rng.sample(mine, min(3, len(mine))):
            if batch_digest(default_collate([reference[i] for i in r.sample_ids])) != r.digest:
                out.append((rank, r.epoch, r.step))
    return out


_UNREAD = (
    "rank {rank} trained on {n} samples (e.g. {i}) that were never read from the dataset your "
    "function got, before their batch came: read every sample through that dataset's own "
    "dataset[i] (a loader, a wrapper or a cache over it), not past it."
)
_AHEAD = (
    "rank {rank}'s log says sample {i} was loaded before the text it was made from was read "
    "(a load's end sent ahead of its work): the log counts a load where dataset[i] ends. Load "
    "every sample through dataset[i] and leave the checker's connections and its loop's marks "
    "alone."
)


def _evidence(fn: Callable[..., Any], timeout: float, cluster: Any) -> tuple[Ledger, dict]:
    """Train on the learner's loader; the ranks' ledger and each rank's words, or a stop."""
    from ezpz_nb.workshop.verdicts import run_learner  # see check_faster_loader

    with ReadLog(dataset()) as log:
        got = run_learner(
            job_faster_loader,
            fn,
            log.address,
            world_size=WORLD_SIZE,
            timeout=timeout,
            cluster=cluster,
        )
    for rank, out in enumerate(got):
        if out is None:
            raise wrong(f"rank {rank} got None from your function: return a DataLoader.")
    ended = all(log.ranks[r].last[0] == "z" for r in range(WORLD_SIZE))
    faults = log.faults + log.bytes.faults + _skipped(log)
    if faults or not ended:
        fault = faults[0] if faults else "a loop whose last epoch never ended"
        raise wrong(
            f"the checker's read log was not kept as its loop ran ({fault}): read every "
            "document through the dataset you are given, and leave the checker's connections, "
            "its loop and its all-reduces alone."
        )
    ledger = Ledger.from_results(got, num_samples=NUM_SAMPLES)
    changed = _changed(ledger, fresh_seed())
    if changed:
        rank, epoch, step = changed[0]
        raise wrong(
            f"rank {rank}'s batch at epoch {epoch} step {step} differs from the dataset's "
            "samples: change how they are loaded, not what they are."
        )
    for rank in range(WORLD_SIZE):
        for find, say in ((unread, _UNREAD), (loaded_unread, _AHEAD)):
            found = find(log.ranks[rank], ledger, rank)
            if found:
                raise wrong(say.format(rank=rank, n=len(found), i=found[0]))
    problems = ledger.check()
    if problems:
        raise wrong(f"every sample once per epoch, on one rank: {problems[0].message}")
    return ledger, {r: words_loaded(log.ranks[r], ledger, r) for r in range(WORLD_SIZE)}


def check_faster_loader(
    fn: Callable[[Any, int, int], DataLoader],
    *,
    timeout: float = 2 * CHECK_TIMEOUT,
    cluster: Any = None,
) -> CheckResult:
    """Judge ``fn(dataset, rank, world_size) -> DataLoader`` on the words each rank waits for.

    Args:
        fn: The learner's loader factory; it gets the dataset, the rank and the
            world size, and returns what the training loop iterates.
        timeout: Seconds before the ranks are reported as hung.
        cluster: Warm ranks (an ``ez.Cluster(2)``: tests) instead of fresh ones.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        ledger, words = _evidence(fn, timeout, cluster)
        ref = dataset()
        bar = sum(ref.words_of(i) for i in range(HEAVY_RANK, NUM_SAMPLES, WORLD_SIZE))
        return _verdict(ledger, words, bar)

    return judge(EXERCISE, body)


def _verdict(ledger: Ledger, words: dict[int, dict[str, Any]], bar: int) -> str:
    """What the counted words say, epoch by epoch, or a stop at the first fault."""
    for rank, w in words.items():
        if w["hidden"] > bar / 2:
            raise wrong(
                f"rank {rank} loaded {w['hidden']:,} words of documents outside its epochs (in "
                "your function, set_epoch, or a thread or worker done before the steps began); "
                f"an epoch of rank {HEAVY_RANK}'s shard holds {bar:,} words. Loading ahead of "
                "the loop hides the wait from the steps, it does not remove it. Let the loader "
                "work while the steps run (workers, prefetch_factor, persistent_workers)."
            )
    for epoch in range(EPOCHS):
        for rank, w in words.items():
            if w["at_start"][epoch] > bar / 2:
                raise wrong(
                    f"rank {rank}'s epoch {epoch} loaded {w['at_start'][epoch]:,} words while "
                    "it waited for its first batch (in its own process, or in a worker before "
                    f"the DataLoader asked for them), of the {bar:,} of rank {HEAVY_RANK}'s "
                    "epoch. The wait moved to the epoch's start, it did not go away: load "
                    "while the steps run (workers, prefetching)."
                )
    for epoch in range(EPOCHS):
        for rank, w in words.items():
            if w["ahead"][epoch] > PREFETCH_DEPTH:
                raise wrong(
                    f"rank {rank}'s own process loaded, in epoch {epoch}, a sample "
                    f"{w['ahead'][epoch]} steps past the batches its loop had taken: the epoch "
                    "loaded at once, in the process that runs the steps (its threads share one "
                    "interpreter, so the first batch waits for the rest). The wait moved to the "
                    "epoch's start, it did not go away: prefetch in a thread at most "
                    f"{PREFETCH_DEPTH} batches ahead (a bounded queue), or use DataLoader workers."
                )
    unequal = unequal_batches(ledger)
    if unequal:
        raise wrong(unequal)
    worst = {e: max(words, key=lambda r: words[r]["waited"][e]) for e in range(EPOCHS)}
    e_max = max(worst, key=lambda e: words[worst[e]]["waited"][e])
    most = words[worst[e_max]]["waited"][e_max]
    measured = (
        f"With the slow loader rank {HEAVY_RANK}'s steps wait while every word of its shard "
        f"loads, {bar:,} an epoch; with yours the most any rank's waited for in an epoch is "
        f"{most:,} (rank {worst[e_max]}, epoch {e_max})."
    )
    balanced: list[tuple[str, int, StepWords]] = []
    ref = dataset(len(ledger.ranks()))
    # The slow loader's heavy rank is every step's slowest: its shard against the mean.
    slow = bar * len(ledger.ranks()) / sum(ref.words_of(i) for i in range(NUM_SAMPLES))
    for epoch in range(EPOCHS):
        if words[worst[epoch]]["waited"][epoch] <= bar / 2:
            continue
        # Rebalanced: judged on the work each rank loaded (the words of the samples the
        # ledger recorded), not on time: two ranks' clocks do not compare on the machines
        # this runs on (two vCPUs ran the same loop up to 1.45x apart).
        work = words_per_rank(ref, ledger, epoch)
        # Sorted by words, then rank: two different ranks named even when the counts tie.
        order = sorted(work, key=lambda r: (work[r], r))
        least, top = order[0], order[-1]
        balance = (
            f"In epoch {epoch} rank {top} loaded {work[top]:,} words, rank {least} {work[least]:,}."
        )
        if work[top] > REBALANCED * work[least]:
            raise wrong(
                f"{measured} {balance} Load beside the steps on every rank, in every epoch "
                "(more workers for the heavy rank, prefetching), or spread the long documents "
                "over the ranks, so that no rank stalls the others."
            )
        # And at every step: each step waits for its slowest rank's loads (the all-reduce).
        steps = step_words(ref, ledger, epoch)
        if steps.ratio() > STEP_BALANCED:
            raise wrong(
                f"{measured} {balance} Balancing the words over the epoch is not enough: "
                f"{_per_step(epoch, steps, slow)}: at every step a rank still loads more "
                "than the others, which wait for it in the all-reduce; only which rank "
                "changes. Load beside the steps on every rank, in every epoch (more workers "
                "for the heavy rank, prefetching), or spread the long documents over the "
                "ranks within every step, so that no rank stalls the others."
            )
        balanced.append((balance, epoch, steps))
    if balanced:
        _, epoch, steps = max(balanced, key=lambda x: x[2].ratio())
        return (
            f"{measured} Each rank waits for its own loads, but no rank for another's: "
            f"{_per_step(epoch, steps, slow)}. {balanced[-1][0]} The work is rebalanced."
        )
    if any(w["read"][EPOCHS - 1] for w in words.values()):
        return f"{measured} The loading runs beside the steps."
    return (
        f"{measured} No rank loaded anything in the last epoch: a cache. It loads every "
        "document once, in the first epoch, and holds the whole shard in memory; filled "
        "at once at the first step, that step waits for the whole shard, and the other "
        "ranks wait for it in the all-reduce. A fix for several epochs over a shard "
        "that fits in memory; one epoch gains nothing."
    )


def _per_step(epoch: int, steps: StepWords, slow: float) -> str:
    """What the steps of ``epoch`` wait for, in words: the slowest rank's against the mean."""
    return (
        f"summed over epoch {epoch}'s {steps.steps} steps, each step's slowest rank loaded "
        f"{steps.slowest:,} words, {steps.ratio():.2f}x the ranks' mean of {steps.mean:,.0f} "
        f"(the slow loader's {slow:.2f}x; rebalanced: at most {STEP_BALANCED}x)"
    )
