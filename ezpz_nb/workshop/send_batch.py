"""Notebook 05, exercise 5 (after notebook 03): a TP leader's batch of unknown shape to its peers.

``check_send_batch(fn)``: ``fn(batch, group)`` returns, on every rank of ``group``, the
leader's dict of tensors. Its job gives each TP leader of 4 real gloo ranks (dp 2 x
tp 2) a batch and its peer ``None``, and sends back each rank's result as shapes,
dtypes and digests, key by key; a second round sends other keys, shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_send_batch"]


def leader_batch(dp_rank: int, seed: int | None) -> dict[str, torch.Tensor]:
    """The batch a TP leader sends: the documented one, or with a seed other shapes."""
    from ezpz_nb.data import RandomTokenDataset

    if seed is None:
        ds = RandomTokenDataset(100, 8, num_samples=16)
        items = [ds[2 * dp_rank + k] for k in range(2)]
        return {
            "input_ids": torch.stack([it["input_ids"] for it in items]),
            "index": torch.tensor([it["index"] for it in items]),
        }
    # Other keys, shapes and dtypes than the first round: a peer that assumes
    # them instead of receiving them fails here. Token ids above 2**24 do not
    # survive a trip through float32: packing every tensor into one float
    # buffer changes their bytes.
    g = torch.Generator().manual_seed(seed + dp_rank)
    rows, cols = (int(v) for v in torch.randint(3, 12, (2,), generator=g))
    return {
        "mask": torch.rand(rows, cols, generator=g),
        "input_ids": torch.randint(2**24, 2**40, (rows, cols), generator=g),
        "index": torch.arange(rows, dtype=torch.int32) + 100 * dp_rank,
    }


def batch_spec(batch: dict) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """Shape, dtype and digest of each tensor of ``batch``, by key (in no order)."""
    from ezpz_nb.ledger import batch_digest

    return {
        k: (tuple(v.shape), str(v.dtype), batch_digest(v))
        for k, v in batch.items()
        if isinstance(v, torch.Tensor)
    }


def job_send(fn: Callable, seed: int) -> Any:
    """Exercise 5: per round, the leader's batch spec sent and what this rank got."""
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    rounds = []
    for s in (None, seed):
        batch = leader_batch(lay.dp_rank, s) if lay.tp_rank == 0 else None
        sent = batch_spec(batch) if batch is not None else None  # before fn can touch it
        out = fn(batch, lay.tp_group)
        got = (
            batch_spec(out)
            if isinstance(out, dict)
            else "None"
            if out is None
            else f"a {type(out).__name__}"
        )
        rounds.append((sent, got))
    return lay.tp_rank, rounds


def check_send_batch(
    fn: Callable[[Any, Any], dict],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 5: ``fn(batch, group)``: the leader's dict of tensors reaches its peers.

    4 ranks as dp 2 x tp 2. Each TP leader holds a batch (``input_ids`` int64
    [2, 8], ``index`` int64 [2]); its peer passes ``None`` and knows no shapes.
    Every rank must return a dict with the leader's keys, shapes, dtypes and
    exact bytes, compared key by key (the dict's order does not matter). A
    second call sends a batch with other keys, shapes and dtypes, and token ids
    above ``2**24``, which a trip through float32 would change.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        got = run_learner(job_send, fn, seed, timeout=timeout, cluster=cluster)
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
