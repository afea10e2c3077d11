"""What notebook 12's read log says, counted: samples trained on unread, and words waited for.

The :class:`~.read_log.ReadLog` keeps, per rank (a :class:`RankLog`), every read and
every load (a :class:`Read`: its number in the log's one order, its sample, its words,
whether a worker read it, the loop's steps the kernel had counted then) and every mark of
the checker's training loop (``a e s`` asked for step s, ``g e s`` got it, ``z e`` the
epoch ended). These functions read them with the rank's ledger (which samples each step
trained on) and count; no clock enters. Pure functions over data: testable without
processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.ledger import Ledger

__all__ = ["PREFETCH_DEPTH", "RankLog", "Read", "loaded_unread", "unread", "words_loaded"]


@dataclass(frozen=True)
class Read:
    """One read or load, as the notebook's process logged it: its place in the order, by whom.

    A read is ``dataset.document(i)`` (the text asked for); a load is ``dataset[i]``
    finished (the text tokenized: its ``done``), which ``began`` at its read (its own
    ``seq`` when it read nothing: the text kept from before).
    """

    seq: int
    index: int
    words: int
    worker: bool  # read by another process than the rank's (a DataLoader worker)
    steps: int = -1  # the rank's loop steps finished then, by the kernel's count (-1: unknown)
    began: int = 0
    began_steps: int = -1
    batch: int = -1  # the batch a DataLoader worker was fetching as it loaded (-1: none)
    loop: bool = False  # loaded by the rank's thread that runs the checker's loop (it says so)


@dataclass
class RankLog:
    """One rank's events in the log's order: its reads and its loop's marks."""

    pid: int = 0
    reads: list[Read] = field(default_factory=list)
    loads: list[Read] = field(default_factory=list)
    marks: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (kind, e, s) -> seq
    last: tuple[str, int, int] = ("z", -1, 0)  # the loop's last mark (none yet: before epoch 0)
    marking: bool = False  # its mark connection is claimed
    gets: int = 0  # "g" marks so far: the loop's steps


def unread(log: RankLog, ledger: Ledger, rank: int) -> list[int]:
    """Samples ``rank`` trained on with no read and no load of theirs before their batch came.

    A sample that reached a step without one was made past the dataset (another dataset,
    its text made in the rank, tokenized past ``dataset[i]``), or its batch was made after
    the loop's mark said it came.
    """
    first: dict[int, int] = {}
    for r in log.reads:
        first.setdefault(r.index, r.seq)
    loaded: dict[int, int] = {}
    for r in log.loads:
        loaded.setdefault(r.index, r.seq)
    came = {(e, s): seq for (kind, e, s), seq in log.marks.items() if kind == "g"}
    return sorted(
        {
            i
            for rec in ledger.records
            if rec.rank == rank
            for i in rec.sample_ids
            if max(first.get(i, float("inf")), loaded.get(i, float("inf")))
            > came.get((rec.epoch, rec.step), -1)
        }
    )


def loaded_unread(log: RankLog, ledger: Ledger, rank: int) -> list[int]:
    """Samples trained on whose load the log got before the text their batch was made from
    was read: a ``done`` sent ahead of its work, past ``dataset[i]`` (issue 45's seventh trial).

    A read asks for a text to tokenize it (``dataset[i]``), and the log gets that load's end
    after the read: before a batch comes, the last read of each of its samples is followed
    by a load of it. A batch that comes first was made from a text read and tokenized
    unlogged, its ``done`` sent earlier (beside the step before). A cache, of samples or of
    texts, loads after its last read as well. (A sample never read at all: :func:`unread`.)
    """
    reads: dict[int, list[int]] = {}
    for r in log.reads:
        reads.setdefault(r.index, []).append(r.seq)
    came = {(e, s): seq for (kind, e, s), seq in log.marks.items() if kind == "g"}
    out: set[int] = set()
    for rec in (r for r in ledger.records if r.rank == rank):
        g = came.get((rec.epoch, rec.step), -1)
        for i in rec.sample_ids:
            last = max((q for q in reads.get(i, ()) if q < g), default=-1)
            if last >= 0 and not any(last <= x.seq < g for x in log.loads if x.index == i):
                out.add(i)
    return sorted(out)


