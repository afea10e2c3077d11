"""Ids that name their data: a few delivered samples read again from the dataset, each epoch.

The ids rules read the ids the batches carry, and :func:`~ezpz_nb.verify.contents.first_twin`
needs several contents spread one copy per replica. A loader that deals honest shards but
puts other data under an id or two an epoch (the eighth trial: each replica's first sample
of an epoch held sample 0's data under its own id) stays below both. So each rank keeps a
few samples of each epoch as delivered (its first, and others drawn at random, so a
loader cannot guess which), and right after the epoch reads ``dataset[i]`` again for each
id ``i``, collates it alone as the loader does and compares the two field by field
(:func:`~ezpz_nb.verify.samples.sample_columns`).

What keeps a right loader from failing: a sample is judged only where ``dataset[i]`` says
it is sample ``i`` (its id field holds ``i``, at some level of a ``Subset`` chain); a field
is judged where it reads the same twice in every kept sample (a field drawn anew each read,
an augmentation or a TTA draw, is left out for all, the sample's other fields judged: the
thirteenth trial hid a misread loss beside one) and has the same size (a collate that pads
to the batch's longest: not judged); and a field differs only where
another kept sample of the epoch matched there exactly, which shows that re-reading gives
what this loader delivers (a wrapper that casts or normalises whole batches matches none).
:func:`~.reread_judge.misnamed` fails ``dp_disjoint`` only where the data delivered under the id is what
another id carries in some batch (masking or noise the loader adds is new data, not
another sample's; a mask may turn a mostly-zero row into another row, so a change to one
value in under half the places is never blamed), or is made up (:func:`made_up`: one value
in every place, zeros, where ``dataset[i]`` holds varied values and agrees with it in
under half the places) while no kept sample of that field on any rank shows the loader
changing a sample in part (a loop that masks or augments may wipe a short row whole; one
that never changes a row in part did not mask it). Each epoch is read right after it,
before the next ``set_epoch`` (a dataset whose samples change with the epoch still holds
that epoch's); persistent workers keep the copy of the dataset they started with, so after
the epoch that started them they are re-read only in one run (check_eval, check_steps:
``once``); streams, hashed keys, TP and CP peers of a leader (they receive, not load) are not
re-read. :mod:`~ezpz_nb.verify.reread_judge` judges the findings across the ranks. Made-up data that varies (noise under an id) is not told from a loop's
augmentation by one re-read: not failed.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ezpz_nb.verify.batches import field_values, observe_batch
from ezpz_nb.verify.reread_judge import SHIFT, made_up_finding, misnamed, vouched
from ezpz_nb.verify.samples import field_token, sample_columns, tag_columns

__all__ = ["KEEP", "ONE", "Reread", "made_up", "made_up_finding", "misnamed", "vouched"]

#: Samples a rank keeps at random from each epoch (besides the epoch's first).
KEEP = 32
# A chain of .dataset wrappers deeper than this is not followed (a cycle).
_DEPTH = 8


#: :meth:`Reread.judge`'s ``made`` for a one-number field, then the value delivered and
#: ``dataset[id]``'s: ``"value: 0.0 1.8"``.
ONE = "value: "


def _number(b: bytes) -> str:
    return f"{float(np.frombuffer(b, np.float64)[0]):g}"


def made_up(delivered: bytes, read: bytes) -> str:
    """How ``delivered`` differs from ``read`` (the dataset's), as far as it tells a fault:
    ``"zeros"`` or ``"one value"`` where it holds one value in every place of two or more
    while ``read`` holds varied values and agrees with it in under half the places (made
    up); ``"mask"`` where it agrees in half the places or more and every place that differs
    holds one value (masking: a mostly-zero row masked to 0 may equal another row, rightly);
    ``""`` otherwise (noise, a shift, another sample's data).

    Both are a field's values as :func:`~ezpz_nb.verify.samples.sample_columns` gives them
    (8 bytes a number); text whose length is not a multiple of 8 is never told here.
    """
    if len(delivered) != len(read) or len(read) % 8 or len(read) < 16:
        return ""
    d, r = np.frombuffer(delivered, np.uint64), np.frombuffer(read, np.uint64)
    same = d == r
    if np.mean(same) >= 0.5:
        return "mask" if len(set(d[~same].tolist())) <= 1 else ""
    if bool(np.any(d != d[0])) or bool(np.all(r == r[0])):
        return ""
    return "zeros" if int(d[0]) == 0 else "one value"


@dataclass
class _Kept:
    id: int
    epoch: int
    step: int
    cols: dict[str, bytes]  # field path -> the sample's content as delivered


class Reread:
    """Keeps a few samples of an epoch as delivered; :meth:`judge` re-reads them after it.

    Args:
        loader: The loader (or the DataLoader inside it) whose ``.dataset`` and
            ``collate_fn`` made the batches.
        enabled: False: keep nothing (a stream, a resumed run, a TP/CP peer...).
        tags: Compare each sample's one-number fields too (a loss: an eval's batches may
            hold nothing else), all but these (a weight, an epoch: a pad's weight is 0 under
            a real id, rightly); None: content fields only.
    """

    def __init__(
        self, loader: Any, enabled: bool, tags: frozenset[str] | None = None, once: bool = False
    ) -> None:
        self.loader, self.on, self.tags = loader, enabled, tags
        # Persistent workers keep the copy of the dataset they were started with: a dataset
        # that changes with the epoch differs there from dataset[i] read here after a later
        # epoch. ``once`` (one run, no epoch: check_eval, check_steps) or the epoch that
        # starts them (no iterator yet) is judged; later epochs are counted in ``skipped``.
        self.once, self.epochs, self.skipped = once, 0, 0
        self.fresh = getattr(loader, "_iterator", None) is None
        self.first: _Kept | None = None
        self.kept: list[_Kept] = []
        self.seen = 0
        self.key = ""
        # Kept samples re-read alike in every field compared, all epochs so far: the loader
        # delivers dataset[i] under i (contents.same_bytes trusts a fixed placement's repeats).
        self.alike = 0
        self.numbers: set[str] = set()  # the paths of the one-number fields compared
        # Drawn from the OS: a loader in this process cannot replay the draw.
        self._rng = random.SystemRandom()

    def see(self, batch: Any, ids: list[int], key: str, epoch: int, step: int) -> None:
        """Keep some of ``batch``'s samples (reservoir sampling over the epoch)."""
        if not self.on or not ids:
            return
        self.key = key
        cols: dict[str, list[bytes]] | None = None
        for k, i in enumerate(ids):
            self.seen += 1
            slot = len(self.kept) if len(self.kept) < KEEP else self._rng.randrange(self.seen)
            first = self.first is None
            if slot >= KEEP and not first:
                continue
            if cols is None:
                cols = self._cols(batch, len(ids))
            one = _Kept(i, epoch, step, {p: v[k] for p, v in cols.items()})
            if first:
                self.first = one
            if slot < KEEP:
                self.kept[slot : slot + 1] = [one]

    def _chain(self) -> list[Any]:
        out: list[Any] = []
        ds = getattr(self.loader, "dataset", None)
        while ds is not None and len(out) < _DEPTH and hasattr(ds, "__getitem__"):
            out.append(ds)
            ds = getattr(ds, "dataset", None)
        return out

    def collate(self) -> Any:
        """The loader's ``collate_fn`` (torch's default where it has none)."""
        collate = getattr(self.loader, "collate_fn", None)
        if collate is None:
            from torch.utils.data import default_collate

            collate = default_collate
        return collate

    def read_values(self, i: int, name: str) -> list[Any] | None:
        """Every value of sample ``i``'s field ``name`` (:func:`~.batches.field_values`):
        ``dataset[i]`` read twice alike and collated alone by torch's default collate (the
        sample's own data, whatever the loader's collate adds); None where it cannot be
        (off, no level names it ``i``, the reads differ)."""
        from torch.utils.data import default_collate

        if not self.on:
            return None
        return self._read(i, self._chain(), default_collate,
                          lambda a: field_values(a, self.key, name))  # fmt: skip

    def _read(self, i: int, chain: list[Any], collate: Any, take: Any) -> Any:
        """Sample ``i`` as :meth:`_reads` gives it, where the two reads are alike; else None."""
        got = self._reads(i, chain, collate, take)
        return got[0] if got is not None and got[0] is not None and got[0] == got[1] else None

    def _reads(self, i: int, chain: list[Any], collate: Any, take: Any) -> Any:
        """Sample ``i`` read twice from the first level of ``chain`` that names it ``i``,
        each collated alone, as ``take`` gives it: ``(first, second)``; None when no level
        does."""
        for ds in chain:
            try:
                a, b = collate([ds[i]]), collate([ds[i]])
                ids, names, _, _ = observe_batch(a, self.key)
            except Exception:  # noqa: BLE001 - the user's dataset: a level that cannot say
                continue
            if names or ids != [i]:
                continue
            return take(a), take(b)
        return None

    def _columns(self, batch: Any) -> dict[str, bytes]:
        return {p: v[0] for p, v in self._cols(batch, 1).items()}

    def _cols(self, batch: Any, count: int) -> dict[str, list[bytes]]:
        cols = sample_columns(batch, self.key, count)
        if self.tags is not None:  # the sample's one-number fields too (check_eval's loss)
            tags = tag_columns(batch, self.tags | {self.key}, count)
            self.numbers.update(tags)
            cols.update(tags)
        return cols

    def judge(self, deadline: float) -> list[tuple[int, int, int, str, str]]:
        """``(id, epoch, step, token, made)`` of each kept sample whose delivered field is not
        ``dataset[id]``'s, where the rank's other kept samples show re-reading is faithful;
        ``token``: the field and digest of what was delivered
        (:func:`~ezpz_nb.verify.samples.field_token`), ``made``: :func:`made_up`'s word;
        then keeps anew (the next epoch). Never raises."""
        try:
            return self._judge(deadline)
        except Exception:  # noqa: BLE001 - the user's dataset and collate: never fatal here
            return []
        finally:
            self.first, self.kept, self.seen = None, [], 0

    def _judge(self, deadline: float) -> list[tuple[int, int, int, str, str]]:
        chain = self._chain()
        if not self.on or self.first is None or not chain:
            return []
        self.epochs += 1
        kept = getattr(self.loader, "persistent_workers", False)
        if kept and not self.once and (self.epochs > 1 or not self.fresh):
            self.skipped += 1
            return []  # its workers keep their own copies of an epoch-dependent dataset
        collate = self.collate()
        reads: list[tuple[_Kept, dict[str, bytes]]] = []
        # A field that reads differently twice in any kept sample is drawn anew each read
        # (augmentation, a TTA draw): left out for every sample, the other fields judged.
        drawn: set[str] = set()
        for s in [self.first, *(k for k in self.kept if k is not self.first)]:
            if time.monotonic() > deadline:
                break
            got = self._reads(s.id, chain, collate, self._columns)
            if got is None:
                continue
            a, b = got
            drawn.update(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))
            reads.append((s, a))
        # Each field's re-read values -> the kept id they are: delivered bytes that are another
        # kept id's own show a shift (sample i given i+1's data in a worker: the thirteenth
        # trial), which leaves no sample matched for the rule below to trust.
        reread_of: dict[tuple[str, bytes], int] = {}
        for s, got in reads:
            for path, b in got.items():
                if path not in drawn:
                    reread_of.setdefault((path, b), s.id)
        matched: set[str] = set()
        shifted: dict[str, set[bytes]] = {}  # one-number fields: values another kept id's
        differ: list[tuple[_Kept, str, str]] = []
        agreed: list[tuple[bool, set[str]]] = []  # per sample: a field agreed; those not
        for s, got in reads:
            same, other = False, set()
            for path, b in got.items():
                d = s.cols.get(path)
                if d is None or len(d) != len(b) or path in drawn:
                    continue
                if d == b:
                    matched.add(path)
                    same = True
                elif path in self.numbers:  # a loss, a flag: the two values, for the words
                    differ.append((s, path, f"{ONE}{_number(d)} {_number(b)}"))
                    other.add(path)
                    if reread_of.get((path, d), s.id) != s.id:
                        shifted.setdefault(path, set()).add(d)
                else:
                    made = made_up(d, b)
                    # Rows of several values only (one number collides by chance), and not a
                    # mask (a mostly-zero row masked to 0 may equal another, rightly).
                    theirs = reread_of.get((path, d), s.id) if made == "" else s.id
                    differ.append((s, path, f"{SHIFT}{theirs}" if theirs != s.id else made))
                    other.add(path)
                    if theirs != s.id:
                        matched.add(path)  # re-reading reproduces what was delivered
            agreed.append((same, other))
        # One number may equal another's by chance; three distinct ones delivered under ids
        # whose own they are not, each another kept id's, are a shift (every sample off).
        matched.update(p for p, got in shifted.items() if len(got) >= 3)
        # Alike: a field agreed, and none differed that another sample shows read faithfully
        # (a collate that changes one field in every sample leaves the others judged).
        self.alike += sum(same and not other & matched for same, other in agreed)
        return [
            (s.id, s.epoch, s.step, field_token(p, s.cols[p]), made)
            for s, p, made in differ
            if p in matched
        ]
