"""Checks of a loader's contract beyond sharding: the global batch's size, the order
across epochs, and which findings the loader's own settings (``drop_last``) explain.

Part of the rule set of :mod:`ezpz_nb.ledger.checks`, which runs them.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ezpz_nb.ledger.problem import Allowance, Problem
from ezpz_nb.ledger.records import StepRecord

__all__ = ["check_batch", "check_order", "dp_allowed", "never_allowed"]


def dp_allowed(allow: Allowance | None, n_dups: int, dp_size: int, n: int | None) -> str:
    if allow is None or allow.sampler_drop_last is not False:
        return ""
    pad = (-n) % dp_size if n is not None else dp_size - 1
    if n_dups > pad:
        return ""
    return (
        f"DistributedSampler(drop_last=False) pads the epoch to a multiple of {dp_size} "
        f"replicas by repeating {pad} sample(s) from its start; drop_last=True drops them instead"
    )


def never_allowed(allow: Allowance | None, missing: int, dp_size: int, n: int | None) -> str:
    if allow is None:
        return ""
    budget, why = 0, []
    if allow.sampler_drop_last:
        budget += (n % dp_size) if n is not None else dp_size - 1
        why.append(f"DistributedSampler(drop_last=True) drops what does not divide over {dp_size}")
    if allow.loader_drop_last and allow.batch_size:
        per = n // dp_size if n is not None else None
        budget += dp_size * (per % allow.batch_size if per is not None else allow.batch_size - 1)
        why.append("DataLoader(drop_last=True) drops each replica's last partial batch")
    if not why or missing > budget:
        return ""
    return "; ".join(why)


def check_batch(epoch: int, recs: list[StepRecord], allow: Allowance | None) -> list[Problem]:
    # One record per replica and step (TP/CP peers hold the same batch); only the
    # steps every replica took (step_mismatch speaks for the others).
    size: dict[tuple[int, int], tuple[int, int]] = {}
    for r in sorted(recs, key=lambda r: r.rank):
        size.setdefault((r.dp_rank, r.step), (len(r.sample_ids), r.rank))
    replicas = {d for d, _ in size}
    steps = sorted({s for _, s in size})
    totals = {
        s: sum(size[(d, s)][0] for d in replicas)
        for s in steps
        if all((d, s) in size for d in replicas)
    }
    if len(set(totals.values())) <= 1:
        return []
    usual = Counter(totals.values()).most_common(1)[0][0]
    odd = [s for s, n in totals.items() if n != usual]
    step = odd[0]
    rank = min(
        (size[(d, step)] for d in replicas), key=lambda x: (x[0] == usual // len(replicas), x[1])
    )[1]
    last_only = odd == [max(totals)] and totals[step] < usual
    expected = ""
    if last_only and allow is not None and allow.loader_drop_last is False:
        expected = (
            "DataLoader(drop_last=False) keeps the last partial batch; drop_last=True drops it"
        )
    return [
        Problem(
            "batch_size",
            f"Epoch {epoch}: the global batch (all DP replicas' samples at one step) was "
            f"{usual} samples at most steps but {totals[step]} at step {step}"
            + (f" and {len(odd) - 1} other step(s)" if len(odd) > 1 else "")
            + ". A changing global batch changes the effective learning rate; a smaller "
            "last batch comes from drop_last=False, other changes from replicas batching "
            "differently.",
            epoch,
            steps=tuple(odd),
            expected=expected,
            first=(rank, step, None),
        )
    ]


def check_order(by_epoch: dict[int, list[StepRecord]]) -> list[Problem]:
    out = []
    epochs = sorted(by_epoch)
    order = {
        e: {
            rank: tuple(i for r in sorted(rs, key=lambda r: r.step) for i in r.sample_ids)
            for rank, rs in _by_rank(by_epoch[e]).items()
        }
        for e in epochs
    }
    for prev, epoch in zip(epochs, epochs[1:], strict=False):
        a, b = order[prev], order[epoch]
        if a and a == b and any(b.values()):
            rank = min(b)
            out.append(
                Problem(
                    "order_unchanged",
                    f"Epoch {epoch}: every rank saw the same samples in the same order as in "
                    f"epoch {prev}, though shuffling was asked for. DistributedSampler draws "
                    "its permutation from seed + epoch: call sampler.set_epoch(epoch) (or "
                    "set_epoch on the loader) before each epoch.",
                    epoch,
                    ranks=tuple(sorted(b)),
                    first=(rank, 0, b[rank][0] if b[rank] else None),
                )
            )
    return out


def _by_rank(recs: list[StepRecord]) -> dict[int, list[StepRecord]]:
    out: dict[int, list[StepRecord]] = defaultdict(list)
    for r in recs:
        out[r.rank].append(r)
    return out
