"""Notebook 08's plan checker, fed right and wrong TP plans on 4 real gloo ranks.

Guards the capstone's exercise: a plan that does not fit must be reported with the
layer it broke in, a plan that silently computes something else must be caught by
the loss against the one-process reference, a plan that shards nothing must not
pass as tensor parallelism, and any plan that truly splits the model and trains
like one process must pass, however it is written.
"""

from __future__ import annotations

import pytest

import ezpz_nb as ez
from ezpz_nb.errors import EzpzError
from ezpz_nb.examples import capstone
from ezpz_nb.workshop.tp_plan import check_tp_plan


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(4, timeout=90) as c:
        yield c


# ------------------------------------------------------------------ right plans
def library_plan():
    return capstone.tp_plan()


def mlp_only():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"w1": ColwiseParallel(), "w2": RowwiseParallel()}


def attention_output_gathered():
    # Unusual but right: attn.wo takes the split heads, gathers them, and splits its
    # own output columns, then gathers again: more communication, the same numbers.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel

    plan = capstone.tp_plan()
    plan["attn.wo"] = ColwiseParallel(input_layouts=Shard(-1), output_layouts=Replicate())
    return plan


# ------------------------------------------------------------------ wrong plans
def w2_colwise():
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {**capstone.tp_plan(), "w2": ColwiseParallel()}


def wo_colwise():
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {**capstone.tp_plan(), "attn.wo": ColwiseParallel()}


def w2_without_its_all_reduce():
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    return {**capstone.tp_plan(), "w2": RowwiseParallel(output_layouts=Partial())}


def nothing_split():
    return {}


def not_a_dict():
    return list(capstone.tp_plan().items())


@pytest.mark.parametrize("plan", [library_plan, mlp_only, attention_output_gathered])
def test_plans_that_split_and_match_pass(cluster, plan):
    """Guards against a checker that accepts only the shipped plan: any plan that splits
    some layers over tp and trains like one process is correct."""
    result = check_tp_plan(plan, cluster=cluster)
    assert result.passed, result.message
    assert "w2.weight" in result.message  # it names what each TP rank holds half of


@pytest.mark.parametrize(
    "plan,phrases",
    [
        (w2_colwise, ["the run stopped", "'w2'"]),
        (wo_colwise, ["the run stopped", "'attn.wo'"]),
        (w2_without_its_all_reduce, ["did not stop", "TP peers 0 and 1", "one process"]),
        (nothing_split, ["splits nothing"]),
        (not_a_dict, ["before any block ran", "not a dict"]),
    ],
    ids=["w2_colwise", "wo_colwise", "w2_without_its_all_reduce", "nothing_split", "not_a_dict"],
)
def test_wrong_plans_are_explained(cluster, plan, phrases):
    """Guards the exercise's two lessons: a plan whose layers do not pair stops with the
    layer named, and a plan that drops the all-reduce runs but leaves the reference."""
    result = check_tp_plan(plan, cluster=cluster)
    assert result.status == "wrong", result.message
    for phrase in phrases:
        assert phrase in result.message, result.message


@pytest.mark.system  # fresh ranks of its own (~8 s quiet): `make system`
def test_fresh_ranks_give_the_same_verdict():
    """Guards the path without a cluster: fresh ranks run the whole check to a pass.

    One fresh run: a wrong plan's verdict is made from the same results, whichever ranks
    ran it (a second fresh run of 4 ranks importing DTensor cost ~3 s on 2 cores).
    """
    result = check_tp_plan(mlp_only)
    assert result.passed, result.message
    assert "w2.weight" in result.message


def test_a_cluster_of_another_size_is_refused_before_anything_runs():
    """Guards against a silent comparison with the wrong reference (dp 2 x tp 2 only)."""

    class Two:
        world_size = 2

    with pytest.raises(EzpzError, match="4-rank cluster"):
        check_tp_plan(mlp_only, cluster=Two())
