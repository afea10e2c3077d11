"""Checker for notebook 16's exercise: an evaluation loop exact on any dataset size and DP degree.

The learner writes ``exact_mean(dataset, dp_rank, dp_size) -> float``: every rank
returns the mean of ``dataset[i]["loss"]`` over all ``len(dataset)`` samples, equal to
what one process computes, while reading at least one and at most
``ceil(len / dp_size)`` samples itself, every sample read by some rank: the read
record is the evidence, since the losses sit in the rank's process (packed, never as a
list an answer could find in a frame or by ``gc``). Each check draws a fresh size and
DP degree (2, 3 or 4 ranks; a size the degree does not divide) and fresh losses, so a
fixed answer cannot fit, and the three dodges (``DistributedSampler``'s padding, ``drop_last``, the mean of per-rank
means) each land measurably off; the checker names the one an answer matches.
Reading every sample on every rank is exact but not distributed: refused too.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    CheckStopped,
    judge,
    not_done,
    run_job,
    wrong,
)

__all__ = ["check_exact_mean", "dodge_means", "draw_case", "loss_table", "pack"]

EXERCISE = "exact_mean"
#: Relative error an answer may have: float32 sums pass, every dodge lands far outside.
TOLERANCE = 1e-6
#: A dodge must land at least this far off (relative) for a case to be drawn.
SEPARATION = 1e-3


def pack(losses: list[float]) -> bytes:
    """The losses as the rank job receives them: packed doubles, never a list of floats."""
    return struct.pack(f"<{len(losses)}d", *losses)


def loss_table(packed: bytes) -> tuple[Any, list[int]]:
    """The evaluation set the learner's function gets, and the record of what it read.

    The set offers ``len`` and ``[i] -> {"index", "loss"}`` only: the losses (packed
    bytes from :func:`pack`, unpacked one at a time) and the record live in this
    function's closure, not on the object, so an answer cannot read every loss at once
    (``dataset.losses``, a list found in a caller's frame or by ``gc``) or rewrite what
    it read (``dataset.reads``); only the record's owner, the checker's job, sees it.
    """
    n, reads = len(packed) // 8, []

    class LossTable:
        """``len(dataset)`` samples; ``dataset[i]`` is ``{"index": i, "loss": ...}``."""

        __slots__ = ()

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int) -> dict[str, Any]:
            if not isinstance(i, int) or not 0 <= i < n:
                raise IndexError(f"index {i!r} outside 0..{n - 1}")
            reads.append(i)
            return {"index": i, "loss": struct.unpack_from("<d", packed, 8 * i)[0]}

        def __repr__(self) -> str:
            return f"<evaluation set of {n} samples>"

    return LossTable(), reads


def dodge_means(losses: list[float], dp: int) -> dict[str, float]:
    """What each dodge would return: padding, ``drop_last``, the mean of per-rank means."""
    n = len(losses)
    padded = [losses[i % n] for i in range(math.ceil(n / dp) * dp)]
    kept = losses[: (n // dp) * dp]
    shard_means = [math.fsum(losses[r::dp]) / len(losses[r::dp]) for r in range(dp)]
    return {
        "DistributedSampler's padding (the first samples counted twice)": math.fsum(padded)
        / len(padded),
        "drop_last (the last samples never counted)": math.fsum(kept) / len(kept),
        "the mean of per-rank means (a short shard weighs as much as a long one)": math.fsum(
            shard_means
        )
        / dp,
    }


def draw_case(rng: random.Random) -> tuple[int, list[float]]:
    """A DP degree and losses whose size the degree does not divide, every dodge far off."""
    while True:
        dp = rng.choice((2, 3, 4))
        n = rng.choice([k for k in range(2 * dp + 1, 41) if k % dp])
        losses = [round(rng.uniform(0.0, 10.0), 6) for _ in range(n)]
        truth = math.fsum(losses) / n
        if all(abs(v - truth) > SEPARATION * truth for v in dodge_means(losses, dp).values()):
            return dp, losses


def job_exact_mean(fn: Callable[..., Any], packed: bytes) -> tuple[Any, list[int]]:
    """On each rank: the learner's answer, and the indices it read.

    The rank holds the losses only as packed bytes (no list of floats for an answer to
    find in this frame or by ``gc``), and never the mean: the checker's parent computes
    that, and judges the reads, after the ranks return.
    """
    import torch.distributed as dist

    table, reads = loss_table(packed)
    out = fn(table, dist.get_rank(), dist.get_world_size())
    return out, sorted(set(reads))


def _judge(got: list[Any], losses: list[float], dp: int) -> str:
    """What every rank's answer says, or a stop at the first rank that is off."""
    n, truth = len(losses), math.fsum(losses) / len(losses)
    case = f"(N={n}, dp={dp}, one process's mean {truth:.6f})"
    if all(out is None for out, _ in got):
        raise not_done("exact_mean returned None: return the mean.")
    for rank, (out, reads) in enumerate(got):
        if not isinstance(out, (int, float)) and not hasattr(out, "item"):
            raise wrong(f"rank {rank} returned {out!r}: return the mean, a float, on every rank.")
        value = float(out)
        if not abs(value - truth) <= TOLERANCE * abs(truth):
            same = [k for k, v in dodge_means(losses, dp).items() if abs(v - value) <= 1e-9 * truth]
            why = f" That is what {same[0]} gives." if same else ""
            raise wrong(f"rank {rank} returned {value:.6f} {case}.{why}")
        share = math.ceil(n / dp)
        if len(reads) > share:
            raise wrong(
                f"rank {rank} read {len(reads)} samples {case}: exact, but each rank should "
                f"evaluate only its share (at most {share}) and combine with one collective."
            )
        if not reads:
            raise wrong(
                f"rank {rank} read no sample {case}, yet returned the mean: each rank must "
                "evaluate its share through dataset[i] and combine the sums with one collective."
            )
    # The ledger is the evidence: with every rank at most its share, every index read by
    # some rank means the work was split, and a right value on every rank that the ranks
    # agreed on it (a rank that read only its share cannot know the others' sums alone).
    missed = sorted(set(range(n)) - {i for _, reads in got for i in reads})
    if missed:
        raise wrong(
            f"no rank read sample(s) {missed[:5]} {case}: every sample must be evaluated "
            "once, on some rank, through dataset[i]."
        )
    return f"every rank returned {truth:.6f} {case}, and each read only its share."


def check_exact_mean(
    fn: Callable[..., Any], *, timeout: float = CHECK_TIMEOUT, seed: int | None = None
) -> CheckResult:
    """Notebook 16's exercise: ``fn(dataset, dp_rank, dp_size)`` returns the exact mean loss.

    Args:
        fn: The learner's function, run on every rank of a fresh group.
        timeout: Seconds before the ranks count as hung.
        seed: Fix the drawn case (tests, an instructor replaying one); by default fresh.
    """

    def body() -> str:
        dp, losses = draw_case(random.Random(seed))
        got = _answers(fn, losses, dp, timeout)
        return _judge(got, losses, dp)

    return judge(EXERCISE, body)


def _answers(fn: Callable[..., Any], losses: list[float], dp: int, timeout: float) -> Any:
    """The ranks' answers; a hang is worded for this exercise (a collective per sample)."""
    if not callable(fn):
        raise wrong("pass the function itself: check_exact_mean(exact_mean).")
    try:
        return run_job(job_exact_mean, fn, pack(losses), world_size=dp, timeout=timeout)
    except CheckStopped as stop:
        if stop.status == "wrong" and stop.message.startswith("the ranks hung"):
            raise wrong(
                f"{stop.message}\nEvery rank must make the same collectives, as often, a rank "
                "with a shorter shard included: sum in the loop, all-reduce after it."
            ) from None
        raise
