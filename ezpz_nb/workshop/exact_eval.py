"""Checker for notebook 16's exercise: an evaluation loop exact on any dataset size and DP degree.

The learner writes ``exact_mean(dataset, dp_rank, dp_size) -> float``: every rank
returns the mean of ``dataset[i]["loss"]`` over all ``len(dataset)`` samples, equal to
what one process computes, while reading at least one and at most
``len // dp_size + len % dp_size`` samples itself (an equal split, or the remainder on
one rank), every sample read by some rank, none read twice beyond a sampler's padding.
The losses never enter a rank: the checker serves ``dataset[i]`` from its own process
(:mod:`.loss_server`: two connections per rank, one for its reads and one for its record
of collectives, claimed before the learner's code runs), so every loss a rank holds it
asked for, and the record of what each rank read is kept where the learner's code never runs.
Each check draws a fresh size and DP degree (2, 3 or 4 ranks; a size the degree does not
divide) and fresh losses, so a fixed answer cannot fit, and
the three dodges (``DistributedSampler``'s padding, ``drop_last``, the mean of per-rank
means) each land measurably off; the checker names the one an answer matches. Reading
every sample on every rank is exact but not distributed: refused too. How the ranks
combined is judged as well (:mod:`.sent_log`): every collective and store use is recorded
in the rank while the answer runs, and each rank must have sent its own partial sum (known
here from the read log) through a collective: not through the store, a file or a socket,
and not every loss it read. Code in a rank can go past any recorder, so the bytes that
crossed between the ranks are counted from outside them too, by the kernel
(:mod:`.wire_bytes`): beyond what the recorded collectives carry when replayed, data went
around them. And the answer runs confined (:mod:`.confine`, Linux's Landlock, and
:mod:`.no_sockets`' seccomp filter): no file written, no TCP socket bound or connected, no
new socket of any family (UDP, unix, raw: what Landlock and the TCP counters miss), no
abstract unix socket of another rank reached, no program started. It runs on fresh ranks
whose every thread is confined before it is unpickled (:mod:`.seal`), so code it rebinds
for the rank's main thread (the reply that follows it) or hands gloo's threads is confined
too; a warm cluster passed in (tests) confines the answer's thread only, and says so.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ezpz_nb.workshop.confine import call_confined, refusals_explained
from ezpz_nb.workshop.loss_server import LossServer, ServedLosses, record_note
from ezpz_nb.workshop.seal import call_sealed, packed
from ezpz_nb.workshop.sent_log import Sent, recording
from ezpz_nb.workshop.sent_rules import FIX, judge_channel, judge_sent, judge_size
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, CheckStopped, not_done, wrong
from ezpz_nb.workshop.wire_bytes import WireCounter, judge_wire, replay, store_file

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_exact_mean", "dodge_means", "draw_case"]

EXERCISE = "exact_mean"
#: Relative error an answer may have: float32 sums pass, every dodge lands far outside.
TOLERANCE = 1e-6
#: A dodge must land at least this far off (relative) for a case to be drawn.
SEPARATION = 1e-3
#: The fewest samples a rank's share holds in a drawn case. A drawn loss has 7 digits
#: (10**7 values, 23.3 bits), so a share's losses packed whole (issue 45's seventh trial:
#: into one int) fill more than MAX_SENT float64s (768 bits, 704 beside the rank's part,
#: which it must send too). Packed lossy, k bits a loss, a share of m fits when m * k <= 704:
#: at 44, 16 bits did (issue 45's seventh brief), and losses rounded to as many bits as fit
#: gave a mean within TOLERANCE in 31% of drawn cases (3000 simulated). At 60 a loss gets
#: 11.7 bits at most (60 * 16 = 960: 16 or 17 bits, bfloat16's, never fit), and the mean
#: of losses rounded so is within TOLERANCE in 3% of cases, by luck of the rounding (the
#: rank's part sent beside it: a share's sum in float32 is 1e-7 off, one of 12 bits 1e-5).
#: Fewer bits a loss fitted (stop 56), so what a rank sends is counted in bits too
#: (:mod:`.sent_bits`): at most BUDGET (56) past what its sum and count explain, under
#: MIN_SHARE, so its losses at one bit each do not fit either.
MIN_SHARE = 60
#: Candidate loss vectors drawn at once: at shares of MIN_SHARE, the mean of per-rank means
#: lands SEPARATION off in ~0.5% of draws (the shares' sizes differ by one sample), so one
#: at a time took 0.25 s a case; a batch of this many holds ~5.
_BATCH = 1024
#: A wrong mean this close (relative), no dodge's, is a sum in too few digits: over 2000
#: drawn cases float16 sums landed up to 1.3e-3 off, bfloat16 up to 7.9e-3. The verdict
#: then names the dtype.
ROUNDED = 2e-2


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
    import numpy as np  # here: a rank imports this module

    while True:
        dp = rng.choice((2, 3, 4))
        # At least MIN_SHARE samples a rank: sending its losses, however written (issue 45's
        # fifth trial: each + 1000) or packed, is more numbers than a pair needs.
        n = rng.choice([k for k in range(MIN_SHARE * dp + 1, MIN_SHARE * dp + 41) if k % dp])
        drawn = np.random.default_rng(rng.getrandbits(64)).uniform(0.0, 10.0, (_BATCH, n))
        every = np.round(drawn, 6)
        truth = every.mean(axis=1)
        # The dodges' means for every candidate at once; the one taken is checked exactly.
        pad = math.ceil(n / dp) * dp - n
        padded = (every.sum(axis=1) + every[:, :pad].sum(axis=1)) / (n + pad)
        kept = every[:, : (n // dp) * dp].mean(axis=1)
        shard = np.mean([every[:, r::dp].mean(axis=1) for r in range(dp)], axis=0)
        far = np.ones(_BATCH, dtype=bool)
        for value in (padded, kept, shard):
            far &= np.abs(value - truth) > SEPARATION * truth
        for row in np.flatnonzero(far):
            losses = [float(v) for v in every[row]]
            exact = math.fsum(losses) / n
            means = dodge_means(losses, dp).values()
            if all(abs(v - exact) > SEPARATION * exact for v in means):
                return dp, losses


#: Said after an answer that was refused a file, a socket or the store while it ran.
_CONFINED = (
    "exact_mean runs where it may write no file, open no socket of its own (TCP, UDP or "
    "unix) and not use the process group's key-value store: what the ranks share goes "
    "through torch.distributed's collectives (code it leaves the rank to run later is held "
    f"to the same). {FIX}"
)


def _answer(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def job_exact_mean(learners: bytes, port: int, n: int, sealed: bool) -> Any:
    """On each rank: claim this rank's two connections to the checker (the reads, the record),
    then run the learner's answer (``learners``: it pickled, unpickled once confined), every
    collective and store use it makes streamed to the checker over the record connection
    (:mod:`.sent_log`).

    The barrier holds the learner's code back until every rank holds its connections, so no
    rank's code can claim another's. The reads are judged from the checker's log, not here.
    The checker reads the bytes between the ranks before and after the answer, and after
    the recorded calls are replayed (:mod:`.wire_bytes`); each ask waits for every rank.
    """
    import torch.distributed as dist

    table, note = ServedLosses(n, port, dist.get_rank()), record_note(port, dist.get_rank())
    dist.barrier()
    calls: list[Any] = []
    counted = note(f"snap before {os.getpid()} {store_file()}") == "ok"
    # Confined (Landlock and seccomp, where the kernel has them): no file written, no new
    # socket (TCP, UDP, unix, raw), no abstract unix socket of another rank reached, no
    # program started: what crosses between the ranks goes through the process group. On
    # ranks of the check's own, every thread of the rank (:mod:`.seal`): code the answer
    # leaves for the rank's main thread or gloo's threads to run later is confined too.
    confined = call_sealed if sealed else call_confined
    with recording(note, calls):
        out = confined(_answer, learners, [], table, dist.get_rank(), dist.get_world_size())
    if counted:
        note("snap after")
        replay(calls, note)
        note("snap replayed")
    return out


def _judge(got: list[Any], losses: list[float], dp: int, counter: WireCounter) -> str:
    """What every rank's answer says, or a stop at the first rank that is off."""
    n, truth = len(losses), math.fsum(losses) / len(losses)
    case = f"(N={n}, dp={dp}, one process's mean {truth:.6f})"
    if all(out is None for out, _, _ in got):
        raise not_done("exact_mean returned None: return the mean.")
    for rank, (_, _, sent) in enumerate(got):
        judge_channel(rank, sent, case)
    values = []
    for rank, (out, _, _) in enumerate(got):
        if not isinstance(out, (int, float)) and not hasattr(out, "item"):
            raise wrong(f"rank {rank} returned {out!r}: return the mean, a float, on every rank.")
        values.append(float(out))
    # The server's log is the evidence: with every rank at most its share (checked below),
    # every index read by some rank means the work was split, and a right value on every
    # rank that the ranks agreed on it (a rank that read only its share cannot know the
    # others' sums alone).
    # Judged before the value: a loop that stops early is named as such, not as the dodge
    # (drop_last) its mean may equal.
    missed = sorted(set(range(n)) - {i for _, reads, _ in got for i in reads})
    if missed:
        raise wrong(
            f"no rank read sample(s) {missed[:5]} {case}: every sample must be evaluated "
            f"once, on some rank, through dataset[i].{_why(values[0], losses, dp, rounded=False)}"
        )
    # Read more than once in all: no more than DistributedSampler's padding adds (dp - 1 at
    # most), which judge_sent's partial sums count on.
    again = sum(len(reads) for _, reads, _ in got) - n
    if again > math.ceil(n / dp) * dp - n:
        raise wrong(
            f"the ranks read {again} samples more than once {case}: split the samples so each "
            "is read once, on one rank (a sampler's padding, weighed 0, aside)."
        )
    # A share: an equal split (ceil), or floor on every rank and the remainder on one.
    share = n // dp + n % dp
    for rank in range(len(got)):  # losses sent rounded: named as sent, not as a float16 sum
        judge_size(rank, got, losses, case)
    for rank, ((_, reads, _), value) in enumerate(zip(got, values, strict=True)):
        if not abs(value - truth) <= TOLERANCE * abs(truth):
            raise wrong(f"rank {rank} returned {value:.6f} {case}.{_why(value, losses, dp)}")
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
    for rank in range(len(got)):
        judge_sent(rank, got, losses, case)
    around, note = judge_wire(
        counter,
        {r: s.wire for r, (_, _, s) in enumerate(got)},
        {r: s.replayed for r, (_, _, s) in enumerate(got)},
    )
    if around:
        raise wrong(f"{around} {case}: send only through torch.distributed's collectives; {FIX}")
    return (
        f"every rank returned {truth:.6f} {case}, each read only its share, and the ranks "
        f"combined their sums with a collective.{note}"
    )