def words_loaded(log: RankLog, ledger: Ledger, rank: int) -> dict[str, Any]:
    """Words loaded where they hide and where they stall, from the log's order alone.

    A load (``dataset[i]`` done: the text read and tokenized) counts where it ends.
    ``hidden``: ended outside every epoch (the function, ``set_epoch``, a preload);
    per epoch: ``at_start``: ended in the epoch's first wait and not dispatched (below);
    ``waited``: ended by the loop's own thread anywhere in the epoch; or ended while its
    loop waited for a batch and not dispatched: in the rank's own process (any of its
    threads), or in a worker but not for the one batch the DataLoader had asked that
    worker to fetch (a ``worker_init_fn``, or other batches' samples loaded with its own:
    a preload, where a prefetch of any depth loads only what was asked); or began in a worker after the step that trained on it asked; or
    (any reader) for a step t's batch once the kernel counted t steps' all-reduces (the
    loop had finished step t-1 and was asking for t: what the loop's own marks say unless
    they were moved); ``read``: ended within the epoch at all (0 in every epoch after the
    first: a cache). A load that feeds steps of more than one epoch (the last load of its
    sample before each of their batches came) is a cache's fill: it counts as ``read`` only.
    ``ahead``: per epoch, how many steps past the batches its loop had taken the rank's own
    process (any thread) ended a load, cache fills aside: a bounded prefetch stays within
    :data:`PREFETCH_DEPTH`; the epoch loaded at once (a thread per sample) does not.
    """
    m = log.marks
    epochs = sorted({e for kind, e, _ in m if kind == "z"})
    span = {e: (m["a", e, 0], m["z", e, 0]) for e in epochs}
    waits = {(e, s): (m["a", e, s], m["g", e, s]) for kind, e, s in m if kind == "g"}
    mine = [r for r in ledger.records if r.rank == rank]
    step_of = {(r.epoch, i): r.step for r in mine for i in r.sample_ids}
    # The loop's step count (what the kernel counts) where each epoch begins.
    first = {e: sum(1 for r in mine if r.epoch < e) for e in epochs}
    fed: dict[int, set[int]] = {}  # load seq -> epochs it fed
    # Steps fed by what a DataLoader worker loaded while fetching batch b of an epoch: one
    # step when it loaded what it was asked for.
    fetched: dict[tuple[int, int], set[int | None]] = {}
    for x in log.loads:
        epoch = _epoch_of(span, x.seq)
        if x.worker and x.batch >= 0 and epoch is not None:
            fetched.setdefault((epoch, x.batch), set()).add(step_of.get((epoch, x.index)))
    for r in mine:
        for i in r.sample_ids:
            feeding = [x.seq for x in log.loads if x.index == i and x.seq < m["g", r.epoch, r.step]]
            if feeding:
                fed.setdefault(max(feeding), set()).add(r.epoch)
    ahead = _own_ahead(log, span, waits, step_of)
    out: dict[str, Any] = {"hidden": 0}
    out.update({k: dict.fromkeys(epochs, 0) for k in ("at_start", "waited", "read", "ahead")})
    for x in log.loads:
        epoch = _epoch_of(span, x.seq)
        if epoch is None:
            out["hidden"] += x.words
            continue
        out["read"][epoch] += x.words
        if len(fed.get(x.seq, ())) > 1:
            continue  # a cache's fill
        step = step_of.get((epoch, x.index))
        if not x.worker and step is not None:  # how far ahead of the loop its own process ran
            got = sum(1 for (e, _), (_, g) in waits.items() if e == epoch and g < x.seq)
            out["ahead"][epoch] = max(out["ahead"][epoch], step - got)
        asked = m.get(("a", epoch, step if step is not None else -1), x.seq + 1)
        counted = x.began_steps if x.worker else x.steps
        kernel = step is not None and counted >= 0 and counted >= first[epoch] + step
        # Loaded by a worker for the batch the DataLoader asked it for: a prefetch, at any
        # depth. Any other load, a worker's included (its worker_init_fn, or another
        # batch's samples fetched with its own), is the loop's wait if it ends in one,
        # unless the rank's own process prefetched it (see _own_ahead).
        dispatched = x.worker and step is not None and fetched.get((epoch, x.batch)) == {step}
        ended, alongside = ahead.get(x.seq, (_wait_of(waits, epoch, x.seq), None))
        # The loop's own thread loads nothing beside its steps: between its steps it runs
        # them, so what it loads anywhere in the epoch, the steps wait for (issue 45's
        # seventh trial loaded from a wrapper of the loop's marks, after each batch came).
        inside = (not dispatched and ended is not None) or (x.loop and not x.worker)
        if kernel or inside or alongside is not None or (x.worker and x.began > asked):
            out["waited"][epoch] += x.words
        if (not dispatched and ended == 0) or alongside == 0:
            out["at_start"][epoch] += x.words
    return out


