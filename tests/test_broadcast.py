"""ezpz_nb.data.broadcast and tree: the TP leader's batches reach its peers intact.

Multi-rank tests run through ``ez.launch`` on real gloo ranks; each launch runs
several checks and returns plain data, so the assertions live here.
"""

from __future__ import annotations

import gc
import random
import threading
import weakref

import pytest
import torch
import torch.distributed as dist
from _batches import Point
from torch.utils.data import DataLoader, IterableDataset

import ezpz_nb as ez
from ezpz_nb.data import TPBroadcastDataLoader, TPLeaderError, broadcast
from ezpz_nb.data.broadcast import BatchBroadcaster
from ezpz_nb.data.groups import make_layout
from ezpz_nb.data.tree import flatten_batch, unflatten_batch


def test_flatten_roundtrip_keeps_structure():
    """Guards the broadcast's tree encoding: nesting, namedtuples and plain leaves survive."""
    batch = {
        "a": [torch.ones(2), (torch.zeros(1, dtype=torch.int8), "s")],
        "p": Point(1, torch.arange(3)),
        "n": None,
    }
    tree, tensors = flatten_batch(batch)
    assert len(tensors) == 3
    back = unflatten_batch(tree, tensors)
    assert back["a"][1][1] == "s" and back["n"] is None and isinstance(back["p"], Point)
    assert torch.equal(back["p"].y, torch.arange(3))


class MixedLoader:
    """Batches whose structure, shapes and dtypes change, with non-tensor leaves."""

    def __init__(self):
        self.batches = []
        for i in range(9):
            n = 3 if i < 4 else 1 + i % 3  # steady for 4 steps, then shapes change
            self.batches.append(
                {
                    "ids": torch.arange(n * 4, dtype=torch.int64).reshape(n, 4) + i,
                    "x": [
                        torch.full((n,), i / 3, dtype=torch.float32),
                        torch.tensor(i, dtype=torch.bfloat16),
                    ],
                    "mask": (torch.arange(n) % 2).bool(),
                    "small": (
                        torch.tensor([i], dtype=torch.int8),
                        torch.zeros(0, 2, dtype=torch.float64),
                    ),
                    "strided": torch.arange(12.0).reshape(3, 4).t()[:, i % 3],
                    "meta": {"step": i, "name": f"b{i // 5}", "none": None},
                    "point": Point(i, torch.tensor([i, i], dtype=torch.int16)),
                    "complex": torch.full(
                        (2,), complex(i, -i), dtype=torch.complex128
                    ),  # 16-byte items
                }
            )

        # Flat dicts of tensors take the leader's shortcut past flattening and
        # pickling. Each of these differs from the one before in a way the shortcut
        # must notice (shape, dtype, a plain leaf, key order, a key's name) or must
        # pass through intact (requires_grad; a subclass, which takes the long way).
        def flat(n, dtype=torch.int64, ids=None):
            return {
                "input_ids": torch.arange(n, dtype=dtype) if ids is None else ids,
                "index": torch.tensor([n]),
            }

        self.batches += [
            flat(4),
            flat(4),
            flat(5),
            flat(5, torch.int32),  # steady, then a shape, then a dtype
            {"input_ids": torch.arange(5, dtype=torch.int32), "index": 5},  # a plain leaf
            {
                "index": torch.tensor([5]),
                "input_ids": torch.arange(5, dtype=torch.int32),
            },  # key order
            {"index": torch.tensor([5]), "ids": torch.arange(5, dtype=torch.int32)},  # a key's name
            flat(5, ids=torch.ones(5, requires_grad=True)),
            flat(5, ids=torch.nn.Parameter(torch.full((5,), 2.0))),  # a Tensor subclass
            flat(5, ids=torch.full((5,), 3.0, requires_grad=True)),
        ]
        self.batches.append({"only": torch.ones(2)})  # structure change at the end

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


