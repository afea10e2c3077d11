"""The ledger file format (ezpz_nb.ledger.codec): every version ever written still loads.

Each older version's writer is kept here as it was (the few lines that wrote it),
fed with records a real recorder made now; the reader must give back what that
writer could say, and the defaults for what it could not.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace

import pytest
from torch.utils.data import DataLoader, default_collate

from ezpz_nb.data import RandomTokenDataset
from ezpz_nb.ledger import FORMAT_VERSION, Ledger, StepRecord, codec, record, tag_worker

# StepRecord's fields when versions 1 and 2 first shipped (before worker_ids, cp, loss).
FIRST_FIELDS = (
    "epoch",
    "step",
    "rank",
    "dp_rank",
    "dp_size",
    "tp_rank",
    "tp_size",
    "sample_ids",
    "source",
    "digest",
)


def write_v1(records: list[StepRecord], num_samples: int) -> str:
    """Ledger.save before files were written step by step: a bare header, bare records."""
    lines = [json.dumps({"ezpz_nb_ledger": 1, "num_samples": num_samples})]
    lines += [
        json.dumps({k: v for k, v in asdict(r).items() if k in FIRST_FIELDS}) for r in records
    ]
    return "\n".join(lines) + "\n"


def write_v2_first(records: list[StepRecord], num_samples: int) -> str:
    """The recorder's file when version 2 shipped: header, one step line a step, end."""
    head = {"ezpz_nb_ledger": 2, "kind": "header", "num_samples": num_samples}
    lines = [json.dumps({**head, "rank": 0, "world_size": 1, "pid": os.getpid(), "run_id": None})]
    for r in records:
        lines.append(
            json.dumps(
                {"kind": "step", **{k: v for k, v in asdict(r).items() if k in FIRST_FIELDS}}
            )
        )
    lines.append(json.dumps({"kind": "end", "rank": 0, "steps": len(records)}))
    return "\n".join(lines) + "\n"


# Version 2's last step fields: the first ones, then worker ids, CP and the loss.
V2_LAST = (*FIRST_FIELDS, "worker_ids", "cp_rank", "cp_size", "loss")


def write_v2_last(records: list[StepRecord], num_samples: int) -> str:
    """Version 2 at its last: every field it knew in the step line, loss lines after."""
    lines = [json.dumps({"ezpz_nb_ledger": 2, "kind": "header", "num_samples": num_samples})]
    for r in records:
        lines.append(
            json.dumps({"kind": "step", **{k: v for k, v in asdict(r).items() if k in V2_LAST}})
        )
        if r.loss is not None:
            lines.append(
                json.dumps(
                    {
                        "kind": "loss",
                        "rank": r.rank,
                        "epoch": r.epoch,
                        "step": r.step,
                        "loss": r.loss,
                    }
                )
            )
    lines.append(json.dumps({"kind": "end", "rank": 0, "steps": len(records)}))
    return "\n".join(lines) + "\n"


# What version 3 added to version 2's last fields, before version 4's token counts.
V3_FIELDS = V2_LAST


def write_v3(records: list[StepRecord], num_samples: int) -> str:
    """Version 3: step lines without token counts, then loss and time lines."""
    lines = [json.dumps({"ezpz_nb_ledger": 3, "kind": "header", "num_samples": num_samples})]
    for r in records:
        lines.append(
            json.dumps({"kind": "step", **{k: v for k, v in asdict(r).items() if k in V3_FIELDS}})
        )
        key = {"rank": r.rank, "epoch": r.epoch, "step": r.step}
        if r.loss is not None:
            lines.append(json.dumps({"kind": "loss", **key, "loss": r.loss}))
        if r.times is not None:
            lines.append(json.dumps({"kind": "time", **key, **asdict(r.times)}))
    lines.append(json.dumps({"kind": "end", "rank": 0, "steps": len(records)}))
    return "\n".join(lines) + "\n"


# What version 4 added to version 3: token counts (before version 5's dataset_ids).
V4_FIELDS = (*V3_FIELDS, "real_tokens", "pad_tokens", "row_docs")


