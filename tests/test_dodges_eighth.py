"""Issue 45's eighth trial: four dodges of notebooks 11 and 15's checkers that each fit a
value the checks held fixed, turned down now that the checks draw it.

- 11 pack: a token's document looked up by the token's id (ids were unique over a check:
  documents now share ids, as words recur over texts);
- 11 pack: exactly three documents a call (every call held 3: the count is drawn);
- 11 plan: the global rank and world size taken for the DP ones (the world was DP alone:
  one case of each check now has two TP ranks per replica);
- 15 loader_state: the offset saved in steps and restored as ``steps * 2`` (every loader
  had batches of 2: the batch size is drawn, two distinct and one odd a check).

The packing draws are judged offline over many seeds (the judge is pure); the plan and the
loader state on real ranks, the loader's saves on one warm cluster and its loads on the
ranks :func:`shared_load_ranks` keeps, as ``tests/test_dcp_exercise.py`` does.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from test_text_exercises import (
    _pack_by,  # the notebook's packing, documents told by a key
    pack_pieces_offsets_see_themselves,
)

import ezpz_nb as ez
from ezpz_nb.workshop import budget_plan, dcp_places, packing
from ezpz_nb.workshop.dcp_state import check_loader_state, shared_load_ranks
from ezpz_nb.workshop.exercises import check_budget_plan
from ezpz_nb.workshop.stops import CheckStopped

pytestmark = pytest.mark.timeout(400)

#: Checks on ranks per answer (each draws afresh): one in `make unit`, 20 in `make stress`.
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))
#: Packing draws judged offline per answer (cheap: no ranks).
SEEDS = range(20)

# --------------------------------------------------------------------- 11: pack


def _pack_by_key(docs, row_len, key):
    """The notebook's packing, each token's document told by ``key(k, token)``."""
    return _pack_by(
        docs, row_len, lambda k, doc: torch.tensor([key(k, int(t)) for t in doc], dtype=torch.int64)
    )


def pack_right(docs, row_len):
    """Right: each token's document is the tensor it came from."""
    return _pack_by_key(docs, row_len, lambda k, t: k)


def pack_by_last_value(docs, row_len):
    """Dodge (trial 8): a dict id -> document, the last document holding the id wins."""
    doc_of = {int(t): k for k, d in enumerate(docs) for t in d}
    return _pack_by_key(docs, row_len, lambda k, t: doc_of[t])


def pack_by_first_value(docs, row_len):
    """Dodge: the same lookup, the first document holding the id wins."""
    doc_of: dict[int, int] = {}
    for k, d in enumerate(docs):
        for t in d:
            doc_of.setdefault(int(t), k)
    return _pack_by_key(docs, row_len, lambda k, t: doc_of[t])


def pack_three(docs, row_len):
    """Dodge (trial 8): exactly three documents a call."""
    a, b, c = docs
    return pack_right([a, b, c], row_len)


