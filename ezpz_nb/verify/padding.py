"""Rows a batch was padded with: a few batches holding more rows than samples, their
samples read again after the epoch.

:mod:`.shares` compares the DP replicas' batches by samples and by rows of data (a packer
fills fixed rows with however many samples fit). A loader can even out unequal shares by
padding every batch with rows of noise to one count (issue 45's eleventh trial: 5 and 3
samples a step, every batch 6 rows): no batch then holds a row per sample, and by the counts
alone its rows look like a packer's. The contents tell them apart. A rank keeps a few
batches of each epoch that hold more distinct rows than samples (the first such one, and
others drawn at random), and after the epoch reads each of their samples again
(:meth:`.reread.Reread.read_alone`); where every sample's own row is among the batch's rows
of one field, the field's other rows are no sample's of that batch: padding, not data. A
packer's rows hold parts of several samples, not one sample's row whole, and are never
called padding; a batch of one row per sample holds no more rows than samples and is never
kept.

A sample is read again through the loader's ``collate_fn`` first (a collate that converts
rows converts the re-read alike), then through torch's default collate for the fields the
first left with more rows than one sample's (a collate that pads whatever it is given).
A dataset that cannot say which sample it holds (:meth:`.reread.Reread.read_alone`), a
stream or a TP/CP peer (not re-read) is not judged here: its rows count as before.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ezpz_nb.data.tree import leaves
from ezpz_nb.verify.reread import Reread
from ezpz_nb.verify.samples import sample_columns

__all__ = ["KEEP_BATCHES", "Padding"]

#: Batches a rank keeps at random from each epoch to read their samples again.
KEEP_BATCHES = 3


class Padding:
    """Keeps a few batches of an epoch holding more rows than samples; :meth:`judge` reads
    their samples again after it.

    Args:
        reread: The rank's :class:`~.reread.Reread` (its dataset chain, collate and switch).
    """

    def __init__(self, reread: Reread) -> None:
        self.reread = reread
        # (epoch, step, ids, {field path: one bytes a row}) of each kept batch.
        self.kept: list[tuple[int, int, list[int], dict[str, list[bytes]]]] = []
        self.seen = 0
        self._rng = random.SystemRandom()  # drawn from the OS: not replayable in the rank

    def see(self, batch: Any, ids: list[int], key: str, held: int, epoch: int, step: int) -> None:
        """Keep ``batch`` (reservoir sampling) if it holds more distinct rows of data
        (``held``, :func:`~.batches.batch_rows`) than samples. Never raises."""
        if not self.reread.on or not ids or held <= len(ids):
            return
        try:
            counts = {
                int(leaf.shape[0])
                for path, leaf in leaves(batch)
                if len(getattr(leaf, "shape", ())) >= 2
                and int(leaf.shape[0]) > len(ids)
                and path.rsplit("/", 1)[-1] != key
            }
            self.seen += 1
            slot = (
                len(self.kept) if len(self.kept) < KEEP_BATCHES else self._rng.randrange(self.seen)
            )
            if slot >= KEEP_BATCHES or not counts:
                return
            cols: dict[str, list[bytes]] = {}
            for rows in counts:
                cols.update(sample_columns(batch, key, rows))
            self.kept[slot : slot + 1] = [(epoch, step, list(ids), cols)]
        except Exception:  # noqa: BLE001 - the user's data, read only to compare
            return

    def judge(self, deadline: float) -> list[tuple[int, int, int]]:
        """``(epoch, step, samples)`` of each kept batch whose every sample's own row is
        among its rows of one field: the field's other rows are padding. Then keeps anew (the
        next epoch). Never raises."""
        try:
            return self._judge(deadline)
        except Exception:  # noqa: BLE001 - the user's dataset and collate: never fatal here
            return []
        finally:
            self.kept, self.seen = [], 0

    def _judge(self, deadline: float) -> list[tuple[int, int, int]]:
        if not self.kept:
            return []
        from torch.utils.data import default_collate

        own = self.reread.collate()
        padded: list[tuple[int, int, int]] = []
        for epoch, step, ids, cols in self.kept:
            reads = []
            for i in ids:
                if time.monotonic() > deadline:
                    return padded
                got = self.reread.read_alone(i, own) or {}
                if any(p not in got for p in cols):
                    got = {**(self.reread.read_alone(i, default_collate) or {}), **got}
                reads.append(got)
            for path, rows in cols.items():
                there = set(rows)
                if len(rows) > len(ids) and all(r.get(path) in there for r in reads):
                    padded.append((epoch, step, len(ids)))
                    break
        return padded
