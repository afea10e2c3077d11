"""The workshop checkers, fed right, wrong, blank and hanging solutions on real gloo ranks.

Guards against checkers that pass everything (wrong answers must be called wrong,
including the dodges a learner writes to turn a checker green without the
skill), that fail correct code written another way (they must judge behaviour,
not source), and that raise or hang on the shipped blanks. The shipped
solutions and blanks are read from the notebook's source, never copied here.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ezpz_nb as ez
import ezpz_nb.workshop.exercises as ex


def _workshop_cells(variant: str) -> list[str]:
    """Code cells of 05 as notebooks/_build.py writes them (``workshop`` or ``solutions``)."""
    root = Path(__file__).resolve().parent.parent / "notebooks"
    spec = importlib.util.spec_from_file_location("nb_build", root / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    name = "05_workshop.ipynb" if variant == "workshop" else "solutions/05_workshop_solutions.ipynb"
    nb = build.notebooks()[name]
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def _shipped_solutions() -> dict:
    """The solutions notebook's functions, defined as the notebook defines them.

    Read from the stored notebook (plain JSON, which ``_build.py --check`` keeps equal
    to the source): ranks import this module, and must not pay for jupytext.
    """
    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    path = notebooks / "solutions" / "05_workshop_solutions.ipynb"
    ns: dict = {"__name__": "workshop_solutions"}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and not re.match(r"\s*assert ex\.check_", src):
            exec(compile(src, "<solutions cell>", "exec"), ns)
    return ns


SOL = _shipped_solutions()


def returns_none(*args):
    return None


# ------------------------------------------------------------------ 1. global sum
def sum_by_gather(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts).sum(0)


def sum_by_average(x):
    # Dodge: AVG looks like a reduction, but it is not the sum.
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    return x


# ------------------------------------------------------------------ 2. group broadcast
def share_by_group_src(x, group):
    dist.broadcast(x, group=group, group_src=0)  # the group's rank 0, named as such
    return x


def share_by_masked_sum(x, group):
    # Unusual but right: everyone but the leader contributes zeros to a group sum.
    if dist.get_rank(group) != 0:
        x.zero_()
    dist.all_reduce(x, group=group)
    return x


def share_by_first_listed(x, group):
    # Unusual but right: get_process_group_ranks lists the members by group rank.
    dist.broadcast(x, src=dist.get_process_group_ranks(group)[0], group=group)
    return x


def share_leader_rank_number(x, group):
    # Dodge: "shares" the leader's rank number, which every rank can compute alone.
    return torch.full_like(x, float(dist.get_global_rank(group, 0)))


def share_nothing(x, group):
    return x


def share_from_global_zero(x, group):
    dist.broadcast(x, src=0, group=group)  # rank 0 is not in [2, 3]
    return x


def share_over_world(x, group):
    dist.broadcast(x, src=0)
    return x


def share_by_rank_arithmetic(x, group):
    # Dodge: the leader computed from the global rank, right for consecutive pairs only.
    r = dist.get_rank()
    dist.broadcast(x, src=r - r % 2, group=group)
    return x


def share_by_smallest_member(x, group):
    # Dodge: the smallest member is the leader only when the group sorted its ranks.
    dist.broadcast(x, src=min(dist.get_process_group_ranks(group)), group=group)
    return x


def share_by_rank_minus_group_rank(x, group):
    # Dodge: global rank minus group rank is the leader only for consecutive groups.
    dist.broadcast(x, src=dist.get_rank() - dist.get_rank(group), group=group)
    return x


# ------------------------------------------------------------------ 3. DP sampler
class BlocksOfAPermutation:
    """Unusual but right: contiguous blocks of one permutation drawn from seed + epoch."""

    def __init__(self, n, dp_rank, dp_size, seed):
        self.n, self.dp_rank, self.dp_size, self.seed, self.epoch = n, dp_rank, dp_size, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        per = self.n // self.dp_size
        perm = torch.randperm(self.n, generator=g).tolist()
        return iter(perm[self.dp_rank * per : (self.dp_rank + 1) * per])


def sampler_blocks(dataset, layout, seed):
    return BlocksOfAPermutation(len(dataset), layout.dp_rank, layout.dp_size, seed)


def sampler_seed_offset(dataset, layout, seed):
    # Unusual but right: any seed derived from `seed` alone, the same on every rank.
    return DistributedSampler(
        dataset, layout.dp_size, layout.dp_rank, shuffle=True, seed=3 * seed + 7, drop_last=True
    )


def sampler_fixed_seed(dataset, layout, seed):
    # Dodge (the old shipped solution): shuffled, but the same order whatever the seed.
    return DistributedSampler(
        dataset, layout.dp_size, layout.dp_rank, shuffle=True, seed=0, drop_last=True
    )


class FixedOrder:
    """A sampler stand-in whose order ignores the epoch: for the "not ascending" dodges."""

    def __init__(self, ids):
        self.ids = ids

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        return iter(self.ids)


def _shard(dataset, layout):
    per = len(dataset) // layout.dp_size
    return list(range(layout.dp_rank * per, (layout.dp_rank + 1) * per))


def sampler_reversed(dataset, layout, seed):
    # Dodge: "not ascending" without a shuffle.
    return FixedOrder(_shard(dataset, layout)[::-1])


def sampler_pairwise_swapped(dataset, layout, seed):
    # Dodge: "not ascending" without a shuffle.
    ids = _shard(dataset, layout)
    for k in range(0, len(ids) - 1, 2):
        ids[k], ids[k + 1] = ids[k + 1], ids[k]
    return FixedOrder(ids)


class ReshuffledPerPass(BlocksOfAPermutation):
    """Dodge: a new order every time it is read, whatever epoch it was told."""

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        self.epoch += 1
        return super().__iter__()


def sampler_per_pass(dataset, layout, seed):
    return ReshuffledPerPass(len(dataset), layout.dp_rank, layout.dp_size, seed)


class FromGlobalRandomness(BlocksOfAPermutation):
    """Dodge: a new permutation from torch's global generator; the seed is never used."""

    def __iter__(self):
        perm = torch.randperm(self.n).tolist()
        per = self.n // self.dp_size
        return iter(perm[self.dp_rank * per : (self.dp_rank + 1) * per])


