"""A corpus of loaders whose verdicts are known by construction, rule by rule.

Each case is a factory (``make_loader(layout)``), the layout it runs on, and the
verdict every covered rule must give: ``"pass"``, ``"fail"``, ``"expected"`` (a
pass whose findings the loader's settings explain) or ``"not judged"``. The
truth comes from how the loader was built (a sampler over the whole world makes
TP peers differ...), never from running the checker. Every future rule lands
here with a right case and a wrong one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import _verify_loaders as L
import _verify_thirteenth as R
import _verify_twelfth as T
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    Subset,
)

P, F, X, NJ = "pass", "fail", "expected", "not judged"


def _ds(n: int = 16) -> L.Squares:
    return L.Squares(n)


def _dist(layout: Any, ds: Any, shuffle: bool = True, **kw: Any) -> DistributedSampler:
    return DistributedSampler(
        ds, num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=shuffle, seed=5, **kw
    )


# ------------------------------------------------------------------ batch shapes
def listed(layout: Any) -> DataLoader:
    """collate_fn=list: each batch is a list of sample dicts (issue 33, row 1)."""
    ds = _ds()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds), collate_fn=list)


def tupled(layout: Any) -> DataLoader:
    """collate_fn=tuple: a tuple of sample dicts."""
    ds = _ds()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds), collate_fn=tuple)


class _Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[dict[str, Any], torch.Tensor]:
        return {"x": torch.ones(2) * i, "meta": {"index": i}}, torch.tensor(i % 3)


def nested(layout: Any) -> DataLoader:
    """(features, label) pairs whose ids sit two dicts deep."""
    ds = _Pairs()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds))


def columns(layout: Any) -> list[dict[str, Any]]:
    """A dict of lists, as a Hugging Face batch gives (text column, index column)."""
    ids = list(range(layout.dp_rank, 16, layout.dp_size))
    return [
        {"text": [f"doc {i}" for i in ids[b : b + 4]], "index": ids[b : b + 4]}
        for b in range(0, len(ids), 4)
    ]


def listed_pairs(layout: Any) -> DataLoader:
    """collate_fn=list over (dict, label) samples: a list of tuples."""
    ds = _Pairs()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds), collate_fn=list)


# ------------------------------------------------------------------ no data
def one_pass(layout: Any) -> Any:
    """iter(DataLoader): spent after epoch 0, so epoch 1 is empty on every rank (row 2)."""
    return iter(L.right(layout))


def empty_subset(layout: Any) -> DataLoader:
    """An empty Subset: no batch at all (row 3)."""
    return DataLoader(Subset(_ds(), []), batch_size=2)


def too_small_to_batch(layout: Any) -> DataLoader:
    """drop_last=True with fewer samples per replica than a batch: no batch at all (row 3)."""
    ds = _ds(6)
    return DataLoader(ds, batch_size=4, sampler=_dist(layout, ds), drop_last=True)


def generator(layout: Any) -> Iterator[dict[str, Any]]:
    """A generator: one pass only."""
    return ({"index": i} for i in range(layout.dp_rank, 16, layout.dp_size))


# ------------------------------------------------------------------ where the shuffle sits
def in_batch_sampler(layout: Any) -> DataLoader:
    """A shuffled DistributedSampler inside a BatchSampler: set_epoch reaches it (row 4)."""
    ds = _ds()
    return DataLoader(ds, batch_sampler=BatchSampler(_dist(layout, ds), 2, drop_last=False))


class Hiding:
    """A wrapper object without set_epoch: its sampler is never told the epoch (row 4)."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self._loader)


def hidden_sampler(layout: Any) -> Hiding:
    return Hiding(L.right(layout))


class Passing(Hiding):
    """The same wrapper with a set_epoch that passes the epoch on: right."""

    def set_epoch(self, epoch: int) -> None:
        self._loader.sampler.set_epoch(epoch)


def passed_on(layout: Any) -> Passing:
    return Passing(L.right(layout))


class _FixedShuffle(Sampler[int]):
    """Shuffles with a generator re-seeded to the same value every epoch, no set_epoch."""

    shuffle = True

    def __init__(self, layout: Any) -> None:
        self.rank, self.size = layout.dp_rank, layout.dp_size

    def __iter__(self) -> Iterator[int]:
        perm = torch.randperm(16, generator=torch.Generator().manual_seed(0)).tolist()
        return iter(perm[self.rank :: self.size])

    def __len__(self) -> int:
        return 16 // self.size