def _why(value: float, losses: list[float], dp: int, *, rounded: bool = True) -> str:
    """What a wrong mean says: the dodge it equals, or (``rounded``: every sample was read)
    a sum kept in too few digits."""
    truth = math.fsum(losses) / len(losses)
    same = [k for k, v in dodge_means(losses, dp).items() if abs(v - value) <= 1e-9 * truth]
    if same:
        return f" That is what {same[0]} gives."
    if rounded and abs(value - truth) <= ROUNDED * truth:
        return (
            f" That is {abs(value - truth) / truth:.1e} off: close, not exact, as a sum kept "
            "in float16 or bfloat16 (a few digits) ends up. Sum in float64."
        )
    return ""


def check_exact_mean(
    fn: Callable[..., Any],
    *,
    timeout: float = CHECK_TIMEOUT,
    seed: int | None = None,
    cluster: Any = None,
) -> CheckResult:
    """Notebook 16's exercise: ``fn(dataset, dp_rank, dp_size)`` returns the exact mean loss.

    Args:
        fn: The learner's function, run on every rank of a fresh group.
        timeout: Seconds before the ranks count as hung.
        seed: Fix the drawn case (tests, an instructor replaying one); by default fresh.
        cluster: Warm ranks (an ``ez.Cluster`` of the drawn degree: tests) instead of
            fresh ones; the answer then runs in a confined thread of each, not on ranks
            whose every thread is confined (:mod:`.seal`), and the verdict says so.
    """
    # Here, not at the top: a rank imports this module for job_exact_mean (see stops.py).
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        dp, losses = draw_case(random.Random(seed))
        got, counter = _answers(fn, losses, dp, timeout, cluster)
        verdict = _judge(got, losses, dp, counter)
        if cluster is not None:
            verdict += (
                " (Not judged here: code the answer leaves the warm ranks' other threads to "
                "run; leave cluster out to judge it.)"
            )
        return verdict

    return judge(EXERCISE, body)


