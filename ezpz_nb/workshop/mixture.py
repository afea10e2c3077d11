"""Checker for notebook 17's exercise: a deterministic mixing loader.

The learner writes ``mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)``:
this DP rank's part of global batch ``step``, a list of ``global_batch // dp_size`` pairs
``(source, index)`` with ``0 <= index < sizes[source]``. Rank ``r`` holds slots ``r * m``
to ``(r + 1) * m - 1`` of the global batch.

Judged on 4 real ranks, called inside real DataLoader workers (each worker makes every
other step, as workers share a loader's batches), at dp=1 (no workers), dp=2 and dp=4
(2 workers a rank). Everything is drawn anew per check, here in the notebook, which
judges (the ranks only get the arguments): the number of sources (2 to 5), their sizes
and weights, two seeds, the global batch (8, 16, 20 or 24) and the number of global
batches (32 to 64), so no fixed number of sources, batch, horizon or slot size fits:

1. the same ``(source, index)`` stream at both layouts (``check_layout_invariance``): a
   rank that draws with a seed of its own changes the stream when the DP size changes;
2. each source within one sample of its target in every global batch and cumulatively,
   over all batches so far (``check_mixture``, ``per="batch"`` and ``"cumulative"``): a
   round-robin that ignores the weights misses, and so does the same rounding in every
   batch (MosaicML's stratified batching promises the per-batch bound only; this
   exercise asks for both, as the notebook says);
3. within each source, every sample once before any repeats (a pass over the source): a
   seed that is the same for every step or worker hands out the same samples again, and
   so does a table of fewer than 32 batches replayed (``step % 24``);
4. the stream changes with the seed: a second run at dp=1 with the other seed must hold
   other samples in some global batch. A seed that changes nothing (ignored, or no
   randomness at all) gives every epoch and every run the same order.

Each check also runs dp=1 with a second case, another of the four global batches and
another number of sources, and holds that stream to rules 2 and 3: an answer that assumes
one batch size or three sources fails on every draw, not only on the draws it does not fit.

Rules 1 and 2 are the two judges of :mod:`ezpz_nb.verify.mixture`; a judge that cannot
judge (a rank that returned nothing) is reported as "not done", never as correct. A
generator (``yield`` in ``mix_batch``) is refused at once: it cannot leave a DataLoader
worker, and the ranks would wait for the cluster's whole timeout.
"""

from __future__ import annotations

import inspect
import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ezpz_nb.verify.mixture import check_layout_invariance, check_mixture, global_batches
from ezpz_nb.verify.verdict import Judgement, Verdict
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, fresh_seed, not_done, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["Case", "Draw", "check_mix_batch", "draw_setup", "job_mix"]

EXERCISE = "mix_batch"
WORLD = 4
#: Global batches drawn from (every DP size checked, 1, 2 and 4, divides each one).
GLOBALS = (8, 16, 20, 24)
#: Numbers of sources drawn from; a check's two cases never have the same number.
SOURCES = (2, 3, 4, 5)
#: The number of global batches a check runs is drawn from this range (both ends
#: included). Long enough that a replayed table of batches shows: over 500 draws each
#: (offline, the rules above on in-process streams at dp=1), ``step % 16``, ``% 24`` and
#: ``% 31`` were rejected 500 times (by rule 2 or 3), ``% 40`` passed on the 145 draws
#: of 40 or fewer batches; the notebook's solution, the library's plan and the sources
#: side by side passed 500 of 500. The solution replays its quotas from step 0, so its
#: cost grows with the square of this number: a check took as long as the old 16 to 24.
STEPS = (32, 64)


class Case(NamedTuple):
    """One stream the checker asks for: the sources' sizes and weights, the global batch."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    global_batch: int


class Draw(NamedTuple):
    """One check's draw (:func:`draw_setup`).

    Attributes:
        main: The case judged at every layout and with both seeds.
        other: The case judged at dp=1 only: another global batch, another number of sources.
        steps: Global batches in every run.
        seeds: The seed of every run, and the other seed of rule 4's second run.
    """

    main: Case
    other: Case
    steps: int
    seeds: tuple[int, int]


def draw_setup(seed: int) -> Draw:
    """One check's cases, number of global batches and seeds, all from ``seed``.

    The weights do not divide a case's batch evenly, and the number of batches is long
    enough that any composition used in every batch from half-way on (the same rounding
    each time) drifts past one sample over the second half alone.
    """
    rng = random.Random(seed)
    steps = rng.randint(*STEPS)
    k, k_other = rng.sample(SOURCES, 2)
    g = rng.choice(GLOBALS)
    main = _draw_case(rng, k, g, steps)
    other = _draw_case(rng, k_other, rng.choice([x for x in GLOBALS if x != g]), steps)
    second = seed
    while second == seed:
        second = rng.randrange(1, 2**31)
    return Draw(main, other, steps, (seed, second))


def _draw_case(rng: random.Random, k: int, g: int, steps: int) -> Case:
    """``k`` sources (one small one, so that its passes end and repeat) at global batch ``g``."""
    while True:
        sizes = [rng.randint(4, 9)] + [rng.randint(10, 40) for _ in range(k - 1)]
        rng.shuffle(sizes)
        raw = [rng.randint(2, 9) for _ in range(k)]
        w = tuple(x / sum(raw) for x in raw)
        # A weight-blind round-robin (g/k each) must miss by more than one sample somewhere.
        if max(abs(x * g - g / k) for x in w) > 1.2 and _fixed_error(w, g) * (steps // 2) > 1.2:
            return Case(tuple(sizes), w, g)


def _fixed_error(w: tuple[float, ...], g: int) -> float:
    """The smallest per-batch error, in samples, of a composition used in every batch.

    The best one rounds each ``w * g`` down and gives the leftover samples to the largest
    remainders: any other composition is off by a larger remainder or by a whole sample.
    """
    exact = [x * g for x in w]
    rest = sorted((e - int(e) for e in exact), reverse=True)
    up = g - sum(int(e) for e in exact)
    return max([1 - r for r in rest[:up]] + [r for r in rest[up:]] + [0.0])


_NOT_A_LIST = (
    "mix_batch returned a {}, not a list: return a list of (source, index) pairs (a "
    "generator or iterator cannot leave a DataLoader worker; build the list and return it)"
)


class _Steps(IterableDataset):
    """The learner's function called in each DataLoader worker, every other step per worker."""

    def __init__(
        self, fn: Callable, args: tuple[Any, ...], dp_rank: int, dp_size: int, steps: int
    ) -> None:
        self.fn, self.args, self.dp_rank, self.dp_size = fn, args, dp_rank, dp_size
        self.steps = steps

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        sizes, weights, g, seed = self.args
        for step in range(wid, self.steps, nw):
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
            "the global batch: use the argument, not a number of your own)"
        )
    return pairs