def _broadcast_run(mode):
    calls = [0]
    dl = TPBroadcastDataLoader(MixedLoader(), dist.group.WORLD, mode=mode)
    if dl._broadcaster is not None:  # count collectives without changing them
        inner = dl._broadcaster._bcast
        dl._broadcaster._bcast = lambda buf: (calls.__setitem__(0, calls[0] + 1), inner(buf))
    got = list(dl)  # keep every batch: a reused receive buffer would overwrite earlier ones
    # A steady second pass: same shapes every step.
    steady = TPBroadcastDataLoader(
        [{"a": torch.ones(4, 4) * i} for i in range(6)], dist.group.WORLD, mode=mode
    )
    before = calls[0]
    if steady._broadcaster is not None:
        inner2 = steady._broadcaster._bcast
        steady._broadcaster._bcast = lambda buf: (calls.__setitem__(0, calls[0] + 1), inner2(buf))
    flattened = [0]  # the leader's full flatten+pickle: only while the spec is new
    real_flatten = broadcast.flatten_batch

    def counting_flatten(batch):
        flattened[0] += 1
        return real_flatten(batch)

    broadcast.flatten_batch = counting_flatten
    try:
        list(steady)
    finally:
        broadcast.flatten_batch = real_flatten
    return {
        "batches": got,
        "source": dl.source,
        "steady_calls": calls[0] - before,
        "flattened": flattened[0],
    }


