"""Checkers for the workshop notebook: run the learner's function on real ranks.

Each ``check_<name>(fn)`` launches a few gloo ranks, calls ``fn`` inside every
rank the way the exercise describes, and looks at what the ranks *saw* (the
values they returned, the samples they held, whether they hung). It prints one
verdict in plain words and returns a :class:`CheckResult`:

* ``"not done"``: the function still raises ``NotImplementedError`` (or returns
  ``None``), as shipped;
* ``"wrong"``: what was wrong, on which rank, and a hint;
* ``"correct"``.

Checkers never read the learner's source: any code that behaves right passes.
Where an answer could be fitted to one input (a sum, a step count, a batch's
shapes), the function is called a second time with inputs drawn for that check.
What runs on the ranks lives in :mod:`ezpz_nb.workshop.jobs`.
Every checker also takes ``timeout=`` (seconds, default :data:`CHECK_TIMEOUT`)
after which the learner's code is reported as hung and its ranks are stopped.

Example::

    import ezpz_nb.workshop.exercises as ex

    def global_sum(x):
        dist.all_reduce(x)
        return x

    ex.check_global_sum(global_sum).passed   # True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ezpz_nb.workshop import jobs
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
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
    "check_agreed_num_steps",
    "check_build_tp_loader",
    "check_global_sum",
    "check_make_sampler",
    "check_run_epochs",
    "check_send_batch",
    "check_share_from_leader",
]


# ----------------------------------------------------------------- 1. all_reduce
def check_global_sum(fn: Callable[[torch.Tensor], torch.Tensor], *,
                     timeout: float = CHECK_TIMEOUT) -> CheckResult:
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
                    raise _wrong(f"rank {r} returned {type(out).__name__} {out!r}{again}; "
                                 "return a tensor.")
                if out.shape == want.shape and torch.equal(out, inputs[r]):
                    raise _wrong(f"rank {r} returned its own input {_fmt(out)} instead of the "
                                 f"sum over all {world} ranks {_fmt(want)}: call "
                                 "dist.all_reduce(x) (it sums in place on every rank) and "
                                 "return x.")
                if out.shape != want.shape or not torch.allclose(out.float(), want):
                    raise _wrong(f"rank {r} returned {_fmt(out)}{again}, expected the sum over "
                                 f"all ranks {_fmt(want)} (inputs were "
                                 f"{[_fmt(i) for i in inputs]}): compute it from x.")
        first = _fmt(torch.stack(jobs.sum_inputs(world, None)).sum(0))
        return (f"All {world} ranks returned {first}, the sum of every rank's input, and the "
                "right sum again for other inputs.")
    return _verdict("global_sum", body)


# ----------------------------------------------------------------- 2. group broadcast
def check_share_from_leader(fn: Callable[[torch.Tensor, Any], torch.Tensor], *,
                            timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 2: ``fn(x, group)`` gives every rank of ``group`` the group leader's ``x``.

    4 ranks in TP groups ``[0, 1]`` and ``[2, 3]``; rank ``r`` holds ``[r, r, r]``.
    Ranks 0 and 1 must return ``[0, 0, 0]``, ranks 2 and 3 ``[2, 2, 2]``.
    """
    def body() -> str:
        got = _ranks(jobs.job_share, fn, timeout=timeout)
        for r, out in enumerate(got):
            leader = r - r % 2
            if not isinstance(out, torch.Tensor):
                raise _wrong(f"rank {r} returned {type(out).__name__} {out!r}; return a tensor.")
            if out.numel() and torch.all(out == 0) and leader != 0:
                raise _wrong(f"rank {r} got rank 0's value {_fmt(out)}, but its group is "
                             f"[{leader}, {leader + 1}] and its leader is rank {leader}: "
                             "broadcast inside the group (group=group), from the group's "
                             "rank 0, whose global rank is dist.get_global_rank(group, 0).")
            if out.shape != (3,) or not torch.all(out == leader):
                raise _wrong(f"rank {r} holds {_fmt(out)}, expected its group leader's "
                             f"value {[float(leader)] * 3}.")
        return "Ranks 0 and 1 hold rank 0's tensor; ranks 2 and 3 hold rank 2's."
    return _verdict("share_from_leader", body)


