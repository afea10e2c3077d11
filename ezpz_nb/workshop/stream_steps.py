"""Notebook 05, exercise 7 (after notebook 04): every rank takes as many steps over a stream.

``check_steps_over_stream(fn)``: ``fn(stream, train_step)`` steps every rank the same
number of times. Its job gives each of 4 real gloo ranks a stream without ``len()``
that counts the batches pulled from it (one never ends) and a ``train_step`` that
all-reduces over every rank; the checker judges the steps taken and how far each
rank read ahead.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_steps_over_stream"]


#: Batches an endless stream yields at full speed before it slows down: more than any
#: finite stream holds, so only reading ahead without end meets the slow part.
_FAST = 2000


def stream_counts(seed: int, world: int) -> list[int | None]:
    """Batches per rank for exercise 7: distinct counts, and one endless stream (None).

    Hundreds of batches: long enough that reading ahead up to a fixed cap before the
    ranks agree cannot stay within one batch beyond the steps taken.
    """
    rng = random.Random(seed)
    counts: list[int | None] = list(rng.sample(range(100, 300), world - 1))
    counts.insert(rng.randrange(world), None)
    return counts


class UnsizedBatches:
    """A generator of batches that counts the batches pulled from it.

    No ``len()``, and with ``count=None`` no end either.
    """

    def __init__(self, count: int | None) -> None:
        self.count, self.pulled = count, 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._batches()

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        while self.count is None or self.pulled < self.count:
            if self.pulled >= _FAST:
                time.sleep(0.05)  # an endless stream read to its end hangs, without filling memory
            k = self.pulled
            self.pulled += 1
            yield {"input_ids": torch.full((4,), k), "index": torch.tensor([k])}


def job_stream(fn: Callable, counts: list[int | None]) -> Any:
    """Exercise 7: what ``fn`` returned, how often it called ``train_step``, batches it
    pulled, and its furthest read ahead: ``(pulled, step)`` where pulled minus steps
    peaked (counted at every step, so reading ahead in chunks shows even when the last
    chunk happens to end one batch past the last step)."""
    calls: list[int] = []
    ahead = (0, 0)  # (batches pulled, at step), where the pulled batches led the steps most

    def train_step(batch: Any) -> None:
        """One training step: a gradient all-reduce over every rank."""
        nonlocal ahead
        if not isinstance(batch, dict) or "index" not in batch:
            raise TypeError(f"train_step needs a batch from the stream, got {batch!r}")
        step = len(calls) + 1
        if stream.pulled - step > ahead[0] - ahead[1]:
            ahead = (stream.pulled, step)
        grad = batch["index"].float()
        dist.all_reduce(grad)  # stands in for DDP's gradient all-reduce
        calls.append(int(batch["index"][0]))

    stream = UnsizedBatches(counts[dist.get_rank()])
    out = fn(iter(stream), train_step)
    if out is None and not calls:
        return None
    try:
        out = int(out)
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return out, len(calls), stream.pulled, ahead


def check_steps_over_stream(
    fn: Callable[[Any, Callable[[Any], None]], int],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 7: ``fn(stream, train_step)`` steps every rank the same number of times.

    4 DP ranks; each rank's stream is a generator (no ``len()``) of a different
    number of batches, drawn per check, and on one rank it never ends.
    ``train_step`` all-reduces over every rank, so unequal calls hang. Every
    rank must call it as many times as the shortest stream has batches, and
    return that number, pulling at most one batch more than it steps: the
    streams hold hundreds of batches, so reading ahead to a cap does not pass.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        counts = stream_counts(seed, 4)
        got = run_learner(job_stream, fn, counts, timeout=timeout, cluster=cluster)
        each_returned(got, "the number of steps taken")
        want = min(c for c in counts if c is not None)
        plan = ", ".join(f"rank {r} {'endless' if c is None else c}" for r, c in enumerate(counts))
        for r, (out, calls, pulled, (ahead, at_step)) in enumerate(got):
            if calls != want:
                raise wrong(
                    f"rank {r} called train_step {calls} times; with batches per rank "
                    f"{plan}, every rank can take {want} steps and no more: stop when "
                    "the first rank runs out, and not before."
                )
            if ahead > at_step + 1:
                raise wrong(
                    f"rank {r} had pulled {ahead} batches from its stream when it took step "
                    f"{at_step}: a rank may read at most one batch beyond its steps (the one "
                    "that tells whether a step follows). Reading ahead in chunks or to a cap "
                    "holds batches the ranks have not agreed on; agree on every batch."
                )
            if pulled > calls + 1:
                raise wrong(
                    f"rank {r} pulled {pulled} batches from its stream but took {calls} "
                    "steps: a rank may read at most one batch beyond its steps (the one "
                    "that tells whether a step follows). A stream can be endless or "
                    "huge; look at how far ahead your code reads before the ranks agree."
                )
            if out != calls:
                raise wrong(
                    f"rank {r} returned {out!r} but took {calls} steps: return the "
                    "number of steps taken, as an int."
                )
        return (
            f"Every rank took {want} steps and stopped together when the shortest stream "
            f"ran out ({plan}), reading at most one batch ahead."
        )

    return judge("steps_over_stream", body)