def sampler_unreproducible(dataset, layout, seed):
    return FromGlobalRandomness(len(dataset), layout.dp_rank, layout.dp_size, seed)


def sampler_list(dataset, layout, seed):
    # A plain list has no set_epoch: it cannot give each epoch its own order.
    perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    per = len(dataset) // layout.dp_size
    return perm[layout.dp_rank * per : (layout.dp_rank + 1) * per]


def sampler_strided(dataset, layout, seed):
    # The pitfall notebook 02 warns about: an odd count gives the replicas unequal shards.
    return FixedOrder(list(range(layout.dp_rank, len(dataset), layout.dp_size)))


def sampler_padded(dataset, layout, seed):
    return DistributedSampler(dataset, layout.dp_size, layout.dp_rank, seed=seed)


def sampler_unshuffled(dataset, layout, seed):
    return DistributedSampler(
        dataset, layout.dp_size, layout.dp_rank, shuffle=False, drop_last=True, seed=seed
    )


def sampler_over_world(dataset, layout, seed):
    return DistributedSampler(dataset, drop_last=True, seed=seed)


def sampler_same_rank(dataset, layout, seed):
    return DistributedSampler(dataset, layout.dp_size, 0, drop_last=True, seed=seed)


def sampler_seeded_by_rank(dataset, layout, seed):
    # Dodge: a per-rank seed looks random, but TP peers no longer agree.
    return DistributedSampler(
        dataset, layout.dp_size, layout.dp_rank, drop_last=True, seed=seed + dist.get_rank()
    )


# ------------------------------------------------------------------ 4. set_epoch
def _ids(loader):
    return [i for b in loader for i in b["index"].tolist()]


def epochs_from_one(loader, n):
    # Unusual but right: epochs numbered from 1, and set through the attribute.
    out = []
    for e in range(n):
        loader.sampler.epoch = e + 1
        out.append(_ids(loader))
    return out