def test_pack_draws_share_ids_and_vary_the_call_size():
    """Guards the packing draw: every draw has a token id in two documents of one call, and
    a call of other than 3 documents (trial 8: ids were unique, every call held 3)."""
    for seed in SEEDS:
        draw = packing.draw_pack(seed)
        assert any(n != 3 for sizes in draw.sizes for n in sizes), draw.sizes
        assert all(sum(s) == packing.DOCS // packing.WORLD for s in draw.sizes)
        shared = [
            t
            for rank, sizes in enumerate(draw.sizes)
            for docs in _calls_of(draw, rank, sizes)
            for i, a in enumerate(docs)
            for b in docs[i + 1 :]
            for t in set(a) & set(b)
        ]
        assert shared, seed


@pytest.mark.parametrize("seed", [1023, 1063, 1088, 1102, 1128])
def test_a_fault_past_a_shared_id_is_told_from_the_reading_whose_positions_hold(seed):
    """Guards the wording where documents share ids (helper F's stress, 4-11 draws in 400):
    every reading of the rows fails, and the one that dealt a shared id's places the wrong
    way round fails first, at that id's position id; the mask that hides too much (what is
    wrong) is told from the reading whose position ids all hold."""
    try:
        said = packing.judge_offline(pack_pieces_offsets_see_themselves, seed)
    except CheckStopped as stop:
        said = str(stop)
    assert "hides too much" in said and "position id" not in said, said


def _calls_of(draw, rank, sizes):
    mine, k = draw.docs[rank :: packing.WORLD], 0
    for n in sizes:
        yield mine[k : k + n]
        k += n


@pytest.mark.parametrize("fn", [pack_by_last_value, pack_by_first_value])
def test_pack_turns_down_a_document_looked_up_by_id(fn):
    """Guards the shared ids (trial 8: passed 2 of 2): a document told by a token's value
    joins or splits documents at a shared id on every draw, and the verdict says ids recur;
    the same packing by tensor passes every draw."""
    for seed in SEEDS:
        with pytest.raises(CheckStopped, match="ids recur over documents") as stop:
            packing.judge_offline(fn, seed)
        assert stop.value.status == "wrong"
        assert "rows of" in stop.value.message  # the call's drawn size and row length
        packing.judge_offline(pack_right, seed)


def test_pack_turns_down_three_documents_a_call():
    """Guards the drawn call size (trial 8: passed 2 of 2): ``a, b, c = docs`` meets a call of
    other than 3 documents on every draw (judged offline: on ranks the error is the verdict),
    and the error says which call, its documents and row length (Python 3.11's notes)."""
    for seed in SEEDS:
        with pytest.raises(ValueError, match="values to unpack") as err:
            packing.judge_offline(pack_three, seed)
        if sys.version_info >= (3, 11):
            assert ", row_len " in " ".join(err.value.__notes__)  # the call, size and length


# --------------------------------------------------------------------- 11: plan


def plan_global_rank(lengths, dp_rank, dp_size, budget):
    """Dodge (trial 8): the global rank and world size, each shard planned, count agreed."""
    from ezpz_nb.text.plan import shard_then_plan

    own = shard_then_plan(lengths, dist.get_rank(), dist.get_world_size(), budget)
    n = torch.tensor([len(own)])
    dist.all_reduce(n, op=dist.ReduceOp.MIN)
    return own[: int(n)]


def plan_agreed_by_gather(lengths, dp_rank, dp_size, budget):
    """Right (trial 8's): fix 2 by hand, the count agreed through all_gather_object over every
    rank (TP peers included), its own shard a block of a seeded permutation."""
    perm = random.Random(1234).sample(range(len(lengths)), len(lengths))
    block = -(-len(lengths) // dp_size)
    mine = sorted(perm[dp_rank * block : (dp_rank + 1) * block], key=lambda i: -lengths[i])
    plan = []
    for i in mine:
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= budget:
            plan[-1].append(i)
        else:
            plan.append([i])
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(plan))
    return plan[: min(counts)]


def test_plan_peers_must_agree():
    """Guards the TP rule, offline: TP peers that planned other batches are named, with the
    DP replica; peers that agree give one plan per replica."""
    a, b = [[0, 1], [2]], [[3], [4]]
    with pytest.raises(CheckStopped, match="ranks 2 and 3 are TP peers of DP replica 1"):
        budget_plan._judge_peers([(a, 2), (a, 2), (a, 2), (b, 2)], 2, "case")
    assert budget_plan._judge_peers([(a, 2), (a, 2), (b, 2), (b, 2)], 2, "c") == [(a, 2), (b, 2)]


def test_plan_turns_down_the_global_rank_and_accepts_a_gathered_count():
    """Guards the TP case of every plan check (trial 8: the global rank passed 2 of 2): TP
    peers given the global rank plan different shards and are turned down, naming the TP
    layout; a right fix 2 that agrees over every rank passes there."""
    for _ in range(DRAWS):
        result = check_budget_plan(plan_global_rank)
        assert result.status == "wrong", result.message
        assert "x tp 2" in result.message and "TP peers" in result.message, result.message
        result = check_budget_plan(plan_agreed_by_gather)
        assert result.passed, result.message
        assert "x tp 2" in result.message, result.message


# ------------------------------------------------------------ 15: loader_state


def test_loader_draws_two_batch_sizes_one_odd_with_an_odd_offset():
    """Guards the batch draw: two distinct sizes a check, one odd, and at that size a step
    whose offset is odd (so halving it, or any one batch size written in, is wrong)."""
    for seed in range(200):
        rng = random.Random(seed)
        batches = dcp_places.draw_batches(rng)
        assert len(set(batches)) == 2 and any(b % 2 for b in batches), batches
        for (dp, tp), batch in zip(((2, 2), (4, 1)), batches, strict=True):
            case = dcp_places.draw_case(rng, dp, tp, batch)
            assert case.batch == batch and case.num_samples % (dp * batch) == 0
            if batch % 2:
                assert any(s * batch % 2 for s in case.stops), case


@pytest.fixture(scope="module")
def cluster() -> Iterator[ez.Cluster]:
    """Four warm ranks for the saves; the loads on ranks the module shares."""
    with ez.Cluster(world_size=4, timeout=120) as c, shared_load_ranks():
        yield c


def save_steps(loader, layout):
    """Dodge (trial 8): the offset saved as a step count, batches of 2 assumed."""
    s = loader.state_dict()
    return {f"dp{layout.dp_rank}": {**s, "offset": s["offset"] // 2}}


def load_steps_times_two(loader, layout, state):
    s = dict(state[f"dp{layout.dp_rank}"])
    loader.load_state_dict({**s, "offset": int(s["offset"]) * 2})


def save_true_steps(loader, layout):
    """Dodge: the step count right (the loader's own batch), restored with batches of 2."""
    s = loader.state_dict()
    return {f"dp{layout.dp_rank}": {**s, "offset": s["offset"] // loader.batch_size}}


def save_offset_only(loader, layout):
    """Right (trial 8's): one shared key, the offset only; the load replays the RNG."""
    return {"offset": torch.tensor(loader.offset)}


def load_offset_replayed(loader, layout, state):
    loader.offset = 0
    loader.generator.manual_seed(loader.seed + loader.shard)
    it = iter(loader)
    for _ in range(int(state["offset"]) // loader.batch_size):
        next(it)


@pytest.mark.parametrize(
    "save,load,expected",
    [
        (save_steps, load_steps_times_two, "wrong"),
        (save_true_steps, load_steps_times_two, "wrong"),
        (save_offset_only, load_offset_replayed, "correct"),
    ],
    ids=["steps_halved", "steps_of_the_batch", "offset_replayed"],
)
def test_loader_state_with_a_drawn_batch(cluster, save, load, expected):
    """Guards the drawn batch size (trial 8: steps restored as ``steps * 2`` passed 2 of 2):
    a batch size written in is turned down on every draw, the verdict naming the batch and
    offset; a right answer that counts in the loader's own batch passes."""
    for _ in range(DRAWS):
        result = check_loader_state(save, load, cluster=cluster)
        assert result.status == expected, result.message
        assert "batches of" in result.message, result.message
