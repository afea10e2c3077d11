"""Checkers for the workshop notebook: run the learner's function on real ranks.

Each ``check_<name>(fn)`` launches a few gloo ranks, calls ``fn`` inside every
rank the way the exercise describes, and looks at what the ranks *did* (the
values they returned, the samples their loaders yielded, how often each rank's
dataset was read, whether they hung). It prints one verdict in plain words and
returns a :class:`CheckResult`:

* ``"not done"``: the function still raises ``NotImplementedError`` (or returns
  ``None``), as shipped;
* ``"wrong"``: what was wrong, on which rank, and a hint;
* ``"correct"``.

Checkers never read the learner's source and never trust what it says about
itself: any code that behaves right passes, and code that only looks right
fails. Inputs an answer could be fitted to (values, lengths, shapes) are drawn
anew for each check. What runs on the ranks lives in :mod:`ezpz_nb.workshop.jobs`.
Every checker also takes ``timeout=`` (seconds, default :data:`CHECK_TIMEOUT`)
after which the learner's code is reported as hung and its ranks are stopped.

The exercises follow the notebooks: 1-2 after 01 (collectives, subgroups), 3-4
after 02 (sharding, epochs), 5 after 03 (a batch of unknown shape), 6-7 after
04 (step alignment).

Example::

    import ezpz_nb.workshop.exercises as ex

    def global_sum(x):
        dist.all_reduce(x)
        return x

    ex.check_global_sum(global_sum).passed   # True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ezpz_nb.workshop import jobs
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    _each_returned,
    _fmt,
    _fresh_seed,
    _ranks,
    _Verdict,
    _verdict,
    _wrong,
)

__all__ = [
    "CHECK_TIMEOUT",
    "CheckResult",
    "check_global_sum",
    "check_leader_batches",
    "check_make_sampler",
    "check_run_epochs",
    "check_send_batch",
    "check_share_from_leader",
    "check_steps_over_stream",
]


# ----------------------------------------------------------------- 1. all_reduce
def check_global_sum(
    fn: Callable[[torch.Tensor], torch.Tensor], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 1: ``fn(x)`` returns the element-wise sum of ``x`` over all ranks.

    Rank ``r`` passes ``[r + 1, 10 r]`` on 4 ranks; every rank must return ``[10, 60]``.
    Then every rank calls ``fn`` again with values drawn for this check, so an
    answer that does not depend on the ranks' data fails.
    """
    seed = _fresh_seed()

    def body() -> str:
        got = _ranks(jobs.job_global_sum, fn, seed, timeout=timeout)
        world = len(got)
        for k, s in enumerate((None, seed)):
            again = " (second call, other inputs)" if k else ""
            inputs = jobs.sum_inputs(world, s)
            want = torch.stack(inputs).sum(0)
            for r, outs in enumerate(got):
                out = outs[k]
                if not isinstance(out, torch.Tensor):
                    raise _wrong(
                        f"rank {r} returned {type(out).__name__} {out!r}{again}; return a tensor."
                    )
                if out.shape == want.shape and torch.equal(out, inputs[r]):
                    raise _wrong(
                        f"rank {r} returned its own input {_fmt(out)} instead of the "
                        f"sum over all {world} ranks {_fmt(want)}: call "
                        "dist.all_reduce(x) (it sums in place on every rank) and "
                        "return x."
                    )
                if out.shape != want.shape or not torch.allclose(out.float(), want):
                    raise _wrong(
                        f"rank {r} returned {_fmt(out)}{again}, expected the sum over "
                        f"all ranks {_fmt(want)} (inputs were "
                        f"{[_fmt(i) for i in inputs]}): compute it from x."
                    )
        first = _fmt(torch.stack(jobs.sum_inputs(world, None)).sum(0))
        return (
            f"All {world} ranks returned {first}, the sum of every rank's input, and the "
            "right sum again for other inputs."
        )

    return _verdict("global_sum", body)