def _answers(
    fn: Callable[..., Any], losses: list[float], dp: int, timeout: float, cluster: Any
) -> Any:
    """Each rank's answer with the indices it read (from the server's log, in this process).

    A hang is worded for this exercise (a collective per sample).
    """
    # Here, not at the top: a rank imports this module for job_exact_mean (see stops.py).
    from ezpz_nb.workshop.verdicts import run_job

    if not callable(fn):
        raise wrong("pass the function itself: check_exact_mean(exact_mean).")
    learners, sealed = packed("exact_mean", fn), cluster is None
    # The server stops with the check, whether the ranks returned, raised or hung.
    with LossServer(losses, dp) as server:
        try:
            with refusals_explained(_CONFINED):
                got = run_job(
                    job_exact_mean,
                    learners,
                    server.port,
                    len(losses),
                    sealed,
                    world_size=dp,
                    timeout=timeout,
                    cluster=cluster,
                )
        except CheckStopped as stop:
            if stop.status == "wrong" and stop.message.startswith("the ranks hung"):
                raise wrong(
                    f"{stop.message}\nEvery rank must make the same collectives, as often, a rank "
                    "with a shorter shard included: sum in the loop, all-reduce after it."
                ) from None
            raise
    if server.refused:
        raise wrong(
            "a connection other than the ranks' own asked the checker for samples: read the "
            "evaluation set only through the dataset you are given (dataset[i])."
        )
    return [
        (out, sorted(set(server.reads.get(rank, []))), server.sent.get(rank, Sent()))
        for rank, out in enumerate(got)
    ], server.counter
