"""Checkers of exercises 5-7 (after notebooks 03 and 04): a batch, a leader's loop, a step count.

Re-exported by :mod:`ezpz_nb.workshop.exercises`, where the workshop finds every
checker; the rank side lives in :mod:`ezpz_nb.workshop.batch_jobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ezpz_nb.workshop import batch_jobs
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    CheckStopped,
    each_returned,
    fresh_seed,
    judge,
    run_learner,
    wrong,
)

__all__ = ["check_leader_batches", "check_send_batch", "check_steps_over_stream"]


# ----------------------------------------------------------------- 5. send a batch
def check_send_batch(
    fn: Callable[[Any, Any], dict], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 5: ``fn(batch, group)``: the leader's dict of tensors reaches its peers.

    4 ranks as dp 2 x tp 2. Each TP leader holds a batch (``input_ids`` int64
    [2, 8], ``index`` int64 [2]); its peer passes ``None`` and knows no shapes.
    Every rank must return a dict with the leader's keys, shapes, dtypes and
    exact bytes, compared key by key (the dict's order does not matter). A
    second call sends a batch with other keys, shapes and dtypes, and token ids
    above ``2**24``, which a trip through float32 would change.
    """
    seed = fresh_seed()

    def body() -> str:
        got = run_learner(batch_jobs.job_send, fn, seed, timeout=timeout)
        for k in range(2):
            again = " on the second call (other keys and shapes)" if k else ""
            for r, (tp_rank, rounds) in enumerate(got):
                leader = r - tp_rank
                spec, out = got[leader][1][k][0], rounds[k][1]
                if isinstance(out, str):
                    hint = (
                        " Peers start with None: they must receive the batch from the leader."
                        if tp_rank
                        else ""
                    )
                    raise wrong(
                        f"rank {r} returned {out}{again}, expected the batch as a dict.{hint}"
                    )
                if sorted(out) != sorted(spec):
                    raise wrong(
                        f"rank {r} returned the keys {sorted(out)}{again}, its "
                        f"leader (rank {leader}) sent {sorted(spec)}."
                    )
                # Key by key: a dict's order is not part of the batch.
                for key, (shape, dtype, digest) in sorted(spec.items()):
                    o_shape, o_dtype, o_digest = out[key]
                    if (o_shape, o_dtype) != (shape, dtype):
                        raise wrong(
                            f"rank {r} returned {key!r} with shape {o_shape} and dtype "
                            f"{o_dtype}{again}; its leader (rank {leader}) sent shape "
                            f"{shape}, dtype {dtype}. The peers know nothing in advance: "
                            "what they need to rebuild a tensor must travel too."
                        )
                    if o_digest != digest:
                        whose = "it sent" if r == leader else f"its leader (rank {leader}) sent"
                        raise wrong(
                            f"rank {r} returned {key!r} with the right shape and dtype "
                            f"but other bytes than {whose}{again}. "
                            "Look at which rank sends, inside which group, and whether "
                            "any step converts the values on the way (a large int64 "
                            "does not survive a float32)."
                        )
        return (
            "Every peer returned its leader's batch, key by key and byte for byte, with "
            "the same shapes and dtypes, for two different batches."
        )

    return judge("send_batch", body)


# ----------------------------------------------------------------- 6. leader-announced loop
def _round_setting(k: int, actual: int, claimed: int, workers: int) -> str:
    batches, said = -(-actual // batch_jobs.LOOP_BATCH), -(-claimed // batch_jobs.LOOP_BATCH)
    also = f", {workers} DataLoader workers" if workers else ""
    return (
        f"round {k + 1}: the leader's loader yields {batches} batches, its len() says {said}{also}"
    )


def _loop_round(got: list[Any], actual: int, setting: str) -> None:
    setting = f" ({setting})"
    for r, (tp_rank, mine, loads, want) in enumerate(got):
        leader = r - tp_rank
        sent = got[leader][1]
        bad = [b for b in mine if isinstance(b, str)]
        if bad:
            raise wrong(
                f"rank {r} yielded {bad[0]}{setting}: yield the batches (dicts) themselves."
            )
        if tp_rank == 0:
            if [ids for ids, _ in mine] != want:
                raise wrong(
                    f"the leader, rank {r}, yielded {len(mine)} batches, but its "
                    f"loader has {len(want)}{setting}: iterate the loader itself "
                    "to its end: len() is only an estimate."
                )
            if loads != actual:
                raise wrong(
                    f"rank {r}'s stream was read {loads} times for {actual} "
                    f"items{setting}: the leader reads each item once."
                )
        else:
            if loads:
                raise wrong(
                    f"rank {r} (a TP peer) read its stream {loads} times, itself or "
                    f"through its DataLoader workers{setting}: only the leader loads; "
                    "peers must not iterate the loader, only receive."
                )
            if mine != sent:
                n_same = sum(1 for a, b in zip(mine, sent, strict=False) if a == b)
                raise wrong(
                    f"rank {r} (a TP peer) yielded {len(mine)} batches, {n_same} of "
                    f"them its leader's; the leader (rank {leader}) yielded "
                    f"{len(sent)}{setting}: peers must yield exactly the leader's "
                    "batches and stop when the leader says the epoch ended. Nothing "
                    "but reading the stream tells how many batches it holds."
                )


def check_leader_batches(
    fn: Callable[[Any, Any], Iterable[Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 6: ``fn(loader, group)`` yields the leader's batches on every rank of ``group``.

    4 ranks as dp 2 x tp 2; every rank gets a DataLoader over a filtered stream
    (an ``IterableDataset``) that counts the items read from it (workers
    included): how many batches it holds is known only by reading it, and its
    ``len()`` lies: first it claims more batches than come, then fewer (with 2
    workers), in amounts drawn per check. Judged by the counts and by what each rank
    yielded: the leader yields every batch of its loader and reads each
    sample once; its peers read nothing and yield exactly the leader's
    batches, byte for byte; no rank waits for a batch that never comes.
    """
    rounds = batch_jobs.leader_loop_rounds(fresh_seed())

    def body() -> str:
        for k, (actual, claimed, workers) in enumerate(rounds):
            setting = _round_setting(k, actual, claimed, workers)
            try:  # one launch per round, so that a hang says which lie caused it
                got = run_learner(
                    batch_jobs.job_leader_loop, fn, actual, claimed, workers, timeout=timeout
                )
            except CheckStopped as v:
                if v.status != "wrong":
                    raise
                raise wrong(f"In {setting}: {v.message}") from None
            each_returned(got, "an iterable of batches")
            _loop_round(got, actual, setting)
        return (
            "In both rounds only the leaders (ranks 0 and 2) read their streams, once "
            "per item, and every peer yielded its leader's batches, ending with it, "
            "whether len() claimed more batches or fewer."
        )

    return judge("leader_batches", body)


# ----------------------------------------------------------------- 7. step count over a stream
def check_steps_over_stream(
    fn: Callable[[Any, Callable[[Any], None]], int], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 7: ``fn(stream, train_step)`` steps every rank the same number of times.

    4 DP ranks; each rank's stream is a generator (no ``len()``) of a different
    number of batches, drawn per check, and on one rank it never ends.
    ``train_step`` all-reduces over every rank, so unequal calls hang. Every
    rank must call it as many times as the shortest stream has batches, and
    return that number, pulling at most one batch more than it steps: the
    streams hold hundreds of batches, so reading ahead to a cap does not pass.
    """
    seed = fresh_seed()

    def body() -> str:
        counts = batch_jobs.stream_counts(seed, 4)
        got = run_learner(batch_jobs.job_stream, fn, counts, timeout=timeout)
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