# ----------------------------------------------------------------- 3. DP sampler
def check_make_sampler(fn: Callable[[Any, Any], Any], *,
                       timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 3: ``fn(dataset, layout)`` returns a sampler that shards over DP replicas.

    4 ranks as dp 2 x tp 2, 24 samples: TP peers must get the same indices, the
    two DP replicas disjoint halves that together cover every sample.
    """
    n = 24

    def body() -> str:
        got = _ranks(jobs.job_sampler, fn, n, timeout=timeout)
        by_dp: dict[int, tuple[int, list[int]]] = {}
        for r, (dp, _tp, ids) in enumerate(got):
            first, peer = by_dp.setdefault(dp, (r, ids))
            if ids != peer:
                raise _wrong(f"TP peers disagree: rank {first} got {peer[:6]}... and rank {r} "
                             f"got {ids[:6]}... TP peers must see the same samples: "
                             "shard over the DP group only (num_replicas=layout.dp_size, "
                             "rank=layout.dp_rank), not over the whole world.")
        a, b = by_dp[0][1], by_dp[1][1]
        both = sorted(set(a) & set(b))
        if both:
            raise _wrong(f"DP replicas 0 and 1 both got samples {both[:8]}: each replica must "
                         "get its own share (rank=layout.dp_rank).")
        missing = sorted(set(range(n)) - set(a) - set(b))
        if missing:
            raise _wrong(f"samples {missing[:8]} were given to no replica: with {n} samples over "
                         f"2 replicas each should get {n // 2}.")
        return (f"TP peers share their replica's indices; DP replicas 0 and 1 got "
                f"{len(a)} and {len(b)} disjoint samples covering all {n}.")
    return _verdict("make_sampler", body)


# ----------------------------------------------------------------- 4. set_epoch
def check_run_epochs(fn: Callable[[Any, int], list[list[int]]], *,
                     timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 4: ``fn(loader, num_epochs)`` returns each epoch's sample ids, reshuffled.

    2 ranks, 16 samples, batch 2, 3 epochs. Epoch ``e`` must hold exactly what
    DistributedSampler gives after ``set_epoch(e)``.
    """
    def body() -> str:
        got = _ranks(jobs.job_epochs, fn, 3, world_size=2, timeout=timeout)
        for r, (out, want) in enumerate(got):
            if out is None:
                raise _Verdict("not done", f"rank {r} returned None: return one list of sample "
                               "ids per epoch.")
            try:
                out = [[int(i) for i in epoch] for epoch in out]
            except (TypeError, ValueError):
                raise _wrong(f"rank {r} returned {out!r}: return a list with one list of "
                             "sample ids (ints, from batch['index']) per epoch.") from None
            if len(out) != len(want):
                raise _wrong(f"rank {r} returned {len(out)} epoch(s), expected {len(want)}.")
            if len(out) > 1 and out[0] == out[1] and want[0] != want[1]:
                raise _wrong(f"rank {r} saw the same order in epoch 0 and epoch 1 ({out[0]}): "
                             "the sampler reshuffles only when told the epoch. Call "
                             "loader.sampler.set_epoch(epoch) before each pass.")
            for e, (o, w) in enumerate(zip(out, want, strict=True)):
                if o != w:
                    raise _wrong(f"rank {r}, epoch {e}: got sample ids {o}, expected {w} "
                                 f"(DistributedSampler after set_epoch({e})).")
        return "Every epoch has a new order, the one DistributedSampler gives for that epoch."
    return _verdict("run_epochs", body)


# ----------------------------------------------------------------- 5. TP loader
def check_build_tp_loader(fn: Callable[[Any], Any], *,
                          timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 5: ``fn(layout)`` returns a loader where only TP leaders load.

    4 ranks as dp 2 x tp 2; the exercise asks for 32 samples in batches of 2, so
    nothing is dropped. One epoch is recorded in a ledger: TP peers must hold
    identical batches, DP replicas different samples, every sample must be
    seen once, and only the leaders (tp_rank 0) may have loaded.
    """
    def body() -> str:
        from ezpz_nb.ledger import Ledger

        ledger = Ledger.from_results(_ranks(jobs.job_tp_loader, fn, timeout=timeout))
        if not ledger.records:
            raise _wrong("the loader yielded no batches: check batch_size against the "
                         "number of samples per DP replica.")
        problems = ledger.check()
        if problems:
            hint = ""
            if any(p.kind == "never_seen" for p in problems):
                hint = (" (Without dp_group the sampler shards over all 4 ranks, and the shares "
                        "of the peers, who never load, are never seen.)")
            raise _wrong("the sample ledger found: " + " ".join(p.message for p in problems)
                         + hint)
        loaded_peers = sorted({s.rank for s in ledger.records
                               if s.tp_rank != 0 and s.source != "received"})
        if loaded_peers:
            raise _wrong(f"ranks {loaded_peers} (not TP leaders) loaded batches themselves: "
                         "only the leader of each TP group should load and broadcast "
                         "(broadcast_within_tp=True).")
        steps = len(ledger.steps(0, ledger.epochs()[0]))
        return (f"Over {steps} steps TP peers held identical batches, DP replicas disjoint "
                "samples, and only ranks 0 and 2 (the leaders) loaded.")
    return _verdict("build_tp_loader", body)


# ----------------------------------------------------------------- 6. step count
def _check_steps_round(got: list[Any], counts: tuple[int, ...], again: str) -> None:
    want = min(counts)
    try:
        vals = [int(v) for v in got]
    except (TypeError, ValueError):
        raise _wrong(f"the ranks returned {got!r}{again}: return a plain int "
                     "(e.g. int(t.item()) of a tensor).") from None
    if len(set(vals)) > 1:
        plan = ", ".join(f"rank {r} {v}" for r, v in enumerate(vals))
        raise _wrong(f"the ranks disagree ({plan} steps{again}): the first rank to stop leaves, "
                     "and the others wait forever in their next collective. Agree with an "
                     "all_reduce (which op gives the count every rank can reach?).")
    if vals[0] > want:
        raise _wrong(f"every rank returned {vals[0]}{again}, but rank {counts.index(want)} has "
                     f"only {want} batches: it would run out of data. Take the smallest "
                     "count, not the largest.")
    if vals[0] != want:
        raise _wrong(f"every rank returned {vals[0]}{again}; the most steps every rank can take "
                     f"is {want} (batches per rank: {list(counts)}): compute it from the "
                     "ranks' counts.")


def check_agreed_num_steps(fn: Callable[[int], int], *,
                           timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 6: ``fn(local_batches)`` returns the step count every rank can take.

    4 ranks hold 5, 3, 4 and 6 batches; all must return 3, so none runs out of
    data and none waits for a rank that has left. A second call gives the ranks
    other counts, drawn for this check, so a fixed answer fails.
    """
    rounds = jobs.step_count_rounds(_fresh_seed())

    def body() -> str:
        got = _ranks(jobs.job_steps, fn, rounds, timeout=timeout)
        for k, counts in enumerate(rounds):
            again = f" on a second call, with batches per rank {list(counts)}" if k else ""
            _check_steps_round([outs[k] for outs in got], counts, again)
        first, other = rounds
        return (f"All ranks agreed on {min(first)} steps (batches per rank: {list(first)}), "
                f"and on {min(other)} for {list(other)}.")
    return _verdict("agreed_num_steps", body)


# ----------------------------------------------------------------- 7. send a batch
def check_send_batch(fn: Callable[[Any, Any], dict], *,
                     timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 7: ``fn(batch, group)``: the leader's dict of tensors reaches its peers.

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
                    hint = (" Peers start with None: they must receive the batch from the "
                            "leader." if tp_rank else "")
                    raise _wrong(f"rank {r} returned {out}{again}, expected the batch as a "
                                 f"dict.{hint}")
                if sorted(out[1]) != sorted(spec):
                    raise _wrong(f"rank {r} returned the keys {sorted(out[1])}{again}, its "
                                 f"leader (rank {leader}) sent {sorted(spec)}.")
                for key, (shape, dtype) in spec.items():
                    if out[1][key] != (shape, dtype):
                        raise _wrong(f"rank {r} returned {key!r} with shape {out[1][key][0]} "
                                     f"and dtype {out[1][key][1]}{again}; its leader (rank "
                                     f"{leader}) sent shape {shape}, dtype {dtype}. Send the "
                                     "shapes and dtypes too, not only the bytes.")
                if out[0] != digest:
                    raise _wrong(f"rank {r} returned a batch whose bytes differ from its "
                                 f"leader's (rank {leader}){again}. Send from the group's "
                                 "rank 0 inside the group.")
        return ("Every peer returned its leader's batch, byte for byte, with the same keys, "
                "shapes and dtypes, for two different batches.")
    return _verdict("send_batch", body)
