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
from ezpz_nb.data import get_random_dataset_fsdp_tp


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


def share_from_global_zero(x, group):
    dist.broadcast(x, src=0, group=group)  # rank 0 is not in [2, 3]
    return x


def share_over_world(x, group):
    dist.broadcast(x, src=0)
    return x


def sampler_right(dataset, layout):
    return DistributedSampler(dataset, num_replicas=layout.dp_size, rank=layout.dp_rank)


def sampler_over_world(dataset, layout):
    return DistributedSampler(dataset)


def sampler_same_rank(dataset, layout):
    return DistributedSampler(dataset, num_replicas=layout.dp_size, rank=0)


def epochs_right(loader, n):
    out = []
    for e in range(n):
        loader.sampler.set_epoch(e)
        out.append([i for b in loader for i in b["index"].tolist()])
    return out


def epochs_no_set_epoch(loader, n):
    return [[i for b in loader for i in b["index"].tolist()] for _ in range(n)]


def _tp_loader(layout, **kw):
    return get_random_dataset_fsdp_tp(2, 64, 8, num_samples=32, tp_group=layout.tp_group,
                                      **kw)["dataloader"]


def tp_loader_right(layout):
    return _tp_loader(layout, dp_group=layout.dp_group, broadcast_within_tp=True)


def tp_loader_no_broadcast(layout):
    return _tp_loader(layout, dp_group=layout.dp_group)


def tp_loader_no_dp_group(layout):
    return _tp_loader(layout, broadcast_within_tp=True)


def steps_min(n):
    t = torch.tensor(n)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def steps_by_gather(n):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, n)
    return min(everyone)


def steps_max(n):
    t = torch.tensor(n)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def steps_local(n):
    return n


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


CASES = [
    # (checker, right solutions, [(wrong solution, phrase its message must contain)])
    (ex.check_global_sum, [sum_in_place, sum_by_gather], [
        (lambda x: x, "its own input"),
        # The right answer for the documented inputs, hard-coded: the second call fails.
        (lambda x: torch.tensor([10.0, 60.0]), "second call")]),
    (ex.check_share_from_leader, [share_right], [
        (share_from_global_zero, "not part of group"),
        (share_over_world, "rank 0's value")]),
    (ex.check_make_sampler, [sampler_right], [
        (sampler_over_world, "TP peers disagree"),
        (sampler_same_rank, "both got samples")]),
    (ex.check_run_epochs, [epochs_right], [
        (epochs_no_set_epoch, "set_epoch")]),
    (ex.check_build_tp_loader, [tp_loader_right], [
        (tp_loader_no_broadcast, "loaded batches themselves"),
        (tp_loader_no_dp_group, "never seen")]),
    (ex.check_agreed_num_steps, [steps_min, steps_by_gather], [
        (steps_max, "run out of data"),
        (steps_local, "disagree"),
        (lambda n: 3, "second call")]),
    (ex.check_send_batch, [send_as_object, send_shapes_then_tensors], [
        (send_nothing, "returned None"),
        (send_flattened_to_peers, "with shape"),
        (send_bytes_as_uint8, "dtype torch.uint8")]),
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


def test_hang_is_reported_with_stacks():
    result = ex.check_send_batch(send_only_on_leader, timeout=8)
    assert result.status == "wrong"
    assert "hung" in result.message and "Where each rank was" in result.message


def test_not_a_function():
    result = ex.check_global_sum(42)
    assert result.status == "wrong" and "expected a function" in result.message


def test_verdict_is_printed_once_and_repr_is_short(capsys):
    result = ex.check_agreed_num_steps(steps_min)
    out = capsys.readouterr().out
    assert out.count("agreed_num_steps: correct") == 1
    assert repr(result) == "CheckResult('agreed_num_steps', 'correct')"
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
