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
Every checker also takes ``timeout=`` (seconds, default :data:`CHECK_TIMEOUT`)
after which the learner's code is reported as hung and its ranks are stopped.

Example::

    import ezpz_nb.exercises as ex

    def global_sum(x):
        dist.all_reduce(x)
        return x

    ex.check_global_sum(global_sum).passed   # True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ezpz_nb._checks import (
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
def _sum_inputs(world: int, seed: int | None) -> list[torch.Tensor]:
    """Each rank's input: the documented ``[r + 1, 10 r]``, or with a seed fresh values."""
    if seed is None:
        return [torch.tensor([r + 1.0, 10.0 * r]) for r in range(world)]
    g = torch.Generator().manual_seed(seed)
    # Values of 100 or more: their sum is never the first round's, so an answer
    # that ignores the ranks' data cannot pass both rounds.
    return list(torch.randint(100, 1000, (world, 2), generator=g).float().unbind(0))


def _job_global_sum(fn: Callable, seed: int) -> Any:
    r, world = dist.get_rank(), dist.get_world_size()
    outs = []
    for s in (None, seed):
        out = fn(_sum_inputs(world, s)[r].clone())
        outs.append(out.detach().clone() if isinstance(out, torch.Tensor) else out)
    return None if outs[0] is None else outs


def check_global_sum(fn: Callable[[torch.Tensor], torch.Tensor], *,
                     timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 1: ``fn(x)`` returns the element-wise sum of ``x`` over all ranks.

    Rank ``r`` passes ``[r + 1, 10 r]`` on 4 ranks; every rank must return ``[10, 60]``.
    Then every rank calls ``fn`` again with values drawn for this check, so an
    answer that does not depend on the ranks' data fails.
    """
    seed = _fresh_seed()

    def body() -> str:
        got = _ranks(_job_global_sum, fn, seed, timeout=timeout)
        world = len(got)
        for k, s in enumerate((None, seed)):
            again = " (second call, other inputs)" if k else ""
            inputs = _sum_inputs(world, s)
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
        return (f"All {world} ranks returned {_fmt(torch.stack(_sum_inputs(world, None)).sum(0))}"
                ", the sum of every rank's input, and the right sum again for other inputs.")
    return _verdict("global_sum", body)


# ----------------------------------------------------------------- 2. group broadcast
def _job_share(fn: Callable) -> Any:
    from ezpz_nb.groups import make_layout

    lay = make_layout(tp_size=2)
    x = torch.full((3,), float(dist.get_rank()))
    out = fn(x.clone(), lay.tp_group)
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


def check_share_from_leader(fn: Callable[[torch.Tensor, Any], torch.Tensor], *,
                            timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 2: ``fn(x, group)`` gives every rank of ``group`` the group leader's ``x``.

    4 ranks in TP groups ``[0, 1]`` and ``[2, 3]``; rank ``r`` holds ``[r, r, r]``.
    Ranks 0 and 1 must return ``[0, 0, 0]``, ranks 2 and 3 ``[2, 2, 2]``.
    """
    def body() -> str:
        got = _ranks(_job_share, fn, timeout=timeout)
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
def _job_sampler(fn: Callable, num_samples: int) -> Any:
    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=num_samples)
    sampler = fn(ds, lay)
    if sampler is None:
        return None
    return (lay.dp_rank, lay.tp_rank, [int(i) for i in sampler])


