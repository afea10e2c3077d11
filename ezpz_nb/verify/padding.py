"""Rows a batch holds past its samples: a packer's or a chunker's data, or padding. Told by
reading the batch's samples again after the epoch.

:mod:`.shares` compares the DP replicas' batches by samples and by rows of data (a packer
fills fixed rows with however many samples fit). A loader can even out unequal shares by
padding its batches with rows of noise to one count (the eleventh trial: 5 and 3 samples a
step, every batch 6 rows); by the counts alone its rows look like a packer's. Their values
tell them apart. A rank keeps a few batches of each epoch that hold more distinct rows than
samples (the first such one, and others drawn at random), and after the epoch reads each of
their samples again (:meth:`.reread.Reread.read_values`: ``dataset[i]`` twice alike, by
torch's default collate, so nothing a collate adds counts as the sample's). The rows of the
field :func:`~.batches.batch_rows` counts then draw on the samples' values as a multiset,
leaving out the pad (the value the rows hold most of those no sample holds). Rows that are
one sample's run of values (a plain row, a chunk, a window) draw first, the fullest first,
then rows made of several samples' (a packer's). A row whose values are nearly all found
there and not yet taken is data, in any order (rows rolled, a BOS a row); a window may
repeat a stride of the one before, as long as it adds a value; a row that adds no value
not yet taken (a copy, a row of pads holding a copied value, a row pieced from parts of
others: the thirteenth trial), or whose values are nearly all found in no sample (noise),
is padding. And rows of data that hold the samples' values in no more than half their
places (a sample's values spread over more rows, one or two a row) were padded too.

Each kept batch is one of three:

- data: every row is data. The rank's rows past its samples are vouched for
  (:attr:`Padding.vouched`).
- padded: some rows data, some padding. :mod:`.shares` counts that rank's batches by their
  samples.
- unsure (:attr:`Padding.unsure`): a sample could not be read again (a stream, no level of
  the dataset names it, reads that differ: augmentation), a row between the two bounds, or
  no row of data at all (workers that keep their own copy of a dataset that changes). Rows
  that no re-read vouched for cannot excuse replicas' unequal samples: :mod:`.shares` says
  the step is not judged.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

from ezpz_nb.verify.batches import data_field
from ezpz_nb.verify.reread import Reread

__all__ = ["DATA_SHARE", "KEEP_BATCHES", "PADDING_SHARE", "Padding"]

#: Batches a rank keeps at random from each epoch to read their samples again.
KEEP_BATCHES = 3
#: A row is data where at most this share of its values is in no sample of the batch (a
#: packer's separator or a BOS token a row), padding where at least :data:`PADDING_SHARE`
#: is (noise); a row between is not judged (half a row copied, half noise).
DATA_SHARE = 0.25
PADDING_SHARE = 0.75


def _row(r: Any) -> tuple[Any, ...] | None:
    """A row's values, or None for a row of one value (blank: already no data)."""
    values = tuple(r.reshape(-1).tolist())
    return values if len(set(values)) > 1 or len(values) < 2 else None


def _within(part: list[Any], whole: list[Any]) -> bool:
    """Whether ``part`` is a run of consecutive values of ``whole``."""
    n = len(part)
    return any(whole[k : k + n] == part for k in range(len(whole) - n + 1) if whole[k] == part[0])


class Padding:
    """Keeps a few batches of an epoch holding more rows than samples; :meth:`judge` reads
    their samples again after it.

    Args:
        reread: The rank's :class:`~.reread.Reread` (its dataset chain and switch).
    """

    def __init__(self, reread: Reread) -> None:
        self.reread = reread
        # (epoch, step, ids, field name, its distinct rows of more than one value).
        self.kept: list[tuple[int, int, list[int], str, list[tuple[Any, ...]]]] = []
        self.seen = 0
        self.vouched = 0  # kept batches whose every row held its samples' data, all epochs
        self.unsure = 0  # kept batches not judged, all epochs
        self._rng = random.SystemRandom()  # drawn from the OS: not replayable in the rank

    def see(self, batch: Any, ids: list[int], key: str, held: int, epoch: int, step: int) -> None:
        """Keep ``batch`` (reservoir sampling) if it holds more distinct rows of data
        (``held``, :func:`~.batches.batch_rows`) than samples. Never raises."""
        if not self.reread.on or not ids or held <= len(ids):
            return
        try:
            self.seen += 1
            slot = (
                len(self.kept) if len(self.kept) < KEEP_BATCHES else self._rng.randrange(self.seen)
            )
            found = data_field(batch, key, len(ids)) if slot < KEEP_BATCHES else None
            if found is None:
                return
            name, rows = found
            distinct = list(dict.fromkeys(r for r in map(_row, rows) if r is not None))
            self.kept[slot : slot + 1] = [(epoch, step, list(ids), name, distinct)]
        except Exception:  # noqa: BLE001 - the user's data, read only to compare
            return

    def judge(self, deadline: float) -> list[tuple[int, int, int]]:
        """``(epoch, step, samples)`` of each kept batch found padded; counts the others in
        :attr:`vouched` or :attr:`unsure`. Then keeps anew (the next epoch). Never raises."""
        padded: list[tuple[int, int, int]] = []
        try:
            for epoch, step, ids, name, rows in self.kept:
                what = self._batch(ids, name, rows, deadline)
                if what == "padded":
                    padded.append((epoch, step, len(ids)))
                elif what == "data":
                    self.vouched += 1
                else:
                    self.unsure += 1
        except Exception:  # noqa: BLE001 - the user's dataset: never fatal here, never vouched
            self.unsure += 1
        finally:
            self.kept, self.seen = [], 0
        return padded

    def _batch(
        self, ids: list[int], name: str, rows: list[tuple[Any, ...]], deadline: float
    ) -> str:
        if not rows:
            return "unsure"
        have: Counter[Any] = Counter()
        seqs: list[list[Any]] = []
        for i in ids:
            values = self.reread.read_values(i, name) if time.monotonic() < deadline else None
            if values is None:
                return "unsure"
            have.update(values)
            seqs.append(values)
        # The pad: the value the rows hold most of those no sample holds (a packer pads each
        # row's tail; a sample read alone by the default collate holds none); none else.
        known = set(have)
        pads = Counter(v for r in rows for v in r if v not in known).most_common(1)
        pad = pads[0][0] if pads else object()
        kept = [[v for v in r if v != pad] for r in rows]
        run = [bool(k) and any(_within(k, q) for q in seqs) for k in kept]
        # One sample's run of values first (a plain row, a chunk, a window), the fullest
        # first, then rows made of several (a packer's): a row of pads holding a value
        # copied from a sample, or a row pieced from parts of others (the thirteenth
        # trial), then finds those values taken by the rows they were copied from.
        order = sorted(range(len(kept)), key=lambda j: (not run[j], -len(kept[j])))
        data = padding = taken = 0
        for j in order:
            need = Counter(kept[j])
            if not need:
                continue
            new = need & have
            missing = 1 - sum(new.values()) / sum(need.values())
            if not new:
                padding += 1  # every value already taken: a copy adds no data
                continue
            if missing <= DATA_SHARE or run[j]:  # a window may repeat a stride of the last
                data += 1
                taken += sum(new.values())
                have -= new
            elif missing >= PADDING_SHARE:
                padding += 1
            else:
                return "unsure"
        # Samples' values spread thin over more rows (each row a run of a sample holding a
        # value or two: the thirteenth trial) fill fewer than half the rows' places; a
        # packer's rows are full but for their tails.
        if padding and data or data and taken * 2 <= data * max(map(len, rows)):
            return "padded"
        return "data" if data else "unsure"
