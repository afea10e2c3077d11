"""The corpus's classes beyond ``check_contract``: loaders as users write them (issue 44).

Each class of loader that verify once misjudged has a right loader and a wrong one,
run through the check its row names (contract, eval, steps, resume, layout
invariance), with the verdict of each rule known by construction and, where a
hint was wrong, the words the hint must say (and must not). ``test_verify_corpus.py``
runs them on the corpus's warm clusters.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import _verify_loaders as L
import _verify_splits as S
import _verify_thirteenth as R
import _verify_twelfth as T
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    Subset,
    SubsetRandomSampler,
    random_split,
)

from ezpz_nb.data import WeightedShard
from ezpz_nb.verify import global_batches

P, F, X, NJ, NA = "pass", "fail", "expected", "not judged", "not asked"


def _dist(layout: Any, ds: Any, shuffle: bool = True, **kw: Any) -> DistributedSampler:
    return DistributedSampler(
        ds, num_replicas=kw.pop("replicas", layout.dp_size), rank=layout.dp_rank,
        shuffle=shuffle, seed=5, **kw,
    )  # fmt: skip


def _split(n: int = 20) -> list[Any]:
    """random_split of 20 samples into 12 for training and 8 held out (shuffled indices)."""
    return random_split(L.Squares(n), [12, n - 12], generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------ the dataset's universe
def split_train(layout: Any) -> DataLoader:
    """The training part of a random_split under a DistributedSampler: its 12 indices."""
    train, _ = _split()
    return DataLoader(train, batch_size=2, sampler=_dist(layout, train))


def split_train_too_many_shards(layout: Any) -> DataLoader:
    """The same part over twice the replicas there are: half its indices never seen."""
    train, _ = _split()
    return DataLoader(
        train, batch_size=2, sampler=_dist(layout, train, replicas=2 * layout.dp_size)
    )


def _sampled(layout: Any, overlap: bool = False) -> DataLoader:
    # The 10 training ids of 20 held in a Subset, each rank sampling its positions of it.
    train = Subset(L.Squares(20), list(range(0, 20, 2)))
    mine = list(range(layout.dp_rank, len(train), layout.dp_size))
    if overlap and layout.dp_rank == 1:
        mine.append(0)  # rank 0's first sample again
    # A seeded generator: unseeded, 5 samples drew the same order in two epochs 1 time in
    # 120 per rank, and the reshuffle rule then (rightly) failed this correct loader.
    rng = torch.Generator().manual_seed(layout.dp_rank)
    return DataLoader(train, batch_size=2, sampler=SubsetRandomSampler(mine, generator=rng))


def sampler_stops_short(layout: Any) -> DataLoader:
    """Per-rank SubsetRandomSamplers over range(17) of an 18-sample dataset: 17 in no rank's."""
    return DataLoader(
        L.Squares(18),
        batch_size=3,
        sampler=SubsetRandomSampler(
            range(layout.dp_rank, 17, 2), generator=torch.Generator().manual_seed(layout.dp_rank)
        ),
    )