def check_make_sampler(fn: Callable[[Any, Any], Any], *,
                       timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 3: ``fn(dataset, layout)`` returns a sampler that shards over DP replicas.

    4 ranks as dp 2 x tp 2, 24 samples: TP peers must get the same indices, the
    two DP replicas disjoint halves that together cover every sample.
    """
    n = 24

    def body() -> str:
        got = _ranks(_job_sampler, fn, n, timeout=timeout)
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
def _job_epochs(fn: Callable, epochs: int) -> Any:
    from torch.utils.data import DistributedSampler

    from ezpz_nb.data import get_random_dataset_fsdp_tp

    built = get_random_dataset_fsdp_tp(2, 64, 4, num_samples=16, seed=7)
    out = fn(built["dataloader"], epochs)
    ref = DistributedSampler(built["dataset"], shuffle=True, seed=7, drop_last=True)
    want = []
    for e in range(epochs):
        ref.set_epoch(e)
        want.append([int(i) for i in ref])
    return out, want


def check_run_epochs(fn: Callable[[Any, int], list[list[int]]], *,
                     timeout: float = CHECK_TIMEOUT) -> CheckResult:
    """Exercise 4: ``fn(loader, num_epochs)`` returns each epoch's sample ids, reshuffled.

    2 ranks, 16 samples, batch 2, 3 epochs. Epoch ``e`` must hold exactly what
    DistributedSampler gives after ``set_epoch(e)``.
    """
    def body() -> str:
        got = _ranks(_job_epochs, fn, 3, world_size=2, timeout=timeout)
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
def _job_tp_loader(fn: Callable) -> Any:
    from ezpz_nb.groups import make_layout
    from ezpz_nb.ledger import record

    lay = make_layout(tp_size=2)
    loader = fn(lay)
    if loader is None:
        return None
    rec = record(loader, lay, publish=False)
    for _ in rec:
        pass
    return rec.ledger()


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

        ledger = Ledger.from_results(_ranks(_job_tp_loader, fn, timeout=timeout))
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
_LOCAL_BATCHES = (5, 3, 4, 6)


def _job_steps(fn: Callable, rounds: list[tuple[int, ...]]) -> Any:
    first = fn(rounds[0][dist.get_rank()])
    return None if first is None else [first, *(fn(c[dist.get_rank()]) for c in rounds[1:])]


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
    import random

    other = tuple(random.Random(_fresh_seed()).sample(range(7, 40), len(_LOCAL_BATCHES)))
    rounds = [_LOCAL_BATCHES, other]

    def body() -> str:
        got = _ranks(_job_steps, fn, rounds, timeout=timeout)
        for k, counts in enumerate(rounds):
            again = f" on a second call, with batches per rank {list(counts)}" if k else ""
            _check_steps_round([outs[k] for outs in got], counts, again)
        return (f"All ranks agreed on {min(_LOCAL_BATCHES)} steps (batches per rank: "
                f"{list(_LOCAL_BATCHES)}), and on {min(other)} for {list(other)}.")
    return _verdict("agreed_num_steps", body)


# ----------------------------------------------------------------- 7. send a batch
def _leader_batch(dp_rank: int, seed: int | None) -> dict[str, torch.Tensor]:
    """The batch a TP leader sends: the documented one, or with a seed other shapes."""
    from ezpz_nb.data import RandomTokenDataset

    if seed is None:
        ds = RandomTokenDataset(100, 8, num_samples=16)
        items = [ds[2 * dp_rank + k] for k in range(2)]
        return {"input_ids": torch.stack([it["input_ids"] for it in items]),
                "index": torch.tensor([it["index"] for it in items])}
    # Other keys, shapes and dtypes than the first round: a peer that assumes
    # them instead of receiving them fails here.
    g = torch.Generator().manual_seed(seed + dp_rank)
    rows, cols = (int(v) for v in torch.randint(3, 12, (2,), generator=g))
    return {"input_ids": torch.randint(0, 100, (rows, cols), generator=g),
            "mask": torch.rand(rows, cols, generator=g),
            "index": torch.arange(rows, dtype=torch.int32) + 100 * dp_rank}


def _spec(batch: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape), str(v.dtype)) for k, v in batch.items()
            if isinstance(v, torch.Tensor)}


def _job_send(fn: Callable, seed: int) -> Any:
    from ezpz_nb.groups import make_layout
    from ezpz_nb.ledger import batch_digest

    lay = make_layout(tp_size=2)
    rounds = []
    for s in (None, seed):
        batch = _leader_batch(lay.dp_rank, s) if lay.tp_rank == 0 else None
        out = fn(batch, lay.tp_group)
        sent = (batch_digest(batch), _spec(batch)) if batch is not None else None
        got = ((batch_digest(out), _spec(out)) if isinstance(out, dict)
               else "None" if out is None else f"a {type(out).__name__}")
        rounds.append((sent, got))
    return lay.tp_rank, rounds


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
        got = _ranks(_job_send, fn, seed, timeout=timeout)
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
