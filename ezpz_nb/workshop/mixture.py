"""Checker for notebook 17's exercise: a deterministic mixing loader.

The learner writes ``mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)``:
this DP rank's part of global batch ``step``, a list of ``global_batch // dp_size`` pairs
``(source, index)`` with ``0 <= index < sizes[source]``. Rank ``r`` holds slots ``r * m``
to ``(r + 1) * m - 1`` of the global batch.

Judged on 4 real ranks, called inside real DataLoader workers (each worker makes every
other step, as workers share a loader's batches), at dp=1 (no workers), dp=2 and dp=4
(2 workers a rank), with sizes, weights, seed, the global batch (8, 16, 20 or 24) and the
number of global batches (16 to 24) drawn anew per check, so no fixed batch, horizon or
slot size fits:

1. the same ``(source, index)`` stream at both layouts (``check_layout_invariance``): a
   rank that draws with a seed of its own changes the stream when the DP size changes;
2. each source within one sample of its target in every global batch and cumulatively,
   over all batches so far (``check_mixture``, ``per="batch"`` and ``"cumulative"``): a
   round-robin that ignores the weights misses, and so does the same rounding in every
   batch (MosaicML's stratified batching promises the per-batch bound only; this
   exercise asks for both, as the notebook says);
3. within each source, every sample once before any repeats (a pass over the source): a
   seed that is the same for every step or worker hands out the same samples again.

Rules 1 and 2 are the two judges of :mod:`ezpz_nb.verify.mixture`; a judge that cannot
judge (a rank that returned nothing) is reported as "not done", never as correct. A
generator (``yield`` in ``mix_batch``) is refused at once: it cannot leave a DataLoader
worker, and the ranks would wait for the cluster's whole timeout.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ezpz_nb.launcher import Cluster
from ezpz_nb.verify.mixture import check_layout_invariance, check_mixture, global_batches
from ezpz_nb.verify.verdict import Judgement, Verdict
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    fresh_seed,
    judge,
    not_done,
    run_job,
    wrong,
)

__all__ = ["check_mix_batch", "draw_setup", "job_mix"]

EXERCISE = "mix_batch"
WORLD = 4
#: Global batches drawn from (every DP size checked, 1, 2 and 4, divides each one).
GLOBALS = (8, 16, 20, 24)


def draw_setup(seed: int) -> tuple[tuple[int, ...], tuple[float, ...], int, int]:
    """One check's sizes, weights, global batch and number of global batches.

    The weights do not divide the batch evenly, and the number of batches is long enough
    that any composition used in every batch from half-way on (the same rounding each
    time) drifts past one sample over the second half alone.
    """
    rng = random.Random(seed)
    sizes = (rng.randint(4, 9), rng.randint(10, 20), rng.randint(25, 40))
    while True:
        g, steps = rng.choice(GLOBALS), rng.randint(16, 24)
        raw = [rng.randint(2, 9) for _ in range(3)]
        w = tuple(x / sum(raw) for x in raw)
        # A weight-blind round-robin (g/3 each) must miss by more than one sample somewhere.
        if max(abs(x * g - g / 3) for x in w) > 1.2 and _fixed_error(w, g) * (steps // 2) > 1.2:
            return sizes, w, g, steps


def _fixed_error(w: tuple[float, ...], g: int) -> float:
    """The smallest per-batch error, in samples, of a composition used in every batch."""
    return min(
        max(abs(a - w[0] * g), abs(b - w[1] * g), abs(g - a - b - w[2] * g))
        for a in range(g + 1)
        for b in range(g + 1 - a)
    )


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


def _pairs(out: Any, m: int, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    if out is None:
        raise TypeError("mix_batch returned None: return a list of (source, index) pairs")
    pairs = [(int(s), int(i)) for s, i in out]
    if len(pairs) != m or any(not (0 <= s < len(sizes) and 0 <= i < sizes[s]) for s, i in pairs):
        raise ValueError(
            f"mix_batch returned {pairs[:4]}...: give {m} pairs (source, index) with "
            f"0 <= source < {len(sizes)} and 0 <= index < sizes[source]"
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
    return [_pairs(got[b], args[2] // dp, args[0]) for b in range(steps)]


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


def _judge(fn: Callable, cluster: Cluster | None, timeout: float) -> str:
    if inspect.isgeneratorfunction(fn):
        raise wrong(_NOT_A_LIST.format("generator"))
    seed = fresh_seed()  # fresh per check: no answer fits a fixed one
    sizes, weights, g, steps = draw_setup(seed)
    args = (sizes, weights, g, seed)
    runs = []
    for dp, workers in ((1, 0), (2, 2), (WORLD, 2)):
        got = run_job(
            job_mix,
            fn,
            args,
            dp,
            workers,
            steps,
            world_size=WORLD,
            timeout=timeout,
            cluster=cluster,
        )
        runs.append(global_batches([r for r in got if r is not None]))
    a = runs[0]
    for dp, b in ((2, runs[1]), (WORLD, runs[2])):
        same = check_layout_invariance(a, b, names=("dp=1", f"dp={dp} with 2 workers a rank"))
        _stop_unless(
            same,
            "The stream must not depend on the layout: compute the whole global batch from "
            "(seed, step) alone, then take this rank's slots.",
        )
    share = check_mixture(a, weights, bound=1)
    _stop_unless(
        share,
        "Give each source floor or ceil of weight * global_batch samples in every global batch.",
    )
    total = check_mixture(a, weights, bound=1, per="cumulative")
    _stop_unless(
        total,
        "Within one sample per batch is not enough here: the same rounding in every batch "
        "drifts. Give the extra samples to the sources furthest behind over all batches so far.",
    )
    repeat = _first_repeat(a, sizes)
    if repeat:
        raise wrong(repeat)
    return (
        f"the same {g * steps} (source, index) pairs ({steps} global batches of {g}) at dp=1 "
        f"and at dp=2 and 4 with 2 workers a rank; {share.reason}; {total.reason}; every sample of a source once before any repeats."
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

    def body() -> str:
        if not callable(fn):
            raise wrong(f"pass the function itself, got {type(fn).__name__}")
        return _judge(fn, cluster, timeout)

    return judge(EXERCISE, body)