# ----------------------------------------------------------------- 2. group broadcast
def check_share_from_leader(
    fn: Callable[[torch.Tensor, Any], torch.Tensor], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 2: ``fn(x, group)`` gives every rank of ``group`` the group leader's ``x``.

    4 ranks in TP groups ``[0, 1]`` and ``[2, 3]``; each rank holds 3 values
    drawn for this check. Ranks 0 and 1 must return rank 0's values, ranks 2
    and 3 rank 2's: only a collective can tell a rank what those are.
    """
    seed = _fresh_seed()

    def body() -> str:
        got = _ranks(jobs.job_share, fn, seed, timeout=timeout)
        inputs = jobs.share_inputs(len(got), seed)
        for r, out in enumerate(got):
            leader = r - r % 2
            want = inputs[leader]
            if not isinstance(out, torch.Tensor):
                raise _wrong(f"rank {r} returned {type(out).__name__} {out!r}; return a tensor.")
            if out.shape == want.shape and torch.equal(out.float(), want):
                continue
            if leader and out.shape == want.shape and torch.equal(out.float(), inputs[0]):
                raise _wrong(
                    f"rank {r} got rank 0's values {_fmt(out)}, but its group is "
                    f"[{leader}, {leader + 1}] and its leader is rank {leader}: "
                    "broadcast inside the group (group=group), from the group's "
                    "rank 0, whose global rank is dist.get_global_rank(group, 0)."
                )
            if r != leader and out.shape == want.shape and torch.equal(out.float(), inputs[r]):
                raise _wrong(
                    f"rank {r} still holds its own values {_fmt(out)}: it received "
                    f"nothing from its leader (rank {leader}, values {_fmt(want)})."
                )
            raise _wrong(
                f"rank {r} holds {_fmt(out)}, expected its group leader's values "
                f"{_fmt(want)} (rank {leader}'s, drawn for this check): send them "
                "with a collective inside the group."
            )
        return (
            f"Ranks 0 and 1 hold rank 0's values {_fmt(inputs[0])}; ranks 2 and 3 hold "
            f"rank 2's {_fmt(inputs[2])}."
        )

    return _verdict("share_from_leader", body)


# ----------------------------------------------------------------- 3. DP sampler
def _overlap_hint(both: list[int], dp_size: int) -> str:
    if len(both) < dp_size:  # no more than padding adds: the replicas are right, the tail is not
        return (
            "DistributedSampler's default drop_last=False pads the shards by repeating "
            "samples; drop_last=True drops the remainder instead."
        )
    return "each replica must get its own share (rank=layout.dp_rank)."


def check_make_sampler(
    fn: Callable[[Any, Any], Iterable[int]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 3: ``fn(dataset, layout)`` returns a sampler that shards over DP replicas.

    4 ranks as dp 2 x tp 2 and 27 samples, which do not divide over the 2
    replicas. Exactly what the exercise asks: TP peers get the same indices in
    the same order; no sample on two replicas or twice on one; every replica
    gets 27 // 2 = 13 (the one left over is dropped); the order is shuffled
    (not ascending). Any iterable of indices passes, a sampler or a list.
    """
    n = jobs.SAMPLER_SAMPLES

    def body() -> str:
        got = _ranks(jobs.job_sampler, fn, n, timeout=timeout)
        _each_returned(got, "a sampler (or a list of indices)")
        by_dp: dict[int, tuple[int, list[int]]] = {}
        for r, (dp, _tp, ids) in enumerate(got):
            first, peer = by_dp.setdefault(dp, (r, ids))
            if ids != peer:
                raise _wrong(
                    f"TP peers disagree: rank {first} got {peer[:6]}... and rank {r} "
                    f"got {ids[:6]}... TP peers must see the same samples in the same "
                    "order: shard over the DP group only (num_replicas=layout.dp_size, "
                    "rank=layout.dp_rank), with the same seed on every rank."
                )
        dp_size = len(by_dp)
        shards = [by_dp[d][1] for d in sorted(by_dp)]
        for d, ids in enumerate(shards):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            if twice:
                raise _wrong(
                    f"DP replica {d} got samples {twice[:8]} more than once: no sample "
                    "may be seen twice in an epoch. " + _overlap_hint(twice, dp_size)
                )
        for d, ids in enumerate(shards[1:], start=1):
            both = sorted(set(shards[0]) & set(ids))
            if both:
                raise _wrong(
                    f"DP replicas 0 and {d} both got samples {both[:8]}: no sample may "
                    "go to two replicas; " + _overlap_hint(both, dp_size)
                )
        lengths = [len(ids) for ids in shards]
        want = n // dp_size
        if len(set(lengths)) > 1:
            raise _wrong(
                f"the DP replicas got {lengths} samples: unequal shards give unequal "
                "step counts, and the replica with more steps waits forever in its "
                f"next collective (notebook 02). Give each replica {want} and drop the "
                f"{n - want * dp_size} left over (drop_last=True)."
            )
        if lengths[0] != want:
            raise _wrong(
                f"each DP replica got {lengths[0]} samples; {n} samples over {dp_size} "
                f"replicas give {want} each: drop only the {n - want * dp_size} that "
                "do not divide."
            )
        for d, ids in enumerate(shards):
            if ids == sorted(ids):
                raise _wrong(
                    f"DP replica {d} gets its samples in ascending order {ids[:6]}...: "
                    "shuffle (shuffle=True, the same seed on every rank), or training "
                    "sees the data in the same fixed order every epoch."
                )
        return (
            f"TP peers share their replica's indices; the {dp_size} DP replicas got "
            f"{want} disjoint samples each, shuffled, and the {n - want * dp_size} left "
            "over was dropped."
        )

    return _verdict("make_sampler", body)


# ----------------------------------------------------------------- 4. set_epoch
def check_run_epochs(
    fn: Callable[[Any, int], list[list[int]]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 4: ``fn(loader, num_epochs)`` returns each epoch's sample ids, reshuffled.

    4 ranks as dp 2 x tp 2, 16 samples in batches of 2, 3 epochs; the loader
    shuffles with a DistributedSampler over the DP group (seed drawn per
    check). Judged by what the loader really yielded: once per epoch, in the
    order returned; a new order every epoch on every rank; TP peers alike; the
    two DP replicas split the 16 samples between them in every epoch. Any
    epoch numbering passes (``set_epoch(epoch + 1)`` as well as ``set_epoch(epoch)``).
    """
    epochs, seed = 3, _fresh_seed()

    def body() -> str:
        got = _ranks(jobs.job_epochs, fn, epochs, seed, timeout=timeout)
        _each_returned(got, "one list of sample ids per epoch")
        for r, (_dp, _tp, out, passes) in enumerate(got):
            if isinstance(out, str):
                raise _wrong(
                    f"rank {r} returned {out}: return a list with one list of sample "
                    "ids (ints, from batch['index']) per epoch."
                )
            if len(passes) != epochs:
                raise _wrong(
                    f"rank {r} iterated its loader {len(passes)} time(s) for "
                    f"{epochs} epochs: once per epoch."
                )
            if len(out) != epochs:
                raise _wrong(f"rank {r} returned {len(out)} epoch(s), expected {epochs}.")
            for e, (o, p) in enumerate(zip(out, passes, strict=True)):
                if o != p:
                    raise _wrong(
                        f"rank {r}, epoch {e}: returned {o}, but its loader yielded "
                        f"{p}: return the ids the loader gave, in order."
                    )
            for e in range(1, epochs):
                for earlier in range(e):
                    if out[e] == out[earlier]:
                        raise _wrong(
                            f"rank {r} saw the same order in epoch {earlier} and epoch "
                            f"{e} ({out[e]}): the sampler reshuffles only when told a "
                            "new epoch. Call loader.sampler.set_epoch(...) with a "
                            "different number before each pass."
                        )
        by_place = {(dp, tp): out for dp, tp, out, _ in got}
        for (dp, tp), out in by_place.items():
            if tp and out != by_place[(dp, 0)]:
                raise _wrong(
                    f"the TP peers of DP replica {dp} saw different orders: call "
                    "set_epoch with the same number on every rank."
                )
        for e in range(epochs):
            a, b = by_place[(0, 0)][e], by_place[(1, 0)][e]
            if set(a) & set(b) or len(set(a) | set(b)) != 16:
                raise _wrong(
                    f"in epoch {e} the DP replicas got {sorted(a)} and {sorted(b)}, "
                    "which do not split the 16 samples between them: every rank must "
                    "set the same epoch."
                )
        return (
            "Every epoch had a new order on every rank, TP peers alike, the DP replicas "
            "splitting the data between them."
        )

    return _verdict("run_epochs", body)


# ----------------------------------------------------------------- 5. send a batch
def check_send_batch(
    fn: Callable[[Any, Any], dict], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 5: ``fn(batch, group)``: the leader's dict of tensors reaches its peers.

    4 ranks as dp 2 x tp 2. Each TP leader holds a batch (``input_ids`` int64
    [2, 8], ``index`` int64 [2]); its peer passes ``None`` and knows no shapes.
    Every rank must return a dict with the leader's keys, shapes, dtypes and
    exact bytes. A second call sends a batch with other keys, shapes and dtypes.
    """
    seed = _fresh_seed()

    def body() -> str:
        got = _ranks(jobs.job_send, fn, seed, timeout=timeout)
        for k in range(2):
            again = " on the second call (other keys and shapes)" if k else ""
            for r, (tp_rank, rounds) in enumerate(got):
                leader = r - tp_rank
                (digest, spec), out = got[leader][1][k][0], rounds[k][1]
                if isinstance(out, str):
                    hint = (
                        " Peers start with None: they must receive the batch from the leader."
                        if tp_rank
                        else ""
                    )
                    raise _wrong(
                        f"rank {r} returned {out}{again}, expected the batch as a dict.{hint}"
                    )
                if sorted(out[1]) != sorted(spec):
                    raise _wrong(
                        f"rank {r} returned the keys {sorted(out[1])}{again}, its "
                        f"leader (rank {leader}) sent {sorted(spec)}."
                    )
                for key, (shape, dtype) in spec.items():
                    if out[1][key] != (shape, dtype):
                        raise _wrong(
                            f"rank {r} returned {key!r} with shape {out[1][key][0]} "
                            f"and dtype {out[1][key][1]}{again}; its leader (rank "
                            f"{leader}) sent shape {shape}, dtype {dtype}. Send the "
                            "shapes and dtypes too, not only the bytes."
                        )
                if out[0] != digest:
                    raise _wrong(
                        f"rank {r} returned a batch whose bytes differ from its "
                        f"leader's (rank {leader}){again}. Send from the group's "
                        "rank 0 inside the group."
                    )
        return (
            "Every peer returned its leader's batch, byte for byte, with the same keys, "
            "shapes and dtypes, for two different batches."
        )

    return _verdict("send_batch", body)


# ----------------------------------------------------------------- 6. leader-announced loop
def _round_setting(k: int, actual: int, claimed: int, workers: int) -> str:
    batches, said = -(-actual // jobs.LOOP_BATCH), -(-claimed // jobs.LOOP_BATCH)
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
            raise _wrong(
                f"rank {r} yielded {bad[0]}{setting}: yield the batches (dicts) themselves."
            )
        if tp_rank == 0:
            if [ids for ids, _ in mine] != want:
                raise _wrong(
                    f"the leader, rank {r}, yielded {len(mine)} batches, but its "
                    f"loader has {len(want)}{setting}: iterate the loader itself "
                    "to its end, not range(len(loader)): len() is only an estimate."
                )
            if loads != actual:
                raise _wrong(
                    f"rank {r}'s dataset was read {loads} times for {actual} "
                    f"samples{setting}: the leader loads each batch once."
                )
        else:
            if loads:
                raise _wrong(
                    f"rank {r} (a TP peer) read its dataset {loads} times, itself or "
                    f"through its DataLoader workers{setting}: only the leader loads; "
                    "peers must not iterate the loader, only receive."
                )
            if mine != sent:
                n_same = sum(1 for a, b in zip(mine, sent, strict=False) if a == b)
                raise _wrong(
                    f"rank {r} (a TP peer) yielded {len(mine)} batches, {n_same} of "
                    f"them its leader's; the leader (rank {leader}) yielded "
                    f"{len(sent)}{setting}: peers must yield exactly the leader's "
                    "batches and stop when the leader says the epoch ended."
                )


def check_leader_batches(
    fn: Callable[[Any, Any], Iterable[Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 6: ``fn(loader, group)`` yields the leader's batches on every rank of ``group``.

    4 ranks as dp 2 x tp 2; every rank gets a DataLoader over a dataset that
    counts its ``__getitem__`` calls (workers included), whose ``len()`` lies:
    first it claims more batches than come, then fewer (with 2 workers), in
    amounts drawn per check. Judged by the counts and by what each rank
    yielded: the leader yields every batch of its loader and reads each
    sample once; its peers read nothing and yield exactly the leader's
    batches, byte for byte; no rank waits for a batch that never comes.
    """
    rounds = jobs.leader_loop_rounds(_fresh_seed())

    def body() -> str:
        for k, (actual, claimed, workers) in enumerate(rounds):
            setting = _round_setting(k, actual, claimed, workers)
            try:  # one launch per round, so that a hang says which lie caused it
                got = _ranks(jobs.job_leader_loop, fn, actual, claimed, workers, timeout=timeout)
            except _Verdict as v:
                if v.status != "wrong":
                    raise
                raise _wrong(f"In {setting}: {v.message}") from None
            _each_returned(got, "an iterable of batches")
            _loop_round(got, actual, setting)
        return (
            "In both rounds only the leaders (ranks 0 and 2) read their datasets, once "
            "per sample, and every peer yielded its leader's batches, ending with it, "
            "whether len() claimed more batches or fewer."
        )

    return _verdict("leader_batches", body)


# ----------------------------------------------------------------- 7. step count over a stream
def check_steps_over_stream(
    fn: Callable[[Any, Callable[[Any], None]], int], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Exercise 7: ``fn(stream, train_step)`` steps every rank the same number of times.

    4 DP ranks; each rank's stream is a generator (no ``len()``) of a different
    number of batches, drawn per check, and on one rank it never ends.
    ``train_step`` all-reduces over every rank, so unequal calls hang. Every
    rank must call it as many times as the shortest stream has batches, and
    return that number.
    """
    seed = _fresh_seed()

    def body() -> str:
        counts = jobs.stream_counts(seed, 4)
        got = _ranks(jobs.job_stream, fn, counts, timeout=timeout)
        _each_returned(got, "the number of steps taken")
        want = min(c for c in counts if c is not None)
        plan = ", ".join(f"rank {r} {'endless' if c is None else c}" for r, c in enumerate(counts))
        for r, (out, calls) in enumerate(got):
            if calls != want:
                raise _wrong(
                    f"rank {r} called train_step {calls} times; with batches per rank "
                    f"{plan}, every rank can take {want} steps and no more: stop when "
                    "the first rank runs out, and not before."
                )
            if out != calls:
                raise _wrong(
                    f"rank {r} returned {out!r} but took {calls} steps: return the "
                    "number of steps taken, as an int."
                )
        return (
            f"Every rank took {want} steps and stopped together when the shortest stream "
            f"ran out ({plan})."
        )

    return _verdict("steps_over_stream", body)