def epochs_no_set_epoch(loader, n):
    return [_ids(loader) for _ in range(n)]


def epochs_shuffled_afterwards(loader, n):
    # Reports a new order every epoch without reshuffling the loader: the ids
    # returned are not the ones the loader yielded.
    import random

    out = []
    for e in range(n):
        ids = _ids(loader)
        random.Random(e).shuffle(ids)
        out.append(ids)
    return out


def epochs_read_twice(loader, n):
    # Dodge: a first pass to look at the data, then the pass it reports: two epochs' worth
    # of loading per epoch, and the order reported is not the first one the loader gave.
    out = []
    for e in range(n):
        loader.sampler.set_epoch(e)
        _ids(loader)
        out.append(_ids(loader))
    return out


def epochs_per_rank_seed(loader, n):
    # A new order every epoch, but set_epoch differs between ranks: TP peers and
    # DP replicas no longer agree.
    out = []
    for e in range(n):
        loader.sampler.set_epoch(e + 10 * dist.get_rank())
        out.append(_ids(loader))
    return out


# ------------------------------------------------------------------ 5. send a batch
def send_shapes_then_tensors(batch, group):
    src = dist.get_global_rank(group, 0)
    spec = [None if batch is None else {k: (v.shape, v.dtype) for k, v in batch.items()}]
    dist.broadcast_object_list(spec, src=src, group=group)
    out = batch or {k: torch.empty(s, dtype=d) for k, (s, d) in spec[0].items()}
    for k in spec[0]:
        dist.broadcast(out[k], src=src, group=group)
    return out


def send_in_sorted_key_order(batch, group):
    # Unusual but right: tensors sent in sorted key order, the dict rebuilt in that order
    # (the old checker's digest in insertion order rejected it).
    src = dist.get_global_rank(group, 0)
    spec = [None if batch is None else {k: (v.shape, v.dtype) for k, v in batch.items()}]
    dist.broadcast_object_list(spec, src=src, group=group)
    out = {}
    for k in sorted(spec[0]):
        shape, dtype = spec[0][k]
        out[k] = batch[k] if batch is not None else torch.empty(shape, dtype=dtype)
        dist.broadcast(out[k], src=src, group=group)
    return out


def send_as_raw_bytes(batch, group):
    # Unusual but right: every tensor's bytes packed into one uint8 buffer.
    src = dist.get_global_rank(group, 0)
    spec = [None if batch is None else [(k, v.shape, v.dtype) for k, v in batch.items()]]
    dist.broadcast_object_list(spec, src=src, group=group)
    if batch is not None:
        flat = torch.cat([v.contiguous().reshape(-1).view(torch.uint8) for v in batch.values()])
    else:
        sizes = [
            torch.empty(s, dtype=d).reshape(-1).view(torch.uint8).numel() for _, s, d in spec[0]
        ]
        flat = torch.empty(sum(sizes), dtype=torch.uint8)
    dist.broadcast(flat, src=src, group=group)
    out, at = {}, 0
    for k, shape, dtype in spec[0]:
        n = torch.empty(shape, dtype=dtype).reshape(-1).view(torch.uint8).numel()
        out[k] = flat[at : at + n].clone().view(dtype).reshape(shape)  # clone: aligned
        at += n
    return out


def send_packed_as_float32(batch, group):
    # Dodge: one float32 buffer for every tensor; large token ids lose their low bits.
    src = dist.get_global_rank(group, 0)
    spec = [None if batch is None else [(k, v.shape, v.dtype) for k, v in batch.items()]]
    dist.broadcast_object_list(spec, src=src, group=group)
    sizes = [torch.Size(s).numel() for _, s, _ in spec[0]]
    if batch is not None:
        flat = torch.cat([v.reshape(-1).float() for v in batch.values()])
    else:
        flat = torch.empty(sum(sizes))
    dist.broadcast(flat, src=src, group=group)
    return {k: p.reshape(s).to(d) for (k, s, d), p in zip(spec[0], flat.split(sizes), strict=True)}


def send_nothing(batch, group):
    return batch


