"""Checker for notebook 17's exercise: a deterministic mixing loader.

The learner writes ``mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)``:
this DP rank's part of global batch ``step``, a list of ``global_batch // dp_size`` pairs
``(source, index)`` with ``0 <= index < sizes[source]``. Rank ``r`` holds slots ``r * m``
to ``(r + 1) * m - 1`` of the global batch.

Judged on 4 real ranks, called inside real DataLoader workers (each worker makes every
other step, as workers share a loader's batches), at dp=1 (no workers), dp=2 and dp=4
(2 workers a rank). Everything is drawn anew per check, here in the notebook, which
judges (the ranks only get the arguments): the number of sources (2 to 5), their sizes
and weights, five seeds, the global batch (8, 12, 16, 20 or 24), the number of global
batches (32 to 64) and the far steps, so no fixed number of sources, batch, horizon or
slot size fits:

1. the same ``(source, index)`` stream at both layouts (``check_layout_invariance``): a
   rank that draws with a seed of its own changes the stream when the DP size changes;
2. each source within one sample of its target in every global batch and cumulatively,
   over all batches so far (``check_mixture``, ``per="batch"`` and ``"cumulative"``): a
   round-robin that ignores the weights misses, and so does the same rounding in every
   batch (MosaicML's stratified batching promises the per-batch bound only; this
   exercise asks for both, as the notebook says);
3. within each source, every sample once before any repeats (a pass over the source), in
   a new order each pass (up to rotation), not an arithmetic one (:mod:`.mix_streams`,
   bounds worked out so a fresh permutation per seed, source and pass fails with a chance
   of at most 1e-6 per source): a seed that is the same for every step or worker hands
   out the same samples again, and one order (or two, or one shifted) reused pass after
   pass shows; and each pass drawn afresh, not made from the pass before
   (:mod:`.mix_maps`: one map from a pass to the next, of places or of samples, rotated or
   not, used again and again, or samples of the pass before drawn again within a few draws
   across the seam, more often than fresh passes);
   the draw holds a small source in 6 passes or more and one of 12 samples or more in 2;
4. the stream changes with the seed: 4 other seeds at dp=1 (spread over the ranks, in
   parallel), and every two of the 5 streams hold other samples in the first half and in
   the second half of the horizon, and each source's samples differ too (in a half, or
   over the horizon, where fresh permutations match by a chance under 1e-6). A seed that
   changes nothing, or reaches only some sources, meets two streams (or a source) that
   match. The other seeds are twins of the first (its last 8 decimal digits, its low 24
   bits, all but its lowest 3 bits) and one at random, so an answer that keeps a part of
   the seed (``seed % 1000``, ``seed & 0xFFFF``) meets two streams that match too; and 128
   more seeds drawn at random run the first few global batches, no two alike, whole or
   per source (:func:`~ezpz_nb.workshop.mix_seeds.few_streams`): a seed that reaches one
   of K fixed streams passes with a chance under 2.1e-4 for K up to 1000;
5. far steps: runs of 4 global batches from just past the horizon to step 1024 or further
   (:func:`~ezpz_nb.workshop.mix_streams.far_steps`) and two windows of 32 consecutive
   global batches, each from a step drawn from 2**16 to 2**17, with both cases
   (:mod:`.mix_window`): each batch mixed (rule 2), no run the same samples as a run of the
   horizon or an earlier one, so a table of batches replayed from step 0 (or right up to a
   step, then again) shows for any length up to 1024; and in each window the rules over all
   batches so far hold for some count of draws before it within one sample of its target:
   the running totals within one sample after every batch, no sample twice within a pass
   (passes cut every ``size`` draws from step 0). A stream that drifts far out, a table of
   fewer than 2**16 batches replayed (its batches there carry another count's passes) or
   pass positions guessed from the weights show. An answer that replays its quotas from step
   0 on each call pays its step per call (0.6 s at 10**5): the notebook asks that it keep
   its running totals between calls, so that a process pays for the steps before its first
   call once;
6. the same batches in a new Python process (:mod:`.mix_fresh`: another drawn
   ``PYTHONHASHSEED``, none of the ranks' state), the horizon at dp=1 and the first 4
   batches of the first far window: every rank descends from one forkserver and shares its
   string-hash salt, and a warm cluster keeps what an earlier cell left in it, so a stream
   seeded by ``hash()`` of a str, or by a salt planted in the ranks, is the same at every
   layout, while a restarted job draws another. That process answers before any rank runs,
   confined (:mod:`.mix_confine`: it reads no shared place and writes nothing), so it can
   neither wait for the ranks' batches nor leave them its salt (issue 45's ninth trial);
   where Landlock is missing a match is "not judged here".

Not seen (the notebook says so): the steps between those asked, and past 2**17. A table
of batches replayed from step 0 every ``T`` steps passes when ``T`` is past both windows'
first steps (on some draws for ``T`` from 2**16 to 2**17, on all from 2**17: the windows'
batches are right ones), and may pass when ``T`` times each source's
share of a batch is a whole number of passes over every source, with both cases (its
windows then keep every rule a window can judge; offline, ``step % 55440`` passed 2 draws in
200). Issue 45's seventh trial (a table of 16384 batches; exact to step 1024, then the same
rounding each batch with pass positions guessed) was turned down 200 of 200 draws offline
(:mod:`.mix_window`).

Offline (in-process streams at dp=1, the rules above, 500 draws each): fresh numpy,
torch.randperm and random.Random permutations per (seed, source, pass) passed 500 of 500;
one order every pass, two alternating, three cycling, rotations or strides, one source's
order reused, one permutation shifted a place each pass, one or two bits of the seed and
``step % T`` for T = 64 to 128 were turned down 500 of 500. Since the fifth brief of
issue 45: the notebook's solution passed 50 of 50 draws, the library's plan 40 of 40;
``step % 129``, ``step % 1024`` and the stream frozen at step 128 were turned down 30,
30 and 20 of as many (replayed), a seed hashed to 1000 values and one hashed to 50 for
the largest source only 50 of 50 each (few streams, or the 5 seeds).

Each check also runs dp=1 with a second case, another of the global batches (12 or 24)
and another number of sources, and holds that stream to rules 2 and 3: an answer that
assumes one batch size or three sources fails on every draw, not only on the draws it does
not fit. That case runs again at dp=3 on 3 of the ranks (no workers), the same stream: slots
cut right for powers of two only (``global_batch >> (dp_size // 2)``, issue 45's eighth
trial) show.

7. Each check's twin (:attr:`~.mix_streams.Draw.twin`: the first case's sizes and global
batch, other weights) is asked in the same process right after the first case's horizon,
for the next :data:`~.mix_streams.RUN` batches, and alone on another rank from step 0
(:func:`_own_stream`): within one sample of its own targets in every batch, and the same
batches both ways. Running totals kept between calls under the global batch alone (the
eighth trial) go on from the first weights' totals there; a process's state is the
learner's to keep, its keys are what this rule judges.

Rules 1 and 2 are the two judges of :mod:`ezpz_nb.verify.mixture`; a judge that cannot
judge (a rank that returned nothing) is reported as "not done", never as correct. A
generator (``yield`` in ``mix_batch``) is refused at once: it cannot leave a DataLoader
worker, and the ranks would wait for the cluster's whole timeout.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ezpz_nb.verify.mixture import check_layout_invariance, check_mixture, global_batches
from ezpz_nb.verify.verdict import Judgement, Verdict
from ezpz_nb.workshop import mix_streams
from ezpz_nb.workshop.mix_confine import not_confined
from ezpz_nb.workshop.mix_fresh import FreshStream, same_in_a_new_process, start_fresh
from ezpz_nb.workshop.mix_maps import map_repeated, seams_repeated
from ezpz_nb.workshop.mix_passes import (
    first_repeat,
    kept_neighbours_again,
    same_order_again,
    unshuffled,
)
from ezpz_nb.workshop.mix_seeds import few_streams, passes_shared, seed_blind
from ezpz_nb.workshop.mix_streams import RUN, Case, Draw, draw_setup
from ezpz_nb.workshop.mix_window import WINDOW, window_steps, windows_broken
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, CheckStopped, fresh_seed, not_done, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_mix_batch", "job_mix", "job_streams"]

EXERCISE = "mix_batch"
WORLD = 4
_SLOW = (
    "mix_batch did not finish the far steps in time (runs up to step 1024, then windows of 32 "
    "global batches past step 2**16): replaying the quotas from step 0 on every call costs "
    "about half a second a call there. Keep each source's running total between calls and go "
    "on from the last step asked, as the notebook's solution does."
)
_NOT_A_LIST = (
    "mix_batch returned a {}, not a list: return a list of (source, index) pairs (a "
    "generator or iterator cannot leave a DataLoader worker; build the list and return it)"
)


class _Steps(IterableDataset):
    """The learner's function called in each DataLoader worker, every other step per worker."""

    def __init__(
        self, fn: Callable, args: tuple[Any, ...], dp_rank: int, dp_size: int, steps: list[int]
    ) -> None:
        self.fn, self.args, self.dp_rank, self.dp_size = fn, args, dp_rank, dp_size
        self.steps = steps

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        sizes, weights, g, seed = self.args
        for step in self.steps[wid::nw]:
            out = self.fn(sizes, weights, g, step, self.dp_rank, self.dp_size, seed)
            if isinstance(out, Iterator):
                # A generator cannot be pickled out of a worker: say so, do not wait.
                raise TypeError(_NOT_A_LIST.format(type(out).__name__))
            yield step, out