def job_mix(fn: Callable, args: tuple[Any, ...], dp: int, workers: int, steps: int) -> Any:
    """Rank side: this DP rank's batches in step order (TP peers of a replica return None)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // dp
    if rank % tp:
        return None
    ds = _Steps(fn, args, rank // tp, dp, steps)
    got = dict(DataLoader(ds, batch_size=None, num_workers=workers))
    return [_pairs(got[b], args[2], dp, args[0]) for b in range(steps)]


def _first_repeat(stream: list[list[tuple[int, int]]], sizes: tuple[int, ...]) -> str:
    """Where a source first hands out a sample again before its pass is over; '' if nowhere."""
    seen: dict[int, set[int]] = {s: set() for s in range(len(sizes))}
    for b, batch in enumerate(stream):
        for slot, (s, i) in enumerate(batch):
            if len(seen[s]) == sizes[s]:
                seen[s] = set()  # a pass over the source is complete: a new one starts
            if i in seen[s]:
                return (
                    f"global batch {b}, slot {slot}: source {s} hands out sample {i} again while "
                    f"{sizes[s] - len(seen[s])} of its {sizes[s]} samples were never drawn in this "
                    "pass. Derive each pick from the step (or a count of draws so far), not from "
                    "a seed that is the same for every call, worker or rank."
                )
            seen[s].add(i)
    return ""


def _stream(
    fn: Callable, case: Case, seed: int, dp: int, workers: int, steps: int, **run: Any
) -> list[list[tuple[int, int]]]:
    """The global batches of one run of ``fn`` at ``dp`` replicas, ``workers`` a rank."""
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
    repeat = _first_repeat(stream, case.sizes)
    if repeat:
        raise wrong(f"{at}: {repeat}" if at else repeat)
    return share.reason, total.reason


def _seed_changes_it(
    a: list[list[tuple[int, int]]], b: list[list[tuple[int, int]]], seeds: tuple[int, int]
) -> None:
    """Rule 4: runs at two seeds differ in what some global batch holds (order within a
    batch aside, as rule 1 compares batches)."""
    if [Counter(x) for x in a] == [Counter(x) for x in b]:
        raise wrong(
            f"seed={seeds[0]} and seed={seeds[1]} gave the same samples in all {len(a)} global "
            "batches: the seed changes nothing. Draw the order of each source's samples from "
            "the seed (as np.random.default_rng([seed, ...])): a new seed is how a run gets a "
            "new order, for each epoch or each run."
        )


def _judge(fn: Callable, cluster: Cluster | None, timeout: float) -> str:
    if inspect.isgeneratorfunction(fn):
        raise wrong(_NOT_A_LIST.format("generator"))
    # Drawn here, in the notebook, fresh per check: the ranks see only the arguments.
    main, other, steps, (seed, seed_b) = draw_setup(fresh_seed())
    run = {"timeout": timeout, "cluster": cluster}
    a = _stream(fn, main, seed, 1, 0, steps, **run)
    for dp in (2, WORLD):
        b = _stream(fn, main, seed, dp, 2, steps, **run)
        same = check_layout_invariance(a, b, names=("dp=1", f"dp={dp} with 2 workers a rank"))
        _stop_unless(
            same,
            "The stream must not depend on the layout: compute the whole global batch from "
            "(seed, step) alone, then take this rank's slots.",
        )
    share, total = _mixed_and_fresh(a, main, "")
    _seed_changes_it(a, _stream(fn, main, seed_b, 1, 0, steps, **run), (seed, seed_b))
    # A second case at dp=1 (the cheapest layout): an answer that assumes one of GLOBALS
    # or a number of sources instead of reading the arguments meets one it does not fit.
    k, g = len(main.sizes), main.global_batch
    at = f"{len(other.sizes)} sources at a global batch of {other.global_batch}, dp=1"
    _mixed_and_fresh(_stream(fn, other, seed, 1, 0, steps, **run), other, at)
    return (
        f"the same {g * steps} (source, index) pairs ({steps} global batches of {g} from {k} "
        f"sources) at dp=1 and at dp=2 and 4 with 2 workers a rank; {share}; {total}; every "
        "sample of a source once before any repeats; another seed gave other samples; the "
        f"same rules hold with {at}."
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