def fixed_shuffle(layout: Any) -> DataLoader:
    return DataLoader(_ds(), batch_size=2, sampler=_FixedShuffle(layout))


def not_shuffled(layout: Any) -> DataLoader:
    """DistributedSampler(shuffle=False): no shuffle asked, reshuffle not judged."""
    ds = _ds()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds, shuffle=False))


def random_unsharded(layout: Any) -> DataLoader:
    """DataLoader(shuffle=True) on every rank: shuffled, but every replica reads everything."""
    return DataLoader(_ds(), batch_size=2, sampler=RandomSampler(_ds()))


# ------------------------------------------------------------------ workers, libraries
def with_workers(layout: Any) -> DataLoader:
    """Two DataLoader workers over a DistributedSampler."""
    ds = _ds()
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds), num_workers=2)


def _hf(layout: Any) -> Any:
    import datasets

    return datasets.Dataset.from_dict({"index": list(range(16)), "x": [[i, i] for i in range(16)]})


def hf_map(layout: Any) -> DataLoader:
    """A Hugging Face map-style Dataset (torch format) under a DistributedSampler."""
    ds = _hf(layout).with_format("torch")
    return DataLoader(ds, batch_size=2, sampler=_dist(layout, ds))


def hf_map_unsharded(layout: Any) -> DataLoader:
    """The same without a sampler: every replica reads the whole dataset."""
    return DataLoader(_hf(layout).with_format("torch"), batch_size=2)


def _hf_stream(layout: Any, shuffle: bool, split: bool = True) -> Any:
    import datasets
    from datasets.distributed import split_dataset_by_node

    ds = _hf(layout).to_iterable_dataset(num_shards=4)
    if shuffle:
        ds = ds.shuffle(seed=1, buffer_size=8)
    if split:
        ds = split_dataset_by_node(ds, rank=layout.dp_rank, world_size=layout.dp_size)
    assert isinstance(ds, datasets.IterableDataset)
    return ds.with_format("torch")


def hf_stream_shuffled(layout: Any) -> DataLoader:
    """HF IterableDataset .shuffle(seed) split by node: set_epoch on the dataset reshuffles."""
    return DataLoader(_hf_stream(layout, True), batch_size=2)


def hf_stream(layout: Any) -> DataLoader:
    """HF IterableDataset split by node, no shuffle."""
    return DataLoader(_hf_stream(layout, False), batch_size=2)


def hf_stream_unsplit(layout: Any) -> DataLoader:
    """HF IterableDataset not split by node: every replica streams everything."""
    return DataLoader(_hf_stream(layout, False, split=False), batch_size=2)


def torchdata_stateful(layout: Any) -> Any:
    """torchdata's StatefulDataLoader over a shuffled DistributedSampler."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = _ds()
    return StatefulDataLoader(ds, batch_size=2, sampler=_dist(layout, ds))


class _Shards(IterableDataset):
    """A hand-written stream: rank r reads ids [start, stop) of its own range."""

    def __init__(self, layout: Any, overlap: int = 0) -> None:
        per = 16 // layout.dp_size
        self.ids = range(layout.dp_rank * per, min(16, (layout.dp_rank + 1) * per + overlap))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in self.ids:
            yield {"x": torch.ones(2) * i, "index": i}


def stream(layout: Any) -> DataLoader:
    return DataLoader(_Shards(layout), batch_size=2)


def stream_overlapping(layout: Any) -> DataLoader:
    """Shards that overlap by two samples: DP replicas share them."""
    return DataLoader(_Shards(layout, overlap=2), batch_size=2)


# ------------------------------------------------------------------ TP
def tp_broadcast(layout: Any) -> Any:
    """ezpz_nb's TP broadcast loader: only the TP leader loads, peers receive."""
    from ezpz_nb.data import TPBroadcastDataLoader

    return TPBroadcastDataLoader(L.right(layout), layout.tp_group)