def _same(a, b):
    if torch.is_tensor(a):
        return (
            torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("mode", ["tensor", "pickle"])
def test_broadcast_handles_changing_shapes_mixed_dtypes_and_plain_leaves(mode):
    """Guards the packed broadcast: changing shapes and structure, int8/int16/bf16/bool/f64/c128,
    0-d, empty and non-contiguous tensors, namedtuples and non-tensor leaves all arrive
    intact, each batch in its own memory; steady shapes cost one collective per batch."""
    leader, peer = ez.launch(_broadcast_run, mode, world_size=2, timeout=60)
    assert (leader["source"], peer["source"]) == ("loaded", "received")
    want = MixedLoader().batches
    assert len(peer["batches"]) == len(want)
    for i, (a, b) in enumerate(zip(want, peer["batches"], strict=True)):
        assert _same(a, b), f"batch {i} differs"
    if mode == "tensor":
        assert peer["steady_calls"] == 6 + 2  # first batch: spec + data; then 1 each; end: 1
        assert leader["flattened"] == 1  # then the flat-dict shortcut, for 5 batches


class Stream(IterableDataset):
    """An IterableDataset with no __len__: peers cannot know the step count."""

    def __iter__(self):
        for i in range(7):
            yield {"index": torch.tensor(i), "x": torch.full((3,), float(i))}


class Lying:
    """A loader whose __len__ disagrees with what it yields."""

    def __init__(self, length, yields, fail_at=None):
        self.length, self.yields, self.fail_at = length, yields, fail_at

    def __len__(self):
        return self.length

    def __iter__(self):
        for i in range(self.yields):
            if i == self.fail_at:
                raise KeyError(f"corrupt shard at step {i}")
            yield {"index": torch.tensor([i])}


def _stop_run():
    lay = make_layout(2)
    out = {}
    cases = {
        "iterable": lambda: DataLoader(Stream(), batch_size=2),
        "shorter": lambda: Lying(10, 3),
        "longer": lambda: Lying(2, 5),
        "leader_fails": lambda: Lying(10, 10, fail_at=2),
        # A lock pickles neither way (a lambda would: the spec falls back to cloudpickle).
        "unpicklable": lambda: [{"x": torch.ones(1)}, {"x": torch.ones(1), "f": threading.Lock()}],
    }
    for mode in ("tensor", "pickle"):
        for name, make in cases.items():
            dl = TPBroadcastDataLoader(make(), lay.tp_group, mode=mode)
            steps = []
            try:
                for b in dl:
                    steps.append(b["index"].tolist() if "index" in b else None)
                out[(mode, name)] = ("ok", steps)
            except TPLeaderError as e:
                out[(mode, name)] = ("TPLeaderError", steps, e.leader_rank, e.error_type, str(e))
            except Exception as e:  # noqa: BLE001 - the leader's own exception, any type
                out[(mode, name)] = (type(e).__name__, steps)
            dist.barrier()  # every rank reached the same point: nobody hung
    return out


def test_leader_announces_end_and_errors_so_no_rank_hangs():
    """Guards ezpz pitfall 3 (docs/ezpz_pitfalls.md) (hang): an IterableDataset, a loader shorter or longer than its
    len(), a leader exception and an unpicklable batch give the same stop, or a clear
    TPLeaderError naming the leader's global rank, on every TP rank, in both modes."""
    results = ez.launch(_stop_run, world_size=4, timeout=60)
    for mode in ("tensor", "pickle"):
        for rank, res in enumerate(results):
            leader = rank - rank % 2
            assert res[(mode, "iterable")] == ("ok", [[0, 1], [2, 3], [4, 5], [6]])
            assert res[(mode, "shorter")] == ("ok", [[0], [1], [2]])
            assert res[(mode, "longer")] == ("ok", [[i] for i in range(5)])
            fail = res[(mode, "leader_fails")]
            unp = res[(mode, "unpicklable")]
            if rank == leader:
                assert fail == ("KeyError", [[0], [1]])
                assert unp[0] != "ok" and unp[1] == [None]
            else:
                kind, steps, leader_rank, error_type, message = fail
                assert (kind, steps, leader_rank, error_type) == (
                    "TPLeaderError",
                    [[0], [1]],
                    leader,
                    "KeyError",
                )
                assert f"global rank {leader}" in message and "corrupt shard at step 2" in message
                assert unp[0] == "TPLeaderError" and unp[1] == [None]


def test_broadcaster_rejects_unknown_mode():
    """Guards a typo silently picking a path: only 'tensor' and 'pickle' exist."""
    with pytest.raises(ValueError, match="mode"):
        BatchBroadcaster(None, mode="tensors")


# --------------------------------------------------- received memory is reused


def _numbered(i):
    """Batch ``i``: every element of every tensor says ``i``."""
    return {
        "input_ids": torch.full((4, 8), i, dtype=torch.int64),
        "x": torch.full((3,), float(i)),
        "index": torch.tensor(i),
    }


def _is(t, i):
    return t is None or bool((t == i).all())


def _rows_trained(out):
    """The embedding rows that backward from ``out`` reaches: those its saved input names."""
    _EMBEDDING.grad = None
    out.sum().backward()
    return _EMBEDDING.grad.sum(1).nonzero()[:, 0]


_EMBEDDING = torch.ones(128, 2, requires_grad=True)

# What a training loop may keep of a received batch, and how to read a tensor
# back from what it kept (None: it is gone, as a weakly referenced batch may be).
_KEEPS = {
    "the dict": (lambda b: b, lambda k: k["input_ids"]),
    "the first tensor": (lambda b: b["input_ids"], lambda k: k),
    "the last tensor": (lambda b: b["index"], lambda k: k),
    "a slice": (lambda b: b["input_ids"][1:, :2], lambda k: k),
    "a detached alias": (lambda b: b["x"].detach(), lambda k: k),
    "a numpy array": (lambda b: b["index"].numpy(), torch.from_numpy),
    "the storage": (
        lambda b: (b["x"].untyped_storage(), b["x"].storage_offset()),
        lambda k: torch.empty(0).set_(k[0], k[1], (3,)),
    ),
    "a weak reference": (lambda b: weakref.ref(b["input_ids"]), lambda k: k()),
    "autograd's saved input": (
        lambda b: torch.nn.functional.embedding(b["input_ids"], _EMBEDDING),
        _rows_trained,
    ),
}


def _reuse_run(plan, recycle=True):
    """Run the steps of ``plan`` (the name of what to keep, or None) through a
    TPBroadcastDataLoader; report what broke in what the peer kept and how many
    receive buffers it made."""
    if not recycle:
        broadcast._CAN_RECYCLE = False  # as on a torch without the private counters
    made = [0]
    real = broadcast._RecvBuffer

    def counting(*args):
        made[0] += 1
        return real(*args)

    broadcast._RecvBuffer = counting
    dl = TPBroadcastDataLoader([_numbered(i) for i in range(len(plan))], dist.group.WORLD)
    kept = []
    # Everything alive now (torch's modules above all) is left out of each collection
    # below: with torch loaded a full gc.collect() costs ~86 ms, after a freeze ~0.
    gc.freeze()
    try:
        for i, batch in enumerate(dl):
            if plan[i] is not None:
                kept.append((i, plan[i], _KEEPS[plan[i]][0](batch)))
            del batch
            gc.collect()  # nothing but what the loop kept is alive
    finally:
        gc.unfreeze()
    broken = [(i, name) for i, name, k in kept if not _is(_KEEPS[name][1](k), i)]
    return {"rank": dist.get_rank(), "broken": broken, "made": made[0]}


def test_a_received_batch_stays_valid_while_anything_can_reach_it():
    """Guards the peers' reuse of receive buffers: a batch kept as a dict, one tensor,
    a slice, an alias, a numpy array, its storage, a weak reference or autograd's saved
    input is never overwritten by a later batch, in a seeded random mix of 120 steps."""
    rng = random.Random(17)
    plan = [rng.choice([*_KEEPS, None, None]) for _ in range(120)]
    leader, peer = ez.launch(_reuse_run, plan, world_size=2, timeout=120)
    assert leader["broken"] == [] and peer["broken"] == []
    kept = sum(p is not None for p in plan)
    # Each kept batch keeps its buffer; the rest share the two that take turns
    # (plus the first, sized for the spec announcement).
    assert kept <= peer["made"] <= kept + 3


def test_a_loop_that_keeps_nothing_receives_into_two_buffers():
    """Guards the steady step's speed: ``for batch in loader`` holds only the previous
    batch while the next arrives, so two buffers take turns (after the one the spec
    announcement came in); without torch's reference counters every step makes one."""
    plan = [None] * 30
    recycled = ez.launch(_reuse_run, plan, world_size=2, timeout=60)[1]
    fresh = ez.launch(_reuse_run, plan, False, world_size=2, timeout=60)[1]
    assert recycled["broken"] == fresh["broken"] == []
    assert recycled["made"] == 1 + 2
    # The first batch comes in the spec's own buffer; the end announcement needs one too.
    assert fresh["made"] == 1 + 29 + 1


def _local_type_run():
    from typing import NamedTuple

    class Pair(NamedTuple):  # defined on the rank, as in a notebook cell: no importable name
        ids: torch.Tensor
        mask: torch.Tensor

    batches = [Pair(torch.arange(3) + i, torch.ones(2, i + 1)) for i in range(3)]
    got = list(TPBroadcastDataLoader(batches, dist.group.WORLD))
    return [(type(b).__name__, b.ids.tolist(), b.mask.shape) for b in got]


def test_a_batch_type_defined_in_a_cell_crosses_the_broadcast():
    """Guards a NamedTuple batch defined in a notebook cell failing on the leader: plain
    pickle cannot name a class that exists on the ranks only as a copy."""
    leader, peer = ez.launch(_local_type_run, world_size=2, timeout=60)
    assert peer == leader
    assert [name for name, _, _ in peer] == ["Pair"] * 3
    assert [ids for _, ids, _ in peer] == [[i, i + 1, i + 2] for i in range(3)]


def _epochs_run(epochs: int):
    dl = TPBroadcastDataLoader(
        [{"a": torch.full((4, 256), float(i))} for i in range(4)], dist.group.WORLD
    )
    return [[int(b["a"][0, 0]) for b in dl] for _ in range(epochs)]


def test_the_end_of_an_epoch_leaves_the_next_epoch_whole():
    """Guards the end announcement, which borrows a send buffer of the leader's (issue 47
    item 10: a new one each epoch was an allocation and a fill of a whole step): the
    buffer gets its data header back, so every epoch after brings all its batches (without
    it the next epoch's first batch says "end" and the ranks part ways)."""
    leader, peer = ez.launch(_epochs_run, 3, world_size=2, timeout=60)
    assert leader == peer == [[0, 1, 2, 3]] * 3
