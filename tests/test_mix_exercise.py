"""Notebook 17's checker (ezpz_nb.workshop.mixture): dodges rejected, right answers accepted.

Every answer runs on 4 real ranks (one warm Cluster), inside real DataLoader workers. The
corpus below is the checker's specification: 0 false passes, 0 false failures.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import types

import numpy as np
import pytest
from _mix_answers import (
    DRAWS_BEFORE_SOURCE,
    HardCodedBatch,
    SameSeedInEveryWorker,
    _fresh,
    _reordered,
    big_sources_rotated,
    cached_epoch,
    drawn_with_replacement,
    exact_then_estimated,
    global_batch_of_twelve,
    grouped_by_source,
    largest_source_hashed_to_50,
    library_answer,
    low_16_bits,
    neighbours_swapped_every_other_pass,
    not_done,
    notebook_solution,
    numpy_array_answer,
    one_bit_of_the_seed,
    one_order_shifted,
    pass_off_by_one,
    per_rank_sampling,
    permuted_every_other_pass,
    quotas_in_order,
    replays_24_batches,
    replays_80_batches,
    replays_16384_batches,
    replays_from,
    returns_an_iterator,
    reversed_every_other_pass,
    riffled_every_other_pass,
    right_for_eight_steps,
    rotated_by_the_seed,
    round_robin,
    same_order_every_pass,
    same_rounding_every_batch,
    same_seed_every_step,
    seed_for_source_zero_only,
    seed_hashed_to,
    seed_ignored,
    seed_mod_1000,
    seed_plus_pass,
    slot_size_for_four,
    slots_for_powers_of_two,
    starts_with_the_last_sample,
    stops_at_128,
    three_sources_assumed,
    torch_randperm_per_pass,
    totals_under_the_batch_alone,
    two_orders_alternating,
    yields_pairs,
)

import ezpz_nb as ez
from ezpz_nb.data.mixture import Mixture
from ezpz_nb.launcher.startup import pack_job
from ezpz_nb.verify.mixture import check_mixture
from ezpz_nb.workshop.mix_confine import not_confined
from ezpz_nb.workshop.mix_fresh import FreshStream, hash_seed
from ezpz_nb.workshop.mix_maps import log_same_map, map_repeated, seam_tail, seams_repeated
from ezpz_nb.workshop.mix_seeds import (
    FEW_MOST,
    MANY,
    _few_below,
    _log_match,
    few_streams,
    passes_shared,
    seed_blind,
)
from ezpz_nb.workshop.mix_streams import (
    COVER,
    GLOBALS,
    RUN,
    SEEDS,
    SOURCES,
    STEPS,
    THIRDS,
    TWIN_APART,
    _drift,
    draw_setup,
    far_steps,
    quotas,
)
from ezpz_nb.workshop.mix_window import REACH, WINDOW, WINDOWS, far_rules
from ezpz_nb.workshop.mixture import check_mix_batch

#: Checks per answer: each draws its own sizes, weights and seed. One in `make unit`, as in
#: every checker's file (each run draws afresh), 20 in `make stress`.
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(4, timeout=60) as c:
        yield c


@pytest.mark.parametrize(
    "fn",
    [
        library_answer,
        notebook_solution,
        numpy_array_answer,
        grouped_by_source,
        torch_randperm_per_pass,
        cached_epoch,
    ],
    ids=["library", "notebook", "numpy", "grouped", "torch_randperm", "lru_cache_epoch"],
)
def test_right_answers_pass(cluster, fn):
    """Guards against false failures: the library's stratified plan, the notebook's own
    solution, the solution as a numpy array, the sources' blocks side by side as a tuple
    of tuples, a torch.randperm per source and pass, and the stream cached by an lru_cache
    helper of the notebook's ``__main__`` (issue 45's third trial: it could not reach the
    ranks) all pass, with both of each check's cases and every seed."""
    for _ in range(DRAWS):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "correct", got.message


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (per_rank_sampling, "must not depend on the layout"),
        (round_robin, "against a target"),
        (SameSeedInEveryWorker(), "must not depend on the layout"),
        (same_seed_every_step, "again"),
        (same_rounding_every_batch, "drifts"),
        (right_for_eight_steps, "drifts"),
        (returns_an_iterator, "cannot leave a DataLoader worker"),
        (seed_ignored, "the seed changes nothing"),
        # No shuffle at all: every pass of a source is the same order (issue 45's third trial).
        (
            quotas_in_order,
            ("the seed changes nothing", "a new order for each pass", "arithmetic order"),
        ),
        (three_sources_assumed, "ValueError"),
    ],
)
def test_dodges_are_rejected_by_the_rule_they_break(cluster, fn, says):
    """Guards against false passes: per-rank sampling (layout), a weight-blind round-robin
    (shares), one generator copied into every worker (layout), picks from the seed alone
    (repeats), a seed that changes nothing, ignored or with no randomness at all (issue 45:
    the seed rule), and three sources assumed (issue 45: the second case has another number
    of sources, so the unpacking fails on every draw) are each turned down, by the rule each
    one breaks."""
    _rejected(cluster, fn, says, DRAWS)


