"""Check any loader's distributed contract on real ranks.

:func:`check_contract` runs a loader factory on a ``dp x tp`` (``x cp``) layout of
real gloo ranks (or in place under torchrun) and says, rule by rule, whether TP
peers got identical bytes, DP replicas disjoint samples, every sample came
exactly once an epoch, every rank took as many steps (at least one), the global
batch kept its size and the order changed between epochs; each rule passes only
on evidence, else it fails or is not judged (a :class:`Verdict`, with why); :func:`check_resume` says whether a
run stopped and resumed saw what a straight run sees. Both return a
:class:`Report` (a table, JSON, a mesh figure)::

    from ezpz_nb.verify import check_contract

    def make_loader(layout):
        sampler = DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank)
        return DataLoader(ds, batch_size=4, sampler=sampler)

    report = check_contract(make_loader, "dp=2,tp=2", epochs=2)
    print(report.table())
    report.raise_for_violations()   # in a test

:func:`check_eval` judges an evaluation loader, where a repeated or dropped sample
is a violation (weights summed: padding at weight 0 passes); :func:`check_steps`
judges an endless loader over ``steps`` batches. Their rules answer pass, fail or
not judged (with why), in an :class:`EvalReport`. :func:`check_mixture` and
:func:`check_layout_invariance` answer one rule each. Every judge answers each rule
with a :class:`Judgement` (:class:`Verdict` PASS, FAIL, NOT_JUDGED or NOT_ASKED, and
why); every report is a :class:`BaseReport`: FAIL when a rule failed, NOT ALL JUDGED
when none failed but some could not be judged (``raise_for_violations(strict=True)``
raises then too), PASS otherwise. A rule the user turned off (``shuffle=False``) is
"not asked" and does not stop a PASS. ``.ok`` is True on PASS only; ``.failed`` on FAIL.
"""

from __future__ import annotations

from ezpz_nb.verify.contract import check_contract, parse_layout
from ezpz_nb.verify.dcp import VIAS
from ezpz_nb.verify.evaluation import check_eval
from ezpz_nb.verify.mixture import (
    check_layout_invariance,
    check_mixture,
    global_batches,
    ledger_stream,
)
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.outcomes import EvalReport
from ezpz_nb.verify.report import RULES, ContractViolation, Finding, Report, VerifyError
from ezpz_nb.verify.resume import SCENARIOS, check_resume
from ezpz_nb.verify.stepped import check_steps
from ezpz_nb.verify.verdict import PROMISES, BaseReport, Judgement, Verdict

__all__ = [
    "PROMISES",
    "RULES",
    "SCENARIOS",
    "VIAS",
    "BaseReport",
    "ContractViolation",
    "EvalReport",
    "Finding",
    "Grid",
    "Judgement",
    "Report",
    "Verdict",
    "VerifyError",
    "check_contract",
    "check_eval",
    "check_layout_invariance",
    "check_mixture",
    "check_resume",
    "check_steps",
    "global_batches",
    "ledger_stream",
    "parse_layout",
]
