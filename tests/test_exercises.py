"""The workshop checkers, fed right, wrong, blank and hanging solutions on real gloo ranks.

Guards against checkers that pass everything (wrong answers must be called wrong),
that fail correct code written another way (they must judge behaviour, not
source), and that raise or hang on the shipped blanks.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ezpz_nb.workshop.exercises as ex


def blank(*args):
    raise NotImplementedError("your code here")


def returns_none(*args):
    return None


# ------------------------------------------------------------------ solutions
def sum_in_place(x):
    dist.all_reduce(x)
    return x


def sum_by_gather(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts).sum(0)


def share_right(x, group):
    dist.broadcast(x, src=dist.get_global_rank(group, 0), group=group)
    return x


def share_by_group_src(x, group):
    dist.broadcast(x, group=group, group_src=0)  # the group's rank 0, named as such
    return x


def share_by_masked_sum(x, group):
    # Unusual but right: everyone but the leader contributes zeros to a group sum.
    if dist.get_rank(group) != 0:
        x.zero_()
    dist.all_reduce(x, group=group)
    return x


def share_leader_rank_number(x, group):
    # The cheat the old checker passed: it "shares" the leader's rank number,
    # which every rank can compute alone; nothing is communicated.
    return torch.full_like(x, float(dist.get_global_rank(group, 0)))


def share_nothing(x, group):
    return x


def share_from_global_zero(x, group):
    dist.broadcast(x, src=0, group=group)  # rank 0 is not in [2, 3]
    return x


def share_over_world(x, group):
    dist.broadcast(x, src=0)
    return x


def sampler_right(dataset, layout):
    return DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        drop_last=True,
        seed=0,
    )


def sampler_as_blocks_of_a_permutation(dataset, layout):
    # Unusual but right: a plain list, contiguous blocks of one shared permutation.
    per = len(dataset) // layout.dp_size
    perm = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(5)).tolist()
    return perm[layout.dp_rank * per : (layout.dp_rank + 1) * per]


def sampler_strided(dataset, layout):
    # The pitfall notebook 02 warns about: 27 samples give replicas 14 and 13.
    return list(range(layout.dp_rank, len(dataset), layout.dp_size))


def sampler_padded(dataset, layout):
    return DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank)


def sampler_unshuffled(dataset, layout):
    return DistributedSampler(
        dataset, num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=False, drop_last=True
    )


def sampler_over_world(dataset, layout):
    return DistributedSampler(dataset, drop_last=True)


def sampler_same_rank(dataset, layout):
    return DistributedSampler(dataset, num_replicas=layout.dp_size, rank=0, drop_last=True)


def _ids(loader):
    return [i for b in loader for i in b["index"].tolist()]


def epochs_right(loader, n):
    out = []
    for e in range(n):
        loader.sampler.set_epoch(e)
        out.append(_ids(loader))
    return out


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


def epochs_per_rank_seed(loader, n):
    # A new order every epoch, but set_epoch differs between ranks: TP peers and
    # DP replicas no longer agree.
    out = []
    for e in range(n):
        loader.sampler.set_epoch(e + 10 * dist.get_rank())
        out.append(_ids(loader))
    return out


def steps_min(stream, train_step):
    steps = 0
    for batch in _with_end(stream):
        more = torch.tensor(0 if batch is None else 1)
        dist.all_reduce(more, op=dist.ReduceOp.MIN)
        if not more:
            return steps
        train_step(batch)
        steps += 1


def _with_end(stream):
    yield from stream
    while True:
        yield None


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


def steps_by_len(stream, train_step):
    n = torch.tensor(len(stream))  # a stream has no len()
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    for _ in range(int(n)):
        train_step(next(stream))
    return int(n)


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
    return steps_min(stream, train_step) and 0  # steps, then claims 0


def send_as_object(batch, group):
    box = [batch]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return box[0]


def send_shapes_then_tensors(batch, group):
    src = dist.get_global_rank(group, 0)
    spec = [None if batch is None else {k: (v.shape, v.dtype) for k, v in batch.items()}]
    dist.broadcast_object_list(spec, src=src, group=group)
    out = batch or {k: torch.empty(s, dtype=d) for k, (s, d) in spec[0].items()}
    for k in spec[0]:
        dist.broadcast(out[k], src=src, group=group)
    return out


def send_nothing(batch, group):
    return batch


def send_flattened_to_peers(batch, group):
    out = send_as_object(batch, group)  # the right bytes, but the peers lose the shapes
    return out if batch is not None else {k: v.reshape(-1) for k, v in out.items()}


def send_bytes_as_uint8(batch, group):
    out = send_as_object(batch, group)  # the same bytes again, read with another dtype
    return out if batch is not None else {k: v.view(torch.uint8) for k, v in out.items()}


def send_only_on_leader(batch, group):
    if batch is not None:  # the peers never call the matching broadcast: a hang
        dist.broadcast(batch["input_ids"], src=dist.get_global_rank(group, 0), group=group)
    return batch


def leader_announces(loader, group):
    src = dist.get_global_rank(group, 0)
    if dist.get_rank(group) == 0:
        for batch in loader:
            dist.broadcast_object_list([batch], src=src, group=group)
            yield batch
        dist.broadcast_object_list([None], src=src, group=group)  # the end
    else:
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=src, group=group)
            if box[0] is None:
                return
            yield box[0]


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


def everyone_loads(loader, group):
    yield from loader  # the peers' own copies happen to be equal; the counts tell


def peers_load_and_discard(loader, group):
    # Announces right, but the peers also read their dataset (and throw it away).
    if dist.get_rank(group) != 0:
        for _ in loader:
            pass
    yield from leader_announces(loader, group)


CASES = [
    # (checker, right solutions, [(wrong solution, phrase its message must contain)])
    (
        ex.check_global_sum,
        [sum_in_place, sum_by_gather],
        [
            (lambda x: x, "its own input"),
            # The right answer for the documented inputs, hard-coded: the second call fails.
            (lambda x: torch.tensor([10.0, 60.0]), "second call"),
        ],
    ),
    (
        ex.check_share_from_leader,
        [share_right, share_by_group_src, share_by_masked_sum],
        [
            (share_leader_rank_number, "expected its group leader's values"),
            (share_nothing, "received nothing"),
            (share_from_global_zero, "not part of group"),
            (share_over_world, "rank 0's values"),
        ],
    ),
    (
        ex.check_make_sampler,
        [sampler_right, sampler_as_blocks_of_a_permutation],
        [
            (sampler_strided, "[14, 13] samples"),
            (sampler_padded, "drop_last=True drops"),
            (sampler_unshuffled, "ascending order"),
            (sampler_over_world, "TP peers disagree"),
            (sampler_same_rank, "rank=layout.dp_rank"),
        ],
    ),
    (
        ex.check_run_epochs,
        [epochs_right, epochs_from_one],
        [
            (epochs_no_set_epoch, "set_epoch"),
            (epochs_shuffled_afterwards, "its loader yielded"),
            (epochs_per_rank_seed, "TP peers"),
        ],
    ),
    (
        ex.check_send_batch,
        [send_as_object, send_shapes_then_tensors],
        [
            (send_nothing, "returned None"),
            (send_flattened_to_peers, "with shape"),
            (send_bytes_as_uint8, "dtype torch.uint8"),
        ],
    ),
    (
        ex.check_leader_batches,
        [leader_announces, leader_sends_whole_epoch, leader_flag_then_tensors],
        [(everyone_loads, "read its dataset"), (peers_load_and_discard, "read its dataset")],
    ),
    (
        ex.check_steps_over_stream,
        [steps_min, steps_by_gathered_flags],
        [(steps_by_len, "has no len()"), (steps_one_short, "returned 0")],
    ),
]
IDS = [c[0].__name__ for c in CASES]


@pytest.mark.parametrize("checker,rights,wrongs", CASES, ids=IDS)
def test_right_solutions_pass(checker, rights, wrongs):
    for fn in rights:
        result = checker(fn)
        assert result.passed, f"{fn.__name__}: {result.message}"
        assert result.status == "correct"


@pytest.mark.parametrize("checker,rights,wrongs", CASES, ids=IDS)
def test_wrong_solutions_are_explained(checker, rights, wrongs):
    for fn, phrase in wrongs:
        result = checker(fn)
        assert not result.passed
        assert result.status == "wrong", result.message
        assert phrase in result.message, result.message


@pytest.mark.parametrize("checker", [c[0] for c in CASES], ids=IDS)
def test_blank_says_not_done(checker, capsys):
    result = checker(blank)
    assert result.status == "not done" and not result.passed
    assert "not done yet" in capsys.readouterr().out


def test_none_everywhere_is_not_done():
    assert ex.check_global_sum(returns_none).status == "not done"


@pytest.mark.parametrize(
    "checker,fn",
    [
        (ex.check_send_batch, send_only_on_leader),
        # ezpz's peers count their own len(): the first round claims more batches than come.
        (ex.check_leader_batches, peers_count_len),
        # Each rank stops when its own stream ends: the others wait in train_step's all-reduce.
        (ex.check_steps_over_stream, steps_local),
        # Reading an endless stream to its end never finishes.
        (ex.check_steps_over_stream, steps_materialized),
    ],
    ids=["send_only_on_leader", "peers_count_len", "steps_local", "steps_materialized"],
)
def test_hang_is_reported_with_stacks(checker, fn):
    # The verdict holds wherever the ranks were when the timeout ran out, even before
    # they reached the hang: nothing here has to finish first, so a short one will do.
    result = checker(fn, timeout=2)
    assert result.status == "wrong"
    assert "hung" in result.message and "Where each rank was" in result.message


def test_not_a_function():
    result = ex.check_global_sum(42)
    assert result.status == "wrong" and "expected a function" in result.message


def test_verdict_is_printed_once_and_repr_is_short(capsys):
    result = ex.check_steps_over_stream(steps_min)
    out = capsys.readouterr().out
    assert out.count("steps_over_stream: correct") == 1
    assert repr(result) == "CheckResult('steps_over_stream', 'correct')"
    assert str(result) == result.message


def _workshop_as_shipped():
    """The workshop notebook's code cells, as notebooks/_build.py writes them for learners."""
    root = Path(__file__).resolve().parent.parent / "notebooks"
    spec = importlib.util.spec_from_file_location("nb_build", root / "_build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    workshop = build.notebooks()["05_workshop.ipynb"]
    return [cell.source for cell in workshop.cells if cell.cell_type == "code"]


def test_shipped_blanks_say_not_done(capsys):
    ns = {"__name__": "__main__"}
    checks = []
    for src in _workshop_as_shipped():
        call = re.fullmatch(r"\s*ex\.check_(\w+)\((\w+)\);?\s*", src)
        if call:
            checks.append(call.groups())
        else:
            exec(compile(src, "<workshop cell>", "exec"), ns)  # imports and the blanks
    assert len(checks) == 7, checks
    for name, fn in checks:
        result = getattr(ex, f"check_{name}")(ns[fn])
        assert result.status == "not done", f"{name}: {result.message}"
    assert capsys.readouterr().out.count("not done yet") == 7