def send_flattened_to_peers(batch, group):
    out = SOL["send_batch"](batch, group)  # the right bytes, but the peers lose the shapes
    return out if batch is not None else {k: v.reshape(-1) for k, v in out.items()}


def send_bytes_as_uint8(batch, group):
    out = SOL["send_batch"](batch, group)  # the same bytes again, read with another dtype
    return out if batch is not None else {k: v.view(torch.uint8) for k, v in out.items()}


def send_only_on_leader(batch, group):
    if batch is not None:  # the peers never call the matching broadcast: a hang
        dist.broadcast(batch["input_ids"], src=dist.get_global_rank(group, 0), group=group)
    return batch


# ------------------------------------------------------------------ 6. leader-announced loop
def leader_sends_whole_epoch(loader, group):
    # Unusual but right: the leader reads the epoch, then sends it in one message.
    box = [list(loader) if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def leader_flag_then_tensors(loader, group):
    # Unusual but right: a "more?" flag each step, then the batch via send_batch.
    src = dist.get_global_rank(group, 0)
    it = iter(loader) if dist.get_rank(group) == 0 else None
    while True:
        batch = next(it, None) if it is not None else None
        more = torch.tensor(int(batch is not None))
        dist.broadcast(more, src=src, group=group)
        if not more:
            return
        yield send_shapes_then_tensors(batch, group)


def peers_count_len(loader, group):
    # ezpz's loop: peers trust their own len(); with fewer batches than claimed they hang.
    src = dist.get_global_rank(group, 0)
    steps = iter(loader) if dist.get_rank(group) == 0 else range(len(loader))
    for maybe in steps:
        box = [maybe if dist.get_rank(group) == 0 else None]
        dist.broadcast_object_list(box, src=src, group=group)
        yield box[0]


def peers_count_dataset_size(loader, group):
    # Dodge: peers take the step count from the dataset's size instead of the leader's word.
    src = dist.get_global_rank(group, 0)
    if dist.get_rank(group) == 0:
        yield from ((b, dist.broadcast_object_list([b], src=src, group=group))[0] for b in loader)
        return
    for _ in range(-(-len(loader.dataset) // loader.batch_size)):
        box = [None]
        dist.broadcast_object_list(box, src=src, group=group)
        yield box[0]


def everyone_loads(loader, group):
    yield from loader  # the peers' own copies happen to be equal; the counts tell


def peers_load_and_discard(loader, group):
    # Announces right, but the peers also read their stream (and throw it away).
    if dist.get_rank(group) != 0:
        for _ in loader:
            pass
    yield from SOL["leader_batches"](loader, group)


def peers_count_by_reading(loader, group):
    # Dodge: each peer reads its own stream to count the steps, then receives that many.
    src = dist.get_global_rank(group, 0)
    if dist.get_rank(group) == 0:
        for batch in loader:
            dist.broadcast_object_list([batch], src=src, group=group)
            yield batch
        return
    for _ in range(sum(1 for _ in loader)):
        box = [None]
        dist.broadcast_object_list(box, src=src, group=group)
        yield box[0]


# ------------------------------------------------------------------ 7. step count over a stream
def steps_by_gathered_flags(stream, train_step):
    # Unusual but right: gather everyone's "done" flag, stop when any is set.
    it, steps = iter(stream), 0
    while True:
        batch = next(it, None)
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, batch is None)
        if any(flags):
            return steps
        train_step(batch)
        steps += 1


def steps_over_padded_stream(stream, train_step):
    # Unusual but right: the stream padded with None forever, one MIN all-reduce per step.
    steps = 0
    for batch in itertools.chain(stream, itertools.repeat(None)):
        more = torch.tensor(0 if batch is None else 1)
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more:
            return steps
        train_step(batch)
        steps += 1


def steps_prefetching_one(stream, train_step):
    # Unusual but right: the next batch read before this one's step (one batch ahead).
    steps, upcoming = 0, next(stream, None)
    while True:
        more = torch.tensor(0 if upcoming is None else 1)
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more:
            return steps
        batch, upcoming = upcoming, next(stream, None)
        train_step(batch)
        steps += 1


def steps_by_len(stream, train_step):
    n = torch.tensor(len(stream))  # a stream has no len()
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for _ in range(int(n)):
        train_step(next(stream))
    return int(n)


def steps_read_ahead_to_a_cap(stream, train_step, cap=1000):
    # Dodge: read ahead up to a cap, agree once on the shortest, then step.
    batches = list(itertools.islice(stream, cap))
    n = torch.tensor(len(batches))
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for b in batches[: int(n)]:
        train_step(b)
    return int(n)


def steps_in_chunks(stream, train_step, chunk=8):
    # Dodge: agree once per chunk of batches read ahead: fewer collectives, too many reads.
    steps = 0
    while True:
        batches = list(itertools.islice(stream, chunk))
        n = torch.tensor(len(batches))
        dist.all_reduce(n, op=dist.ReduceOp.MIN)
        for b in batches[: int(n)]:
            train_step(b)
        steps += int(n)
        if int(n) < chunk:
            return steps


def steps_local(stream, train_step):
    steps = 0
    for batch in stream:  # each rank stops when its own stream ends: the others hang
        train_step(batch)
        steps += 1
    return steps


def steps_materialized(stream, train_step):
    batches = list(stream)  # the endless stream never ends: a hang
    n = torch.tensor(len(batches))
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for b in batches[: int(n)]:
        train_step(b)
    return int(n)


def steps_one_short(stream, train_step):
    return SOL["steps_over_stream"](stream, train_step) and 0  # steps, then claims 0


CASES = [
    # (checker, right solutions, [(wrong solution, phrase its message must contain)]);
    # the first right solution of each is the one shipped in the solutions notebook.
    (
        ex.check_global_sum,
        [SOL["global_sum"], sum_by_gather],
        [
            (lambda x: x, "its own input"),
            # The right answer for the documented inputs, hard-coded: the second call fails.
            (lambda x: torch.tensor([10.0, 60.0]), "second call"),
            (sum_by_average, "expected the sum"),
        ],
    ),
    (
        ex.check_share_from_leader,
        [SOL["share_from_leader"], share_by_group_src, share_by_masked_sum, share_by_first_listed],
        [
            (share_leader_rank_number, "expected its group leader's values"),
            (share_nothing, "received nothing"),
            (share_from_global_zero, "not part of group"),
            (share_over_world, "rank 0's values"),
            (share_by_rank_arithmetic, "raised"),
            (share_by_smallest_member, "global rank 3, the rank its group numbers 0"),
            (share_by_rank_minus_group_rank, "raised"),
        ],
    ),
    (
        ex.check_make_sampler,
        [SOL["make_sampler"], sampler_blocks, sampler_seed_offset],
        [
            (sampler_fixed_seed, "two different seeds gave the same order"),
            (sampler_reversed, "set_epoch(0) and set_epoch(1)"),
            (sampler_pairwise_swapped, "set_epoch(0) and set_epoch(1)"),
            (sampler_per_pass, "reading the sampler twice"),
            (sampler_unreproducible, "reading the sampler twice"),
            (sampler_list, "without set_epoch"),
            (sampler_strided, "unequal shards"),
            (sampler_padded, "drop_last=True drops"),
            (sampler_unshuffled, "ascending order"),
            (sampler_over_world, "TP peers disagree"),
            (sampler_same_rank, "rank=layout.dp_rank"),
            (sampler_seeded_by_rank, "TP peers disagree"),
        ],
    ),
    (
        ex.check_run_epochs,
        [SOL["run_epochs"], epochs_from_one],
        [
            (epochs_no_set_epoch, "set_epoch"),
            (epochs_shuffled_afterwards, "its loader yielded"),
            (epochs_per_rank_seed, "TP peers"),
            (epochs_read_twice, "time(s) for"),
        ],
    ),
    (
        ex.check_send_batch,
        [SOL["send_batch"], send_shapes_then_tensors, send_in_sorted_key_order, send_as_raw_bytes],
        [
            (send_nothing, "returned None"),
            (send_flattened_to_peers, "with shape"),
            (send_bytes_as_uint8, "dtype torch.uint8"),
            (send_packed_as_float32, "other bytes"),
        ],
    ),
    (
        ex.check_leader_batches,
        [SOL["leader_batches"], leader_sends_whole_epoch, leader_flag_then_tensors],
        [
            (everyone_loads, "read its stream"),
            (peers_load_and_discard, "read its stream"),
            (peers_count_by_reading, "read its stream"),
        ],
    ),
    (
        ex.check_steps_over_stream,
        [
            SOL["steps_over_stream"],
            steps_by_gathered_flags,
            steps_over_padded_stream,
            steps_prefetching_one,
        ],
        [
            (steps_by_len, "has no len()"),
            (steps_one_short, "returned 0"),
            (steps_read_ahead_to_a_cap, "pulled"),
            (steps_in_chunks, "pulled"),
        ],
    ),
]
IDS = [c[0].__name__ for c in CASES]


@pytest.fixture(scope="module")
def warm():
    """Four warm ranks the right and wrong answers run on (a check on fresh ranks starts
    four processes: ~60 launches in this file before); the hang tests keep fresh ones."""
    with ez.Cluster(world_size=4, timeout=120) as cluster:
        yield cluster


@pytest.mark.parametrize("checker,rights,wrongs", CASES, ids=IDS)
def test_right_solutions_pass(checker, rights, wrongs, capsys, warm):
    """Guards against checkers that fail correct code written another way: the shipped
    solution and the unusual right answers (group_src, a masked sum, sorted-key sends,
    a sampler class of one's own, gathered flags) all pass.

    And the notebook's look: each verdict printed once, not a second time in the repr.
    """
    name = checker.__name__.removeprefix("check_")
    for fn in rights:
        result = checker(fn, cluster=warm)
        assert result.passed, f"{fn.__name__}: {result.message}"
        assert result.status == "correct"
        assert capsys.readouterr().out.count(f"{name}: correct") == 1, fn.__name__
        assert repr(result) == f"CheckResult({name!r}, 'correct')"
        assert str(result) == result.message


@pytest.mark.parametrize("checker,rights,wrongs", CASES, ids=IDS)
def test_wrong_solutions_are_explained(checker, rights, wrongs, warm):
    """Guards against checkers a learner can dodge (rank arithmetic for the leader, "not
    ascending" for a shuffle, counting without loading, reading ahead to a cap): each is
    called wrong, with a message that points at what to look at."""
    for fn, phrase in wrongs:
        result = checker(fn, cluster=warm)
        assert not result.passed
        assert result.status == "wrong", result.message
        assert phrase in result.message, result.message


def test_reading_ahead_in_chunks_fails_when_the_last_chunk_ends_one_past_the_last_step(
    monkeypatch,
):
    """Guards the draw that let the chunk dodge pass (1 check in 8): with the shortest stream
    at 8k + 7 batches, chunks of 8 end exactly one batch past the last step, so the totals
    look like one batch read ahead; the read-ahead is counted at every step."""
    from ezpz_nb.workshop import stream_steps
    from ezpz_nb.workshop.send_time import patched_on_purpose

    seed = 11  # streams of 215, 243, 299 batches and an endless one: 215 = 8 * 26 + 7
    counts = stream_steps.stream_counts(seed, 4)
    assert min(c for c in counts if c is not None) % 8 == 7
    monkeypatch.setattr(stream_steps, "fresh_seed", lambda: seed)
    patched_on_purpose(stream_steps.__name__, "fresh_seed")  # else refused (send_time.py)
    result = ex.check_steps_over_stream(steps_in_chunks)
    assert result.status == "wrong", result.message
    assert "had pulled 8 batches from its stream when it took step 1" in result.message
    assert ex.check_steps_over_stream(steps_prefetching_one).status == "correct"


def test_none_everywhere_is_not_done():
    """Guards the half-filled blank (a body without return): "not done", not "wrong"."""
    assert ex.check_global_sum(returns_none).status == "not done"


@pytest.mark.parametrize(
    "checker,fn",
    [
        (ex.check_send_batch, send_only_on_leader),
        # ezpz's peers count their own len(): the first round claims more batches than come.
        (ex.check_leader_batches, peers_count_len),
        # Peers count from the stream's claimed size: it claims more than comes.
        (ex.check_leader_batches, peers_count_dataset_size),
        # Each rank stops when its own stream ends: the others wait in train_step's all-reduce.
        (ex.check_steps_over_stream, steps_local),
        # Reading an endless stream to its end never finishes.
        (ex.check_steps_over_stream, steps_materialized),
    ],
    ids=[
        "send_only_on_leader",
        "peers_count_len",
        "peers_count_dataset_size",
        "steps_local",
        "steps_materialized",
    ],
)
def test_hang_is_reported_with_stacks(checker, fn):
    """Guards the workshop room: an answer that hangs is stopped and reported with where
    each rank was, never a cell that runs forever."""
    # The verdict holds wherever the ranks were when the timeout ran out, even before
    # they reached the hang: nothing here has to finish first, so a short one will do.
    result = checker(fn, timeout=2)
    assert result.status == "wrong"
    assert "hung" in result.message and "Where each rank was" in result.message
    # Why, from where the ranks were: an endless read is no mismatch of collectives.
    if fn is steps_materialized:
        assert "never reached a collective" in result.message, result.message
    else:
        assert "did not all make the same collective calls" in result.message, result.message


def test_not_a_function():
    """Guards the common slip check(fn()) for check(fn): said plainly, before ranks start."""
    result = ex.check_global_sum(42)
    assert result.status == "wrong" and "expected a function" in result.message


def test_shipped_blanks_say_not_done(capsys):
    """Guards the notebook as shipped: its seven blanks, run as written, say "not done yet",
    never "wrong" or a traceback; one blank for every checker in CASES.

    (The shipped blanks are the blanks: a blank of this module's own, fed to each checker
    again, cost 7 more launches of 4 ranks.)
    """
    ns = {"__name__": "__main__"}
    checks = []
    for src in _workshop_cells("workshop"):
        call = re.fullmatch(r"\s*ex\.check_(\w+)\((\w+)\);?\s*", src)
        if call:
            checks.append(call.groups())
        else:
            exec(compile(src, "<workshop cell>", "exec"), ns)  # imports and the blanks
    assert len(checks) == 7, checks
    assert sorted(f"check_{name}" for name, _ in checks) == sorted(IDS), checks
    for name, fn in checks:
        result = getattr(ex, f"check_{name}")(ns[fn])
        assert result.status == "not done" and not result.passed, f"{name}: {result.message}"
    assert capsys.readouterr().out.count("not done yet") == 7


def test_an_interrupt_names_a_waiting_collective_only_where_a_stack_shows_one():
    """Guards issue 45's "interrupting a rank that is not in a collective": the sentence about
    a rank waiting in a collective appears when a stack is inside torch.distributed, never
    when every rank was in its own code (a loop, a sleep)."""
    from ezpz_nb.launcher.errors import RunInterrupted
    from ezpz_nb.launcher.stacks import RankStack
    from ezpz_nb.launcher.wire import Frame

    own = Frame("/home/me/work.py", 3, "spin", "while True: pass")
    c10d = Frame("/venv/torch/distributed/distributed_c10d.py", 9, "all_reduce", "work.wait()")
    busy = {r: RankStack(r, "blocked", where="work.py:3", frames=(own,)) for r in range(2)}
    said = "waiting for a call another rank never made"
    assert said not in str(RunInterrupted(busy))
    waiting = {**busy, 1: RankStack(1, "blocked", call="all_reduce", frames=(own, c10d))}
    assert said in " ".join(str(RunInterrupted(waiting)).split())


def _workshop_modules() -> dict[str, object]:
    """``{name: module}`` of every module of ``ezpz_nb.workshop``, imported."""
    import importlib
    import pkgutil

    import ezpz_nb.workshop as pkg

    return {
        info.name: importlib.import_module(f"{pkg.__name__}.{info.name}")
        for info in pkgutil.iter_modules(pkg.__path__)
    }


def test_every_checker_is_listed_where_the_map_says():
    """Guards issue 47's "the workshop contradicts its map": every ``check_*`` a workshop
    module defines is named in the package docstring beside its module, re-exported by
    ``exercises`` (the same object), and its module is named in docs/architecture.md's
    workshop row; nothing is listed that no module defines; and each family holds its
    own rank jobs: no ``*_jobs`` module beside the exercise modules, every ``job_*``
    in a module that defines a checker."""
    import ezpz_nb.workshop as pkg

    mods = _workshop_modules()
    defined: dict[str, str] = {}
    jobs: dict[str, str] = {}
    for module, mod in mods.items():
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", "") != mod.__name__:
                continue
            if name.startswith("check_"):
                defined[name] = module
            elif name.startswith("job_"):
                jobs[name] = module
    assert len(defined) >= 15, defined
    doc = pkg.__doc__ or ""
    bullets = {
        m.group(1): set(re.findall(r"``(check_\w+)``", m.group(0)))
        for m in re.finditer(r"\* :mod:`\.(\w+)`.*?(?=\n\* |\Z)", doc, re.S)
    }
    listed = {name: module for module, names in bullets.items() for name in names}
    assert listed == defined, (listed, defined)
    assert {n for n in ex.__all__ if n.startswith("check_")} == set(defined)
    for name, module in defined.items():
        assert getattr(ex, name) is getattr(mods[module], name), f"ex.{name} is not {module}'s"
    split = sorted(m for m in mods if m == "jobs" or m.endswith("_jobs"))
    assert not split, f"rank jobs kept apart from their checkers: {split}"
    stray = {j: m for j, m in jobs.items() if m not in set(defined.values())}
    assert not stray, f"jobs in a module without a checker: {stray}"
    row = next(
        line
        for line in (Path(__file__).parents[1] / "docs" / "architecture.md")
        .read_text()
        .splitlines()
        if line.startswith("| `workshop/` |")
    )
    missing = {m for m in mods if f"`{m}.py`" not in row and m != "__init__"}
    assert not missing, f"docs/architecture.md's workshop row does not name {missing}: {row}"


def test_a_rank_running_an_exercise_job_loads_none_of_the_notebook_side():
    """Guards issue 47 item 5: a rank unpickles a job by reference, so it imports the job's
    whole exercise module; the checker half's ``verdicts`` brings clusters, the pool and
    the session. Imported as a rank does (a fresh interpreter, nothing else), every
    exercise module (all but ``verdicts`` itself and ``exercises``, which re-exports the
    checkers for the notebook) loads none of the notebook side, and ``verdicts`` not at all."""
    import subprocess
    import sys

    from test_import_graph import NOTEBOOK_SIDE

    names = sorted(set(_workshop_modules()) - {"__init__", "exercises", "verdicts"})
    assert {"collectives", "leader_loop", "packing", "flat_storage"} <= set(names), names
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}: importlib.import_module('ezpz_nb.workshop.' + n)\n"
        "print(' '.join(m for m in sys.modules if m.startswith('ezpz_nb')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = set(out.split())
    assert "ezpz_nb.workshop.collectives" in loaded
    assert not loaded & (NOTEBOOK_SIDE | {"ezpz_nb.workshop.verdicts"}), sorted(
        loaded & (NOTEBOOK_SIDE | {"ezpz_nb.workshop.verdicts"})
    )


def _set_up_fails_on_rank_1() -> None:
    from ezpz_nb.workshop.stops import CouldNotJudge

    if dist.get_rank() == 1:
        raise CouldNotJudge("gloo's worker threads could not all be confined in 20 rounds")


def test_a_check_that_could_not_set_itself_up_says_not_done_not_wrong():
    """Guards the tenth trial's note: sealing a rank (workshop/seal.py) missed a gloo thread
    on a busy machine, and a right answer was told "not right yet" with the checker's own
    error as if it were the learner's. The check's own set-up failing is "not done"."""
    from ezpz_nb.workshop.verdicts import stopped_by

    with pytest.raises(ez.RankError) as info:
        ez.launch(_set_up_fails_on_rank_1, world_size=2)
    stop = stopped_by(info.value)
    assert stop.status == "not done", stop.message
    assert "rank 1" in stop.message and "Run the check again" in stop.message, stop.message
