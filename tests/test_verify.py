"""ezpz_nb.verify.check_contract on real gloo ranks: a wrong loader per rule, right ones pass.

The factories are in ``_verify_loaders.py`` (shared with the torchrun script).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import _verify_loaders as L
import pytest
from test_launch import _ranks_alive

from ezpz_nb.launcher import live_clusters
from ezpz_nb.verify import (
    ContractViolation,
    Grid,
    Report,
    Verdict,
    VerifyError,
    check_contract,
    parse_layout,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(autouse=True)
def _no_leaks():
    """Whatever a check did, no rank process or cluster outlives it."""
    yield
    deadline = time.monotonic() + 5
    while _ranks_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ranks_alive() == []
    assert live_clusters() == []


def _verdicts(report: Report) -> dict[str, str]:
    return report.rule_verdicts()


def test_right_loader_passes_every_rule():
    """A sharded, shuffled DataLoader passes every rule on dp 2 x tp 2, both epochs.

    Guards: a checker that flags right loaders (TP peers counted as DP duplicates,
    the set_epoch reshuffle missed) would teach people to ignore it.
    """
    report = check_contract(L.right, "dp=2,tp=2", epochs=2)
    assert not report.failed, report.table()
    verdicts = _verdicts(report)
    # Memory is shown but judged only against a bound the user passes (test_verify_memory.py).
    assert verdicts.pop("worker_memory") == "not asked"
    assert set(verdicts.values()) == {"pass"} and report.ok
    assert report.steps == {r: [4, 4] for r in range(4)}
    assert report.raise_for_violations() is report


@pytest.mark.parametrize(
    ("factory", "kind", "why"),
    [
        (L.right_padded, "dp_duplicate", "pads"),
        (L.right_dropped, "never_seen", "drops"),
    ],
)
def test_drop_last_choices_are_expected_not_violations(factory, kind, why):
    """Padding (drop_last=False) and dropping (drop_last=True) are reported with their reason.

    Guards: a report that fails every dataset whose length does not divide, or
    one that hides what the sampler repeated or dropped.
    """
    report = check_contract(factory, "dp=2", epochs=1)
    found = [f for f in report.findings if f.kind == kind]
    assert found and why in found[0].expected, report.table()
    assert not report.failed, report.table()


@pytest.mark.parametrize(
    ("factory", "layout", "rule", "kind", "first"),
    [
        (L.world_sharded, "dp=2,tp=2", "tp_identical", "tp_mismatch", (1, 0)),
        (L.seeded_by_rank, "dp=1,tp=2", "tp_identical", "tp_mismatch", (1, 0)),
        (L.unsharded, "dp=2", "dp_disjoint", "dp_duplicate", (1, 0)),
        (L.too_many_shards, "dp=2", "exactly_once", "never_seen", (None, None)),
        (L.stream_workers_repeat, "dp=2", "exactly_once", "rank_duplicate", (0, 1)),
        (L.hand_sharded, "dp=2", "equal_steps", "step_mismatch", (1, 3)),
        (L.uneven_batches, "dp=2", "global_batch", "batch_size", (1, 1)),
        (L.no_set_epoch, "dp=2", "reshuffle", "order_unchanged", (0, 0)),
        (L.cp_split_samples, "dp=1,cp=2", "tp_identical", "tp_mismatch", (1, 0)),
    ],
)
def test_each_wrong_loader_is_caught_with_its_first_offence(factory, layout, rule, kind, first):
    """Each classic mistake fails its rule and names the first rank and step.

    Guards: a rule that stopped firing (a check dropped from the rule set, an
    opt-in flag left off) or a first offence that points at the wrong rank.
    """
    # A wrapper hides the sampler: say that shuffling was asked for.
    shuffle = True if factory is L.no_set_epoch else None
    report = check_contract(factory, layout, epochs=2, shuffle=shuffle)
    assert report.failed
    assert _verdicts(report)[rule] == "fail", report.table()
    f = next(f for f in report.violations if f.kind == kind)
    assert (f.rank, f.step) == first, f
    if kind == "rank_duplicate":
        assert f.worker in (0, 1)  # the DataLoader worker that repeated it
    assert " ".join(f.message.split()) in " ".join(report.table().split())  # table: wrapped


def test_cp_peers_may_hold_different_slices_of_the_same_samples():
    """CP peers hold the same samples as different slices: a right answer, not a TP mismatch.

    Guards: a byte check that compared CP peers as if they were TP peers.
    """
    report = check_contract(L.cp_slices, "dp=2,cp=2", epochs=1)
    assert not report.failed, report.table()
    assert report.layout == {"dp": 2, "tp": 1, "cp": 2}


def test_keys_and_digests_identify_samples():
    """``__key__`` strings are named in the report; key='digest' tells tuple samples apart.

    Guards: reports that print hashed ids instead of the user's keys, and a
    digest mode that sees a whole batch as one sample.
    """
    ok = check_contract(L.keyed, "dp=2", epochs=1)
    assert not ok.failed, ok.table()
    bad = check_contract(L.keyed, "dp=1,tp=2", epochs=1)
    assert not bad.failed  # both TP peers see the same keys and bytes
    dup = check_contract(lambda lay: L.keyed(lay.__class__(0, 1, 0, 1, 0, 1)), "dp=2", epochs=1)
    f = next(f for f in dup.violations if f.kind == "dp_duplicate")
    assert f.sample is not None and f.sample.startswith("shard0/")
    digest = check_contract(L.tuples, "dp=2", epochs=2, key="digest")
    assert not digest.failed, digest.table()
    assert sum(len(r.sample_ids) for r in digest.ledger.records if r.epoch == 0) == L.N


def test_a_loader_that_hangs_is_reported_within_the_timeout():
    """A collective per batch over ranks with unequal step counts: reported as a hang.

    Guards: a check that hangs the notebook (no timeout) or raises the launcher's
    HangError instead of a report naming the rank.
    """
    t0 = time.monotonic()
    report = check_contract(L.collective_uneven, "dp=2", epochs=1, timeout=8)
    assert time.monotonic() - t0 < 60
    f = next(f for f in report.violations if f.rule == "equal_steps")
    assert (f.kind, f.rank) == ("hang", 0), report.table()
    assert "all_reduce" in f.message
    # What arrived before the hang is partial: counting rules are not judged, the hang fails.
    verdicts = {j.rule: j for j in report.judgements()}
    assert verdicts["exactly_once"].verdict is Verdict.NOT_JUDGED, report.table()
    assert "the run hung" in verdicts["exactly_once"].reason
    assert not [f for f in report.findings if f.kind in ("never_seen", "batch_size")]
    assert report.outcome is Verdict.FAIL and report.headline().startswith("FAIL")


def test_a_rank_stuck_outside_a_collective_is_not_said_to_be_in_one():
    """Rank 1 sleeps inside its loader; rank 0 finishes: the hang names rank 1 without
    claiming a collective, and rank 0's records are kept.

    Guards: "a collective inside it never completed" for a rank in time.sleep, "at least
    0 steps", and the records of the ranks that finished lost with the hang.
    """
    report = check_contract(L.sleeps_on_rank1, "dp=2", epochs=1, timeout=6)
    f = report.first("equal_steps")
    assert f is not None and (f.kind, f.rank) == ("hang", 1), report.table()
    assert "no collective on its stack" in f.message and "at least 0" not in f.message
    assert report.steps[0] == [4], report.table()


def test_a_hang_is_judged_by_the_stack_not_by_the_records_that_arrived():
    """The records a hung run left: whatever bunches the ranks published before it.

    The run the test above makes, as a loaded machine once left it: rank 0 published
    one step before it blocked, rank 1 finished but its reply (3 steps) is not in the
    HangError, so it published none. Those counts are timing, not evidence.

    Guards: a hang reported as rank 1's step mismatch (rank 1 "took 0 steps") ahead
    of rank 0's hang, depending on when the ranks happened to publish.
    """
    from ezpz_nb.ledger import StepRecord
    from ezpz_nb.verify.judge import judge
    from ezpz_nb.verify.observe import Grid, Outcome
    from ezpz_nb.verify.ranks import Ranks

    rec = StepRecord(0, 0, 0, 0, 2, 0, 1, (0, 2, 4, 6), "loaded", "d0", ())
    ranks = Ranks(
        [Outcome(rank=0, records=[rec]), Outcome(rank=1)],
        hung={0: "rank 0: all_reduce() at loader.py:9"},
    )
    report = judge(
        ranks, what="hung", grid=Grid(2), epochs=1, key="auto",
        num_samples=None, shuffle=None, wall_s=1.0,
    )  # fmt: skip
    kinds = [(f.kind, f.rank) for f in report.violations if f.rule == "equal_steps"]
    assert kinds == [("hang", 0)], report.table()


def _judge_hung(records, num_samples):
    """The judge fed ``records`` (what arrived) of a dp=2 run whose rank 0 hung."""
    from ezpz_nb.verify.judge import judge
    from ezpz_nb.verify.observe import Grid, Outcome
    from ezpz_nb.verify.ranks import Ranks

    ranks = Ranks(
        [Outcome(rank=0, records=records), Outcome(rank=1)],
        hung={0: "rank 0: all_reduce() at loader.py:9"},
    )
    return judge(
        ranks, what="hung", grid=Grid(2), epochs=1, key="auto",
        num_samples=num_samples, shuffle=None, wall_s=1.0,
    )  # fmt: skip


def test_after_a_hang_the_counting_rules_are_not_judged_on_partial_records():
    """Rank 0 published one step of an 8-sample epoch, rank 1 none, then the run hung.

    Guards: a false ``never_seen`` (samples 1, 3, 5, 7 "never seen": they were only
    never published) or a false global-batch size standing beside the hang; and the
    other way, a duplicate that did arrive hidden by the hang (evidence stays evidence).
    """
    from ezpz_nb.ledger import StepRecord

    rec = StepRecord(0, 0, 0, 0, 2, 0, 1, (0, 2, 4, 6), "loaded", "d0", ())
    report = _judge_hung([rec], num_samples=8)
    verdicts = {j.rule: j for j in report.judgements()}
    for rule in ("exactly_once", "global_batch"):
        assert verdicts[rule].verdict is Verdict.NOT_JUDGED, report.table()
        assert verdicts[rule].reason.startswith("the run hung; the records are only what arrived")
    assert verdicts["equal_steps"].verdict is Verdict.FAIL and verdicts["equal_steps"].rank == 0
    assert [f.kind for f in report.violations] == ["hang"], report.table()
    assert report.outcome is Verdict.FAIL and "never" not in report.table()

    twice = StepRecord(0, 1, 0, 0, 2, 0, 1, (0, 2, 4, 0), "loaded", "d1", ())
    dup = _judge_hung([rec, twice], num_samples=8)
    got = {j.rule: j.verdict for j in dup.judgements()}
    assert got["exactly_once"] is Verdict.FAIL, dup.table()


def test_an_endless_stream_is_reported_not_hung_on():
    """A generator that never stops: the ranks stop at 3/4 of the timeout and the report says so.

    (timeout=10: the ranks count their budget from their own start, which a loaded
    machine delays; a shorter timeout would let the launcher stop them first.)

    Guards: an endless IterableDataset that runs until the launcher kills it.
    """
    report = check_contract(L.endless, "dp=2", epochs=1, timeout=10)
    f = next(f for f in report.violations if f.kind == "timeout")
    assert "endless" in f.message and f.step is not None and f.step > 0


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (L.raises_on_rank1, ["rank 1", "make_loader raised", "FileNotFoundError", "no shard"]),
        (L.not_iterable, ["rank 0", "not iterable", "return the DataLoader"]),
        (L.structure_by_rank, ["rank 1", "another structure", "tokens"]),
        (L.no_ids, ["rank 0", "key='digest'", "'index'"]),
    ],
)
def test_bad_factories_are_clear_errors_naming_the_rank(factory, words):
    """A factory that raises, returns no iterable, changes structure by rank or gives no ids.

    Guards: a bare RankError or a traceback of the checker's own plumbing instead
    of one error that says which rank and what to do.
    """
    with pytest.raises(VerifyError) as info:
        check_contract(factory, "dp=2", epochs=1, timeout=30)
    for w in words:
        assert w in str(info.value), str(info.value)
    assert info.value.rank == int(words[0].split()[1])


def test_a_factory_that_hangs_is_an_error_naming_the_rank():
    """make_loader never returns on rank 1: an error naming rank 1, all ranks stopped.

    Guards: a hung factory reported as a loader hang, or a check that never returns.
    """
    with pytest.raises(VerifyError, match="rank 1: make_loader did not return") as info:
        check_contract(L.hangs_on_rank1, "dp=2", epochs=1, timeout=5)
    assert info.value.rank == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": "dp=two"}, "dp=2,tp=2"),
        ({"layout": "dp=2,pp=2"}, "unknown axis 'pp'"),
        ({"layout": "dp=2,dp=4"}, "dp is given twice"),
        ({"layout": "dp=2,tp=0"}, "tp=0 is not a positive int"),
        ({"layout": {"dp": 2, "cp": -1}}, "cp=-1 is not a positive int"),
        ({"layout": "dp=64,tp=2"}, "at most"),
        ({"epochs": 0}, "epochs"),
        ({"key": ""}, "key"),
        ({"timeout": -1}, "timeout"),
    ],
)
def test_bad_arguments_fail_before_any_rank_starts(kwargs, match):
    """Bad layouts, epochs, keys and timeouts are errors that say what to write.

    Guards: arguments found wrong only after ranks started (or never).
    """
    args = {"layout": "dp=2", **kwargs}
    with pytest.raises(VerifyError, match=match):
        check_contract(L.right, args.pop("layout"), **args)
    with pytest.raises(VerifyError, match="function"):
        check_contract(L.Squares(), "dp=2")
    with pytest.raises(VerifyError, match="tp=0"):  # named here, not by the launcher
        Grid(2, 0)


def test_a_report_with_a_rule_not_judged_never_reads_as_a_pass():
    """No violation but a rule without evidence: the headline, the verdict, the JSON and
    strict raising all say "not judged", with why; the report is neither ok nor failed.

    Guards: "pass" printed for a rule that never ran (the reshuffle of one epoch).
    """
    r = Report("f on dp=2", {"dp": 2, "tp": 1, "cp": 1}, 1, "index",
               not_judged={"reshuffle": "one epoch: no order to compare"})  # fmt: skip
    assert not r.ok and not r.failed and r.outcome is Verdict.NOT_JUDGED
    assert r.verdict == "not judged"
    head = "NOT ALL JUDGED: no violation in 4 rule(s); not judged: reshuffle"
    assert r.headline().endswith(head)
    # The table's first line ends with the headline (broken between words to fit a column).
    assert " ".join(r.table().split()).split(": ", 1)[1].startswith(head)
    assert "one epoch: no order to compare" in " ".join(r.table().split())
    d = json.loads(r.to_json())
    assert d["verdict"] == "not judged" and d["rules"]["reshuffle"] == "not judged"
    assert {
        "rule": "reshuffle",
        "verdict": "not judged",
        "reason": "one epoch: no order to compare",
    } in d["judgements"]
    assert Report.from_json(r.to_json()).not_judged == r.not_judged
    assert r.raise_for_violations() is r
    with pytest.raises(ContractViolation):
        r.raise_for_violations(strict=True)
    import matplotlib.pyplot as plt

    fig = r.figure()
    assert fig.axes[0].get_title().startswith("NOT ALL JUDGED: f on dp=2")
    plt.close(fig)


def test_report_round_trips_through_json_and_raises_for_violations():
    """to_json/from_json keep the verdict and findings; raise_for_violations carries the table.

    Guards: a CI log that cannot be read back, or an assertion without the table.
    """
    report = check_contract(L.unsharded, "dp=2", epochs=1)
    back = Report.from_json(report.to_json())
    assert back.findings == report.findings and back.verdict == "fail"
    assert json.loads(report.to_json())["rules"]["dp_disjoint"] == "fail"
    with pytest.raises(ContractViolation) as info:
        report.raise_for_violations()
    assert isinstance(info.value, AssertionError) and "dp_duplicate" in str(info.value)
    assert parse_layout({"dp": 2, "cp": 2}).world_size == 4


#: The cases of the torchrun job below, in the order it runs them: the one that
#: raises goes last, and the ones after a failed check still get their verdicts.
IN_PLACE = [("right", "pass"), ("world_sharded", "fail"), ("raises_on_rank1", "rank 1")]


@pytest.fixture(scope="module")
def in_place_reports(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One torchrun job (4 ranks) that checks every factory of IN_PLACE in turn."""
    from _verify_torchrun import run_job

    out = tmp_path_factory.mktemp("in_place")
    return out, run_job(4, "dp=2,tp=2", out, [f for f, _ in IN_PLACE])


