"""The ledger file format, both ends: encode on a rank, decode in the notebook.

One JSON object per line, each with a ``kind`` (see :mod:`ezpz_nb.ledger` for
what the lines mean). Every version this module ever wrote still decodes; what
each one added is in :data:`HISTORY`. To add fields to the file, add them here
(an encoder, a branch in :func:`decode`), bump :data:`VERSION` once and say
what it added in :data:`HISTORY`; the tests load a file of every older version.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ezpz_nb.ledger.records import StepRecord, StepTimes

__all__ = [
    "HISTORY",
    "VERSION",
    "Decoded",
    "decode",
    "encode_end",
    "encode_header",
    "encode_loss",
    "encode_step",
    "encode_times",
]

#: Version of the ledger file format this module writes.
VERSION = 6

#: What each version added: the decoder reads all of them.
HISTORY = {
    1: "a header without kind, then bare step records, written once at the end",
    2: "a kind on every line (header, step, loss, end), written step by step; "
    "later keys with defaults: worker_ids, cp_rank, cp_size",
    3: "time lines: data wait, compute and collective per rank and step",
    4: "token counts in step lines: real_tokens, pad_tokens, and row_docs (the documents "
    "of each packed row); -1, -1 and [] where a batch does not say",
    5: "dataset_ids in step lines: the source of each sample of a mixed batch "
    "([] where a batch does not say)",
    6: "delay_s in time lines: how long the kernel kept the rank ready to run but off a CPU "
    "outside its collective (0 where it did not say); older files read as 0",
}

# Readers skip kinds and keys they do not know, and give keys an older writer
# did not write their defaults. The version goes up when a file gains
# something an older reader would silently lose or misread.
_STEP_FIELDS = tuple(f.name for f in fields(StepRecord) if f.name != "times")
_TIME_FIELDS = tuple(f.name for f in fields(StepTimes))


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj) + "\n"


def encode_header(num_samples: int | None, **extra: Any) -> str:
    """The first line of a file: version, dataset length, and ``extra`` keys (rank, pid...)."""
    return _line({"ezpz_nb_ledger": VERSION, "kind": "header", "num_samples": num_samples, **extra})


def encode_step(rec: StepRecord) -> str:
    """A step's line, written when its batch is yielded (loss and times follow later)."""
    d = asdict(rec)
    del d["times"]  # known only after the step: a line of its own
    return _line({"kind": "step", **d})


def encode_loss(rec: StepRecord) -> str:
    """The loss line of ``rec``'s step (the step's line was written before the loss existed)."""
    return _line(
        {"kind": "loss", "rank": rec.rank, "epoch": rec.epoch, "step": rec.step, "loss": rec.loss}
    )


def encode_times(rec: StepRecord) -> str:
    """The time line of ``rec``'s step, written when the loop came back for the next batch."""
    if rec.times is None:
        raise ValueError(f"step {rec.step} of rank {rec.rank} has no times to encode")
    # vars(), not asdict(): asdict deep-copies, ~10x slower, on a per-step path.
    return _line(
        {"kind": "time", "rank": rec.rank, "epoch": rec.epoch, "step": rec.step, **vars(rec.times)}
    )


def encode_end(rank: int, steps: int) -> str:
    """The last line of a rank that finished: how many steps it took."""
    return _line({"kind": "end", "rank": rank, "steps": steps})


@dataclass(frozen=True)
class Decoded:
    """What one file held.

    Attributes:
        version: The file's format version.
        records: Its step records, with the losses and times of later lines.
        num_samples: Dataset length from the header, if any.
        complete: ``{rank: wrote an end line}``; empty for version 1 files,
            which say nothing about how a run ended.
    """

    version: int
    records: list[StepRecord]
    num_samples: int | None
    complete: dict[int, bool]


def _step_from(d: dict[str, Any]) -> StepRecord:
    known = {k: d[k] for k in _STEP_FIELDS if k in d}
    for k in ("sample_ids", "worker_ids", "dataset_ids"):
        if k in known:
            known[k] = tuple(known[k])
    if "row_docs" in known:
        known["row_docs"] = tuple(tuple(row) for row in known["row_docs"])
    return StepRecord(**known)


def _times_from(d: dict[str, Any]) -> StepTimes | None:
    try:
        return StepTimes(**{k: d[k] for k in _TIME_FIELDS if k in d})
    except TypeError:  # a required key missing: a line this reader cannot use
        return None


def decode(text: str, *, name: str = "<ledger>") -> Decoded:
    """Decode one file's text, of any version up to :data:`VERSION`.

    A torn last line (the write in progress when the process was killed) is
    dropped.

    Args:
        text: The file's content.
        name: The file's name, for messages.

    Raises:
        ValueError: A line other than the last is not JSON, or the file is of
            a newer version than this reader knows.
    """
    lines = text.splitlines()
    objs: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break  # the write in progress when the process died
            raise ValueError(f"{name}, line {i + 1}: not a ledger line: {line[:80]!r}") from None
    head = objs[0] if objs and "ezpz_nb_ledger" in objs[0] else {}
    version = head.get("ezpz_nb_ledger", 1)
    if version > VERSION:
        raise ValueError(
            f"{name} is a version {version} ledger; this ezpz_nb reads up to "
            f"version {VERSION}: upgrade ezpz_nb to read it"
        )
    recs: list[StepRecord] = []
    ended: set[int] = set()
    later: dict[tuple[int, int, int], dict[str, Any]] = {}  # (rank, epoch, step) -> fields
    for d in objs:
        # Version 1 lines have no kind: the header has the version key, the rest are steps.
        kind = d.get("kind", "header" if "ezpz_nb_ledger" in d else "step")
        if kind == "step":
            recs.append(_step_from(d))
        elif kind == "end":
            ended.add(d["rank"])
        elif kind in ("loss", "time") and {"rank", "epoch", "step"} <= d.keys():
            key = (d["rank"], d["epoch"], d["step"])
            if kind == "loss" and "loss" in d:
                later.setdefault(key, {})["loss"] = d["loss"]
            elif kind == "time" and (times := _times_from(d)) is not None:
                later.setdefault(key, {})["times"] = times
    if later:
        recs = [replace(r, **later.get((r.rank, r.epoch, r.step), {})) for r in recs]
    complete: dict[int, bool] = {}
    if version >= 2:
        ranks = {r.rank for r in recs} | ended
        if "rank" in head:
            ranks.add(head["rank"])
        complete = {r: r in ended for r in ranks}
    return Decoded(version, recs, head.get("num_samples"), complete)
