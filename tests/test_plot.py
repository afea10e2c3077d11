"""ezpz_nb.viz draws what real runs recorded: checked on the figures' data, not pixels.

Ledgers come from real gloo ranks (one 4-rank Cluster for the module); the
expected sample ids and padding come from torch's own DistributedSampler.
"""

from __future__ import annotations

import numpy as np
import pytest
from _plot_workers import (
    leave_before_barrier,
    seeded_tokens,
    stop_early,
    train_uneven,
    uneven_steps,
)
from torch.utils.data import DistributedSampler

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data.groups import layout_table
from ezpz_nb.examples.explore import explore_rank
from ezpz_nb.ledger import Ledger

WORLD, SEED = 4, 1337


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(WORLD, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def padded(cluster) -> tuple[Ledger, dict]:
    """dp 2 x tp 2, 11 samples, drop_last=False: the sampler pads one sample per epoch."""
    cfg = dict(tp_size=2, num_samples=11, batch_size=2, drop_last=False, epochs=2, broadcast=True)
    return Ledger.from_results(cluster.run(explore_rank, **cfg)), cfg


def sampler_indices(
    n: int, dp_size: int, dp: int, epoch: int, drop_last: bool, shuffle: bool = True
) -> list[int]:
    s = DistributedSampler(
        range(n), num_replicas=dp_size, rank=dp, shuffle=shuffle, seed=SEED, drop_last=drop_last
    )
    s.set_epoch(epoch)
    return list(s)


def test_heatmap_array_is_the_ledgers_sample_ids(padded):
    ledger, _ = padded
    fig = viz.heatmap(ledger)
    data = fig.ezpz_data
    assert data["epochs"] == ledger.epochs() == [0, 1]
    assert data["ranks"] == ledger.ranks()  # TP innermost: rank order keeps TP groups together
    assert data["labels"][3] == "r3 (dp1,tp1)"
    for e in data["epochs"]:
        np.testing.assert_array_equal(data["ids"][e], ledger.sample_matrix(e))
    assert len(fig.axes) == 3  # two epoch panels side by side + the colour bar


def test_heatmap_rows_match_the_sampler_tp_rows_equal_dp_rows_differ(padded):
    ledger, cfg = padded
    data = viz.heatmap(ledger).ezpz_data
    bs, n, dp_size = cfg["batch_size"], cfg["num_samples"], WORLD // cfg["tp_size"]
    for e in data["epochs"]:
        ids = data["ids"][e]
        for row, (rank, dp, _tp) in enumerate(layout_table(WORLD, cfg["tp_size"])):
            expected = sampler_indices(n, dp_size, dp, e, drop_last=False)
            got = [int(i) for i in ids[row].reshape(-1) if i >= 0]
            assert got == expected, f"rank {rank} epoch {e}"
        np.testing.assert_array_equal(ids[0], ids[1])  # TP peers hold the same batches
        np.testing.assert_array_equal(ids[2], ids[3])
        assert ids.shape[1] == -(-len(expected) // bs)
    assert not np.array_equal(data["ids"][0], data["ids"][1]), "set_epoch should reshuffle"


def test_heatmap_marks_exactly_where_distributed_sampler_pads(padded):
    ledger, cfg = padded
    data = viz.heatmap(ledger).ezpz_data
    bs, n, dp_size = cfg["batch_size"], cfg["num_samples"], WORLD // cfg["tp_size"]
    total = 0
    for e in data["epochs"]:
        expected = np.zeros_like(data["repeats"][e])
        for row, (_rank, dp, _tp) in enumerate(layout_table(WORLD, cfg["tp_size"])):
            for j in range(len(sampler_indices(n, dp_size, dp, e, drop_last=False))):
                # Position j of replica dp is global position j * dp_size + dp of the
                # sampler's padded index list; positions >= n are the padding.
                expected[row, j // bs, j % bs] = j * dp_size + dp >= n
        np.testing.assert_array_equal(data["repeats"][e], expected)
        total += int(expected.sum())
    assert total == 2 * 2  # one padded sample per epoch, held by both TP peers


def test_heatmap_without_set_epoch_shows_the_same_order_twice(cluster):
    ledger = Ledger.from_results(
        cluster.run(
            explore_rank, tp_size=1, num_samples=8, epochs=2, set_epoch=False, broadcast=False
        )
    )
    fig = viz.heatmap(ledger)
    ids = fig.ezpz_data["ids"]
    np.testing.assert_array_equal(ids[0], ids[1])
    assert not fig.ezpz_data["repeats"][0].any()  # 8 samples over 4 replicas: no padding
    one = viz.heatmap(ledger, epoch=1).ezpz_data
    assert one["epochs"] == [1] and list(one["ids"]) == [1]


def test_coverage_marks_duplicates_and_never_seen(cluster, padded):
    ledger, cfg = padded
    rep = viz.coverage(ledger).ezpz_data
    assert rep["num_samples"] == 11 and rep["replica"].shape == (2, 11)
    for row, e in enumerate(rep["epochs"]):
        padded_ids = {sampler_indices(11, 2, 1, e, drop_last=False)[-1]}  # replica 1 is short
        assert set(np.nonzero(rep["replica"][row] == -2)[0]) == padded_ids
        assert not (rep["replica"][row] == -1).any()
        for dp in range(2):
            for i in set(sampler_indices(11, 2, dp, e, drop_last=False)) - padded_ids:
                assert rep["replica"][row, i] == dp

    dropped = Ledger.from_results(
        cluster.run(
            explore_rank,
            tp_size=1,
            num_samples=10,
            batch_size=2,
            drop_last=True,
            epochs=1,
            broadcast=False,
        )
    )
    rep = viz.coverage(dropped).ezpz_data
    seen = set()
    for dp in range(WORLD):
        idx = sampler_indices(10, WORLD, dp, 0, drop_last=True)
        seen |= set(idx[: len(idx) // 2 * 2])  # the loader drops the partial batch too
    assert set(np.nonzero(rep["replica"][0] == -1)[0]) == set(range(10)) - seen
    assert not (rep["replica"] == -2).any()


def test_loaded_vs_received_counts_leader_io(cluster, padded):
    ledger, _ = padded
    data = viz.loaded_vs_received(ledger).ezpz_data
    steps = {r: len([x for x in ledger.records if x.rank == r]) for r in ledger.ranks()}
    for rank, (_, _dp, tp) in zip(data["ranks"], layout_table(WORLD, 2), strict=True):
        i = data["ranks"].index(rank)
        assert (data["loaded"][i], data["received"][i]) == (
            (steps[rank], 0) if tp == 0 else (0, steps[rank])
        )

    alone = Ledger.from_results(cluster.run(explore_rank, tp_size=2, broadcast=False, epochs=1))
    data = viz.loaded_vs_received(alone).ezpz_data
    assert (data["received"] == 0).all() and (data["loaded"] > 0).all()


def test_timeline_shows_where_a_rank_raised(cluster):
    with pytest.raises(ez.RankError) as info:
        cluster.run(stop_early, 3, 2)
    err = info.value
    ledger = Ledger.from_events(err.events)
    data = viz.timeline(ledger, err).ezpz_data
    assert data["status"][3] == "raised" and "gave up at step 1" in data["notes"][3]
    assert data["total"][3] == 2
    for r in range(3):
        assert data["total"][r] == 6  # 24 samples over 4 ranks, batch 1
        assert data["status"][r] == "stopped"  # they waited in the barrier and were stopped
    assert data["verdict"] == {"raised": [3], "stopped": [0, 1, 2]}
    assert "rank 3 raised an exception; ranks 0, 1 and 2 stopped by the launcher" in data["title"]


def test_timeline_shows_who_hung_where():
    with ez.Cluster(2, timeout=3) as c, pytest.raises(ez.HangError) as info:
        c.run(stop_early, 1, 4, hang=True)
    err = info.value
    data = viz.timeline(Ledger.from_events(err.events), err).ezpz_data
    assert data["status"] == {0: "hung", 1: "short"}  # rank 1 left early: the cause
    assert data["verdict"] == {"short": [1], "hung": [0]}
    assert "barrier" in data["notes"][0]
    assert "finished its function" in data["notes"][1]
    assert data["total"] == {0: 12, 1: 4}


def test_timeline_title_names_who_finished_early_and_who_hung():
    """Regression: the title called the hung ranks the ones that "stopped early or failed".

    Real run: even ranks take fewer steps and leave; odd ranks hang in their next
    all_reduce. The title must name the even ranks as finished early and the odd
    ones as hung, and the data must agree with the ledger and the HangError.
    """
    world = 4
    with pytest.raises(ez.HangError) as info:
        ez.launch(train_uneven, world_size=world, timeout=3)
    err = info.value
    ledger = Ledger.from_events(err.events)
    data = viz.timeline(ledger, err).ezpz_data
    steps = {r: len(ledger.steps(r, 0)) for r in range(world)}
    assert steps == {r: uneven_steps(r) for r in range(world)}
    early = [r for r in range(world) if steps[r] < max(steps.values())]
    waiting = [r for r in range(world) if err.stacks[r].state != "finished"]
    assert early == [r for r in range(world) if err.stacks[r].state == "finished"]
    assert {err.stacks[r].call for r in waiting} == {"all_reduce"}
    assert data["verdict"] == {"short": early, "hung": waiting}
    assert data["status"] == {**dict.fromkeys(early, "short"), **dict.fromkeys(waiting, "hung")}
    finished, hung = data["title"].split("\n")[1].split("; ")
    assert finished == f"ranks {early[0]} and {early[1]} finished early (fewer steps)"
    assert hung == f"ranks {waiting[0]} and {waiting[1]} hung, waiting in all_reduce()"


def test_timeline_names_ranks_that_left_without_fewer_steps():
    """A rank that returned while the others hang is named even with as many steps as they took.

    (Notebook 04: TP leaders whose loader ran dry leave after 3 steps; their
    peers, also at 3 steps, wait for a fourth broadcast.)
    """
    with pytest.raises(ez.HangError) as info:
        ez.launch(leave_before_barrier, 3, world_size=2, timeout=3)
    err = info.value
    data = viz.timeline(Ledger.from_events(err.events), err).ezpz_data
    assert data["total"] == {0: 3, 1: 3}
    assert data["verdict"] == {"finished": [0], "hung": [1]}
    assert data["title"].endswith(
        "rank 0 finished while the others waited; rank 1 hung, waiting in barrier()"
    )


def test_timeline_without_error_flags_short_ranks(padded):
    ledger, _ = padded
    data = viz.timeline(ledger).ezpz_data
    assert set(data["status"].values()) == {"ok"} and data["verdict"] == {}
    assert data["title"].endswith("all ranks took the same steps")
    cut = Ledger(
        [r for r in ledger.records if not (r.rank == 2 and r.epoch == 1)], ledger.num_samples
    )
    data = viz.timeline(cut).ezpz_data
    assert data["status"][2] == "short" and data["total"][2] < data["total"][0]
    assert data["verdict"] == {"short": [2]} and "rank 2 finished early" in data["title"]


def test_layout_grid_and_groups():
    data = viz.layout(8, 2).ezpz_data
    for rank, dp, tp in layout_table(8, 2):
        assert data["grid"][dp, tp] == rank
    assert data["tp_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert data["dp_groups"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ValueError, match="valid tp sizes"):
        viz.layout(6, 4)


def test_figures_render_as_png_in_notebooks(padded):
    fig = viz.heatmap(padded[0])
    assert fig._repr_png_().startswith(b"\x89PNG")


def test_an_empty_ledger_still_draws():
    """A run that failed before its first step gives an empty ledger: no crash, empty data."""
    empty = Ledger([])
    assert viz.heatmap(empty).ezpz_data["epochs"] == []
    assert viz.coverage(empty).ezpz_data["replica"].size == 0
    assert viz.loaded_vs_received(empty).ezpz_data["ranks"] == []
    assert viz.timeline(empty).ezpz_data["ranks"] == []


def test_loss_curves_measure_the_gap_to_the_reference():
    from ezpz_nb.ledger import StepRecord

    recs = [
        StepRecord(0, s, 0, 0, 1, 0, 1, (s,), "loaded", "d", loss=2.0 - 0.5 * s) for s in range(3)
    ]
    fig = viz.loss_curves(
        {"run": Ledger(recs), "one process": [2.0, 1.5, 1.25]}, reference="one process"
    )
    assert fig.ezpz_data["losses"]["run"].tolist() == [2.0, 1.5, 1.0]
    assert fig.ezpz_data["max_gap"] == {"run": 0.25}
    assert viz.png_bytes(fig).startswith(b"\x89PNG")
    with pytest.raises(KeyError, match="reference"):
        viz.loss_curves({"run": [1.0]}, reference="missing")


def test_heatmap_and_timeline_label_cp_positions():
    from ezpz_nb.ledger import StepRecord

    recs = [
        StepRecord(0, 0, r, 0, 1, r % 2, 2, (0,), "loaded", f"d{r // 2}", cp_rank=r // 2, cp_size=2)
        for r in range(4)
    ]
    fig = viz.heatmap(Ledger(recs))
    assert fig.ezpz_data["labels"] == [
        "r0 (dp0,cp0,tp0)",
        "r1 (dp0,cp0,tp1)",
        "r2 (dp0,cp1,tp0)",
        "r3 (dp0,cp1,tp1)",
    ]
    timeline = viz.timeline(Ledger(recs))
    assert [t.get_text() for t in timeline.axes[0].get_yticklabels()] == fig.ezpz_data["labels"]


@pytest.mark.parametrize(
    ("seed_by_rank", "broadcast", "mismatched_rows"),
    [(True, False, {1, 3}), (True, True, set()), (False, False, set())],
)
def test_digests_mark_tp_peers_whose_bytes_differ_from_their_leader(
    cluster, seed_by_rank, broadcast, mismatched_rows
):
    """Guards: 08's rank-seeded bug drawn as matching sample ids: the digest figure marks the
    tp1 ranks at every step, and nothing when the broadcast or a rank-free seed fixes it."""
    ledger = Ledger.from_results(cluster.run(seeded_tokens, seed_by_rank, broadcast))
    data = viz.digests(ledger).ezpz_data
    assert data["ranks"] == [0, 1, 2, 3] and len(data["columns"]) == 2  # 4 samples / batch 2
    rows = {i for i, bad in enumerate(data["mismatch"].any(axis=1)) if bad}
    assert rows == mismatched_rows
    if mismatched_rows:  # every step of the tp1 rows, none of the leaders'
        assert data["mismatch"][[1, 3]].all() and data["steps_mismatched"] == 2
        assert {p.kind for p in ledger.check()} == {"tp_mismatch"}
    else:
        assert data["steps_mismatched"] == 0 and ledger.ok
    for row in data["digests"]:  # what is drawn is the ledger's digest
        assert all(len(d) == 32 for d in row)


def test_no_figure_name_is_also_a_submodule_name():
    """Guards viz.timeline turning into a module: a submodule of that name, once imported,
    replaces the package's lazily resolved function of the same name."""
    import pkgutil

    import ezpz_nb.viz as viz_pkg

    submodules = {m.name for m in pkgutil.iter_modules(viz_pkg.__path__)}
    assert not submodules & set(viz_pkg._WHERE), submodules & set(viz_pkg._WHERE)