@pytest.mark.system  # a torchrun job, as on a cluster: `make system`
@pytest.mark.parametrize(("factory", "verdict"), IN_PLACE)
def test_under_torchrun_it_runs_in_place(in_place_reports, factory, verdict):
    """torchrun --nproc_per_node=4: the same factories, the same verdicts, no ranks started.

    Guards: a check that only works from a notebook (starting its own ranks
    inside torchrun's, or hanging in the gather when one rank's factory raises).
    """
    folder, proc = in_place_reports
    out = folder / f"{factory}.json"
    assert out.exists(), proc.stderr[-3000:]
    text = out.read_text()
    if verdict == "rank 1":
        assert text.startswith("VerifyError: rank 1: make_loader raised"), text
    else:
        report = Report.from_json(text)
        assert report.verdict == verdict, report.table()
        per_rank = 4 if factory == "right" else 2  # 24 samples over 2 replicas, or over 4
        assert report.steps == {r: [per_rank] * 2 for r in range(4)}


def test_mesh_figure_colours_each_rank_by_its_first_broken_rule():
    """Rank 1 broke dp_disjoint, rank 3 tp_identical, the others nothing: three colours.

    Guards: a figure that colours the whole mesh for one rank's fault, or leaves a
    rule that no single rank broke (samples never seen) unsaid.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_hex
    from matplotlib.patches import Rectangle

    from ezpz_nb.verify import Finding
    from ezpz_nb.verify.figure import RULE_COLORS

    report = Report(
        "hand-made", {"dp": 2, "tp": 2, "cp": 1}, 1, "index",
        [
            Finding("dp_disjoint", "dp_duplicate", 0, "x", rank=1, step=0, ranks=[1]),
            Finding("tp_identical", "tp_mismatch", 0, "y", rank=3, step=2, ranks=[3]),
            Finding("exactly_once", "never_seen", 0, "z", sample="7"),
        ],
    )  # fmt: skip
    fig = report.figure()
    cells = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    colours = [to_hex(c.get_facecolor()) for c in cells]
    assert colours[1] == RULE_COLORS["dp_disjoint"].lower()
    assert colours[3] == RULE_COLORS["tp_identical"].lower()
    assert colours[0] == colours[2] != colours[1]
    assert "exactly_once" in fig.axes[0].get_title()


def test_one_outcome_vocabulary_not_asked_does_not_stop_a_pass():
    """The four outcomes read one way on every report: FAIL beats NOT_JUDGED beats PASS,
    and a rule the user turned off ("not asked") is shown but leaves a PASS a PASS; ``.ok``
    is True on PASS only, ``.failed`` on FAIL only, for Report, EvalReport and any
    BaseReport subclass (the workshop's results).

    Guards: ``.ok`` meaning "no violation" on one report and PASS on another, and
    ``shuffle=False`` heading a right loader's report NOT ALL JUDGED.
    """
    from ezpz_nb.verify import BaseReport, EvalReport, Judgement

    def j(v: Verdict, rule: str = "steps") -> Judgement:
        return Judgement(rule, v, f"{v} because")

    asked_off = Report("f on dp=2", {"dp": 2, "tp": 1, "cp": 1}, 2, "index",
                       not_asked={"reshuffle": "shuffle=False was passed"})  # fmt: skip
    assert asked_off.ok and asked_off.outcome is Verdict.PASS and not asked_off.failed
    assert asked_off.rule_verdicts()["reshuffle"] == "not asked"
    assert "not asked: reshuffle" in asked_off.headline()
    assert "shuffle=False was passed" in asked_off.table()
    assert asked_off.headline().startswith("PASS")
    assert asked_off.raise_for_violations(strict=True) is asked_off
    back = Report.from_json(asked_off.to_json())
    assert back.not_asked == asked_off.not_asked and back.ok
    from IPython.lib.pretty import pretty

    # IPython shows the table, not the dataclass's repr (a notebook's last expression).
    assert pretty(asked_off) == asked_off.table()

    class Result(BaseReport):  # what a workshop result does: judgements and a table
        def __init__(self, *verdicts: Verdict) -> None:
            self.rules = [j(v, f"rule{i}") for i, v in enumerate(verdicts)]

        def judgements(self) -> list[Judgement]:
            return self.rules

        def table(self) -> str:
            return self.headline()

    cases = [
        ((Verdict.PASS, Verdict.NOT_ASKED), Verdict.PASS),
        ((Verdict.PASS, Verdict.NOT_JUDGED, Verdict.NOT_ASKED), Verdict.NOT_JUDGED),
        ((Verdict.NOT_JUDGED, Verdict.FAIL), Verdict.FAIL),
    ]
    for verdicts, want in cases:
        for report in (
            Result(*verdicts),
            EvalReport("e", {"dp": 2}, "eval", Result(*verdicts).rules),
        ):
            assert report.outcome is want, (verdicts, report.headline())
            assert report.ok is (want is Verdict.PASS) and report.failed is (want is Verdict.FAIL)
            if want is Verdict.FAIL:
                with pytest.raises(ContractViolation):
                    report.raise_for_violations()
            elif want is Verdict.NOT_JUDGED:
                assert report.raise_for_violations() is report
                assert report.headline().startswith("NOT ALL JUDGED: no violation in 1 rule(s)")
                with pytest.raises(ContractViolation):
                    report.raise_for_violations(strict=True)
    assert Result(Verdict.FAIL).judgement("rule0").verdict is Verdict.FAIL
    with pytest.raises(KeyError):
        Result(Verdict.PASS).judgement("other")
