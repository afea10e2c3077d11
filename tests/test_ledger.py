"""ezpz_nb.ledger: records, checks, files, and records that survive a hang."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, Subset, get_worker_info

import ezpz_nb as ez
from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp
from ezpz_nb.data.groups import Layout, make_layout
from ezpz_nb.ledger import Ledger, StepRecord, batch_digest, record, tag_worker


def rec(rank, step, ids, *, epoch=0, tp=1, world=2, digest=None, source="loaded"):
    """A hand-made record for rank ``rank`` in a world of ``world`` with TP size ``tp``."""
    return StepRecord(
        epoch,
        step,
        rank,
        rank // tp,
        world // tp,
        rank % tp,
        tp,
        tuple(ids),
        source,
        digest or f"d{tuple(ids)}",
    )


# --------------------------------------------------------------- single process


def test_clean_ledger_passes_every_check():
    """Guards false alarms: disjoint DP shards, identical TP peers, equal step counts."""
    recs = [
        rec(r, s, [2 * s + r // 2 * 4, 2 * s + 1 + r // 2 * 4], tp=2, world=4)
        for r in range(4)
        for s in range(2)
    ]
    ledger = Ledger(recs, num_samples=8)
    assert ledger.check() == [] and ledger.ok
    assert "All checks passed" in ledger.summary() and "dp 2 x tp 2" in ledger.summary()
    assert ledger.ranks() == [0, 1, 2, 3] and ledger.epochs() == [0]
    assert ledger.layout() == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    assert ledger.sample_ids(2, 0) == [4, 5, 6, 7]


def test_each_problem_kind_in_plain_words():
    """Guards the four checks: a duplicated sample, never-seen samples, TP peers with other
    samples or other bytes, and ranks with different step counts, each named with the
    ranks, samples or steps involved."""
    dup = Ledger([rec(0, 0, [0, 4]), rec(1, 0, [4, 1])], num_samples=5)
    kinds = {p.kind: p for p in dup.check()}
    assert set(kinds) == {"dp_duplicate", "never_seen"}
    assert kinds["dp_duplicate"].samples == (4,) and kinds["dp_duplicate"].ranks == (0, 1)
    assert "sample 4 by DP ranks [0, 1]" in kinds["dp_duplicate"].message
    assert kinds["never_seen"].samples == (2, 3) and "2 of 5" in kinds["never_seen"].message

    tp_ids = Ledger([rec(0, 0, [0], tp=2), rec(1, 0, [1], tp=2)])
    (p,) = tp_ids.check()
    assert p.kind == "tp_mismatch" and p.steps == (0,) and "different samples" in p.message
    tp_bytes = Ledger([rec(0, 0, [0], tp=2, digest="a"), rec(1, 0, [0], tp=2, digest="b")])
    (p,) = tp_bytes.check()
    assert (
        p.kind == "tp_mismatch" and "different bytes" in p.message and "seeded by rank" in p.message
    )

    steps = Ledger([rec(0, 0, [0]), rec(0, 1, [2]), rec(1, 0, [1])])
    (p,) = steps.check()
    assert p.kind == "step_mismatch" and "ranks [0] took 2" in p.message and "hang" in p.message
    assert not steps.ok and "step_mismatch" in steps.summary()


def test_a_rank_with_no_step_counts_as_zero_steps():
    """Guards the rank that never got a batch: it has no record, yet it is the one that
    leaves the others waiting. Its place in the layout (dp_size x tp_size) counts it, in
    an epoch where it recorded nothing and in a run where it recorded nothing at all."""
    absent = Ledger([rec(0, s, [s]) for s in range(3)])  # world 2: rank 1 took 0 steps
    (p,) = absent.check()
    assert p.kind == "step_mismatch" and "ranks [1] took 0" in p.message and p.ranks == (0, 1)
    later = Ledger([rec(0, 0, [0], epoch=0), rec(1, 0, [1], epoch=0), rec(0, 0, [1], epoch=1)])
    (p,) = later.check()
    assert (p.kind, p.epoch) == ("step_mismatch", 1) and "ranks [1] took 0" in p.message


def test_num_samples_of_a_hand_made_shard_is_the_whole_dataset():
    """Guards never_seen over Subset shards: the ledger counts the full dataset, so the
    samples no shard holds are reported (a shard's own length would hide them)."""
    ds = RandomTokenDataset(32, 4, num_samples=5)
    shard = Subset(Subset(ds, range(5)), [0, 2])  # nested, as a shard of a split
    recorder = record(DataLoader(shard, batch_size=1), publish=False)
    list(recorder)
    ledger = recorder.ledger()
    assert ledger.num_samples == 5
    (p,) = ledger.check()
    assert p.kind == "never_seen" and p.samples == (1, 3, 4)


def test_never_seen_blames_drop_last_only_when_drop_last_could_drop_that_many():
    """Guards a misleading hint: 2 replicas with batches of 2 can drop at most 3 samples
    (1 remainder, 1 partial batch each). 3 unseen of 11 is drop_last's doing; 16 unseen
    of 24, as when the sampler shards over the world instead of the DP group, is not."""
    few = Ledger(
        [rec(r, s, [4 * s + 2 * r, 4 * s + 2 * r + 1]) for r in (0, 1) for s in (0, 1)],
        num_samples=11,
    )
    (p,) = few.check()
    assert p.kind == "never_seen" and len(p.samples) == 3
    assert "more than" not in p.message
    # Two flags, each named with what it drops (02 and 04 teach them apart).
    assert "The sampler's drop_last=True drops the samples that do not divide" in p.message
    assert "(at most 1 here)" in p.message
    assert "the DataLoader's drop_last=True drops each replica's last partial batch" in p.message
    half = Ledger(
        [rec(r, s, [8 * r + 2 * s, 8 * r + 2 * s + 1]) for r in (0, 1) for s in (0, 1)],
        num_samples=24,
    )
    (p,) = half.check()
    assert p.kind == "never_seen" and len(p.samples) == 16
    assert (
        "more than drop_last can drop (at most 3 with 2 DP replica(s) and batches of 2)"
        in p.message
    )
    assert "instead of the DP group" in p.message


def test_dp_duplicate_blames_padding_only_when_padding_could_repeat_that_many():
    """Guards a misleading hint: DistributedSampler pads fewer than dp_size slots, so 1 repeat
    over 2 replicas can be padding, while 2 repeats (as after a resume at another world size,
    notebook 09) cannot, and the hint must not send the learner to drop_last."""
    padded = Ledger([rec(0, 0, [0, 2]), rec(1, 0, [1, 0])], num_samples=3)
    (p,) = padded.check()
    assert p.kind == "dp_duplicate" and p.samples == (0,)
    assert "pads the last shards" in p.message and "overlap" not in p.message
    overlap = Ledger([rec(0, 0, [0, 1]), rec(1, 0, [1, 0])], num_samples=2)
    (p,) = overlap.check()
    assert p.kind == "dp_duplicate" and p.samples == (0, 1)
    assert "more than the sampler's padding repeats (at most 1 with 2 DP replicas)" in p.message
    assert "pads the last shards" not in p.message and "another world size" in p.message


def test_step_mismatch_says_extra_steps_pair_with_the_next_epoch():
    """Guards the hint's claim about when a step mismatch hangs: with more epochs to come the
    extra collective pairs with the next epoch's first one, so it does not hang there."""
    ledger = Ledger([rec(0, 0, [0]), rec(0, 1, [2]), rec(1, 0, [1])], num_samples=3)
    (p,) = ledger.check()
    assert p.kind == "step_mismatch" and "next epoch's first one" in p.message
    assert "after the last epoch it meets nothing: a hang" in p.message


def test_checks_are_per_epoch():
    """Guards mixing epochs: the same sample in two epochs is not a duplicate."""
    ledger = Ledger(
        [
            rec(0, 0, [0], epoch=0),
            rec(1, 0, [1], epoch=0),
            rec(0, 0, [1], epoch=1),
            rec(1, 0, [0], epoch=1),
        ],
        num_samples=2,
    )
    assert ledger.ok and ledger.epochs() == [0, 1]


def test_sample_matrix_pads_with_minus_one():
    """Guards the plots' input: (ranks x steps x batch), -1 where a rank had less."""
    ledger = Ledger([rec(0, 0, [3, 4]), rec(0, 1, [5]), rec(1, 0, [6, 7])])
    m = ledger.sample_matrix(0)
    assert m.shape == (2, 2, 2)
    assert m.tolist() == [[[3, 4], [5, -1]], [[6, 7], [-1, -1]]]
    assert Ledger().sample_matrix(0).shape == (0, 0, 0)


def test_save_and_load_one_file_and_a_folder_of_ranks(tmp_path):
    """Guards torchrun's one-file-per-rank ledgers: save/load round-trips, a folder merges."""
    recs = [rec(r, s, [s * 2 + r]) for r in range(2) for s in range(3)]
    whole = Ledger(recs, num_samples=6)
    assert Ledger.load(whole.save(tmp_path / "all.jsonl")) == whole
    for r in range(2):
        Ledger([x for x in recs if x.rank == r], num_samples=6).save(
            tmp_path / "run" / f"rank{r}.jsonl"
        )
    merged = Ledger.load(tmp_path / "run")
    assert (
        sorted(merged.records, key=lambda x: (x.rank, x.step)) == recs and merged.num_samples == 6
    )
    first = json.loads((tmp_path / "run" / "rank0.jsonl").read_text().splitlines()[1])
    assert first["sample_ids"] == [0] and first["source"] == "loaded"
    with pytest.raises(FileNotFoundError):
        Ledger.load(tmp_path / "empty_dir_missing")


def test_recorder_writes_its_file_step_by_step_and_an_end_record_when_done(tmp_path):
    """Guards ledgers that survive a kill: the header is on disk before the first step,
    each step is on disk as soon as it is taken (no close needed), and only a block that
    finishes writes the end record, so a file without one loads as incomplete and says
    where its rank stopped."""
    ds = RandomTokenDataset(32, 4, num_samples=6)
    path = tmp_path / "run" / "rank0.jsonl"
    with pytest.raises(RuntimeError, match="boom"):
        with record(DataLoader(ds, batch_size=2), publish=False, path=path) as recorder:
            assert json.loads(path.read_text())["kind"] == "header"
            for step, _ in enumerate(recorder):
                # On disk already, as a killed process would leave it.
                assert Ledger.load(path).last_step(0) == (0, step)
                if step == 1:
                    raise RuntimeError("boom")
    cut = Ledger.load(path)
    assert len(cut) == 2 and cut.complete == {0: False} and cut.num_samples == 6
    assert (
        "incomplete: rank 0 wrote no end record (its last step was epoch 0 step 1)" in cut.summary()
    )
    assert "never_seen" in cut.summary()  # the checks still run on what was recorded

    with record(DataLoader(ds, batch_size=2), publish=False, path=path) as recorder:
        list(recorder)
        list(recorder)
    done = Ledger.load(path)
    assert done == recorder.ledger() and done.complete == {0: True}
    assert json.loads(path.read_text().splitlines()[-1]) == {"kind": "end", "rank": 0, "steps": 6}
    assert "incomplete" not in done.summary()


def test_a_torn_last_line_loads_and_other_bad_lines_do_not(tmp_path):
    """Guards a kill mid-write: the last line without its newline is dropped, every step
    before it loads; a bad line elsewhere is an error naming the file and line."""
    recs = [rec(0, s, [s], world=1) for s in range(3)]
    path = Ledger(recs, num_samples=3, complete={0: False}).save(tmp_path / "rank0.jsonl")
    whole = path.read_text()
    path.write_text(whole + '{"kind": "step", "epoch": 0, "step": 3, "ra')
    torn = Ledger.load(path)
    assert torn.records == recs and torn.complete == {0: False} and torn.last_step(0) == (0, 2)
    assert torn.summary().endswith("All checks passed on what was recorded.")
    path.write_text(whole.replace("\n", "\n{oops\n", 1))
    with pytest.raises(ValueError, match=r"rank0.jsonl, line 2: not a ledger line"):
        Ledger.load(path)


def test_older_and_newer_ledger_files(tmp_path):
    """Guards the format's versioning: a version 1 file (header without kind, bare records)
    still loads, completeness unknown; kinds and keys a newer writer adds are skipped;
    a higher version is refused with what to do."""
    r0 = rec(0, 0, [0])
    v1 = tmp_path / "v1.jsonl"
    v1.write_text(
        json.dumps({"ezpz_nb_ledger": 1, "num_samples": 4})
        + "\n"
        + json.dumps({**r0.__dict__, "sample_ids": [0]})
        + "\n"
    )
    old = Ledger.load(v1)
    assert old.records == [r0] and old.num_samples == 4 and old.complete == {}
    extended = tmp_path / "v2.jsonl"
    extended.write_text(
        "\n".join(
            json.dumps(d)
            for d in [
                {
                    "ezpz_nb_ledger": 2,
                    "kind": "header",
                    "num_samples": 4,
                    "rank": 0,
                    "mesh": [2, 2, 2],
                },
                {"kind": "step", **r0.__dict__, "sample_ids": [0], "worker": 1, "pp_rank": 0},
                {"kind": "loss", "rank": 0, "epoch": 0, "step": 0, "value": 2.5},
                {"kind": "end", "rank": 0, "steps": 1},
            ]
        )
        + "\n"
    )
    new = Ledger.load(extended)
    assert new.records == [r0] and new.complete == {0: True}
    future = tmp_path / "v9.jsonl"
    future.write_text(json.dumps({"ezpz_nb_ledger": 9, "kind": "header"}) + "\n")
    with pytest.raises(ValueError, match="version 9 ledger.*upgrade ezpz_nb"):
        Ledger.load(future)


def test_from_results_and_from_events_shapes():
    """Guards the documented result shapes: per-rank Ledgers or lists of StepRecords
    (nested), and launcher events whose items are StepRecords (others skipped)."""
    a, b = rec(0, 0, [0]), rec(1, 0, [1])
    assert Ledger.from_results([Ledger([a], 4), [b]]) == Ledger([a, b], 4)
    assert Ledger.from_results([[a], [[b]]], num_samples=2).num_samples == 2
    with pytest.raises(TypeError, match="expected Ledger"):
        Ledger.from_results([{"x": 1}])
    events = [
        SimpleNamespace(rank=0, item=a),
        SimpleNamespace(rank=0, item="hello"),
        SimpleNamespace(rank=1, item=b),
    ]
    assert Ledger.from_events(events).records == [a, b]


def test_recorder_in_one_process_counts_passes_and_digests_bytes():
    """Guards the recorder without torch.distributed: batches pass unchanged, ids come from
    the index leaf, epochs label passes (set_epoch or +1), and the digest sees dtype bytes."""
    ds = RandomTokenDataset(32, 4, num_samples=6)
    batches = list(DataLoader(ds, batch_size=2))
    recorder = record(DataLoader(ds, batch_size=2), epoch=3, publish=False)
    got = list(recorder)
    assert all(
        torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(got, batches, strict=True)
    )
    list(recorder)
    recorder.set_epoch(7)
    list(recorder)
    ledger = recorder.ledger()
    assert ledger.epochs() == [3, 4, 7] and ledger.num_samples == 6
    assert [r.sample_ids for r in ledger.steps(0, 3)] == [(0, 1), (2, 3), (4, 5)]
    assert ledger.steps(0, 4)[0].digest == batch_digest(batches[0])
    x = torch.arange(4)
    assert batch_digest({"a": x}) != batch_digest({"a": x.to(torch.int32)})
    assert batch_digest([x[::2]]) == batch_digest([torch.tensor([0, 2])])  # strides do not matter


# ------------------------------------------------------------------- multi-rank


def _recorded_run():
    lay = make_layout(2)
    dl = get_random_dataset_fsdp_tp(
        2,
        64,
        8,
        dp_group=lay.dp_group,
        tp_group=lay.tp_group,
        broadcast_within_tp=True,
        num_samples=12,
    )["dataloader"]
    recorder = record(dl, lay)
    for epoch in (0, 1):
        recorder.set_epoch(epoch)
        for batch in recorder:
            dist.all_reduce(batch["input_ids"].sum())  # a training step's collective
    return recorder.ledger()


def test_records_come_back_as_results_and_as_live_events():
    """Guards issue 4's input: every rank's records come back through Cluster.run as one
    ledger, the same records arrive live as published events, and loaded/received is
    recorded per rank (TP leader loads, peer receives)."""
    with ez.Cluster(world_size=4, timeout=60) as cluster:
        ledger = Ledger.from_results(cluster.run(_recorded_run))
        live = Ledger.from_events(cluster.events, num_samples=12)
    assert ledger.ok, ledger.summary()
    assert sorted(live.records, key=repr) == sorted(ledger.records, key=repr)
    assert {(r.rank, r.source) for r in ledger.records} == {
        (0, "loaded"),
        (1, "received"),
        (2, "loaded"),
        (3, "received"),
    }
    assert len(ledger.records) == 4 * 2 * 3  # 4 ranks, 2 epochs, 12 / 2 replicas / batch 2


def _uneven_run():
    rank = dist.get_rank()
    ds = RandomTokenDataset(64, 8, num_samples=5)
    loader = DataLoader(Subset(ds, list(range(rank, 5, 2))), batch_size=1)  # 3 vs 2 batches
    batches = list(record(loader, Layout(rank, 2, rank, 2, 0, 1)))  # published as they come
    for batch in batches:
        dist.all_reduce(batch["input_ids"])  # rank 0's third call never finds a partner


def test_partial_ledger_survives_a_hang():
    """Guards the records of a hung run: HangError.events rebuild the partial ledger, and
    its check names the step mismatch that caused the hang."""
    with pytest.raises(ez.HangError) as info:
        # Records are all published before the first collective, and the timeout starts
        # once the ranks are up: it covers five tiny batches, even on a busy machine.
        ez.launch(_uneven_run, world_size=2, timeout=3)
    ledger = Ledger.from_events(info.value.events)
    assert [len(ledger.steps(r, 0)) for r in (0, 1)] == [3, 2]
    assert [p.kind for p in ledger.check()] == ["step_mismatch"]


# ------------------------------------------- worker ids, repeats, runs of one job


def test_worker_ids_round_trip_and_default_for_older_files(tmp_path):
    """Guards the optional worker_ids field: saved and loaded as a tuple; a step line that
    does not have it (older writers) loads with the default ()."""
    tagged = StepRecord(0, 0, 0, 0, 1, 0, 1, (4, 5), "loaded", "d", worker_ids=(1, 1))
    path = Ledger([tagged], num_samples=8).save(tmp_path / "w.jsonl")
    assert Ledger.load(path).records == [tagged]
    line = json.loads(path.read_text().splitlines()[1])
    del line["worker_ids"]
    path.write_text(
        json.dumps({"ezpz_nb_ledger": 2, "kind": "header", "num_samples": 8})
        + "\n"
        + json.dumps(line)
        + "\n"
    )
    assert Ledger.load(path).records[0].worker_ids == ()
    assert rec(0, 0, [1]).worker_ids == ()


def test_rank_duplicate_names_the_workers_and_spares_tp_peers():
    """Guards the duplicated-worker check: a sample seen twice by one rank in an epoch is a
    rank_duplicate naming the workers when the records carry them; TP peers that share
    samples, and a repeat in another epoch, are not."""

    def wrec(rank, step, ids, workers, epoch=0):
        return StepRecord(
            epoch, step, rank, rank, 2, 0, 1, tuple(ids), "loaded", "d", worker_ids=tuple(workers)
        )

    bad = Ledger(
        [
            wrec(0, 0, [0, 2], [0, 0]),
            wrec(0, 1, [0, 2], [1, 1]),
            wrec(1, 0, [1, 3], [0, 0]),
            wrec(1, 1, [5, 7], [1, 1]),
        ],
        num_samples=8,
    )
    (dup,) = [p for p in bad.check() if p.kind == "rank_duplicate"]
    assert dup.ranks == (0,) and dup.samples == (0, 2)
    assert "workers [0, 1] of rank 0" in dup.message and "get_worker_info" in dup.message
    untagged = Ledger([rec(0, 0, [0]), rec(0, 1, [0]), rec(1, 0, [1]), rec(1, 1, [3])])
    (dup,) = [p for p in untagged.check() if p.kind == "rank_duplicate"]
    assert "tag_worker" in dup.message and dup.samples == (0,)
    peers = Ledger([rec(r, 0, [0, 1], tp=2, world=2) for r in (0, 1)], num_samples=2)
    assert peers.ok
    epochs = Ledger([rec(r, 0, [r], epoch=e) for r in (0, 1) for e in (0, 1)])
    assert epochs.ok, epochs.summary()


def test_merge_runs_continues_steps_and_catches_what_a_restart_repeats():
    """Guards Ledger.merge_runs: the later run's steps follow the earlier run's in each epoch
    (its loader restarted at 0), so a clean resume reads as one clean epoch and a resume
    that repeats or skips samples is a dp_duplicate / never_seen; completeness comes from
    the last run that had the rank; the world size may change."""
    first = Ledger(
        [rec(r, s, [4 * s + r]) for r in (0, 1) for s in (0, 1)], 8, {0: False, 1: False}
    )
    second = Ledger(
        [rec(r, s, [4 * s + 2 + r]) for r in (0, 1) for s in (0, 1)], 8, {0: True, 1: True}
    )
    merged = Ledger.merge_runs(first, second)
    assert merged.ok and merged.num_samples == 8 and merged.complete == {0: True, 1: True}
    assert [r.step for r in merged.steps(0, 0)] == [0, 1, 2, 3]
    assert merged.sample_ids(0, 0) == [0, 4, 2, 6]
    assert first.records[0].step == 0  # the parts are left as they were
    # A resume that starts the epoch over: rank 0 repeats, rank 1's shard is half missed.
    again = Ledger([rec(r, 0, [r]) for r in (0, 1)], 8)
    redo = Ledger.merge_runs(first, again)
    kinds = {p.kind: p for p in redo.check()}
    assert set(kinds) == {"rank_duplicate", "never_seen"}
    assert kinds["rank_duplicate"].samples == (0, 1) and kinds["never_seen"].samples == (2, 3, 6, 7)
    # Resumed on 4 ranks: steps continue after the 2 the first run took.
    wider = Ledger([rec(r, 0, [2 + r], world=4) for r in range(4)], 8)
    grown = Ledger.merge_runs(first, wider)
    assert {r.step for r in grown.records if r.rank in (2, 3)} == {2}
    assert Ledger.merge_runs() == Ledger()


def test_tag_worker_records_which_worker_made_each_sample():
    """Guards tag_worker + record: map-style and iterable datasets alike, each sample's
    worker id reaches StepRecord.worker_ids (-1 without workers); set_epoch and other
    attributes reach the wrapped dataset; non-dict samples get a clear TypeError."""
    ds = RandomTokenDataset(32, 4, num_samples=8)
    tagged = tag_worker(ds)
    assert len(tagged) == 8 and tagged.seed == ds.seed and tagged[3]["worker_id"] == -1
    loader = DataLoader(tagged, batch_size=2, num_workers=2, multiprocessing_context="fork")
    recorder = record(loader, publish=False)
    list(recorder)
    assert [r.worker_ids for r in recorder.records] == [(0, 0), (1, 1), (0, 0), (1, 1)]
    assert recorder.num_samples() == 8

    class Stream(IterableDataset):
        epoch = 0

        def set_epoch(self, epoch):
            self.epoch = epoch

        def __iter__(self):
            yield from ({"index": i} for i in range(3))

    stream = tag_worker(Stream())
    assert isinstance(stream, IterableDataset)
    stream.set_epoch(5)
    assert stream.dataset.epoch == 5
    got = list(record(DataLoader(stream, batch_size=3), publish=False))
    assert got[0]["worker_id"].tolist() == [-1, -1, -1]
    with pytest.raises(TypeError, match="dicts.*worker_id"):
        tag_worker([(1, 2)])[0]


def _workers_stream_run(by_worker):
    class Stream(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            w, nw = (info.id, info.num_workers) if by_worker else (0, 1)
            rank, world = dist.get_rank(), dist.get_world_size()
            yield from ({"index": i} for i in range(rank * nw + w, 12, world * nw))

    loader = DataLoader(
        tag_worker(Stream()), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    recorder = record(loader)
    list(recorder)
    return recorder.ledger()


def test_duplicated_worker_bug_is_caught_on_real_ranks():
    """Guards issue 15's catch: an IterableDataset sharded over the ranks only, read by 2
    DataLoader workers per rank, gives every sample twice on its rank; the ledger says so and
    names workers 0 and 1. Sharded over rank x worker, every sample is seen once."""
    naive = Ledger.from_results(
        ez.launch(_workers_stream_run, False, world_size=2, timeout=60), num_samples=12
    )
    (dup,) = [p for p in naive.check() if p.kind == "rank_duplicate"]
    assert dup.samples == tuple(range(12)) and "workers [0, 1]" in dup.message
    fixed = Ledger.from_results(
        ez.launch(_workers_stream_run, True, world_size=2, timeout=60), num_samples=12
    )
    assert fixed.ok, fixed.summary()
    assert sorted(i for r in fixed.records for i in r.sample_ids) == list(range(12))


# ------------------------------------------------ a third dimension, the loss


def cp_rec(rank, step, ids, *, dp, cp, tp, cp_size=2, tp_size=2, dp_size=2, digest=None):
    """A record of a dp x cp x tp run (CP peers share sample ids, not bytes)."""
    return StepRecord(
        0,
        step,
        rank,
        dp,
        dp_size,
        tp,
        tp_size,
        tuple(ids),
        "loaded",
        digest or f"d{ids}-cp{cp}",
        cp_rank=cp,
        cp_size=cp_size,
    )


def test_cp_peers_share_samples_not_bytes_tp_peers_share_both():
    """Guards the CP dimension in the checks: CP peers hold different slices (different
    bytes) of the same samples, which is right; TP peers with different bytes, or CP
    peers with different samples, are still a tp_mismatch; the world is dp*cp*tp."""
    good = [
        cp_rec(d * 4 + c * 2 + t, 0, [d], dp=d, cp=c, tp=t)
        for d in range(2)
        for c in range(2)
        for t in range(2)
    ]
    ledger = Ledger(good, num_samples=2)
    assert ledger.ok, ledger.summary()
    assert "dp 2 x cp 2 x tp 2" in ledger.summary()
    bad_bytes = [*good[:-1], cp_rec(7, 0, [1], dp=1, cp=1, tp=1, digest="other")]
    assert [p.kind for p in Ledger(bad_bytes, 2).check()] == ["tp_mismatch"]
    bad_ids = [*good[:-2], cp_rec(6, 0, [0], dp=1, cp=1, tp=0), cp_rec(7, 0, [0], dp=1, cp=1, tp=1)]
    assert "tp_mismatch" in {p.kind for p in Ledger(bad_ids, 2).check()}
    # A rank of the 8-rank world that took no step still counts.
    assert "step_mismatch" in {p.kind for p in Ledger(good[:-1], 2).check()}


def test_losses_round_trip_through_files_and_older_files_get_defaults(tmp_path):
    """Guards the loss lines and the new fields' defaults: a file written step by step
    with log_loss gives every step its loss back; a step line without cp_rank,
    cp_size or loss (an older writer) loads with cp 0 of 1 and no loss."""
    ds = RandomTokenDataset(10, 4, num_samples=6)
    path = tmp_path / "rank0.jsonl"
    with record(DataLoader(ds, batch_size=2), path=path, publish=False) as rec_:
        with pytest.raises(RuntimeError, match="before the first step"):
            rec_.log_loss(1.0)
        for step, _ in enumerate(rec_):
            rec_.log_loss(3.0 - step)
    loaded = Ledger.load(path)
    assert loaded.losses() == [(0, 0, 3.0), (0, 1, 2.0), (0, 2, 1.0)]
    assert loaded.records == rec_.ledger().records and loaded.complete == {0: True}
    assert '"kind": "loss"' in path.read_text()
    saved = Ledger.load(loaded.save(tmp_path / "merged.jsonl"))
    assert saved.losses() == loaded.losses()
    old = tmp_path / "old.jsonl"
    line = {
        k: v
        for k, v in loaded.records[0].__dict__.items()
        if k not in ("cp_rank", "cp_size", "loss", "times")
    }
    old.write_text(
        json.dumps({"ezpz_nb_ledger": 2, "kind": "header", "num_samples": 6})
        + "\n"
        + json.dumps({"kind": "step", **line})
        + "\n"
    )
    r = Ledger.load(old).records[0]
    assert (r.cp_rank, r.cp_size, r.loss) == (0, 1, None)


def test_layout_with_cp_pickles_its_numbers():
    lay = Layout(5, 8, 1, 2, 1, 2, object(), object(), cp_rank=0, cp_size=2)
    import pickle

    back = pickle.loads(pickle.dumps(lay))
    assert back == lay and back.dp_group is None and (back.cp_rank, back.cp_size) == (0, 2)
