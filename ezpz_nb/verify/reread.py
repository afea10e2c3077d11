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
another sample's). Each epoch is read right after it, before the next ``set_epoch`` (a
dataset whose samples change with the epoch still holds that epoch's); streams, hashed
keys, TP and CP peers of a leader (they receive, not load) are not re-read.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ezpz_nb.verify.batches import observe_batch
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.samples import SEP, field_token, sample_columns

__all__ = ["KEEP", "Reread", "misnamed"]

#: Samples a rank keeps at random from each epoch (besides the epoch's first).
KEEP = 32
# A chain of .dataset wrappers deeper than this is not followed (a cycle).
_DEPTH = 8


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
    """

    def __init__(self, loader: Any, enabled: bool) -> None:
        self.loader, self.on = loader, enabled
        self.first: _Kept | None = None
        self.kept: list[_Kept] = []
        self.seen = 0
        self.key = ""
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
                cols = sample_columns(batch, key, len(ids))
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

    def _read(self, i: int, chain: list[Any], collate: Any) -> dict[str, bytes] | None:
        """Sample ``i`` read from the first level of ``chain`` that names it ``i``, collated
        alone; None when no level does, or the reads differ (augmentation)."""
        for ds in chain:
            try:
                a, b = collate([ds[i]]), collate([ds[i]])
                ids, names, _, _ = observe_batch(a, self.key)
            except Exception:  # noqa: BLE001 - the user's dataset: a level that cannot say
                continue
            if names or ids != [i]:
                continue
            got, again = sample_columns(a, self.key, 1), sample_columns(b, self.key, 1)
            if got != again:
                return None
            return {p: v[0] for p, v in got.items()}
        return None

    def judge(self, deadline: float) -> list[tuple[int, int, int, str]]:
        """``(id, epoch, step, token)`` of each kept sample whose delivered field is not
        ``dataset[id]``'s, where the rank's other kept samples show re-reading is faithful;
        ``token``: the field and digest of what was delivered
        (:func:`~ezpz_nb.verify.samples.field_token`); then keeps anew (the next epoch).
        Never raises."""
        try:
            return self._judge(deadline)
        except Exception:  # noqa: BLE001 - the user's dataset and collate: never fatal here
            return []
        finally:
            self.first, self.kept, self.seen = None, [], 0

    def _judge(self, deadline: float) -> list[tuple[int, int, int, str]]:
        chain = self._chain()
        if not self.on or self.first is None or not chain:
            return []
        if getattr(self.loader, "persistent_workers", False):
            return []  # its workers keep their own copies of an epoch-dependent dataset
        collate = getattr(self.loader, "collate_fn", None)
        if collate is None:
            from torch.utils.data import default_collate

            collate = default_collate
        matched: set[str] = set()
        differ: list[tuple[_Kept, str]] = []
        for s in [self.first, *(k for k in self.kept if k is not self.first)]:
            if time.monotonic() > deadline:
                break
            got = self._read(s.id, chain, collate)
            for path, b in (got or {}).items():
                d = s.cols.get(path)
                if d is None or len(d) != len(b):
                    continue
                if d == b:
                    matched.add(path)
                else:
                    differ.append((s, path))
        return [
            (s.id, s.epoch, s.step, field_token(p, s.cols[p])) for s, p in differ if p in matched
        ]


def misnamed(outs: Sequence[Any]) -> Finding | None:
    """The first sample delivered with another sample's data, as a ``dp_disjoint`` failure;
    None: none. ``outs``: the ranks' :class:`~ezpz_nb.verify.observe.Outcome`.

    Its delivered data is not ``dataset[id]``'s as its rank re-read it after the run
    (:class:`Reread`), and is what another id carries in some batch: an augmentation in
    the loader makes new data, not another sample's.
    """
    found = sorted((e, s, o.rank, i, token) for o in outs for i, e, s, token in o.misnamed)
    if not found:
        return None
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
    return None
