"""The sample ledger: which rank held which samples at which step.

Wrap a loader with :func:`record` on every rank; each step appends one
:class:`StepRecord` (and publishes it live to the notebook when run by
``ezpz_nb.launcher``). Gather the records into a :class:`Ledger` and ask it what
went wrong, in plain words::

    def train(layout_tp):
        layout = make_layout(layout_tp)
        loader = get_random_dataset_fsdp_tp(4, 64, 16, dp_group=layout.dp_group,
                                            tp_group=layout.tp_group)["dataloader"]
        rec = record(loader, layout)
        for batch in rec:
            ...
        return rec.ledger()

    ledger = Ledger.from_results(ez.launch(train, 2, world_size=4))
    print(ledger.summary())

Ledger files (``record(..., path=...)``, :meth:`Ledger.save`, :meth:`Ledger.load`)
are JSON lines, format version 5 (:mod:`ezpz_nb.ledger.codec` writes and
reads them), one object per line with a ``kind``:

* ``header`` (first line): ``{"ezpz_nb_ledger": 5, "kind": "header",
  "num_samples": 64, "rank": 3, "world_size": 4, "pid": 1234, "run_id": "..."}``
  (a file of one rank; :meth:`Ledger.save` of a merged ledger leaves out the
  per-process keys). ``run_id`` is torchrun's ``TORCHELASTIC_RUN_ID`` when there
  is one: it tells the files of two runs of one job apart.
* ``step``: the fields of one :class:`StepRecord`. A recording rank appends
  and flushes one per step, so a rank that is killed leaves every step it took.
  Version 4 added its token counts, ``real_tokens`` and ``pad_tokens``, and
  for packed rows ``row_docs``, the documents of each row (-1, -1 and ``[]``
  where the batch does not say; see :func:`~ezpz_nb.ledger.records.batch_tokens`).
  Version 5 added ``dataset_ids``, the source of each sample of a mixed batch
  (its ``dataset_id`` values; ``[]`` where the batch does not say).
* ``loss`` (optional): ``{"kind": "loss", "rank": 3, "epoch": 0, "step": 5,
  "loss": 2.31}``, the loss of that step, written after its step line by
  :meth:`RecordingLoader.log_loss` (a step's line is written before its loss exists).
* ``time`` (version 3): ``{"kind": "time", "rank": 3, "epoch": 0, "step": 5,
  "data_s": 0.004, "compute_s": 0.011, "collective_s": 0.002, "other_s": 0.0,
  "start_at": 1.7e9, "entered_at": 1.7e9, "delay_s": 0.0}``, how the step's time was
  spent (:class:`StepTimes`), written when the loop comes back for the next batch.
  Version 6 added ``delay_s``, the time the kernel kept the rank ready to run but off
  a CPU (a busy machine's stretch, left out when the diagnosis compares ranks).
* ``end``: ``{"kind": "end", "rank": 3, "steps": 32}``, written when the rank
  finished; a file without one was cut short (``Ledger.complete``).

Readers skip kinds they do not know and keys they do not know, and give keys
an older writer did not write their defaults; every older version still loads
(``codec.HISTORY`` says what each added). A key a file lacks takes its field's
default: ``worker_ids`` (the DataLoader worker of each sample, see
:func:`tag_worker`) was added this way.

:meth:`Ledger.timings` turns the times into each rank's wait for the slowest
one, and :meth:`Ledger.diagnose` names the straggler in words.

:meth:`Ledger.merge_runs` joins the ledgers of one job stopped and resumed
(notebook 09); the ``rank_duplicate`` check finds a rank that saw a sample
twice, as when every DataLoader worker yields the same stream (notebook 10).
"""

from __future__ import annotations

from ezpz_nb.ledger.book import Ledger
from ezpz_nb.ledger.checks import Allowance, Problem, check_records
from ezpz_nb.ledger.codec import VERSION as FORMAT_VERSION
from ezpz_nb.ledger.recording import RecordingLoader, record, tag_worker
from ezpz_nb.ledger.records import StepRecord, StepTimes, batch_digest
from ezpz_nb.ledger.timing import Diagnosis, StepTiming

__all__ = [
    "FORMAT_VERSION",
    "Allowance",
    "Diagnosis",
    "Ledger",
    "Problem",
    "RecordingLoader",
    "StepRecord",
    "StepTimes",
    "StepTiming",
    "batch_digest",
    "check_records",
    "record",
    "tag_worker",
]