def _rejected(cluster, fn, says: str | tuple[str, ...], draws: int) -> None:
    """``fn`` judged wrong ``draws`` times, its message holding ``says`` (or one of them)."""
    said = [says] if isinstance(says, str) else says
    for _ in range(draws):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong" and any(x in got.message for x in said), got.message


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (rotated_by_the_seed, "a new order for each pass"),
        (same_order_every_pass, "a new order for each pass"),
        (two_orders_alternating, "a new order for each pass"),
        # Rotated by 7 a pass: arithmetic, and some source shows few orders on some draws.
        (big_sources_rotated, ("arithmetic order", "a new order for each pass")),
        (one_order_shifted, "a new order for each pass"),
        (one_bit_of_the_seed, "the seed changes nothing"),
        (replays_80_batches, "replays a table"),
        (reversed_every_other_pass, "neighbouring pairs"),
        (neighbours_swapped_every_other_pass, "neighbouring pairs"),
    ],
    ids=[
        "rotated", "same_order", "two_orders", "big_rotated", "shifted", "one_bit", "replay_80",
        "reversed_every_other", "swapped_every_other",
    ],
)  # fmt: skip
def test_the_third_trials_dodges_are_rejected(cluster, fn, says):
    """Guards issue 45's third trial: passes in the same order again (one order, a rotation
    by the seed, two alternating), passes in an arithmetic order, a seed that picks one of
    two streams and a table longer than the horizon replayed are each turned down, by the
    rule each one breaks (offline, 500 draws each: the checker module's docstring); and the
    eleventh's: every other pass the last one reversed, or its neighbours swapped.
    Half the file's draws: every one of these rules holds on every draw."""
    _rejected(cluster, fn, says, max(1, DRAWS // 2))


#: What each rule of mix_maps says: one map from pass to pass, or seams that repeat.
_SAME_MAP, _SEAM = "by one and the same reordering", "started with the sample that ended"


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (riffled_every_other_pass, _SAME_MAP),
        # A sigma that sends the last place first also repeats every other seam.
        (permuted_every_other_pass, (_SAME_MAP, _SEAM)),
        # Its maps all send the last place first: (n - 1)! of them, so a small source's
        # repeat more often than fresh ones on some draws (offline: 1 in 40).
        (starts_with_the_last_sample, (_SEAM, _SAME_MAP)),
    ],
    ids=["riffled", "sigma", "last_first"],
)
def test_the_twelfth_trials_dodges_are_rejected(cluster, fn, says):
    """Guards issue 45's twelfth trial: every other pass made from the pass before by a
    fixed map (riffled, or permuted by one sigma: no neighbouring pair kept), and each pass
    started with the sample that ended the pass before, passed. Two draws each, here too:
    offline each is turned down on 400 draws of 400."""
    _rejected(cluster, fn, says, max(2, DRAWS // 2))


def _in_process(fn, seed):
    """``fn``'s dp=1 streams of both cases of ``seed``'s draw, in process, with their sizes."""
    setup = draw_setup(seed)
    return [
        ([fn(*case, b, 0, 1, setup.seeds[0]) for b in range(setup.steps)], case.sizes)
        for case in (setup.main, setup.other)
    ]


@pytest.mark.parametrize("seed", [41, 42])
def test_the_pass_to_pass_rules_keep_right_answers_and_turn_the_dodges_down(seed):
    """Guards mix_maps' two rules on their own, in process (no ranks): the right answers
    (numpy, random.Random and torch per pass) keep both on both cases of a draw; each
    twelfth-trial dodge breaks its rule; and fresh passes of sources as small as the draw
    holds (4 samples in 200 passes, 9 in 30) never break either (200 runs each)."""
    for fn in (notebook_solution, library_answer, cached_epoch, torch_randperm_per_pass):
        for stream, sizes in _in_process(fn, seed):
            assert map_repeated(stream, sizes) == seams_repeated(stream, sizes) == "", fn
    for fn, rule in (
        (riffled_every_other_pass, map_repeated),
        (permuted_every_other_pass, map_repeated),
        (starts_with_the_last_sample, seams_repeated),
    ):
        assert any(rule(*run) for run in _in_process(fn, seed)), fn
    rng = np.random.default_rng(seed)
    for n, passes in ((4, 200), (9, 30)):
        for _ in range(200):
            stream = [[(0, int(i))] for _ in range(passes) for i in rng.permutation(n)]
            assert map_repeated(stream, (n,)) == seams_repeated(stream, (n,)) == ""


def test_the_pass_to_pass_bounds():
    """Guards the two rules' bounds: 6 passes of 4 samples (5 maps, 5 seams) judge neither
    rule however they repeat, 3 maps of 5 being one map is judged from 7 samples on; 9 of 17
    maps being one is judged at 4 samples; and the seams' tail is the Poisson binomial's."""
    assert log_same_map(5, 3, 4) > math.log(1e-6) and seam_tail([1 / 4] * 5, 5) > 1e-6
    assert log_same_map(5, 3, 6) > math.log(1e-6) > log_same_map(5, 3, 7)
    assert log_same_map(17, 9, 4) < math.log(1e-6) and log_same_map(5, 1, 4) == 0.0
    assert seam_tail([0.5, 0.25], 1) == pytest.approx(1 - 0.5 * 0.75)
    assert seam_tail([0.5, 0.25], 2) == pytest.approx(0.125) and seam_tail([0.1], 0) == 1.0
    # 18 passes of 4 that start with the last one's last sample at every seam: judged.
    assert seam_tail([1 / 4] * 17, 17) < 1e-6


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        # Whole batches match instead where source 0 holds a whole pass in every batch
        # (offline: 2 draws in 300), so the words both messages share.
        (seed_for_source_zero_only, "the seed changes nothing there"),
        (seed_mod_1000, "the seed changes nothing"),
        (low_16_bits, "the seed changes nothing"),
        (drawn_with_replacement, "Draw without replacement: one permutation per pass"),
        (pass_off_by_one, "Draw without replacement: one permutation per pass"),
    ],
    ids=["seed_source_0", "seed_mod_1000", "low_16_bits", "with_replacement", "pass_off_by_one"],
)
def test_the_fourth_trials_answers_are_rejected(cluster, fn, says):
    """Guards issue 45's fourth trial: a seed that reaches one source only (each source is
    compared between seeds), a seed cut to ``% 1000`` or its low 16 bits (the seeds include
    twins that share those), and a repeat within a pass (with replacement, a pass index off
    by one: the message says to draw without replacement) are each turned down, by the
    rule each one breaks. Half the file's draws: each holds on every draw (offline, 300)."""
    _rejected(cluster, fn, says, max(1, DRAWS // 2))


def test_seeds_a_little_apart_must_not_shift_the_same_orders(cluster):
    """Guards issue 45's fifth trial: ``seed + source + pass`` as each pass's seed passed (the
    streams of seeds ``x`` and ``x + 1`` differ position by position, one pass apart); and
    the rule never fires on a right answer (in process, 40 draws, three right answers)."""
    _rejected(cluster, seed_plus_pass, "Seeds a little apart shift", max(1, DRAWS // 2))
    for seed in range(40):
        for fn in (notebook_solution, torch_randperm_per_pass, library_answer):
            main, streams = _streams(fn, seed)
            assert passes_shared(streams, main.sizes) == "", (seed, fn)


def _streams(fn, seed):
    """``fn``'s dp=1 streams of ``seed``'s draw over its horizon, in process, by seed."""
    setup = draw_setup(seed)
    main = setup.main
    args = (main.sizes, main.weights, main.global_batch)
    return main, {x: [fn(*args, b, 0, 1, x) for b in range(setup.steps)] for x in setup.seeds}


@pytest.mark.parametrize("seed", [3, 4])
def test_the_seed_rule_compares_each_source(seed):
    """Guards the seed rule on its own, in process (no ranks): the library's plan passes;
    the same plan with one source's orders fixed whatever the seed is named, that source
    and the words; and a source that gets a whole pass in every batch says nothing (its
    batches match whatever the seed, so judging it would fail right answers)."""
    main, right = _streams(library_answer, seed)
    assert seed_blind(right, main.sizes) == ""
    fixed = _reordered(lambda x, s, p, n: _fresh(x if s else 0, s, p, n))
    _, blind = _streams(fixed, seed)
    said = seed_blind(blind, main.sizes)
    assert "gave source 0 (" in said and "changes nothing there for that source" in said, said
    assert _log_match([4] * 10, 0, 4) == 0.0
    assert _log_match([1] * 12, 0, 4) == pytest.approx(-3 * math.log(24))


def test_a_replayed_table_of_batches_is_rejected(cluster):
    """Guards issue 45's fitted horizon: a table of 24 global batches replayed passed while
    no check ran more than 24. Every check now runs 32 to 64, and the restart breaks the
    cumulative bound or hands out samples again (offline: 500 of 500 draws, at 24 and 31)."""
    for _ in range(DRAWS):
        got = check_mix_batch(replays_24_batches, cluster=cluster)
        assert got.status == "wrong", got.message
        assert "drifts" in got.message or "again" in got.message, got.message


@pytest.mark.parametrize("fn", [slot_size_for_four, global_batch_of_twelve])
def test_fixed_sizes_are_rejected(cluster, fn):
    """Guards H11's dodges of a fixed layout: a slot size fitted to dp 4 and a global batch
    fitted to 12 are turned down on every draw (the drawn DP size or batch differs). Half
    the file's draws: each fails by construction, whatever the draw."""
    for _ in range(max(1, DRAWS // 2)):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong", got.message


@pytest.mark.parametrize("fn", [HardCodedBatch(g) for g in GLOBALS], ids=repr)
def test_a_hard_coded_global_batch_is_rejected_on_every_draw(cluster, fn):
    """Guards the outside trial's leftover: an answer assuming one of the drawn global
    batches (8, 12, 16, 20, 24) passed on the draws of its own size. Each check now also runs a
    second, different batch, so it fails on every draw, and says which batch it was given.
    Half the file's draws: the second case differs by construction (the next test)."""
    for _ in range(max(1, DRAWS // 2)):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong" and "use the argument" in got.message, got.message


def test_every_draw_has_two_different_cases_and_seeds():
    """Guards why a hard-coded batch or number of sources fails on every draw, and why the
    seed and pass rules can judge: each check's two cases differ in global batch and in
    number of sources, all from the checker's ranges (the first batch also divisible by every
    DP size checked), its seeds all differ, its far steps start past the horizon and reach
    COVER (then its windows, apart, within REACH), its 128 more seeds are new and their window judges the
    whole batches and the largest source (issue 45's fifth brief: the few-streams rule), and
    each case has a small source drawn in 6 passes or more and one of 12 samples or more
    drawn in 2 passes or more. Pure arithmetic, no ranks: 2000 seeds."""
    for seed in range(2000):
        setup = draw_setup(seed)
        main, other, steps, seeds, far = setup[:5]
        assert len(set(seeds)) == SEEDS and steps <= far <= 2 * steps - RUN
        near = far_steps(far, steps, setup.windows)[: -WINDOW * WINDOWS]
        assert near[-RUN] >= COVER and len(setup.windows) == WINDOWS
        assert REACH[0] <= setup.windows[0] and setup.windows[-1] <= REACH[1] - WINDOW
        assert all(b - a >= WINDOW for a, b in zip(setup.windows, setup.windows[1:], strict=False))
        assert len(set(setup.many)) == MANY and not set(setup.many) & set(seeds)
        # The few-streams window judges the whole batches, and the largest source, always.
        drawn = quotas(main.weights, main.global_batch, setup.window)
        logs = [_log_match([b[s] for b in drawn], 0, n) for s, n in enumerate(main.sizes)]
        below = _few_below(len(main.sizes))
        assert setup.window <= FEW_MOST and sum(logs) <= below, (seed, setup.window)
        assert logs[max(range(len(logs)), key=lambda s: main.sizes[s])] <= below, seed
        for case in (main, other):
            drawn = [w * case.global_batch * steps - 1 for w in case.weights]
            assert min(d / n for n, d in zip(case.sizes, drawn, strict=True) if n < 10) >= 6
            assert any(d >= 2 * n for n, d in zip(case.sizes, drawn, strict=True) if n >= 12)
        assert main.global_batch != other.global_batch and main.global_batch % 4 == 0
        assert {main.global_batch, other.global_batch} <= set(GLOBALS)
        # The second case also runs at dp=3 (issue 45's eighth trial, P).
        assert other.global_batch in THIRDS and other.global_batch % 3 == 0
        # The twin: the first case's sizes and batch, weights TWIN_APART samples off somewhere.
        twin = setup.twin
        assert twin.sizes == main.sizes and twin.global_batch == main.global_batch
        pairs = zip(twin.weights, main.weights, strict=True)
        apart = [abs(a - b) * twin.global_batch for a, b in pairs]
        assert max(apart) >= TWIN_APART and abs(sum(twin.weights) - 1) < 1e-9
        assert len(main.sizes) != len(other.sizes)
        assert {len(main.sizes), len(other.sizes)} <= set(SOURCES)
        assert len(main.weights) == len(main.sizes) and len(other.weights) == len(other.sizes)
        assert STEPS[0] <= steps <= STEPS[1] and seeds[0] == seed != seeds[1]
        # Twins: a seed cut to its last 8 digits or its low 24 bits meets two that match.
        assert all(0 < x < 2**31 for x in seeds[1:])
        assert any(x % 10**8 == seed % 10**8 for x in seeds[1:])
        assert any(x % 2**24 == seed % 2**24 for x in seeds[1:])
        assert any(x >> 3 == seed >> 3 for x in seeds[1:])


def test_the_eighth_trials_dodges_are_rejected(cluster):
    """Guards issue 45's eighth trial: the notebook's running totals kept under the global
    batch alone (O: no case met the same batch with other weights in one process) and slots
    cut by ``global_batch >> (dp_size // 2)`` (P: right at dp 1, 2 and 4, the only DP sizes
    run) passed. Each check now asks the first case's sizes and batch with other weights right
    after it, in the same process, and runs the second case at dp=3: wrong on every draw."""
    for _ in range(max(1, DRAWS // 2)):
        _rejected(cluster, totals_under_the_batch_alone, "in the same process", 1)
        _rejected(cluster, slots_for_powers_of_two, ("dp=3", "global_batch // dp_size"), 1)


def test_every_draw_holds_a_right_answer_to_a_bound_it_keeps():
    """Guards a false failure found offline: 3 sources of weight 9/31 and 2 of 2/31 at a
    global batch of 16 (seed 754282858) took the notebook's rule, and the library's plan,
    1.03 samples from a target over the batches so far. Such weights are no longer drawn:
    the library's stratified plan keeps the cumulative bound on every case of 300 draws.
    Pure arithmetic, no ranks."""
    assert _drift((9 / 31,) * 3 + (2 / 31,) * 2, 16, 64) > 1
    for seed in (754282858, *range(300)):
        main, other, steps = draw_setup(seed)[:3]
        for case in (main, other):
            g = case.global_batch
            plan = Mixture(case.sizes, case.weights, g, "stratified", seed).plan(steps)
            stream = [
                [(int(s), int(i)) for s, i in plan[b * g : (b + 1) * g]] for b in range(steps)
            ]
            judged = check_mixture(stream, case.weights, bound=1, per="cumulative")
            assert judged.passed, (seed, case, judged.reason)


def test_a_generator_is_refused_at_once():
    """Guards issue 45's "the ranks hung ... after the cluster's whole timeout": ``yield`` in
    mix_batch is said at once, before any rank runs (no cluster: none would start)."""
    got = check_mix_batch(yields_pairs, timeout=1)
    assert got.status == "wrong" and "generator" in got.message, got.message
    assert "hung" not in got.message


def test_not_done_and_bad_arguments():
    """Guards the learner's first runs: the stub is "not done" (on fresh ranks), something not
    callable is refused before any rank starts."""
    assert check_mix_batch(not_done).status == "not done"
    assert check_mix_batch([(0, 0)]).status == "wrong"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fn",
    [seed_hashed_to(1000), largest_source_hashed_to_50],
    ids=["hashed_to_1000", "largest_source_50"],
)
def test_a_seed_that_reaches_few_streams_is_rejected(cluster, fn):
    """Guards issue 45's fifth brief, item (a): a seed hashed to one of K values passed when
    the check's 5 seeds fell in 5 streams (about 15% of checks at K = 7). 128 more seeds,
    drawn at random, run the first global batches: any two alike, whole or for one source,
    fail (a chance under 2.1e-4 to pass at K = 1000, less at any smaller K: the next
    test)."""
    _rejected(cluster, fn, ("the seed changes nothing", "two of 128 seeds"), max(1, DRAWS // 2))


def test_the_few_streams_rule_is_bounded_both_ways():
    """Guards the few-streams rule's arithmetic, in process (no ranks, no clock): any map of
    the seed into K <= 1000 streams passes with a chance of at most prod(1 - i / K) over the
    128 seeds (2.1e-4 at K = 1000), the library's plan passes and a seed hashed to 1000
    values fails (the window is judged on every draw: the test of every draw above)."""
    worst = math.exp(sum(math.log1p(-i / 1000) for i in range(MANY)))
    assert MANY == 128 and worst < 2.1e-4
    for seed, fn, says in ((5, library_answer, ""), (6, seed_hashed_to(1000), "two of 128")):
        setup = draw_setup(seed)
        args = (setup.main.sizes, setup.main.weights, setup.main.global_batch)
        streams = {x: [fn(*args, b, 0, 1, x) for b in range(setup.window)] for x in setup.many}
        got = few_streams(streams, setup.main.sizes)
        assert (says in got) if says else got == "", got


@pytest.mark.parametrize("fn", [replays_from(1000), stops_at_128], ids=["1000", "at_128"])
def test_a_table_longer_than_128_batches_is_rejected(cluster, fn):
    """Guards issue 45's fifth brief, item (b): the far steps reached step 128, so a table of
    more batches replayed from step 0 (or the stream right up to step 128, then that batch
    again) passed. The runs now cover every length up to 1024 (and one run is drawn up to
    10**4), and a far run is compared with the earlier far runs too."""
    _rejected(cluster, fn, "replays a table", max(1, DRAWS // 2))


def _defined_in_a_cell(src: str, name: str | None):
    """``name`` from ``src`` (every name when None), defined as a notebook cell defines it
    (``__main__``: it travels by value, so a new process imports numpy alone, as for a
    learner's answer)."""
    ns: dict = {"__name__": "__main__"}
    exec(compile(src, f"<17 {name} cell>", "exec"), ns)
    return ns if name is None else ns[name]


#: The notebook's solution with its generators seeded by ``SEED_OF`` (defined before it), its
#: running totals the notebook's own (kept between calls: the far windows are past 2**16).
_SOLUTION_WITH = (
    "import numpy as np\n"
    + DRAWS_BEFORE_SOURCE
    + "def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    w = tuple(x / sum(weights) for x in weights)\n"
    "    done, quota = draws_before(w, global_batch, step)\n"
    "    slots = np.repeat(np.arange(len(w)), quota)\n"
    "    order = np.random.default_rng(SEED_OF(seed, step, -1)).permutation(slots)\n"
    "    out = []\n"
    "    for s in order:\n"
    "        n, size = done[s], sizes[s]\n"
    "        perm = np.random.default_rng(SEED_OF(seed, int(s), n // size)).permutation(size)\n"
    "        out.append((int(s), int(perm[n % size])))\n"
    "        done[s] += 1\n"
    "    m = global_batch // dp_size\n"
    "    return out[dp_rank * m : (dp_rank + 1) * m]\n"
)

#: Dodge (issue 45's sixth trial, defect 5): every generator seeded by hash() of a str, which
#: Python salts per interpreter. Every rank of a check descends from one forkserver and
#: shares its salt, so all layouts agree; a restarted job draws another stream.
seeded_by_str_hash = _defined_in_a_cell(
    "def SEED_OF(seed, a, b):\n    return hash(f'{seed}/{a}/{b}') & (2**63 - 1)\n" + _SOLUTION_WITH,
    "mix_batch",
)
#: Dodge (sixth trial, defect 6): a salt an earlier cell planted in the warm cluster's ranks
#: (:func:`_plant_salt`), mixed into every seed: the same on every rank and worker, another
#: one in the next session.
seeded_by_a_planted_salt = _defined_in_a_cell(
    "import sys\n"
    "def SEED_OF(seed, a, b):\n"
    "    salt = getattr(sys.modules['ezpz_nb'], '_planted_salt', 0)\n"
    "    return [seed, a + 1, b + 1, salt]\n" + _SOLUTION_WITH,
    "mix_batch",
)
#: Right, unusually: the same answer seeded by sha256 of the same str (the same in every
#: process), and random.Random(str) is in ``cached_epoch``.
_SEEDED_BY_SHA256 = (
    "import hashlib\n"
    "def SEED_OF(seed, a, b):\n"
    "    return int.from_bytes(hashlib.sha256(f'{seed}/{a}/{b}'.encode()).digest()[:8], 'big')\n"
    + _SOLUTION_WITH
)
seeded_by_str_sha256 = _defined_in_a_cell(_SEEDED_BY_SHA256, "mix_batch")


def _plant_salt(salt):
    """An earlier cell's work on the warm ranks (the salt kept in a module they keep)."""
    import sys

    sys.modules["ezpz_nb"]._planted_salt = salt


def test_a_stream_that_depends_on_the_process_is_rejected(cluster):
    """Guards issue 45's sixth trial, defects 5 and 6: permutations seeded by hash() of a str
    (salted per interpreter, shared by every rank of one forkserver) and a salt planted in the
    warm ranks by an earlier cell both passed, as every layout ran on the same ranks. The
    horizon and a far run, computed again in a new process with another PYTHONHASHSEED,
    must be the ranks' batches; the same answer seeded by sha256 of the same str passes."""
    for _ in range(max(1, DRAWS // 2)):
        got = check_mix_batch(seeded_by_str_hash, cluster=cluster)
        assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    cluster.run(_plant_salt, 2**40 + 12345)
    try:
        got = check_mix_batch(seeded_by_a_planted_salt, cluster=cluster)
        assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    finally:
        cluster.run(_plant_salt, 0)
    got = check_mix_batch(seeded_by_str_sha256, cluster=cluster)
    assert got.status == "correct", got.message


#: Rule 6's probes, defined as cells define them (by value: a new process imports no test
#: module): this process's hash of a str as one pair (its salt, seen from outside), a
#: function that raises at step 1, and one that never returns.
_PROBES = _defined_in_a_cell(
    "import time\n"
    "def _hash_of(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    return [(0, hash(f'ezpz_nb {seed}') & 0xFFFFFFFF)]\n"
    "def _fails_at_step_1(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    if step == 1:\n"
    "        raise KeyError('only the ranks have it')\n"
    "    return [(0, 0)]\n"
    "def _never_returns(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    time.sleep(60)\n",
    None,
)
_hash_of, _fails_at_step_1, _never_returns = (
    _PROBES[name] for name in ("_hash_of", "_fails_at_step_1", "_never_returns")
)


def _fresh_stream(fn, hash_seed, timeout=60.0):
    return FreshStream(pack_job(fn, (), {}), ((3,), (1.0,), 1, 7), [0, 1], hash_seed, timeout)


def test_the_new_process_has_its_own_hash_salt_and_says_what_went_wrong():
    """Guards rule 6's own premise, in process (no ranks): the new process runs with the
    drawn PYTHONHASHSEED (two seeds give two salts, one seed the same one), never the
    kernel's setting; a function that raises there is
    said with its exception and line, one that does not return is stopped at the timeout
    (not judged, never wrong), and no process is left."""
    with _fresh_stream(_hash_of, 1) as a, _fresh_stream(_hash_of, 2) as b:
        with _fresh_stream(_hash_of, 1) as c:
            one, two, again = a.batches(), b.batches(), c.batches()
    assert one == again != two
    with _fresh_stream(_fails_at_step_1, 3) as f, pytest.raises(RuntimeError) as err:
        f.batches()
    assert "KeyError" in str(err.value) and "only the ranks have it" in str(err.value)
    stream = _fresh_stream(_never_returns, 4, timeout=0.5)
    with pytest.raises(TimeoutError, match="did not return within"):
        stream.batches()
    assert stream._proc.poll() is not None  # stopped, not left running
    picks = iter([5, 5, 6])
    assert hash_seed(types.SimpleNamespace(randrange=lambda a, b: next(picks)), "5") == 6


def test_the_seventh_trials_far_dodges_are_rejected(cluster):
    """Guards issue 45's seventh trial: a table of 16384 global batches replayed (H1: past
    every step then asked) and a stream exact to step 1024, then the same rounding each batch
    with pass positions guessed from the weights (H2: each far batch within one sample)
    passed. The far windows past 2**16 judge the running totals and the passes for every
    count of draws a right stream could have before them (offline: 200 of 200 draws each)."""
    for fn in (replays_16384_batches, exact_then_estimated):
        _rejected(cluster, fn, "far out", max(1, DRAWS // 2))


@pytest.mark.parametrize("seed", [21, 22])
def test_the_window_rule_keeps_right_answers_and_turns_far_dodges_down(seed):
    """Guards the window rule on its own, in process (no ranks): right answers with other
    permutations, orders and caches (the library's, the notebook's, the sources' blocks side
    by side, random.Random(str) from lru_cache'd totals) keep it in both windows of a draw;
    H1, H2 and a table of 65536 batches break it; and a right window judged as if it started
    a step later (its running totals and passes one batch off) breaks it."""
    setup = draw_setup(seed)
    main = setup.main
    args = (main.sizes, main.weights, main.global_batch)

    def judged(fn, start, at=None):
        window = [list(map(tuple, fn(*args, b, 0, 1, seed))) for b in range(start, start + WINDOW)]
        return far_rules(window, start if at is None else at, main.weights, main.sizes)

    for fn in (library_answer, notebook_solution, grouped_by_source, cached_epoch):
        assert [judged(fn, p) for p in setup.windows] == [""] * WINDOWS, fn
    for fn in (replays_16384_batches, exact_then_estimated, replays_from(65536)):
        assert "far out" in judged(fn, setup.windows[-1]), fn
    assert "far out" in judged(notebook_solution, setup.windows[0], setup.windows[0] + 1)


def test_the_library_answer_is_the_librarys_plan():
    """Guards what ``library_answer`` stands for: computed batch by batch (the library's
    whole plan costs seconds past 2**16), it is ``Mixture.plan``'s stream, batch for batch."""
    for seed in range(3):
        main = draw_setup(seed).main
        g = main.global_batch
        plan = Mixture(main.sizes, main.weights, g, "stratified", seed).plan(40)
        for b in range(40):
            got = library_answer(main.sizes, main.weights, g, b, 0, 1, seed)
            assert got == [(int(s), int(i)) for s, i in plan[b * g : (b + 1) * g]], (seed, b)


#: Where the ninth trial's dodges keep what the ranks and the new process share: the
#: machine's temporary folder, as the trial's (one folder per test process).
_SHARED = os.path.join(tempfile.gettempdir(), f"ezpz_nb-t9-mix-{os.getpid()}")

#: The notebook's solution seeded by hash() of a str (salted per process), each global batch
#: computed once by the salted stream, kept in a shared folder and read back from there.
_SALTED_AND_CACHED = (
    "import hashlib, json, os, time\n"
    "import torch.distributed\n"
    "import torch.utils.data\n"
    "def SEED_OF(seed, a, b):\n    return hash(f'{seed}/{a}/{b}') & (2**63 - 1)\n"
    + _SOLUTION_WITH.replace("def mix_batch(", "def salted(")
    + "def _cached(path, make):\n"
    "    if not os.path.exists(path):\n"
    "        os.makedirs(CACHE, exist_ok=True)\n"
    "        tmp = f'{path}.{os.getpid()}'\n"
    "        with open(tmp, 'w') as f:\n"
    "            json.dump(make(), f)\n"
    "        try:\n"
    "            os.link(tmp, path)  # first writer wins\n"
    "        except FileExistsError:\n"
    "            pass\n"
    "        os.remove(tmp)\n"
    "    with open(path) as f:\n"
    "        return json.load(f)\n"
)


def _waiting(cache: str, make_first: bool):
    """Dodge (issue 45's ninth trial, d17_salted_hash_waits_for_ranks): a caller that is
    neither a rank nor a loader worker (the checker's new process) waits for the ranks'
    batch in ``cache`` instead of computing its own with its own salt; ``make_first``: it
    makes the folder first, as the trial's did."""
    return _defined_in_a_cell(
        f"CACHE, MAKE_FIRST = {cache!r}, {make_first}\n"
        + _SALTED_AND_CACHED
        + "def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
        "    key = repr((list(sizes), list(weights), global_batch, step, seed)).encode()\n"
        "    path = os.path.join(CACHE, hashlib.sha1(key).hexdigest())\n"
        "    if MAKE_FIRST:\n"
        "        os.makedirs(CACHE, exist_ok=True)\n"
        "    if torch.utils.data.get_worker_info() is None and not torch.distributed.is_initialized():\n"
        "        for _ in range(1200):\n"
        "            if os.path.exists(path):\n"
        "                break\n"
        "            time.sleep(0.05)\n"
        "    whole = _cached(path, lambda: salted(sizes, weights, global_batch, step, 0, 1, seed))\n"
        "    m = global_batch // dp_size\n"
        "    return [tuple(x) for x in whole[dp_rank * m : (dp_rank + 1) * m]]\n",
        "mix_batch",
    )


waits_for_the_ranks = _waiting(_SHARED, True)

#: Dodge (the reverse way): the first process to call, most often the new one, draws a salt
#: and leaves it in the shared folder; every other process takes it, so all agree.
takes_the_first_salt = _defined_in_a_cell(
    f"CACHE = {_SHARED!r}\n"
    + _SALTED_AND_CACHED.replace("def SEED_OF(seed, a, b):", "def _unused(seed, a, b):")
    + "def SEED_OF(seed, a, b):\n"
    "    salt = _cached(os.path.join(CACHE, 'salt'), lambda: int.from_bytes(os.urandom(7), 'big'))\n"
    "    return [seed, a + 1, b + 1, salt]\n"
    "def mix_batch(*args):\n"
    "    return salted(*args)\n",
    "mix_batch",
)


def test_the_new_process_cannot_read_what_the_ranks_write_nor_leave_them_anything(cluster):
    """Guards issue 45's ninth trial: the new process of rule 6, started beside the ranks,
    waited for the batches they cached in /tmp (a stream seeded by the salted hash() of a
    str passed, 2 of 2). It now answers before any rank runs and may neither read a shared
    place nor write anything, so that dodge fails on every draw; and so does the reverse, a
    salt the first process leaves for the others (rmtree: each draw starts with no folder,
    as the trial did)."""
    try:
        for fn in [waits_for_the_ranks] * DRAWS + [takes_the_first_salt] * max(1, DRAWS // 2):
            shutil.rmtree(_SHARED, ignore_errors=True)
            got = check_mix_batch(fn, cluster=cluster)
            assert got.status == "wrong" and "in a new Python process" in got.message, got.message
    finally:
        shutil.rmtree(_SHARED, ignore_errors=True)


def test_the_new_process_answers_before_the_ranks_write(cluster, tmp_path, monkeypatch):
    """Guards the order of rule 6: the same dodge with its cache in a folder of the code's
    (on ``sys.path``, so the new process may read it) and made by the ranks alone would
    pass if the process ran beside the ranks; it answers before them, so it waits for a
    batch no rank has written yet and is late ("not done", never correct)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = _waiting(str(tmp_path / "cache"), False)
    got = check_mix_batch(fn, cluster=cluster)
    assert got.status == "not done" and "in a new Python process" in got.message, got.message


#: Rule 6's walls, probed from the new process (a cell's code, no ranks): each of a file in
#: the shared folder read, one written there and in the working folder, a socket made, and
#: this process's own status and the code's files read, as 1 (done) or 0 (refused).
_WALLS = _defined_in_a_cell(
    "import os, socket\n"
    f"SHARED = {_SHARED!r}\n"
    "def _tries():\n"
    "    yield lambda: open(os.path.join(SHARED, 'left')).read()\n"
    "    yield lambda: open(os.path.join(SHARED, 'new'), 'w').write('x')\n"
    "    yield lambda: open('ezpz_nb-t9-left-here', 'w').write('x')\n"
    "    yield lambda: socket.socket(socket.AF_UNIX).close()\n"
    "    yield lambda: open('/proc/self/status').read()\n"
    "    yield lambda: open(socket.__file__).read()\n"
    "def walls(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
    "    out = []\n"
    "    for k, f in enumerate(_tries()):\n"
    "        try:\n"
    "            f()\n"
    "            out.append((k, 1))\n"
    "        except OSError:\n"
    "            out.append((k, 0))\n"
    "    return out\n",
    "walls",
)


@pytest.mark.skipif(bool(not_confined()), reason="no Landlock here: rule 6 says not judged")
def test_the_new_process_reads_no_shared_place_and_writes_nothing(tmp_path, monkeypatch):
    """Guards rule 6's confinement on its own (no ranks): a file left in the machine's
    temporary folder cannot be read from the new process, nothing can be written there or
    in its working folder, no socket made; its own /proc entry and the code's files read."""
    os.makedirs(_SHARED, exist_ok=True)
    try:
        with open(os.path.join(_SHARED, "left"), "w") as f:
            f.write("the ranks' batch")
        monkeypatch.chdir(tmp_path)
        with _fresh_stream(_WALLS, 5) as stream:
            got = stream.batches()
        assert got == [[(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]] * 2
        assert sorted(os.listdir(_SHARED)) == ["left"] and not os.listdir(tmp_path)
    finally:
        shutil.rmtree(_SHARED, ignore_errors=True)


def test_the_new_process_starts_without_torch():
    """Guards issue 47's fifth round: the new process imports what it runs, not torch (the
    confinement's modules took it in: 1.5 s of CPU a check, for answers of plain Python or
    numpy); an answer that uses torch imports it as it is unpickled."""
    code = (
        "import sys, ezpz_nb.workshop.mix_fresh, ezpz_nb.workshop.confine, "
        "ezpz_nb.workshop.no_sockets, ezpz_nb.launcher.wire\n"
        "print([m for m in ('torch', 'numpy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_where_landlock_is_missing_rule_6_is_not_judged():
    """Guards rule 6 where the new process cannot be confined (no Landlock: an older kernel,
    macOS): it could have read the ranks' stream, so a match is "not judged here", named
    with why, never said to be the same stream in a confined process. Run in a notebook of
    its own (a Python process, fresh ranks) whose Landlock is made to look missing before
    any check: the checker's guard refuses code changed after its first check."""
    script = (
        "import json, sys\n"
        "from ezpz_nb.workshop import confine\n"
        "confine.landlock_abi = lambda: 0\n"
        "from ezpz_nb.workshop.mix_confine import not_confined\n"
        "from ezpz_nb.workshop.mixture import check_mix_batch\n"
        "ns = {'__name__': '__main__'}\n"
        f"exec({_SEEDED_BY_SHA256!r}, ns)\n"
        "got = check_mix_batch(ns['mix_batch'], timeout=60)\n"
        "print(json.dumps([not_confined(), got.status, ' '.join(got.message.split())]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True
    )
    missing, status, said = json.loads(run.stdout.strip().splitlines()[-1])
    assert missing[0].startswith("files it reads and writes ("), missing
    assert status == "correct", said
    assert "not judged here" in said and "Landlock is off" in said and "confined" not in said