def _parts(layout: Any, n: int) -> DataLoader:
    d = layout.dp_size
    parts = random_split(
        L.Squares(n), [n // d] * d + [n % d], generator=torch.Generator().manual_seed(0)
    )
    return DataLoader(parts[layout.dp_rank], batch_size=5, shuffle=True)


def own_split_parts(layout: Any) -> DataLoader:
    """Each rank its own random_split part of 20 samples (no remainder)."""
    return _parts(layout, 20)


def own_split_parts_remainder(layout: Any) -> DataLoader:
    """The same over 21 samples: the remainder part [1] is read by no rank."""
    return _parts(layout, 21)


def parts_of_other_wholes(layout: Any) -> DataLoader:
    """Each rank reads all of its own Subset of a different half: no common whole is known."""
    half = Subset(L.Squares(20), range(10 * layout.dp_rank, 10 * layout.dp_rank + 10))
    return DataLoader(Subset(half, range(10)), batch_size=5, shuffle=True)


def _val_strided(layout: Any, short: int) -> DataLoader:
    _, val = random_split(L.Squares(21), [14, 7], generator=torch.Generator().manual_seed(0))
    mine = range(layout.dp_rank, len(val) - short, layout.dp_size)
    return DataLoader(Subset(val, mine), batch_size=2)


def split_val_strided(layout: Any) -> DataLoader:
    """Each rank a strided Subset of the same random_split validation part (4 and 3)."""
    return _val_strided(layout, 0)


def split_val_strided_short(layout: Any) -> DataLoader:
    """The same with range(r, len(val) - 1, dp): the validation part's last sample in no shard."""
    return _val_strided(layout, 1)


def seed_per_rank(layout: Any) -> DataLoader:
    """DistributedSampler seeded by rank: the shards overlap and as many samples go unseen."""
    ds = L.Squares(16)
    sampler = DistributedSampler(ds, layout.dp_size, layout.dp_rank, seed=layout.dp_rank)
    return DataLoader(ds, batch_size=4, sampler=sampler)


def same_rank_everywhere(layout: Any) -> DataLoader:
    """DistributedSampler(rank=0) on every rank: both read the same half, the other never."""
    ds = L.Squares(16)
    return DataLoader(
        ds, batch_size=4, sampler=DistributedSampler(ds, num_replicas=layout.dp_size, rank=0)
    )


def split_by_sampler(layout: Any) -> DataLoader:
    """A train split made by SubsetRandomSampler, each rank its share of the 10 indices."""
    return _sampled(layout)


def split_by_sampler_overlapping(layout: Any) -> DataLoader:
    """The same with rank 1's share holding one of rank 0's samples too."""
    return _sampled(layout, overlap=True)


def split_val_weighted(layout: Any) -> DataLoader:
    """The held-out part of a random_split, padded with weight 0 (WeightedShard): exact."""
    _, val = _split(19)
    return DataLoader(WeightedShard(val, layout.dp_rank, layout.dp_size), batch_size=2)


def split_val_padded(layout: Any) -> DataLoader:
    """The held-out part (7 samples) under DistributedSampler: one repeated to pad."""
    _, val = _split(19)
    return DataLoader(val, batch_size=2, sampler=_dist(layout, val, shuffle=False))


# ------------------------------------------------------------------ drop_last wherever set
def batch_sampler_drops(layout: Any) -> DataLoader:
    """18 samples, BatchSampler(drop_last=True) of 4: one sample a replica dropped, by choice."""
    ds = L.Squares(18)
    return DataLoader(ds, batch_sampler=BatchSampler(_dist(layout, ds), 4, drop_last=True))


def batch_sampler_too_many_shards(layout: Any) -> DataLoader:
    """The same over twice the replicas: far more missing than drop_last drops."""
    ds = L.Squares(18)
    sampler = _dist(layout, ds, replicas=2 * layout.dp_size)
    return DataLoader(ds, batch_sampler=BatchSampler(sampler, 4, drop_last=True))


class OwnBatches:
    """A hand-written batch sampler that shards by rank itself and says ``drop_last``
    (no ``sampler``, no ``batch_size`` attribute); ``lies`` drops the partial batch anyway."""

    def __init__(self, layout: Any, drop_last: bool, lies: bool = False) -> None:
        self.mine = list(range(layout.dp_rank, 18, layout.dp_size))
        self.drop_last, self.lies, self.size = drop_last, lies, 4

    def __iter__(self) -> Iterator[list[int]]:
        for k in range(0, len(self.mine), self.size):
            part = self.mine[k : k + self.size]
            if len(part) == self.size or not (self.drop_last or self.lies):
                yield part

    def __len__(self) -> int:
        return len(self.mine) // self.size


def own_batches_drop(layout: Any) -> DataLoader:
    return DataLoader(L.Squares(18), batch_sampler=OwnBatches(layout, drop_last=True))


def own_batches_lying(layout: Any) -> DataLoader:
    """Says drop_last=False, drops the partial batch all the same."""
    return DataLoader(L.Squares(18), batch_sampler=OwnBatches(layout, False, lies=True))


def _drops_on(layout: Any, ranks: tuple[int, ...]) -> DataLoader:
    ds = L.Squares(18)
    return DataLoader(ds, batch_size=4, sampler=_dist(layout, ds), drop_last=layout.rank in ranks)


def drop_last_everywhere(layout: Any) -> DataLoader:
    return _drops_on(layout, (0, 1))


def drop_last_rank1(layout: Any) -> DataLoader:
    """drop_last on rank 1's loader only: its last partial batch goes, rank 0's stays."""
    return _drops_on(layout, (1,))


def drop_last_rank0(layout: Any) -> DataLoader:
    """The mirror case: the same verdict."""
    return _drops_on(layout, (0,))


# ------------------------------------------------------------------ batch shapes
# A namedtuple whose "index" field shadows tuple.index, as users' batches do.
Batch = collections.namedtuple("Batch", "x index")


@dataclass
class DataBatch:
    x: torch.Tensor
    index: torch.Tensor


def _collate_as(kind: type) -> Any:
    def collate(samples: list[dict[str, Any]]) -> Any:
        return kind(
            torch.stack([s["x"] for s in samples]), torch.tensor([s["index"] for s in samples])
        )

    return collate


def namedtuples(layout: Any) -> DataLoader:
    ds = L.Squares(16)
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds), collate_fn=_collate_as(Batch))


def dataclasses_(layout: Any) -> DataLoader:
    ds = L.Squares(16)
    return DataLoader(
        ds, batch_size=2, sampler=_dist(layout, ds), collate_fn=_collate_as(DataBatch)
    )


def namedtuples_unsharded(layout: Any) -> DataLoader:
    """Namedtuple batches without a sampler: every replica reads everything."""
    return DataLoader(L.Squares(16), batch_size=2, collate_fn=_collate_as(Batch))


