"""ezpz_nb.data.groups: the DP x TP layout, checked against the groups gloo really built."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.data.groups import (
    Layout,
    layout_table,
    make_layout,
    tp_groups_across_nodes,
    valid_tp_sizes,
)


def test_layout_table_puts_tp_innermost():
    """Guards the layout ezpz and Megatron share (a ("dp", "tp") DeviceMesh too): world 4, tp 2 gives
    TP groups [0,1],[2,3] and DP groups [0,2],[1,3]."""
    assert layout_table(4, 2) == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert layout_table(4, 1) == [(r, r, 0) for r in range(4)]
    assert layout_table(8, 4)[6] == (6, 1, 2)
    assert valid_tp_sizes(12) == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize("world, tp", [(4, 3), (6, 4), (4, 0), (2, 2.0)])
def test_layout_table_rejects_tp_that_does_not_divide(world, tp):
    """Guards uneven TP groups: the ValueError names the valid sizes."""
    with pytest.raises(ValueError, match=r"valid tp sizes are \[1, 2"):
        layout_table(world, tp)


def test_make_layout_outside_a_process_group():
    """Guards plain-script use: one process is dp 1 x tp 1; asking for tp 2 says why not."""
    assert make_layout() == Layout(0, 1, 0, 1, 0, 1)
    with pytest.raises(ValueError, match=r"valid tp sizes are \[1\]"):
        make_layout(2)


def test_tp_groups_stay_on_a_node_only_when_tp_divides_the_ranks_per_node():
    """Guards the README's old claim that tp <= nproc_per_node keeps TP on one node: at 12
    ranks, 6 per node, tp 4 puts [4, 5, 6, 7] on two nodes; tp 3 (it divides 6) does not."""
    assert tp_groups_across_nodes(12, 4, 6) == [[4, 5, 6, 7]]
    assert tp_groups_across_nodes(12, 3, 6) == []
    assert tp_groups_across_nodes(12, 6, 6) == [] and tp_groups_across_nodes(12, 12, 6) == [
        list(range(12))
    ]
    assert tp_groups_across_nodes(8, 2, 3) == [[2, 3]]  # uneven nodes: 0-2 | 3-5 | 6-7
    with pytest.raises(ValueError, match="valid tp sizes"):
        tp_groups_across_nodes(12, 5, 6)


def _layout_warnings(local_world_size):
    import os
    import warnings

    from ezpz_nb.data.groups import release_groups

    os.environ["LOCAL_WORLD_SIZE"] = local_world_size  # as torchrun sets it on each node
    release_groups()  # build the groups again, as a fresh torchrun process would
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_layout(2)
    return [str(w.message) for w in caught if w.category is ez.DataLayoutWarning]


def test_make_layout_warns_when_a_tp_group_spans_nodes():
    """Guards the torchrun examples' warning: with 3 ranks per node, tp 2 at world 4 puts
    [2, 3] on two nodes and rank 0 says so once; with 2 per node nothing is said."""
    spans = ez.launch(_layout_warnings, "3", world_size=4, timeout=60)
    assert len(spans[0]) == 1 and spans[1:] == [[], [], []]
    assert "[[2, 3]] span two nodes" in spans[0][0] and "e.g. one of [1]" in spans[0][0]
    assert ez.launch(_layout_warnings, "2", world_size=4, timeout=60) == [[], [], [], []]


def _groups_run():
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for tp in valid_tp_sizes(world):
        for mesh in (True, False):
            lay = make_layout(tp, use_device_mesh=mesh)
            tp_members = [None] * lay.tp_size
            dp_members = [None] * lay.dp_size
            dist.all_gather_object(tp_members, rank, group=lay.tp_group)
            dist.all_gather_object(dp_members, rank, group=lay.dp_group)
            out[(tp, mesh)] = (
                lay,
                tp_members,
                dp_members,
                dist.get_rank(lay.tp_group),
                dist.get_rank(lay.dp_group),
            )
    out["cached"] = make_layout(2).tp_group is make_layout(2).tp_group
    try:
        make_layout(3)
    except ValueError as e:
        out["bad"] = str(e)
    return out


def test_groups_built_in_ranks_match_the_table():
    """Guards make_layout with DeviceMesh and with plain new_group: at world 4 every tp size
    gives groups whose members (seen through all_gather) and group ranks match
    layout_table; repeated calls reuse the groups; tp 3 raises ValueError naming 1, 2, 4."""
    results = ez.launch(_groups_run, world_size=4, timeout=60)
    for rank, res in enumerate(results):
        assert "[1, 2, 4]" in res["bad"]
        assert res["cached"]  # no new groups (sockets, threads) per repeated call
        for tp in (1, 2, 4):
            table = layout_table(4, tp)
            for mesh in (True, False):
                lay, tp_members, dp_members, tp_rank, dp_rank = res[(tp, mesh)]
                _, want_dp, want_tp = table[rank]
                assert (lay.rank, lay.world_size, lay.tp_size, lay.dp_size) == (
                    rank,
                    4,
                    tp,
                    4 // tp,
                )
                assert (lay.dp_rank, lay.tp_rank) == (want_dp, want_tp) == (dp_rank, tp_rank)
                assert tp_members == [r for r, d, _ in table if d == want_dp]
                assert dp_members == [r for r, _, t in table if t == want_tp]
                assert lay.is_tp_leader == (want_tp == 0)
                assert lay.tp_group is None and lay.dp_group is None  # dropped by pickling


def _dtensor_teardown_run():
    import gc

    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ezpz_nb._dist import destroy_distributed

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    t = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
    total = float((t.redistribute(mesh, [Replicate()]).to_local() * 2).sum())  # fills the caches
    del t, mesh
    gloo_threads_left = destroy_distributed()
    gc.collect()
    meshes = sum(isinstance(o, DeviceMesh) for o in gc.get_objects())
    return total, meshes, gloo_threads_left


def test_teardown_frees_every_group_a_dtensor_run_used():
    """Guards the capstone's exit under torchrun. Two holders kept gloo groups, and their
    worker threads, past destroy_process_group(): DTensor's caches (the C++ sharding
    cache, the redistribute planners, the mesh topology) held every DeviceMesh; and
    torch.distributed.nn.functional, imported by DTensor after the group was made, holds
    the default group in ten functions' default arguments. After destroy_distributed()
    no mesh and no gloo thread is left."""
    for total, meshes, threads in ez.launch(_dtensor_teardown_run, world_size=2, timeout=120):
        assert total == 56.0
        assert meshes == 0
        assert threads == 0


def _late_import_run():
    import torch.distributed as dist

    # Imported after the group exists, as a training script would: the default
    # process_group=dist.group.WORLD of this method captures the live group.
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from ezpz_nb._dist import destroy_distributed

    def groups_in_defaults() -> int:
        defaults = ShardedGradScaler.__init__.__defaults__ or ()
        return sum(isinstance(d, dist.ProcessGroup) for d in defaults)

    captured = groups_in_defaults()
    threads_left = destroy_distributed()
    return captured, groups_in_defaults(), threads_left


def test_teardown_frees_a_group_held_by_a_method_default():
    """A class method's default argument holds the group (ShardedGradScaler's
    process_group=dist.group.WORLD, evaluated when imported after init): teardown puts
    None back, so the group and its two gloo threads go."""
    for captured, after, threads in ez.launch(_late_import_run, world_size=2, timeout=120):
        assert captured == 1  # the test's premise: the import came after the group
        assert after == 0 and threads == 0