def _pairs(out: Any, g: int, dp: int, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    if out is None:
        raise TypeError("mix_batch returned None: return a list of (source, index) pairs")
    pairs = [(int(s), int(i)) for s, i in out]
    m = g // dp
    if len(pairs) != m or any(not (0 <= s < len(sizes) and 0 <= i < sizes[s]) for s, i in pairs):
        raise ValueError(
            f"mix_batch(global_batch={g}, dp_size={dp}) returned {len(pairs)} pairs "
            f"{pairs[:4]}...: give global_batch // dp_size = {m} pairs (source, index) with "
            f"0 <= source < {len(sizes)} and 0 <= index < sizes[source] (the checker draws "
            "the global batch: use the argument; quotas rounded one source at a time can "
            "sum to one more or less than the batch: floor each, then give the leftover "
            "samples to the sources furthest behind, as the notebook's solution does)"
        )
    return pairs


def _batches(
    fn: Callable, args: tuple[Any, ...], dp_rank: int, dp: int, workers: int, steps: list[int]
) -> list[list[tuple[int, int]]]:
    ds = _Steps(fn, args, dp_rank, dp, steps)
    got = dict(DataLoader(ds, batch_size=None, num_workers=workers))
    return [_pairs(got[b], args[2], dp, args[0]) for b in steps]


def job_mix(fn: Callable, args: tuple[Any, ...], dp: int, workers: int, steps: list[int]) -> Any:
    """Rank side: this DP rank's batches of ``steps`` (TP peers of a replica, and the ranks
    past ``dp`` replicas when ``dp`` does not divide the world, return None)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // dp
    if rank % tp or rank >= dp * tp:
        return None
    return _batches(fn, args, rank // tp, dp, workers, steps)


#: A stream as the ranks return it: ``stream[step]`` a list of ``(source, index)`` pairs.
Batches = list[list[tuple[int, int]]]
#: One call of a chain: ``((sizes, weights, global_batch, seed), steps)``.
Call = tuple[tuple[Any, ...], list[int]]


def job_streams(fn: Callable, tasks: Sequence[Sequence[Sequence[Call]]]) -> Any:
    """Rank side: the dp=1 batches of this rank's chains ``tasks[rank]``; a chain's calls
    run in order, in this process (what one call leaves in the function, the next meets)."""
    mine = tasks[dist.get_rank()]
    return [[_batches(fn, args, 0, 1, 0, steps) for args, steps in chain] for chain in mine]


def _stream(
    fn: Callable, case: Case, seed: int, dp: int, workers: int, steps: list[int], **run: Any
) -> list[list[tuple[int, int]]]:
    """The global batches of ``steps`` of ``fn`` at ``dp`` replicas, ``workers`` a rank."""
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import run_job

    args = (case.sizes, case.weights, case.global_batch, seed)
    got = run_job(job_mix, fn, args, dp, workers, steps, world_size=WORLD, **run)
    return global_batches([r for r in got if r is not None])


def _mixed_and_fresh(stream: list[list[tuple[int, int]]], case: Case, at: str) -> tuple[str, str]:
    """Rules 2 and 3 on one stream; the two mixture reasons when both hold.

    ``at`` names the run in the messages ("" for the run judged at every layout).
    """
    where = f" ({at})" if at else ""
    share = check_mixture(stream, case.weights, bound=1)
    _stop_unless(
        share,
        f"Give each source floor or ceil of weight * global_batch samples in every global "
        f"batch{where}.",
    )
    total = check_mixture(stream, case.weights, bound=1, per="cumulative")
    _stop_unless(
        total,
        f"Within one sample per batch is not enough here{where}: the same rounding in every batch "
        "drifts. Give the extra samples to the sources furthest behind over all batches so far.",
    )
    for rule in (
        first_repeat,
        same_order_again,
        unshuffled,
        kept_neighbours_again,
        map_repeated,
        seams_repeated,
    ):
        broken = rule(stream, case.sizes)
        if broken:
            raise wrong(f"{at}: {broken}" if at else broken)
    return share.reason, total.reason


def _chains(fn: Callable, chains: list[list[Call]], **run: Any) -> list[list[Batches]]:
    """Each chain's dp=1 streams, one per call, the chains spread over the ranks in one
    run: chain ``k`` on rank ``k % WORLD``, after that rank's earlier chains."""
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import run_job

    tasks = [chains[r::WORLD] for r in range(WORLD)]
    got = run_job(job_streams, fn, tasks, world_size=WORLD, **run)
    return [got[k % WORLD][k // WORLD] for k in range(len(chains))]


def _spread(
    fn: Callable, case: Case, items: list[tuple[int, list[int]]], **run: Any
) -> list[Batches]:
    """Each item's dp=1 batches (``(seed, steps)``), the items spread over the ranks, in one
    run: item ``k`` on rank ``k % WORLD``."""
    chains = [[((*case, seed), steps)] for seed, steps in items]
    return [out for (out,) in _chains(fn, chains, **run)]


def _seeds_change_it(fn: Callable, setup: Draw, a: list[list[tuple[int, int]]], **run: Any) -> None:
    """Rule 4: every two of the check's seeds give other streams, in each half of the
    horizon and for each source (:func:`~ezpz_nb.workshop.mix_seeds.seed_blind`), no source
    has one order in two seeds' different passes (``passes_shared``), and the first global
    batches of many more seeds hold no two alike (``few_streams``)."""
    near, first = list(range(setup.steps)), list(range(setup.window))
    items = [(x, near) for x in setup.seeds[1:]] + [(x, first) for x in setup.many]
    chains = [[((*setup.main, seed), steps)] for seed, steps in items]
    # The twin in the same run: after the first case, in the same process, and alone on
    # the next rank (from step 0, so that what a rank kept before is not read there).
    twin, later = (*setup.twin, setup.seeds[0]), list(range(setup.steps, setup.steps + RUN))
    chains += [[((*setup.main, setup.seeds[0]), near), (twin, later)], [(twin, near + later)]]
    *got, (_, after), (alone,) = _chains(fn, chains, **run)
    _own_stream(setup, after, alone)
    out = [x for (x,) in got]
    others = dict(zip(setup.seeds[1:], out, strict=False))
    judged = {setup.seeds[0]: a, **others}
    same = (
        seed_blind(judged, setup.main.sizes)
        or passes_shared(judged, setup.main.sizes)
        or few_streams(
            dict(zip(setup.many, out[len(setup.seeds) - 1 :], strict=True)), setup.main.sizes
        )
    )
    if same:
        raise wrong(same)


def _own_stream(setup: Draw, after: Batches, alone: Batches) -> None:
    """Rule 7: the twin case (the first case's sizes and global batch, other weights) is
    mixed to its own weights, and the same batches whether or not the first case was asked
    before it in the process: totals kept under the global batch alone are not."""
    twin, n = setup.twin, setup.steps
    said = (
        f"the same sizes and global batch ({twin.global_batch}) with weights "
        f"{', '.join(f'{x:.2f}' for x in twin.weights)}, in the same process"
    )
    _stop_unless(
        check_mixture(alone, twin.weights, bound=1),
        f"Give each source floor or ceil of weight * global_batch samples in every global "
        f"batch ({said}: read the weights on every call).",
    )
    if after != alone[n:]:
        raise wrong(
            f"global batches {n} to {n + RUN - 1} of {said} right after global batches 0 to "
            f"{n - 1} with the first weights, differ from the same batches asked in a process "
            "that did not ask the first weights before: keep running totals under everything "
            "they depend on (the weights and the global batch), or work them out again when "
            "the arguments change."
        )


def _far_window(
    fn: Callable, setup: Draw, a: list[list[tuple[int, int]]], **run: Any
) -> tuple[str, list[list[tuple[int, int]]]]:
    """Rule 5, the far steps: each batch within one sample of its targets, no batches
    replayed, each window of :mod:`.mix_window` within the rules over all batches so far;
    says which steps were judged, and gives their batches (the windows' last)."""
    case, steps = setup.main, mix_streams.far_steps(setup.far, setup.steps, setup.windows)
    near_end = len(steps) - WINDOW * len(setup.windows)
    # The windows as one item, on one rank: an answer that keeps its running totals between
    # calls replays the steps before them once in the check, not once on every rank.
    runs = [(setup.seeds[0], steps[i : i + RUN]) for i in range(0, near_end, RUN)]
    runs.append((setup.seeds[0], steps[near_end:]))
    far = [b for out in _spread(fn, case, runs, **run) for b in out]
    at = f"global batches {steps[0]} to {steps[near_end - 1]}, " + ", ".join(
        f"{p} to {p + WINDOW - 1}" for p in setup.windows
    )
    _stop_unless(
        check_mixture(far, case.weights, bound=1),
        f"Give each source floor or ceil of weight * global_batch samples in every global "
        f"batch ({at}: any step, however far, must hold the mixture).",
    )
    again = mix_streams.replayed(a, far, steps)
    if again:
        raise wrong(again)
    # The windows again with the second case: a table replayed every T steps keeps every
    # rule of a window where T * weight * global_batch is a whole number of passes over each
    # source; other weights and sizes rarely allow that too (mix_window.py).
    other = setup.other
    (theirs,) = _spread(fn, other, [(setup.seeds[0], window_steps(setup.windows))], **run)
    said = f"{len(other.sizes)} sources at a global batch of {other.global_batch}, dp=1"
    _stop_unless(
        check_mixture(theirs, other.weights, bound=1),
        f"Give each source floor or ceil of weight * global_batch samples in every global "
        f"batch ({said}: any step, however far, must hold the mixture).",
    )
    broken = windows_broken(far[near_end:], setup.windows, case.weights, case.sizes)
    if broken:
        raise wrong(broken)
    broken = windows_broken(theirs, setup.windows, other.weights, other.sizes)
    if broken:
        raise wrong(f"{said}, {broken}")
    return at, far


def _judge(fn: Callable, cluster: Cluster | None, timeout: float) -> str:
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.launcher.startup import pack_job

    if inspect.isgeneratorfunction(fn):
        raise wrong(_NOT_A_LIST.format("generator"))
    try:
        # Packed before anything is drawn: code that runs as it is pickled sees no draw.
        job = pack_job(fn, (), {})
    except TypeError as err:
        raise wrong(str(err)) from None
    # Drawn here, in the notebook, fresh per check: the ranks see only the arguments.
    setup = draw_setup(fresh_seed())
    near = list(range(setup.steps))
    deep = list(range(setup.windows[0], setup.windows[0] + RUN))
    with start_fresh(job, setup, near + deep, timeout) as fresh:
        # Its answer before any rank runs: it cannot read what they write (mix_confine).
        fresh.finish()
        return _judge_drawn(fn, setup, fresh, cluster, timeout)


def _judge_drawn(
    fn: Callable, setup: Draw, fresh: FreshStream, cluster: Cluster | None, timeout: float
) -> str:
    """Rules 1 to 6 on one draw, the new process of rule 6 already started."""
    main, other, steps, seeds = setup.main, setup.other, setup.steps, setup.seeds
    run = {"timeout": timeout, "cluster": cluster}
    near = list(range(steps))
    a = _stream(fn, main, seeds[0], 1, 0, near, **run)
    for dp in (2, WORLD):
        b = _stream(fn, main, seeds[0], dp, 2, near, **run)
        same = check_layout_invariance(a, b, names=("dp=1", f"dp={dp} with 2 workers a rank"))
        _stop_unless(
            same,
            "The stream must not depend on the layout: compute the whole global batch from "
            "(seed, step) alone, then take this rank's slots.",
        )
    share, total = _mixed_and_fresh(a, main, "")
    # A second case at dp=1 (the cheapest layout): an answer that assumes one of GLOBALS
    # or a number of sources instead of reading the arguments meets one it does not fit.
    k, g = len(main.sizes), main.global_batch
    at = f"{len(other.sizes)} sources at a global batch of {other.global_batch}, dp=1"
    c = _stream(fn, other, seeds[0], 1, 0, near, **run)
    _mixed_and_fresh(c, other, at)
    # The second case again at dp=3 on 3 of the ranks (its batch is a multiple of 3): slots
    # cut right for powers of two only show; no workers, the layouts above have them.
    _stop_unless(
        check_layout_invariance(
            c, _stream(fn, other, seeds[0], 3, 0, near, **run), names=("dp=1", "dp=3")
        ),
        "The stream must not depend on the layout: compute the whole global batch from "
        "(seed, step) alone, then take this rank's global_batch // dp_size slots.",
    )
    # The costlier rules last, the cheaper of them first: many seeds, then the far steps.
    _seeds_change_it(fn, setup, a, **run)
    try:
        far, far_batches = _far_window(fn, setup, a, **run)
    except CheckStopped as err:
        if not err.message.startswith("the ranks hung"):  # verdicts.stopped_by's hang
            raise
        raise wrong(f"{_SLOW} {err.message}") from None
    # Every rank descends from one forkserver: a new process shows a stream that depends on
    # the process (its hash salt, what an earlier cell left in the ranks). Compared last,
    # so the process (started first) has had the whole check to start and compute.
    first = len(far_batches) - WINDOW * len(setup.windows)  # the first window's first run
    deep = list(range(setup.windows[0], setup.windows[0] + RUN))
    same_in_a_new_process(fresh, a + far_batches[first : first + RUN], near + deep)
    # Unconfined, that process could have taken the ranks' stream: a match proves nothing.
    missing = not_confined()
    fresh_said = (
        f"the same batches in a new Python process (not judged here: it could not be kept "
        f"from what the ranks write, no rule for {'; '.join(missing)})"
        if missing
        else "the same batches in a new, confined Python process"
    )
    return (
        f"the same {g * steps} (source, index) pairs ({steps} global batches of {g} from {k} "
        f"sources) at dp=1 and at dp=2 and 4 with 2 workers a rank; {share}; {total}; every "
        f"sample of a source once before any repeats, in a new order each pass, drawn afresh "
        f"(not made from the pass before); "
        f"{len(seeds)} seeds gave {len(seeds)} other streams, each source too, and "
        f"{len(setup.many)} more no two alike; {far} mixed and not replayed, each window's "
        f"running totals and passes whole from some count before it (for both cases); "
        f"{fresh_said}; the same rules hold with {at}, and the same "
        f"stream at dp=3; the same sizes with other weights mixed to their own, in the same "
        f"process too."
    )


def _stop_unless(judged: Judgement, then: str) -> None:
    """Stop the check on a judge that failed ("wrong") or could not judge ("not done")."""
    if judged.passed:
        return
    stop = not_done if judged.verdict is Verdict.NOT_JUDGED else wrong
    raise stop(f"{judged.reason}. {then}")


def check_mix_batch(
    fn: Callable[..., Any], *, cluster: Cluster | None = None, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 17's exercise: a deterministic, layout-free mixing loader (see the module).

    Args:
        fn: The learner's ``mix_batch``.
        cluster: A warm 4-rank :class:`~ezpz_nb.Cluster` to run on (the notebook's);
            fresh ranks when ``None`` or closed since.
        timeout: Seconds for each run.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        if not callable(fn):
            raise wrong(f"pass the function itself, got {type(fn).__name__}")
        return _judge(fn, cluster, timeout)

    return judge(EXERCISE, body)
