"""What notebook 12's read log says, counted: samples trained on unread, and words waited for.

The :class:`~.read_log.ReadLog` keeps, per rank, every read (its number in the log's one
order, its sample, its words, whether a worker read it) and every mark of the checker's
training loop (``a e s`` asked for step s, ``g e s`` got it, ``z e`` the epoch ended).
These functions read the two with the rank's ledger (which samples each step trained
on) and count; no clock enters. Pure functions over data: testable without processes.
"""

from __future__ import annotations

from typing import Any

from ezpz_nb.ledger import Ledger
from ezpz_nb.workshop.read_log import RankLog

__all__ = ["unread", "words_loaded"]


def unread(log: RankLog, ledger: Ledger, rank: int) -> list[int]:
    """Samples ``rank`` trained on with no read of theirs logged before their batch came.

    A sample that reached a step without one was made past the dataset (another dataset,
    its text made in the rank), or its batch was made after the loop's mark said it came.
    """
    first: dict[int, int] = {}
    for r in log.reads:
        first.setdefault(r.index, r.seq)
    came = {(e, s): seq for (kind, e, s), seq in log.marks.items() if kind == "g"}
    return sorted(
        {
            i
            for rec in ledger.records
            if rec.rank == rank
            for i in rec.sample_ids
            if first.get(i, float("inf")) > came.get((rec.epoch, rec.step), -1)
        }
    )


def words_loaded(log: RankLog, ledger: Ledger, rank: int) -> dict[str, Any]:
    """Words read where they hide and where they stall, from the log's order alone.

    ``hidden``: read outside every epoch (the function, ``set_epoch``, a preload);
    per epoch: ``at_start``: read by the rank's own process in the epoch's first wait;
    ``waited``: read by the rank's own process while its loop waited for a batch (its
    thread may be the reader), or by a worker after the step that trained on it asked;
    ``read``: read within the epoch at all (0 in every epoch after the first: a cache).
    A read that feeds steps of more than one epoch (the last read of its sample before
    each of their batches came) is a cache's fill: it counts as ``read`` only.
    """
    m = log.marks
    epochs = sorted({e for kind, e, _ in m if kind == "z"})
    span = {e: (m["a", e, 0], m["z", e, 0]) for e in epochs}
    waits = [(m["a", e, s], m["g", e, s]) for kind, e, s in m if kind == "g"]
    mine = [r for r in ledger.records if r.rank == rank]
    step_of = {(r.epoch, i): r.step for r in mine for i in r.sample_ids}
    fed: dict[int, set[int]] = {}  # read seq -> epochs it fed
    for r in mine:
        for i in r.sample_ids:
            feeding = [x.seq for x in log.reads if x.index == i and x.seq < m["g", r.epoch, r.step]]
            if feeding:
                fed.setdefault(max(feeding), set()).add(r.epoch)
    out: dict[str, Any] = {"hidden": 0}
    out.update({k: dict.fromkeys(epochs, 0) for k in ("at_start", "waited", "read")})
    for x in log.reads:
        epoch = next((e for e, (a, z) in span.items() if a <= x.seq <= z), None)
        if epoch is None:
            out["hidden"] += x.words
            continue
        out["read"][epoch] += x.words
        if len(fed.get(x.seq, ())) > 1:
            continue  # a cache's fill
        asked = m.get(("a", epoch, step_of.get((epoch, x.index), -1)), x.seq + 1)
        inside = any(a <= x.seq <= g for a, g in waits)
        if (not x.worker and inside) or (x.worker and x.seq > asked):
            out["waited"][epoch] += x.words
        if not x.worker and m["a", epoch, 0] <= x.seq <= m.get(("g", epoch, 0), -1):
            out["at_start"][epoch] += x.words
    return out