#: How many steps ahead of the wait it ends in a load by the rank's own process may feed
#: and still be a prefetch: a thread over a queue of 4 batches (and the batch it holds)
#: ends loads up to 5 steps ahead while its loop's thread, starved by a busy machine, has
#: taken a batch but not yet marked it. Notebook 12 has 8 steps an epoch: a loader that
#: ends loads further ahead in one wait loads the epoch at once.
PREFETCH_DEPTH = 5


def _own_ahead(
    log: RankLog,
    span: dict[int, tuple[int, int]],
    waits: dict[tuple[int, int], tuple[int, int]],
    step_of: dict[tuple[int, int], int],
) -> dict[int, tuple[int | None, int | None]]:
    """Loads by the rank's own process that a wait does not explain alone, by load seq:
    ``(ended, alongside)``, the step whose wait it counts in and the step whose wait it
    ran alongside (None: neither).

    The rank's threads share one interpreter, and a busy machine can starve the loop's
    thread while a prefetching thread runs on: its loads for later steps then end in the
    loop's wait, as many as its queue holds, whatever the load (issue 45: a queue of 3
    ended 4.25 batches in a first wait, rejected at half the epoch). So a load for step u
    ending in the wait for step t is a prefetch (ended None) when t < u <= t +
    PREFETCH_DEPTH, it began after step t's batch was loaded (one load after another, not
    beside it), and no load of that wait fed a step further ahead (a bounded queue; the
    whole epoch at the first step is no prefetch: every load of that wait counts). A load
    for a later step that began in the wait for step t before step t's batch was loaded
    ran alongside it, in the same interpreter, and counts in that wait wherever it ends
    (threads started for the whole epoch at its first step). The loop's own thread
    (``x.loop``, as the rank's side of the log says) prefetches nothing: what it loads
    while its loop waits, the loop waits for (a few batches at once).
    """
    own = [(x, _epoch_of(span, x.seq)) for x in log.loads if not x.worker]
    last: dict[tuple[int, int], int] = {}  # (epoch, t): the last own load of step t's batch
    far: set[tuple[int, int]] = set()  # waits that ended an own load beyond the depth
    for x, e in own:
        u = step_of.get((e, x.index)) if e is not None else None
        if u is None or e is None:
            continue
        if x.seq < waits.get((e, u), (0, -1))[1]:
            last[e, u] = max(last.get((e, u), -1), x.seq)
        t = _wait_of(waits, e, x.seq)
        if t is not None and u - t > PREFETCH_DEPTH:
            far.add((e, t))
    out: dict[int, tuple[int | None, int | None]] = {}
    for x, e in own:
        u = step_of.get((e, x.index)) if e is not None else None
        if u is None or e is None:
            continue
        t, b = _wait_of(waits, e, x.seq), _wait_of(waits, e, x.began)
        after = t is not None and x.began >= last.get((e, t), -1)
        prefetched = not x.loop and t is not None and t < u <= t + PREFETCH_DEPTH and after
        beside = b is not None and u > b and x.began < last.get((e, b), -1)
        ended = None if prefetched and (e, t) not in far else t
        out[x.seq] = (ended, b if beside else None)
    return out


def _wait_of(waits: dict[tuple[int, int], tuple[int, int]], epoch: int, seq: int) -> int | None:
    """The step of ``epoch`` whose wait (its ask to its batch) encloses ``seq``, or None."""
    return next((s for (e, s), (a, g) in waits.items() if e == epoch and a <= seq <= g), None)


def _epoch_of(span: dict[int, tuple[int, int]], seq: int) -> int | None:
    """The epoch whose marks (its first ask to its end) enclose ``seq``, or None (outside)."""
    return next((e for e, (a, z) in span.items() if a <= seq <= z), None)