# ------------------------------------------------------------------ weights in their dtype
class Chunks(torch.utils.data.Dataset):
    """``docs`` documents in 3 chunks each; a chunk's weight 1/3 in ``dtype``, its id the doc's."""

    def __init__(self, docs: int, dtype: torch.dtype, extra: int = 0) -> None:
        self.n, self.dtype = docs * 3 + extra, dtype

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> dict[str, Any]:
        return {"index": (k // 3), "weight": torch.tensor(1 / 3, dtype=self.dtype)}


def _chunks(layout: Any, dtype: torch.dtype, extra: int = 0) -> DataLoader:
    ds = Chunks(6, dtype, extra)
    return DataLoader(ds, batch_size=3, sampler=_dist(layout, ds, shuffle=False))


def chunks_f32(layout: Any) -> DataLoader:
    """6 documents in 18 chunks over 2 replicas (no padding): each document sums to 1."""
    return _chunks(layout, torch.float32)


def chunks_bf16(layout: Any) -> DataLoader:
    return _chunks(layout, torch.bfloat16)


def chunks_f32_padded(layout: Any) -> DataLoader:
    """19 chunks: DistributedSampler repeats chunk 0 to pad, so document 0 sums to 4/3."""
    return _chunks(layout, torch.float32, extra=1)


def chunks_bf16_padded(layout: Any) -> DataLoader:
    return _chunks(layout, torch.bfloat16, extra=1)


# ------------------------------------------------------------------ resume: one identity
class Offsets:
    """A loader resumed exactly by offset, with no RNG; each batch tagged with the worker
    that made it, counted from each iter() (so the tags differ after a resume).

    ``noise``: a float mask drawn from an RNG never saved; ``counter``: an int field
    counting batches since iter() (not random, not a sample's); ``late_key``: the RNG
    state joins state_dict() only after the first batch (a fresh loader's lacks it).
    """

    def __init__(self, layout: Any, noise: bool = False, counter: bool = False,
                 late_key: bool = False) -> None:  # fmt: skip
        self.mine = list(range(layout.dp_rank, 16, layout.dp_size))
        self.offset, self.epoch = 0, 0
        self.noise, self.counter, self.late_key = noise, counter, late_key
        self.gen = torch.Generator().manual_seed(7)
        self.started = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        order = [self.mine[(k + self.epoch) % len(self.mine)] for k in range(len(self.mine))]
        for made, at in enumerate(range(self.offset, len(order), 2)):
            self.started = True
            batch = {
                "index": torch.tensor(order[at : at + 2]),
                "worker_id": torch.tensor([made] * 2),
            }
            if self.noise or self.late_key:
                batch["mask"] = torch.rand(2, generator=self.gen)
            if self.counter:
                batch["made"] = torch.tensor([made, made])
            self.offset = at + 2
            yield batch
        self.offset = 0

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"offset": self.offset}
        if self.late_key and self.started:
            state["rng"] = self.gen.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset = int(state["offset"])
        if "rng" in state:
            self.gen.set_state(state["rng"])


def offsets(layout: Any) -> Offsets:
    return Offsets(layout)


def offsets_noise(layout: Any) -> Offsets:
    return Offsets(layout, noise=True)


def offsets_counter(layout: Any) -> Offsets:
    return Offsets(layout, counter=True)


def offsets_late_key(layout: Any) -> Offsets:
    return Offsets(layout, late_key=True)


# ------------------------------------------------------------------ resume at an epoch's end
class Positioned:
    """A stateful loader keeping its position in its shard; ``modulo`` saves it modulo the
    epoch's length, so a save right after the epoch's last batch (its iterator not yet
    ended) reads position 0 and the resumed loader replays the epoch."""

    def __init__(self, layout: Any, modulo: bool = False, since_load: bool = False) -> None:
        self.mine = list(range(layout.dp_rank, 16, layout.dp_size))
        self.pos, self.epoch, self.modulo = 0, 0, modulo
        self.since_load, self.loaded = since_load, 0  # counts from the last load only

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        g = torch.Generator().manual_seed(self.epoch)
        order = [self.mine[k] for k in torch.randperm(len(self.mine), generator=g).tolist()]
        while self.pos < len(order):
            self.pos += 2
            yield {"index": torch.tensor(order[self.pos - 2 : self.pos])}
        self.pos = 0  # the epoch ended: the next iter() starts the next one

    def state_dict(self) -> dict[str, int]:
        if self.since_load:
            return {"pos": self.pos - self.loaded}
        return {"pos": self.pos % len(self.mine) if self.modulo else self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = self.loaded = state["pos"]


def positioned(layout: Any) -> Positioned:
    return Positioned(layout)


def positioned_modulo(layout: Any) -> Positioned:
    return Positioned(layout, modulo=True)


def positioned_since_load(layout: Any) -> Positioned:
    """No sampler; its state counts batches since the last load, not the epoch's start."""
    return Positioned(layout, since_load=True)


class _NoPosition(IterableDataset):
    def __init__(self, layout: Any) -> None:
        self.mine = range(layout.dp_rank, 16, layout.dp_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from ({"index": i} for i in self.mine)


class StreamLoader(L.Forgetful):
    """A DataLoader over an IterableDataset whose position lives in the dataset, unsaved
    (its empty state is Forgetful's)."""

    def __init__(self, layout: Any) -> None:
        self.loader = DataLoader(_NoPosition(layout), batch_size=2)

    def set_epoch(self, epoch: int) -> None:
        pass  # the stream has one order


def stream_no_position(layout: Any) -> StreamLoader:
    return StreamLoader(layout)


class _ByWorker(IterableDataset):
    """Shards by DataLoader worker but not by rank: every DP replica streams everything."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        w, n = (info.id, info.num_workers) if info is not None else (0, 1)
        yield from ({"index": i} for i in range(w, 16, n))


def by_worker_not_rank(layout: Any) -> DataLoader:
    return DataLoader(_ByWorker(), batch_size=2, num_workers=2)


# ------------------------------------------------------------------ steps
def zigzag(layout: Any) -> Iterator[dict[str, Any]]:
    """Each rank's share forward then backward, endlessly: a period of two epochs."""
    mine = list(range(layout.dp_rank, 12, layout.dp_size))
    return ({"index": torch.tensor([i])} for i in itertools.cycle(mine + mine[::-1]))


def zigzag_skips(layout: Any) -> Iterator[dict[str, Any]]:
    """The zigzag without its share's last sample on the way back: a sample missing."""
    mine = list(range(layout.dp_rank, 12, layout.dp_size))
    back = [mine[-1], *mine[-3::-1], mine[0]]
    return ({"index": torch.tensor([i])} for i in itertools.cycle(mine + back))


def repeats_on_a_rank(layout: Any) -> Iterator[dict[str, Any]]:
    """Rank 1's share of each epoch deals its first sample twice (tagged with the epoch)."""
    mine = list(range(layout.dp_rank, 12, layout.dp_size))
    if layout.dp_rank == 1:
        mine = [mine[0], *mine[:-1]]
    return (
        {"index": torch.tensor([i]), "epoch": torch.tensor([e])}
        for e in itertools.count()
        for i in mine
    )


# ------------------------------------------------------------------ layout invariance
def _global(dp: int, make: Any) -> list[list[tuple[int, int]]]:
    """The global batches of a factory at ``dp`` replicas, each rank's batches in DP order."""
    ranks = [list(make(SimpleNamespace(dp_rank=r, dp_size=dp))) for r in range(dp)]
    return global_batches(ranks)


def _batches(b: int = 4, n: int = 8) -> list[list[tuple[int, int]]]:
    return [[(k % 2, g * b + k) for k in range(b)] for g in range(n)]


def split_each_batch(layout: Any) -> list[list[tuple[int, int]]]:
    """Each rank takes its slice of every global batch: the global batch is the same."""
    per = 4 // layout.dp_size
    return [g[layout.dp_rank * per : (layout.dp_rank + 1) * per] for g in _batches()]


def whole_batches_in_turn(layout: Any) -> list[list[tuple[int, int]]]:
    """Each rank takes whole global batches in turn (islice round-robin): at dp 2 a step's
    global batch doubles and there are half the optimizer steps."""
    return list(itertools.islice(_batches(), layout.dp_rank, None, layout.dp_size))


class _Tagged(torch.utils.data.Dataset):
    """16 samples of one source, each carrying its dataset_id (what ledger_stream pairs)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"index": i, "dataset_id": 0}


def dist_same_global(layout: Any) -> DataLoader:
    """The usual recipe: DistributedSampler, per-rank batch = global batch 4 / dp."""
    ds = _Tagged()
    return DataLoader(ds, batch_size=4 // layout.dp_size, sampler=_dist(layout, ds))


def dist_per_rank_batch(layout: Any) -> DataLoader:
    """The same with batch 4 on every rank: the global batch doubles at dp 2."""
    ds = _Tagged()
    return DataLoader(ds, batch_size=4, sampler=_dist(layout, ds))


def halves_by_rank(layout: Any) -> DataLoader:
    """Each rank reads its contiguous half in order: a step's samples change with dp."""
    ds = Subset(_Tagged(), range(16 * layout.dp_rank // layout.dp_size,
                                 16 * (layout.dp_rank + 1) // layout.dp_size))  # fmt: skip
    return DataLoader(ds, batch_size=4 // layout.dp_size)


def layout_stream(make: Any) -> tuple[Any, Any]:
    """The two runs a layout-invariance case compares: dp 1 and dp 2."""
    return _global(1, make), _global(2, make)


# ------------------------------------------------------------------ the cases
class Run(NamedTuple):
    """A loader through one check, and what each rule must say.

    Attributes:
        check: ``"contract"``, ``"resume"``, ``"eval"``, ``"steps"``, ``"layout"`` or
            ``"ledgers"`` (layout invariance of check_contract's own dp=1 and dp=2 ledgers).
        factory: The loader factory (for ``"layout"``: one returning a rank's batches).
        verdicts: ``{rule: verdict}`` for every rule the check covers.
        kwargs: The check's keyword arguments.
        words: ``{rule: words}`` its reason, first finding or hint must hold
            (``"table"``: the whole report).
        absent: ``{rule: words}`` they must not hold (a hint that contradicts the evidence).
        layout: The layout it runs on (its world size picks the warm cluster).
    """

    check: str
    factory: Any
    verdicts: dict[str, str]
    kwargs: dict[str, Any] = {}
    words: dict[str, str] = {}
    absent: dict[str, str] = {}
    layout: str = "dp=2"


def _c(dp: str = P, once: str = P, steps: str = P, batch: str = P, shuffle: str = P,
       resume: str | None = None) -> dict[str, str]:  # fmt: skip
    out = {"dp_disjoint": dp, "exactly_once": once, "equal_steps": steps, "global_batch": batch,
           "reshuffle": shuffle}  # fmt: skip
    return out if resume is None else {**out, "resume": resume}


def _e(once: str, steps: str = P) -> dict[str, str]:
    return {"counted_once": once, "equal_steps": steps}


def _s(coverage: str, steps: str = P) -> dict[str, str]:
    return {"steps": steps, "balanced_coverage": coverage}


_OFF = {"shuffle": False}
_MID = {"scenarios": ["mid-epoch"], "shuffle": False}
_DCP = {**_MID, "via": "dcp"}
_ENDS = {"scenarios": ["after an epoch's last batch", "after an epoch's first batch"],
         "shuffle": True}  # fmt: skip
_NO_HINT = "drop_last is not set"
_CP = "dp=2,cp=2"

CASES: dict[str, Run] = {
    # the dataset's own universe
    "random_split train": Run("contract", split_train, _c(),
                              words={"table": "over the Subset's 12 indices"}),
    "random_split train, too many shards": Run(
        "contract", split_train_too_many_shards, _c(once=F, batch=X),
        words={"exactly_once": "6 of 12 sample(s)"}),
    "SubsetRandomSampler split": Run(
        "contract", split_by_sampler, _c(batch=X),
        words={"table": "over the 10 indices the ranks' SubsetRandomSamplers are cut from"}),
    "SubsetRandomSampler stopping short": Run(
        "contract", sampler_stops_short, _c(once=F, batch=X),
        words={"table": "over range(18)", "exactly_once": "[17] were never seen"},
        absent={"exactly_once": _NO_HINT}),
    "own random_split parts": Run("contract", own_split_parts, _c(),
                                  words={"table": "over range(20) (the dataset the ranks'"}),
    "own random_split parts, remainder unread": Run(
        "contract", own_split_parts_remainder, _c(once=F),
        words={"table": "over range(21)", "exactly_once": "remainder part"}),
    "parts of other wholes": Run(
        "contract", parts_of_other_wholes, _c(once=NJ),
        words={"exactly_once": "num_samples="}),
    "random_split val, strided Subsets": Run(
        "eval", split_val_strided, _e(P),
        words={"table": "over the 7 indices the ranks' Subsets are cut from"}),
    "random_split val, strided Subsets stopping short": Run(
        "eval", split_val_strided_short, _e(F),
        words={"counted_once": "1 of 7 samples"}),
    "SubsetRandomSampler split, overlapping": Run(
        "contract", split_by_sampler_overlapping, _c(dp=F, batch=X)),
    "random_split val, weight 0 padding": Run(
        "eval", split_val_weighted, _e(P),
        words={"counted_once": "all 7 samples of range(7)",
               "table": "over range(7) (the dataset the ranks' WeightedShards are cut from)"}),
    "random_split val, padded": Run("eval", split_val_padded, _e(F),
                                    words={"counted_once": "counted again"}),
    # drop_last from wherever it is set, per rank
    "BatchSampler drop_last": Run("contract", batch_sampler_drops, _c(once=X),
                                  absent={"table": _NO_HINT}),
    "BatchSampler, too many shards": Run(
        "contract", batch_sampler_too_many_shards, _c(once=F),
        words={"exactly_once": "more than drop_last drops"}, absent={"exactly_once": _NO_HINT}),
    "own batch sampler, drop_last": Run("contract", own_batches_drop, _c(once=X, shuffle=NJ)),
    "own batch sampler, dropping unsaid": Run(
        "contract", own_batches_lying, _c(once=F, shuffle=NJ),
        words={"exactly_once": "drop_last is not set"}),
    "drop_last on every rank": Run("contract", drop_last_everywhere, _c(once=X)),
    "drop_last on rank 1 only": Run("contract", drop_last_rank1, _c(once=X, steps=F),
                                    words={"equal_steps": "rank 1: drop_last=True"}),
    "drop_last on rank 0 only": Run("contract", drop_last_rank0, _c(once=X, steps=F),
                                    words={"equal_steps": "rank 0: drop_last=True"}),
    # batches of every shape
    "namedtuple batches": Run("contract", namedtuples, _c()),
    "namedtuple batches, key='index'": Run("contract", namedtuples, _c(), {"key": "index"}),
    "dataclass batches": Run("contract", dataclasses_, _c()),
    "namedtuple batches, unsharded": Run("contract", namedtuples_unsharded, _c(dp=F, shuffle=NJ)),
    # weights in their dtype (6 documents in 3 chunks each; 7 with the padded chunk)
    "float32 thirds": Run("eval", chunks_f32, _e(P), {"num_samples": 6},
                          words={"counted_once": "summed in torch.float32, within 3.6e-07"}),
    "bfloat16 thirds": Run("eval", chunks_bf16, _e(P), {"num_samples": 6},
                           words={"counted_once": "torch.bfloat16"}),
    "float32 thirds, padded": Run("eval", chunks_f32_padded, _e(F), {"num_samples": 7},
                                  words={"counted_once": "counted again"}),
    "bfloat16 thirds, padded": Run("eval", chunks_bf16_padded, _e(F), {"num_samples": 7},
                                   words={"counted_once": "counted again"}),
    # one identity of a batch across modes
    "worker-tagged, state_dict": Run("resume", offsets, _c(once=NJ, shuffle=NA, resume=P), _MID,
                                     words={"exactly_once": "pass num_samples="}),
    "worker-tagged, dcp": Run("resume", offsets, _c(once=NJ, shuffle=NA, resume=P), _DCP),
    "unsaved RNG, dcp": Run("resume", offsets_noise, _c(once=NJ, shuffle=NA, resume=F), _DCP,
                            words={"resume": "other values in /mask"}),
    "a counter field, dcp": Run("resume", offsets_counter, _c(once=NJ, shuffle=NA, resume=F), _DCP,
                                words={"resume": "other values in /made"}, absent={"resume": "get_state"}),
    "RNG key only after a batch, dcp": Run(
        "resume", offsets_late_key, _c(once=NJ, shuffle=NA, resume=F), _DCP,
        words={"resume": "freshly built loader's state_dict() lacks"}),
    # epochs only where they can be known
    "zigzag, length declared": Run("steps", zigzag, _s(P), {"steps": 18, "num_samples": 12}),
    "zigzag, no length": Run("steps", zigzag, _s(NJ), {"steps": 18},
                             words={"balanced_coverage": "pass num_samples=N"}),
    "zigzag skipping a sample": Run("steps", zigzag_skips, _s(F), {"steps": 18, "num_samples": 12}),
    "a sample twice on one rank": Run(
        "steps", repeats_on_a_rank, _s(F), {"steps": 12, "num_samples": 12},
        words={"balanced_coverage": "rank 1 took sample 1 twice"},
        absent={"balanced_coverage": "overlap"}),
    # layout invariance per global batch
    "global batches split over ranks": Run("layout", split_each_batch,
                                           {"layout_invariance": P}),
    "whole global batches in turn": Run(
        "layout", whole_batches_in_turn, {"layout_invariance": F},
        words={"layout_invariance": "global batch 0: first had 4 samples, second had 8"}),
    "global batches, DistributedSampler, from check_contract's ledgers": Run(
        "ledgers", dist_same_global, {"layout_invariance": P},
        words={"layout_invariance": "within a global batch order is not compared"}),
    "global batch doubled, from check_contract's ledgers": Run(
        "ledgers", dist_per_rank_batch, {"layout_invariance": F},
        words={"layout_invariance": "first had 4 samples, second had 8"}),
    "other samples per step, from check_contract's ledgers": Run(
        "ledgers", halves_by_rank, {"layout_invariance": F},
        words={"layout_invariance": "the samples of an optimizer step changed"}),
    "no dataset_id in the ledgers": Run(
        "ledgers", split_train, {"layout_invariance": NJ},
        words={"layout_invariance": "carried no dataset_id"}),
    # a save at every kind of boundary
    "position kept": Run("resume", positioned, _c(once=NJ, resume=P), _ENDS),
    "position modulo the epoch": Run("resume", positioned_modulo, _c(once=F, resume=F), _ENDS,
                                     words={"resume": "modulo the epoch's length reads 0"},
                                     absent={"resume": "StatefulDistributedSampler"}),
    # "not asked" is not "not judged"
    "not shuffled, shuffle=False": Run("contract", L.right_padded, _c(dp=X, batch=X, shuffle=NA),
                                       _OFF, words={"table": ": PASS"}),
    "unsharded, shuffle=False": Run("contract", L.unsharded, _c(dp=F, shuffle=NA), _OFF),
    # hints from the evidence
    "no position saved in a stream": Run(
        "resume", stream_no_position, _c(once=F, shuffle=NA, resume=F), _MID,
        words={"resume": "IterableDataset"}, absent={"resume": "StatefulDistributedSampler"}),
    "the same rank on every rank": Run(
        "contract", same_rank_everywhere, _c(dp=F, once=F),
        words={"dp_disjoint": "same shard", "exactly_once": "same share"},
        absent={"dp_disjoint": "no sharding at all", "exactly_once": _NO_HINT}),
    "seeded per rank": Run(
        "contract", seed_per_rank, _c(dp=F, once=F),
        words={"dp_disjoint": "samplers that disagree", "exactly_once": "came twice"},
        absent={"exactly_once": _NO_HINT}),
    "position counted since the last load": Run(
        "resume", positioned_since_load, _c(once=F, resume=F),
        {"scenarios": ["right after a resume"], "shuffle": True},
        words={"resume": "counts from the last load"},
        absent={"resume": "StatefulDistributedSampler", "exactly_once": "drop_last"}),
    "a stream sharded by worker, not rank": Run(
        "contract", by_worker_not_rank, _c(dp=F, once=NJ, shuffle=NJ),
        words={"dp_disjoint": "no sharding by rank"}, absent={"dp_disjoint": "DistributedSampler("}),
    # the ninth trial: the replicas' batch sizes at a step, ids past num_samples=, a
    # RandomSampler subclass (_verify_splits.py)
    "batches of 5 and 3, a global batch of 8": Run(
        "contract", S.uneven_batches, _c(batch=F),
        words={"global_batch": "weighs 5/3 of one of replica 0's"}),
    "batches of 5 and 3, raw text": Run(
        "contract", S.uneven_batches_text, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3, two rows of zeros added to the 3": Run(
        "contract", S.uneven_zero_rows, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3, the 3 given copies of 2 of its rows": Run(
        "contract", S.uneven_copied_rows, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 4, the last ones 5 and 1": Run(
        "contract", S.lopsided_last_step, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 1"}),
    "batches of 5 and 3, the 3 given 2 rows of random tokens": Run(
        "contract", S.uneven_noise_rows, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3, each padded with random rows to 6": Run(
        "contract", S.uneven_all_padded, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 4, each padded with 2 random rows": Run(
        "contract", S.even_all_padded, _c()),
    # the twelfth trial's ways around the padding rule (verify/padding.py) and a chunker
    "batches of 5 and 3 padded to 6, persistent workers": Run(
        "contract", S.uneven_padded_persistent, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3 padded to 6, rows rolled by the batch": Run(
        "contract", S.uneven_padded_rolled, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3 padded to 6, a list of rows": Run(
        "contract", S.uneven_padded_list, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3 padded to 6, a token masked per read": Run(
        "contract", S.uneven_padded_masking, _c(batch=NJ),
        words={"global_batch": "could not be read again alike"}),
    "batches of 5 and 3 padded to 6, a stream": Run(
        "contract", S.uneven_padded_stream, _c(batch=NJ), {"num_samples": S.N},
        words={"global_batch": "a stream's samples cannot be read again"}),
    "a chunker with a token budget, 2 and 3 samples in 4 rows": Run(
        "contract", S.token_budget_chunks, _c(batch=X),
        words={"global_batch": "every step holds 8 rows of 8 values"}),
    # the thirteenth trial's: pads holding a copied value, windows, text cut in the collate
    "batches of 5 and 3, each padded with zero rows holding a copied token": Run(
        "contract", S.uneven_pads_holding_a_value, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3, each row a value short, pad rows holding those values": Run(
        "contract", S.uneven_spread_thin, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "windows by a stride, 2 and 4 samples in 6 rows": Run(
        "contract", S.token_budget_windows, _c(batch=X),
        words={"global_batch": "every step holds 12 rows of 8 values"}),
    "a chunker over text tokenized in the collate": Run(
        "contract", S.token_budget_text, _c(batch=NJ),
        words={"global_batch": "could not be read again alike"}),
    "batches of 5 and 3, a side field of 5 fixed rows in each": Run(
        "contract", S.uneven_side_field, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "batches of 5 and 3, the 3 padded to 10 tokens": Run(
        "contract", S.uneven_wider_rows, _c(batch=F),
        words={"global_batch": "replica 0: 5, replica 1: 3"}),
    "a stream dealt every 2nd sample, last batches of 3 and 2": Run(
        "contract", S.uneven_remainders, _c(batch=X), {"num_samples": 13}),
    "packed rows of 5 and 3 documents, the same tokens": Run(
        "contract", S.packed_rows, _c(), {"num_samples": S.N}),
    "packed rows of 10, 7, 7, 6 documents a step, the same tokens": Run(
        "contract", S.packed_rows_varying, _c(batch=X), {"num_samples": 30},
        words={"global_batch": "every step holds 4 rows of 12 values over the replicas"}),
    "random_split parts, a RandomSampler subclass": Run(
        "contract", S.split_random_subclass, _c(batch=X)),
    "training, the pad under a fresh id past num_samples": Run(
        "contract", S.pads_renumbered, _c(once=F, shuffle=NA), {"num_samples": S.M, "shuffle": False},
        words={"exactly_once": "outside range(23) were dealt, [23]"}),
    "eval, the pad counted under a fresh id": Run(
        "eval", S.pads_renumbered, _e(F), {"num_samples": S.M},
        words={"counted_once": "outside range(23) (num_samples=) counted: [23]"}),
    "eval, the pad at weight 0 under a fresh id": Run(
        "eval", S.pads_renumbered_weight_zero, _e(P), {"num_samples": S.M}),
    "eval, the pad and its original at 0.5 each": Run(
        "eval", S.split_weight, _e(P), {"num_samples": S.M}),
    "eval, the pad at 0.5 with a made-up loss": Run(
        "eval", S.split_weight_zero_pad, _e(F), {"num_samples": S.M},
        words={"counted_once": "sample 0 is delivered twice with weight > 0 and the same"}),
    "eval, the pad at 0.5 with a made-up loss, tokens alike": Run(
        "eval", S.split_weight_zero_pad_tokens, _e(F), {"num_samples": S.M},
        words={"counted_once": "holding other values (loss)"}),
    "eval, a document's two chunks at 0.5, each its own tokens and loss": Run(
        "eval", S.chunk_losses, _e(P), {"num_samples": S.M}),
    "steps, the pad dealt under a fresh id": Run(
        "steps", S.steps_pads_renumbered, _s(F), {"steps": 30, "num_samples": S.M},
        words={"balanced_coverage": "outside range(23) (1 in all: [23])"}),
    "steps, no pad": Run("steps", S.steps_unpadded, _s(P), {"steps": 30, "num_samples": S.M}),
    # the twelfth trial: a sample read again from loader.dataset (_verify_twelfth.py)
    "eval, a worker gives sample 22 sample 0's loss": Run(
        "eval", T.eval_worker_misreads, _e(F), {"num_samples": T.M},
        words={"counted_once": "the metric counts sample 0's loss twice and sample 22's never"}),
    "eval, every sample its own loss in a worker": Run(
        "eval", T.eval_worker_reads, _e(P), {"num_samples": T.M},
        absent={"counted_once": "trusted"}),
    "eval, sample 0's loss made under id 22 in a collate over positions": Run(
        "eval", T.eval_positions_misread, _e(P), {"num_samples": T.M},
        words={"counted_once": "carries is trusted, not judged"}),
    "eval, the pads of samples 0 and 1 flagged is_pad": Run(
        "eval", T.eval_pads_flagged, _e(P), {"num_samples": 22},
        absent={"counted_once": "trusted"}),
    "steps, a worker gives sample 22 sample 0's loss": Run(
        "steps", T.steps_worker_misreads, _s(F), {"steps": 8, "num_samples": T.M},
        words={"balanced_coverage": "training reads sample 0's loss twice"}),
    "steps, every sample its own loss in a worker": Run(
        "steps", T.steps_worker_reads, _s(P), {"steps": 8, "num_samples": T.M},
        absent={"balanced_coverage": "trusted"}),
    # the thirteenth trial (_verify_thirteenth.py): a field drawn anew each read is left out,
    # the others judged; a one-number field is judged by its value; persistent workers too
    "eval, a worker gives sample 22 sample 0's loss beside a TTA draw": Run(
        "eval", R.eval_tta_misreads, _e(F), {"num_samples": R.M},
        words={"counted_once": "the metric counts sample 0's loss twice and sample 22's never"}),
    "eval, a TTA draw beside honest fields": Run(
        "eval", R.eval_tta_reads, _e(P), {"num_samples": R.M},
        absent={"counted_once": "trusted"}),
    "eval, a worker gives sample 22 a loss of 0.0": Run(
        "eval", R.eval_worker_zero_loss, _e(F), {"num_samples": R.M},
        words={"counted_once": "was delivered with loss 0 where dataset[22], read again in "
               "the rank after the run (twice alike), holds"}),
    "eval, a worker gives sample 22 sample 0's 0/1 flag": Run(
        "eval", R.eval_worker_flag, _e(F), {"num_samples": R.M},
        words={"counted_once": "delivered with correct 0 where dataset[22]"}),
    "eval, every sample one place off in a worker": Run(
        "eval", R.eval_worker_off_by_one, _e(F), {"num_samples": R.M},
        words={"counted_once": "not its own"}),
    "eval, a worker gives sample 22 sample 0's loss, persistent workers": Run(
        "eval", R.eval_persistent_misreads, _e(F), {"num_samples": R.M},
        words={"counted_once": "the metric counts sample 0's loss twice and sample 22's never"}),
    "eval, a collate scales every sample's loss by the batch size": Run(
        "eval", R.eval_collate_rescales, _e(P), {"num_samples": R.M},
        absent={"counted_once": "trusted"}),
    "steps, a worker gives sample 22 a loss of 0.0": Run(
        "steps", R.steps_worker_stale_loss, _s(F), {"steps": 8, "num_samples": R.M},
        words={"balanced_coverage": "training reads sample 22 with a loss not its own"}),
    "steps, a worker gives sample 22 sample 0's loss, persistent workers": Run(
        "steps", R.steps_persistent_misreads, _s(F), {"steps": 8, "num_samples": R.M},
        words={"balanced_coverage": "training reads sample 0's loss twice"}),
    # context parallel (dp=2,cp=2): the CP ranks of a replica together hold each sample read
    # again (verify/cp_slices.py), as check_contract asks (_verify_corpus.py's CP rows)
    "eval, every CP rank the first half of each sequence": Run(
        "eval", T.cp_eval_same_slice, {**_e(P), "tp_identical": F}, {"num_samples": T.M},
        words={"tp_identical": "4 of its 8 values are on no CP rank and 4 of its 8 values are "
               "on two or more, so part of the sequence is never evaluated"},
        layout=_CP),
    "eval, CP ranks the zigzag chunks of each sequence": Run(
        "eval", T.cp_eval_zigzag, {**_e(P), "tp_identical": P}, {"num_samples": T.M},
        words={"tp_identical": "together hold every value of each sample read again"},
        layout=_CP),
    "steps, token 3 of each sequence on no CP rank": Run(
        "steps", T.cp_steps_gap, {**_s(P), "tp_identical": F}, {"steps": 8, "num_samples": T.M},
        words={"tp_identical": "1 of its 8 values is on no CP rank, so part of the sequence is "
               "never trained in context parallel"},
        layout=_CP),
    "steps, CP ranks the zigzag chunks of each sequence": Run(
        "steps", T.cp_steps_zigzag, {**_s(P), "tp_identical": P},
        {"steps": 8, "num_samples": T.M},
        words={"tp_identical": "together hold every value of each sample read again"},
        layout=_CP),
    # the thirteenth trial: a part out of order, a gap padded, nothing to read again
    "eval, CP rank 1's half reversed": Run(
        "eval", T.cp_eval_reversed, {**_e(P), "tp_identical": F}, {"num_samples": T.M},
        words={"tp_identical": "CP rank 1's part holds the sample's values"}, layout=_CP),
    "eval, token 3's gap on CP rank 0 padded with -100": Run(
        "eval", T.cp_eval_gap_padded, {**_e(P), "tp_identical": F}, {"num_samples": T.M},
        words={"tp_identical": "1 of its 8 values is on no CP rank"}, layout=_CP),
    "steps, CP rank 1's half reversed": Run(
        "steps", T.cp_steps_reversed, {**_s(P), "tp_identical": F},
        {"steps": 8, "num_samples": T.M},
        words={"tp_identical": "is trained as another sequence in context parallel"}, layout=_CP),
    "steps, token 3 on no CP rank, a list of batches": Run(
        "steps", T.cp_steps_listed, {**_s(P), "tp_identical": NJ},
        {"steps": 8, "num_samples": T.M},
        words={"tp_identical": "no sample could be read again whole"}, layout=_CP),
}  # fmt: skip