def tp_random_ids(layout: Any) -> list[dict[str, Any]]:
    """TP peers drawing ids from a generator seeded by global rank: TP peers differ, and
    the DP replicas' halves of two different permutations overlap."""
    g = torch.Generator().manual_seed(layout.rank)
    perm = torch.randperm(16, generator=g).tolist()
    mine = sorted(perm[:8]) if layout.dp_rank == 0 else sorted(perm[8:])
    return [{"index": torch.tensor(mine[b : b + 2])} for b in range(0, 8, 2)]


class Case(NamedTuple):
    """A loader, its layout, and the verdict of each rule the check covers."""

    factory: Any
    layout: str
    verdicts: dict[str, str]


def _v(tp: str | None = None, dp: str = P, once: str = P, steps: str = P, batch: str = P,
       shuffle: str = P) -> dict[str, str]:  # fmt: skip
    out = {"dp_disjoint": dp, "exactly_once": once, "equal_steps": steps,
           "global_batch": batch, "reshuffle": shuffle}  # fmt: skip
    return {"tp_identical": tp, **out} if tp is not None else out


NOT_SHUFFLED = _v(shuffle=NJ)
#: No dataset length, no shuffle: "every sample once" is judged only over what was seen.
STREAM = _v(once=NJ, shuffle=NJ)
NO_DATA = _v(dp=NJ, once=NJ, steps=F, batch=NJ, shuffle=NJ)
CASES = {
    # torch DataLoader and samplers (L: the loaders of test_verify.py)
    "right": Case(L.right, "dp=2", _v()),
    "right tp": Case(L.right, "dp=2,tp=2", _v(tp=P)),
    "padded": Case(L.right_padded, "dp=2", _v(dp=X, batch=X, shuffle=NJ)),
    "dropped": Case(L.right_dropped, "dp=2", _v(once=X)),
    "world sharded": Case(L.world_sharded, "dp=2,tp=2", _v(tp=F)),
    "seeded by rank": Case(L.seeded_by_rank, "dp=2,tp=2", _v(tp=F)),
    "unsharded": Case(L.unsharded, "dp=2", _v(dp=F, shuffle=NJ)),
    "too many shards": Case(L.too_many_shards, "dp=2", _v(once=F)),
    # The step only replica 0 takes is equal_steps' finding; the global batch is
    # compared over the steps every replica took.
    "hand sharded": Case(L.hand_sharded, "dp=2", _v(steps=F, shuffle=NJ)),
    "uneven batches": Case(L.uneven_batches, "dp=2", _v(batch=F, shuffle=NJ)),
    "hidden set_epoch": Case(hidden_sampler, "dp=2", _v(shuffle=F)),
    "passed-on set_epoch": Case(passed_on, "dp=2", _v()),
    "in a BatchSampler": Case(in_batch_sampler, "dp=2", _v()),
    "fixed shuffle": Case(fixed_shuffle, "dp=2", _v(shuffle=F)),
    "not shuffled": Case(not_shuffled, "dp=2", NOT_SHUFFLED),
    "random unsharded": Case(random_unsharded, "dp=2", _v(dp=F)),
    # batch shapes
    "collate list": Case(listed, "dp=2", _v()),
    "collate tuple": Case(tupled, "dp=2", _v()),
    "nested pairs": Case(nested, "dp=2", _v()),
    "list of pairs": Case(listed_pairs, "dp=2", _v()),
    "dict of lists": Case(columns, "dp=2", STREAM),
    "keys": Case(L.keyed, "dp=2", STREAM),
    # no data
    "iter(DataLoader)": Case(one_pass, "dp=2", _v(once=NJ, steps=F, shuffle=NJ)),
    "generator": Case(generator, "dp=2", _v(once=NJ, steps=F, shuffle=NJ)),
    "empty Subset": Case(empty_subset, "dp=2", NO_DATA),
    "smaller than a batch": Case(too_small_to_batch, "dp=2", NO_DATA),
    # workers, streams, libraries
    "workers": Case(with_workers, "dp=2", _v()),
    "workers repeat a stream": Case(L.stream_workers_repeat, "dp=2", _v(once=F, shuffle=NJ)),
    "stream": Case(stream, "dp=2", STREAM),
    "overlapping stream": Case(stream_overlapping, "dp=2", _v(dp=F, once=NJ, steps=F, shuffle=NJ)),
    "HF map": Case(hf_map, "dp=2", _v()),
    "HF map unsharded": Case(hf_map_unsharded, "dp=2", _v(dp=F, shuffle=NJ)),
    "HF stream shuffled": Case(hf_stream_shuffled, "dp=2", _v(once=NJ)),
    "HF stream": Case(hf_stream, "dp=2", STREAM),
    "HF stream unsplit": Case(hf_stream_unsplit, "dp=2", _v(dp=F, once=NJ, shuffle=NJ)),
    "torchdata stateful": Case(torchdata_stateful, "dp=2", _v()),
    # TP and CP
    "TP broadcast": Case(tp_broadcast, "dp=2,tp=2", _v(tp=P)),
    "TP ids seeded by rank": Case(tp_random_ids, "dp=2,tp=2", _v(tp=F, dp=F, once=NJ, shuffle=NJ)),
    # A list of batches: no sample to read again, so the CP peers' slices are not judged.
    "CP slices": Case(L.cp_slices, "dp=2,cp=2", _v(tp=NJ, once=NJ, shuffle=NJ)),
    "CP split samples": Case(L.cp_split_samples, "dp=2,cp=2", _v(tp=F, once=NJ, shuffle=NJ)),
    # The twelfth trial (_verify_twelfth.py): the CP ranks together hold each sample's tokens.
    "CP, every rank the first half": Case(T.cp_same_slice, "dp=2,cp=2", _v(tp=F)),
    "CP, token 3 on no rank": Case(T.cp_gap, "dp=2,cp=2", _v(tp=F)),
    "CP halves": Case(T.cp_halves, "dp=2,cp=2", _v(tp=P)),
    "CP zigzag": Case(T.cp_zigzag, "dp=2,cp=2", _v(tp=P)),
    "CP, whole rows on every rank": Case(T.cp_full_rows, "dp=2,cp=2", _v(tp=P)),
    "CP halves of a next-token input": Case(T.cp_next_token_input, "dp=2,cp=2", _v(tp=P)),
    # One replica (4 ranks, as the corpus's clusters): no dp_disjoint rule.
    "CP halves, TP peers alike": Case(
        T.cp_halves, "dp=1,tp=2,cp=2", {k: v for k, v in _v(tp=P).items() if k != "dp_disjoint"}
    ),
    # The pad (a value in no sample, -1 here) is left out of the parts: the halves hold it.
    "CP halves of padded rows": Case(T.cp_padded_halves, "dp=2,cp=2", _v(tp=P)),
    # The thirteenth trial: each part is runs of the sample in order (at most 2: zigzag),
    # the pad left out (a gap it fills shows); a field still unsure stays not judged.
    "CP, rank 1's half reversed": Case(T.cp_reversed, "dp=2,cp=2", _v(tp=F)),
    "CP, rank 1's half with two tokens swapped": Case(T.cp_swapped_pair, "dp=2,cp=2", _v(tp=F)),
    "CP, rank 1's half rotated": Case(T.cp_half_rotated, "dp=2,cp=2", _v(tp=F)),
    "CP, token 3's gap padded with -100, labels right": Case(
        T.cp_gap_padded, "dp=2,cp=2", _v(tp=F)
    ),
    "CP halves, labels scaled by the collate": Case(T.cp_scaled_labels, "dp=2,cp=2", _v(tp=NJ)),
    "CP halves, the labels' prompt masked with -100": Case(
        T.cp_masked_labels, "dp=2,cp=2", _v(tp=P)
    ),
    "CP halves, the inputs' prompt replaced by -100": Case(
        T.cp_masked_inputs, "dp=2,cp=2", _v(tp=F)
    ),
    # The thirteenth trial (_verify_thirteenth.py): a field that reads differently each time
    # (an augmentation) is left out of the re-read, the sample's other fields judged.
    "a worker misreads beside an augmentation field": Case(
        R.contract_aug_misreads, "dp=2,tp=2", _v(tp=P, dp=F)
    ),
    "an augmentation field beside honest tokens": Case(R.contract_aug_reads, "dp=2,tp=2", _v(tp=P)),
    "every sample one place off in a worker": Case(R.contract_off_by_one, "dp=2", _v(dp=F)),
}
