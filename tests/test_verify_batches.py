"""Reading every sample of a batch: ``data.tree.sample_values`` (verify and the ledger share it).

Pure functions on batches built by hand as loaders give them; no ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from ezpz_nb.data.tree import sample_values
from ezpz_nb.ledger.records import batch_ints
from ezpz_nb.verify.batches import NoSampleIds, observe_batch


class _Samples(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.ones(2) * i, "meta": {"index": i, "worker_id": 0}}


@pytest.mark.parametrize(
    "collate",
    [None, list, tuple, lambda b: [(s, torch.tensor(0)) for s in b]],
    ids=["default", "list", "tuple", "pairs"],
)
def test_every_sample_of_a_batch_is_read_whatever_the_collate(collate):
    """Columns, lists and tuples of sample dicts, pairs: each batch's ids are all its samples.

    Guards: the first sample's id standing for the whole batch (collate_fn=list made
    the check say "12 of 16 never seen" for a right loader), in verify and the ledger alike.
    """
    loader = DataLoader(_Samples(), batch_size=3, collate_fn=collate)
    got = [batch_ints(b, "index") for b in loader]
    assert got == [(0, 1, 2), (3, 4, 5)]
    assert [observe_batch(b, "auto")[0] for b in loader] == [[0, 1, 2], [3, 4, 5]]


def test_columns_nesting_and_keys():
    """A dict of lists (a Hugging Face batch), a key two dicts deep, string keys, and no key."""
    assert sample_values({"text": ["a", "b"], "index": [4, 5]}, "index") == [4, 5]
    assert sample_values(({"m": {"index": torch.tensor([[1], [2]])}}, torch.zeros(2)), "index") == [
        1,
        2,
    ]
    assert sample_values([{"__key__": "s/0"}, {"__key__": "s/1"}], "__key__") == ["s/0", "s/1"]
    assert sample_values({"x": torch.zeros(2)}, "index") is None
    assert batch_ints({"x": torch.zeros(2)}, "index") == ()


def test_a_batch_without_ids_says_what_to_pass():
    """No id field: the error names the structure and the three ways out, with no "an a" typo.

    Guards: "has no an 'index'" / "has no a 'index' field" (issue 33's typos).
    """
    for key, want in (("auto", "no 'index' or '__key__' field"), ("id", "no 'id' field")):
        with pytest.raises(NoSampleIds, match=want) as err:
            observe_batch({"x": torch.zeros(2, 2)}, key)
        assert "key='digest'" in str(err.value)


def test_records_of_every_kind_are_read_and_key_is_honoured():
    """Namedtuples, dataclasses, attrs-like classes and mappings are records: their fields are
    read by name, ``key=`` finds a field in each, and the digest leaves out the tags of where
    and when a sample was loaded (worker id, step, epoch), not its contents.

    Guards: namedtuple batches crashing with "no 'index' field" (issue 44), and a worker tag
    making a resumed batch read as other contents.
    """
    import collections
    import dataclasses
    from types import MappingProxyType

    from ezpz_nb.data.tree import find_in_batch, leaves

    Nt = collections.namedtuple("Nt", "x index")

    @dataclasses.dataclass
    class Dc:
        x: torch.Tensor
        index: torch.Tensor

    class Attr:  # what attrs gives a class: a tuple of fields with names
        __attrs_attrs__ = (type("A", (), {"name": "x"}), type("A", (), {"name": "index"}))

        def __init__(self, x: torch.Tensor, index: torch.Tensor) -> None:
            self.x, self.index = x, index

    x, ids = torch.ones(2, 3), torch.tensor([5, 9])
    for batch in (Nt(x, ids), Dc(x, ids), Attr(x, ids), MappingProxyType({"x": x, "index": ids})):
        assert sample_values(batch, "index") == [5, 9], batch
        assert observe_batch(batch, "index")[0] == [5, 9] and observe_batch(batch, "auto")[0] == [
            5,
            9,
        ]
        assert find_in_batch([batch], "x") is x and [p for p, _ in leaves(batch)] == [
            "/x",
            "/index",
        ]
    plain = observe_batch({"x": x, "index": ids}, "auto")[2]
    tagged = observe_batch({"x": x, "index": ids, "worker_id": torch.tensor([1, 1])}, "auto")
    assert tagged[2] == plain and tagged[3] == [1, 1]
    assert observe_batch({"x": x + 1, "index": ids}, "auto")[2] != plain


def test_ids_outside_the_dataset_length_are_said_so():
    """Guards the eleventh trial's words: ids outside range(len(loader.dataset)) make the
    universe the ids seen, and the report says why, not "no dataset length"."""
    from ezpz_nb.verify.universe import DatasetIds, universe_of

    part = DatasetIds(maps=[], kinds=[], lengths=[30], raws=[], under=[])
    assert universe_of([part], None, [-1, 5, 45]).outside == 30
    assert universe_of([part], None, [0, 5, 29]).ids == frozenset(range(30))
    assert universe_of([None], None, [0]).outside is None