def write_v4(records: list[StepRecord], num_samples: int) -> str:
    """Version 4: version 3 with token counts in the step lines, no dataset_ids."""
    text = write_v3(records, num_samples).replace('"ezpz_nb_ledger": 3', '"ezpz_nb_ledger": 4')
    lines = [json.loads(line) for line in text.splitlines()]
    for d, r in zip((d for d in lines if d.get("kind") == "step"), records, strict=True):
        d.update({k: v for k, v in asdict(r).items() if k in V4_FIELDS})
    return "\n".join(json.dumps(d) for d in lines) + "\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A real recorder's records (worker ids, a loss and times on every step) and its file."""
    path = tmp_path_factory.mktemp("codec") / "rank0.jsonl"
    ds = tag_worker(RandomTokenDataset(32, 4, num_samples=6))
    # A dataset id per sample, as a mixed loader's batches carry: version 5 records them.
    loader = DataLoader(
        ds, batch_size=2, collate_fn=lambda xs: {**default_collate(xs), "dataset_id": [1, 0]}
    )
    with record(loader, path=path, publish=False) as rec:
        for step, _ in enumerate(rec):
            rec.log_loss(2.0 - step / 4)
            with rec.collective():
                pass
    return rec.ledger(), path


def test_the_version_history_names_every_version():
    """Guards the codec's contract: one entry per version up to the one it writes, and the
    package's FORMAT_VERSION is the codec's."""
    assert sorted(codec.HISTORY) == list(range(1, codec.VERSION + 1))
    assert FORMAT_VERSION == codec.VERSION


@pytest.mark.parametrize(
    ("writer", "version", "kept", "complete"),
    [
        (write_v1, 1, FIRST_FIELDS, {}),
        (write_v2_first, 2, FIRST_FIELDS, {0: True}),
        (write_v2_last, 2, V2_LAST, {0: True}),
        (write_v3, 3, V3_FIELDS, {0: True}),
        (write_v4, 4, V4_FIELDS, {0: True}),
    ],
)
def test_every_older_version_loads(recorded, tmp_path, writer, version, kept, complete):
    """Guards old files: a file of each older writer loads with what that writer wrote, the
    defaults for every field it did not know, times only from version 3, and completeness only where the
    version said it."""
    ledger, _ = recorded
    path = tmp_path / "old.jsonl"
    path.write_text(writer(ledger.records, ledger.num_samples))
    loaded = Ledger.load(path)
    defaults = StepRecord(0, 0, 0, 0, 1, 0, 1, (), "loaded", "")
    expected = [
        replace(r, **{k: getattr(defaults, k) for k in asdict(r) if k not in kept})
        for r in ledger.records
    ]
    assert codec.decode(path.read_text()).version == version
    assert loaded.records == expected and loaded.num_samples == ledger.num_samples
    assert [r.loss for r in loaded.records] == [r.loss for r in expected]
    if version < 3:
        assert all(r.times is None for r in loaded.records)
    else:
        assert [r.times for r in loaded.records] == [r.times for r in ledger.records]
    assert loaded.complete == complete
    if "worker_ids" in kept:  # the recorder saw worker ids: the old file must give them back
        assert all(r.worker_ids == (-1, -1) for r in loaded.records)
    assert all(r.dataset_ids == () for r in loaded.records)  # no older version knew them


def test_the_current_version_round_trips_times_and_losses(recorded, tmp_path):
    """Guards versions 3 to 5: the recorder's own file and Ledger.save of its ledger both give
    back every record with its loss and its times, field for field."""
    ledger, path = recorded
    assert codec.decode(path.read_text()).version == codec.VERSION
    for loaded in (Ledger.load(path), Ledger.load(ledger.save(tmp_path / "saved.jsonl"))):
        assert loaded.records == ledger.records and loaded.complete == {0: True}
        assert [r.times for r in loaded.records] == [r.times for r in ledger.records]
        assert [r.loss for r in loaded.records] == [r.loss for r in ledger.records]
    assert all(r.times is not None and r.times.entered_at is not None for r in ledger.records)
    assert all(r.dataset_ids == (1, 0) for r in ledger.records)  # version 5: recorded, kept


def test_time_lines_a_reader_cannot_use_are_skipped(recorded, tmp_path):
    """Guards readers against odd time lines: one without its durations, one for a step
    that does not exist, and keys a newer writer adds are ignored; the step still loads."""
    ledger, _ = recorded
    first = ledger.records[0]
    text = codec.encode_header(6) + codec.encode_step(first)
    text += json.dumps({"kind": "time", "rank": 0, "epoch": 0, "step": 0, "start_at": 1.0}) + "\n"
    text += (
        json.dumps(
            {"kind": "time", "rank": 0, "epoch": 0, "step": 9, "data_s": 1.0, "compute_s": 1.0}
        )
        + "\n"
    )
    got = codec.decode(text)
    assert got.records == [first] and got.records[0].times is None
    newer = codec.encode_times(first).replace('"kind": "time"', '"kind": "time", "gpu_s": 3.0')
    got = codec.decode(codec.encode_header(6) + codec.encode_step(first) + newer)
    assert got.records[0].times == first.times
