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
it is sample ``i`` (its id field holds ``i``, at some level of a ``Subset`` chain), reads
the same twice (augmentation draws anew: not judged) and has the same size in that field
(a collate that pads to the batch's longest: not judged); and a field differs only where
another kept sample of the epoch matched there exactly, which shows that re-reading gives
what this loader delivers (a wrapper that casts or normalises whole batches matches none).
:func:`misnamed` fails ``dp_disjoint`` only where the data delivered under the id is what
another id carries in some batch (masking or noise the loader adds is new data, not
another sample's; a mask may turn a mostly-zero row into another row, so a change to one
value in under half the places is never blamed), or is made up (:func:`made_up`: one value
in every place, zeros, where ``dataset[i]`` holds varied values and agrees with it in
under half the places) while no kept sample of that field on any rank shows the loader
changing a sample in part (a loop that masks or augments may wipe a short row whole; one
that never changes a row in part did not mask it). Each epoch is read right after it,
before the next ``set_epoch`` (a dataset whose samples change with the epoch still holds
that epoch's); streams, hashed keys, TP and CP peers of a leader (they receive, not load)
are not re-read. Made-up data that varies (noise under an id) is not told from a loop's
augmentation by one re-read: not failed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ezpz_nb.verify.batches import field_values, observe_batch
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.samples import SEP, field_token, sample_columns, tag_columns

__all__ = ["KEEP", "Reread", "made_up", "misnamed", "vouched"]

#: Samples a rank keeps at random from each epoch (besides the epoch's first).
KEEP = 32
# A chain of .dataset wrappers deeper than this is not followed (a cycle).
_DEPTH = 8


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

    def __init__(self, loader: Any, enabled: bool, tags: frozenset[str] | None = None) -> None:
        self.loader, self.on, self.tags = loader, enabled, tags
        self.first: _Kept | None = None
        self.kept: list[_Kept] = []
        self.seen = 0
        self.key = ""
        # Kept samples re-read alike in every field compared, all epochs so far: the loader
        # delivers dataset[i] under i (contents.same_bytes trusts a fixed placement's repeats).
        self.alike = 0
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

    def _read(self, i: int, chain: list[Any], collate: Any, take: Any = None) -> Any:
        """Sample ``i`` read from the first level of ``chain`` that names it ``i``, collated
        alone, as ``take`` gives it (default: ``{field path: bytes}``); None when no level
        does, or the reads differ (augmentation)."""
        if take is None:
            take = self._columns
        for ds in chain:
            try:
                a, b = collate([ds[i]]), collate([ds[i]])
                ids, names, _, _ = observe_batch(a, self.key)
            except Exception:  # noqa: BLE001 - the user's dataset: a level that cannot say
                continue
            if names or ids != [i]:
                continue
            got = take(a)
            return got if got is not None and got == take(b) else None
        return None

    def _columns(self, batch: Any) -> dict[str, bytes]:
        return {p: v[0] for p, v in self._cols(batch, 1).items()}

    def _cols(self, batch: Any, count: int) -> dict[str, list[bytes]]:
        cols = sample_columns(batch, self.key, count)
        if self.tags is not None:  # the sample's one-number fields too (check_eval's loss)
            cols.update(tag_columns(batch, self.tags | {self.key}, count))
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
        if getattr(self.loader, "persistent_workers", False):
            return []  # its workers keep their own copies of an epoch-dependent dataset
        collate = self.collate()
        matched: set[str] = set()
        differ: list[tuple[_Kept, str, str]] = []
        for s in [self.first, *(k for k in self.kept if k is not self.first)]:
            if time.monotonic() > deadline:
                break
            got = self._read(s.id, chain, collate)
            compared = same = 0
            for path, b in (got or {}).items():
                d = s.cols.get(path)
                if d is None or len(d) != len(b):
                    continue
                compared += 1
                if d == b:
                    matched.add(path)
                    same += 1
                else:
                    differ.append((s, path, made_up(d, b)))
            self.alike += bool(compared) and same == compared
        return [
            (s.id, s.epoch, s.step, field_token(p, s.cols[p]), made)
            for s, p, made in differ
            if p in matched
        ]


def misnamed(outs: Sequence[Any]) -> Finding | None:
    """The first sample delivered with another sample's data, as a ``dp_disjoint`` failure;
    None: none. ``outs``: the ranks' :class:`~ezpz_nb.verify.observe.Outcome`.

    Its delivered data is not ``dataset[id]``'s as its rank re-read it after the run
    (:class:`Reread`), and is what another id carries in some batch: an augmentation in
    the loader makes new data, not another sample's. Else (:func:`made_up_finding`) made-up
    data under the id.
    """
    # Made-up data (zeros under several ids) is judged by its own words, below; a mask can
    # make one row another's (a mostly-zero row masked to 0), rightly.
    found = sorted(
        (e, s, o.rank, i, token) for o in outs for i, e, s, token, made in o.misnamed if not made
    )
    under: dict[str, set[int]] = {}  # a field's content -> the ids it was delivered under
    for o in outs:
        for r in o.records:
            for i, d in zip(r.sample_ids, o.contents.get((r.epoch, r.step), []), strict=False):
                for token in d.split(SEP):
                    under.setdefault(token, set()).add(i)
    for epoch, step, rank, i, token in found:
        others = sorted(under.get(token, set()) - {i})
        if not others:
            continue
        field = token.rpartition(":")[0].lstrip("/") or "the sample"
        replica = next((r.dp_rank for o in outs if o.rank == rank for r in o.records), rank)
        return Finding(
            "dp_disjoint", "dp_duplicate", epoch,
            f"Epoch {epoch}: the batch under id {i} on rank {rank} (DP replica {replica}, "
            f"step {step}) holds other data ({field}) than dataset[{i}] (read again after the "
            f"epoch, twice alike): the data of id {others[0]}; ids must name the data.",
            rank=rank, step=step, sample=str(i), ranks=[rank],
            hint="yield dataset[i] under id i: a sample stamped with another id than the "
            "data it holds hides a repeat (or a loss) from every rule that counts ids",
        )  # fmt: skip
    return made_up_finding(outs)


def made_up_finding(outs: Sequence[Any]) -> Finding | None:
    """The first sample delivered with made-up data (:func:`made_up`: one value in every
    place) under its id, in a field where no kept sample on any rank was changed in part;
    None: none. Changed in part (masking, noise, a shift) shows a loader that transforms
    samples, and such a loop may wipe a short row whole: not judged there."""
    changed = {
        t.rpartition(":")[0] for o in outs for *_, t, made in o.misnamed if made in ("", "mask")
    }
    found = sorted(
        (e, s, o.rank, i, t, made)
        for o in outs
        for i, e, s, t, made in o.misnamed
        if made in ("zeros", "one value") and t.rpartition(":")[0] not in changed
    )
    if not found:
        return None
    epoch, step, rank, i, token, made = found[0]
    field = token.rpartition(":")[0].lstrip("/") or "the sample"
    what = "all zeros" if made == "zeros" else "one value in every place"
    return Finding(
        "dp_disjoint", "dp_duplicate", epoch,
        f"Epoch {epoch}: the batch under id {i} on rank {rank} (step {step}) holds "
        f"{field} {what}, where dataset[{i}] (read again after the epoch, twice alike) holds "
        f"varied values ({len(found)} such sample(s) kept, and no kept sample changed in "
        f"part): made-up data under a real id; ids must name the data.",
        rank=rank, step=step, sample=str(i), ranks=sorted({x[2] for x in found}),
        hint="yield dataset[i] under id i: a placeholder (zeros) stamped with a real id "
        "trains on nothing while every rule that counts ids sees the sample as read",
    )  # fmt: skip


def vouched(outs: Sequence[Any]) -> bool:
    """Every DP replica's leader re-read kept samples alike (:attr:`Reread.alike`) and no
    kept sample differed on any rank: the loader delivers ``dataset[i]`` under id ``i``.
    ``outs``: the ranks' :class:`~ezpz_nb.verify.observe.Outcome`."""
    replicas = {o.records[0].dp_rank for o in outs if o.records}
    sure = {
        o.records[0].dp_rank
        for o in outs
        if o.records and o.reread_alike and o.records[0].tp_rank == 0 and o.records[0].cp_rank == 0
    }
    return bool(replicas) and replicas <= sure and not any(o.misnamed for o in outs)
