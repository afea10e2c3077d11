"""Checker for notebook 17's exercise: a deterministic mixing loader.

The learner writes ``mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)``:
this DP rank's part of global batch ``step``, a list of ``global_batch // dp_size`` pairs
``(source, index)`` with ``0 <= index < sizes[source]``. Rank ``r`` holds slots ``r * m``
to ``(r + 1) * m - 1`` of the global batch.

Judged on 4 real ranks, called inside real DataLoader workers (each worker makes every
other step, as workers share a loader's batches), once at dp=1 (no workers) and once at
dp=4 (2 workers a rank), with sizes, weights and seed drawn anew per check:

1. the same ``(source, index)`` stream at both layouts (``check_layout_invariance``): a
   rank that draws with a seed of its own changes the stream when the DP size changes;
2. in every global batch, each source within one sample of ``weight * global_batch``
   (``check_mixture``): a round-robin that ignores the weights misses;
3. within each source, every sample once before any repeats (a pass over the source): a
   seed that is the same for every step or worker hands out the same samples again.

Rules 1 and 2 are the two judges of :mod:`ezpz_nb.verify.mixture`; a judge that cannot
judge (a rank that returned nothing) is reported as "not done", never as correct.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ezpz_nb.launcher import Cluster, launch
from ezpz_nb.launcher.errors import HangError, RankError
from ezpz_nb.verify.mixture import check_layout_invariance, check_mixture, global_batches
from ezpz_nb.workshop.verdicts import CHECK_TIMEOUT, CheckResult

__all__ = ["check_mix_batch", "draw_setup", "job_mix"]

EXERCISE = "mix_batch"
GLOBAL, STEPS, WORLD = 12, 8, 4


def draw_setup(seed: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Source sizes and weights for one check: shares that do not divide the batch evenly."""
    rng = random.Random(seed)
    sizes = (rng.randint(4, 9), rng.randint(10, 20), rng.randint(25, 40))
    while True:
        raw = [rng.randint(2, 9) for _ in range(3)]
        w = tuple(x / sum(raw) for x in raw)
        # A weight-blind round-robin (4 each) must miss by more than one sample somewhere.
        if max(abs(x * GLOBAL - GLOBAL / 3) for x in w) > 1.2:
            return sizes, w


class _Steps(IterableDataset):
    """The learner's function called in each DataLoader worker, every other step per worker."""

    def __init__(self, fn: Callable, args: tuple[Any, ...], dp_rank: int, dp_size: int) -> None:
        self.fn, self.args, self.dp_rank, self.dp_size = fn, args, dp_rank, dp_size

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        sizes, weights, g, seed = self.args
        for step in range(wid, STEPS, nw):
            yield step, self.fn(sizes, weights, g, step, self.dp_rank, self.dp_size, seed)


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


def job_mix(fn: Callable, args: tuple[Any, ...], dp: int, workers: int) -> Any:
    """Rank side: this DP rank's batches in step order (TP peers of a replica return None)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = world // dp
    if rank % tp:
        return None
    ds = _Steps(fn, args, rank // tp, dp)
    got = dict(DataLoader(ds, batch_size=None, num_workers=workers))
    return [_pairs(got[b], args[2] // dp, args[0]) for b in range(STEPS)]


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


def _run(cluster: Cluster | None, timeout: float, *args: Any) -> list[Any]:
    if cluster is not None:
        return cluster.run(job_mix, *args)
    return launch(job_mix, *args, world_size=WORLD, timeout=timeout)


def _judge(fn: Callable, cluster: Cluster | None, timeout: float) -> tuple[str, str]:
    seed = random.Random().randrange(1, 2**31)  # fresh per check: no answer fits a fixed one
    sizes, weights = draw_setup(seed)
    args = (sizes, weights, GLOBAL, seed)
    try:
        one = [r for r in _run(cluster, timeout, fn, args, 1, 0) if r is not None]
        four = [r for r in _run(cluster, timeout, fn, args, 4, 2) if r is not None]
    except RankError as err:
        first = next(iter(err.failures.values()))
        if "NotImplementedError" in first.exc_type:
            return "not done", "mix_batch still raises NotImplementedError: write its body."
        return "wrong", f"rank {first.rank} raised {first.message}"
    except HangError as err:
        return "wrong", f"the ranks hung for {err.timeout:g} s: mix_batch must return on its own"
    a, b = global_batches(one), global_batches(four)
    same = check_layout_invariance(a, b, names=("dp=1", "dp=4 with 2 workers a rank"))
    if not same.passed:
        return ("not done" if same.verdict == "not judged" else "wrong"), (
            f"{same.reason}. The stream must not depend on the layout: compute the whole "
            "global batch from (seed, step) alone, then take this rank's slots."
        )
    share = check_mixture(a, weights, bound=1)
    if not share.passed:
        return ("not done" if share.verdict == "not judged" else "wrong"), (
            f"{share.reason}. Give each source floor or ceil of weight * global_batch "
            "samples in every global batch."
        )
    repeat = _first_repeat(a, sizes)
    if repeat:
        return "wrong", repeat
    return "correct", (
        f"the same {GLOBAL * STEPS} (source, index) pairs at dp=1 and at dp=4 with 2 workers a "
        f"rank; {share.reason}; every sample of a source once before any repeats."
    )


def check_mix_batch(
    fn: Callable[..., Any], *, cluster: Cluster | None = None, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 17's exercise: a deterministic, layout-free mixing loader (see the module).

    Args:
        fn: The learner's ``mix_batch``.
        cluster: A warm 4-rank :class:`~ezpz_nb.Cluster` to run on (the notebook's);
            fresh ranks when ``None``.
        timeout: Seconds for each run on fresh ranks.
    """
    if not callable(fn):
        status, message = "wrong", f"pass the function itself, got {type(fn).__name__}"
    elif cluster is not None and cluster.world_size != WORLD:
        status, message = "wrong", f"pass a cluster of {WORLD} ranks, not {cluster.world_size}"
    else:
        status, message = _judge(fn, cluster, timeout)
    prefix = {"correct": "correct", "not done": "not done yet"}.get(status, "not right yet")
    result = CheckResult(EXERCISE, status, f"{EXERCISE}: {prefix}. {message}")
    print(result.message)
    return result
