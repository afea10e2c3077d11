"""check_contract's ``worker_memory`` rule on real gloo ranks and forked DataLoader workers.

Each rank's and worker's private memory is sampled while the check iterates; the
rule is judged only against a bound the user passes (``max_worker_growth_mib``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ezpz_nb.verify import Report, Verdict, VerifyError, check_contract

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="forked workers, /proc memory: Linux"
    ),
]


class Tensors(Dataset):
    """Samples made on demand as tensors: a worker reads nothing of the rank's objects."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.arange(4) * i, "index": i}


class Dicts(Dataset):
    """``n`` samples held as Python dicts of ``width`` ints (ints above 256 are objects).

    Copying each sample's list makes a new reference to every int, so a forked worker
    writes the reference count on the page of each int it reads: the kernel copies
    those pages into the worker (copy-on-access, pytorch #13246).
    """

    def __init__(self, n: int, width: int) -> None:
        self.rows = [{"index": i, "tokens": [1000 + i * width + j for j in range(width)]}
                     for i in range(n)]  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.rows[i]
        return {"index": row["index"], "tokens": torch.tensor(list(row["tokens"]))}


def _loader(layout: Any, ds: Dataset, workers: int, batch: int) -> DataLoader:
    sampler = DistributedSampler(ds, layout.dp_size, layout.dp_rank, shuffle=True, seed=3)
    fork = {"multiprocessing_context": "fork"} if workers else {}
    return DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, **fork)


def tensors_in_workers(layout: Any) -> DataLoader:
    """A right loader with 2 forked workers per rank whose memory has nothing to grow on."""
    return _loader(layout, Tensors(), workers=2, batch=3)


def tensors_in_rank(layout: Any) -> DataLoader:
    """The same without workers: only the rank itself can be read."""
    return _loader(layout, Tensors(), workers=0, batch=3)


def dicts_in_workers(layout: Any) -> DataLoader:
    """4000 samples x 128 ints (about 21 MiB of Python objects) read by 2 forked workers.

    Each worker reads a quarter of the samples, shuffled over the whole list, so it
    touches a large share of the dataset's pages: several MiB, above the 1 MiB bound.
    """
    return _loader(layout, Dicts(4000, 128), workers=2, batch=50)


def _rows(report: Report) -> set[tuple[int, int]]:
    return {(r["rank"], r["worker"]) for r in report.memory or []}


def test_without_a_bound_memory_is_shown_not_asked_and_a_pass_stays_a_pass(two):
    """Peak and growth of each rank and worker appear in the table; the rule is "not
    asked" and the clean loader's report is a PASS.

    Guards: memory figures that turn a right loader's PASS into anything else, or a
    report that claims to have judged memory nobody asked about.
    """
    report = check_contract(tensors_in_workers, "dp=2", epochs=2, cluster=two)
    assert report.outcome is Verdict.PASS and report.ok, report.table()
    j = report.judgement("worker_memory")
    assert j.verdict is Verdict.NOT_ASKED and "max_worker_growth_mib" in j.reason
    assert _rows(report) == {(r, w) for r in (0, 1) for w in (-1, 0, 1)}, report.memory
    text = " ".join(report.table().split())
    assert (
        "rank 1 worker 1, epoch 0: private memory peak" in text
        and "rank 0, from epoch 0" in text
        and "not asked" in text
    )
    back = Report.from_json(report.to_json())
    assert back.memory == report.memory and back.outcome is Verdict.PASS


def test_growth_above_the_bound_fails_at_the_worker_and_without_one_is_only_shown(two):
    """A list of dicts in forked workers grows by MiBs: above a 1 MiB bound it is a
    violation naming the rank, worker and growth; the same loader without a bound
    passes, its growth shown.

    Guards: growth that never reaches a verdict, a failure that does not say which
    worker grew, and an unasked memory rule that fails a loader the contract passes.
    """
    report = check_contract(
        dicts_in_workers, "dp=2", epochs=1, shuffle=False, cluster=two,
        max_worker_growth_mib=1, memory_budget=1.0,
    )  # fmt: skip
    assert report.outcome is Verdict.FAIL, report.table()
    bad = report.first("worker_memory")
    assert bad is not None and bad.violation and bad.kind == "worker_growth"
    assert bad.rank in (0, 1) and bad.worker in (0, 1), bad
    assert f"rank {bad.rank} worker {bad.worker}'s private memory grew by" in bad.message
    grown = max(r["growth_mib"] for r in report.memory or [] if r["worker"] >= 0)
    assert grown > 2, report.table()  # clearly above the bound, not at its edge
    # Every other rule still passes: only memory broke.
    assert {r for r, v in report.rule_verdicts().items() if v == "fail"} == {"worker_memory"}

    # One epoch (the order is not judged: shuffle=False) keeps the test quick.
    unasked = check_contract(
        dicts_in_workers, "dp=2", epochs=1, shuffle=False, cluster=two, memory_budget=1.0
    )
    assert unasked.ok, unasked.table()
    assert unasked.rule_verdicts()["worker_memory"] == "not asked"
    assert "largest worker growth +" in unasked.judgement("worker_memory").reason


def test_growth_within_the_bound_passes(two):
    """Workers reading tensors made on demand grow far less than 64 MiB: the rule passes.

    Guards: a bound that fails every loader with workers.
    """
    report = check_contract(
        tensors_in_workers, "dp=2", epochs=2, cluster=two, max_worker_growth_mib=64,
        memory_budget=1.0,
    )  # fmt: skip
    assert report.ok, report.table()
    assert report.rule_verdicts()["worker_memory"] == "pass"
    assert all(r["samples"] >= 2 for r in report.memory or [] if r["worker"] >= 0)


def test_no_workers_is_not_judged_with_a_bound_and_not_asked_without(two):
    """With num_workers=0 there is no worker to judge: "not judged" (with why) when a bound
    was passed, else "not asked"; the rank's own figures are shown either way.

    Guards: a PASS for a bound that nothing was measured against.
    """
    bounded = check_contract(
        tensors_in_rank, "dp=2", epochs=2, cluster=two, max_worker_growth_mib=1,
        memory_budget=1.0,
    )  # fmt: skip
    assert bounded.outcome is Verdict.NOT_JUDGED and not bounded.failed, bounded.table()
    assert "num_workers=0" in bounded.judgement("worker_memory").reason
    assert _rows(bounded) == {(0, -1), (1, -1)}
    plain = check_contract(tensors_in_rank, "dp=2", epochs=2, cluster=two)
    assert plain.ok and plain.rule_verdicts()["worker_memory"] == "not asked", plain.table()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_worker_growth_mib": -1}, "max_worker_growth_mib"),
        ({"max_worker_growth_mib": True}, "max_worker_growth_mib"),
        ({"memory_budget": 0}, "memory_budget"),
        ({"memory_budget": 2.0}, "memory_budget"),
    ],
)
def test_bad_memory_arguments_fail_before_any_rank_starts(kwargs, match):
    """Guards: a bound or budget found wrong only after ranks started."""
    with pytest.raises(VerifyError, match=match):
        check_contract(tensors_in_workers, "dp=2", **kwargs)


def test_a_report_without_memory_covers_no_memory_rule():
    """A report made without sampling (a resume check, an old JSON) has no such rule.

    Guards: a memory rule "not judged" on every report that never sampled memory.
    """
    r = Report("f on dp=2", {"dp": 2, "tp": 1, "cp": 1}, 2, "index")
    assert "worker_memory" not in r.rule_verdicts() and r.ok
    old = json.loads(r.to_json())
    old.pop("memory")
    assert Report.from_json(json.dumps(old)).memory is None
