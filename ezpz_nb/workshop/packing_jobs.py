"""What runs on the ranks for the two text exercises of notebook 11 (checkers: :mod:`.packing_exercises`).

The documents are made so that every token says where it came from: token
``1 + 1000 * doc + offset`` is token ``offset`` of document ``doc``, and ``0`` is
padding. A checker can then tell, from ``input_ids`` alone, which token of which
document sits where, without trusting anything the learner's code says about itself.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PAD", "budget_lengths", "decode_token", "job_budget_plan", "job_pack", "pack_docs"]

#: The padding id the exercise gives the learner.
PAD = 0
_STRIDE = 1000


def decode_token(token: int) -> tuple[int, int]:
    """``(doc, offset)`` of a token made by :func:`pack_docs`; ``(-1, -1)`` for padding."""
    if token == PAD:
        return (-1, -1)
    return (token - 1) // _STRIDE, (token - 1) % _STRIDE


def pack_docs(seed: int, n: int, row_len: int) -> list[list[int]]:
    """``n`` documents of 1 to ``3 * row_len`` tokens (some longer than a row), drawn per check."""
    rng = random.Random(seed)
    lengths = [
        rng.choice((rng.randint(1, row_len // 2), rng.randint(1, 3 * row_len))) for _ in range(n)
    ]
    return [[1 + _STRIDE * d + t for t in range(k)] for d, k in enumerate(lengths)]


def _plain(x: Any, name: str) -> list[Any]:
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    return x.detach().to(torch.int64).tolist()


def job_pack(fn: Callable, docs: list[list[int]], row_lens: list[int], per_call: int) -> Any:
    """Notebook 11, exercise 1: this rank's documents (dealt round-robin), packed ``per_call`` at a time.

    Call ``c`` packs at ``row_lens[c % len(row_lens)]``: a check asks for two row lengths.
    Returns, per call, the ``input_ids``, ``position_ids`` and ``mask`` the learner's
    ``fn(list_of_token_tensors, row_len)`` returned, as plain lists.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = docs[rank::world]
    calls = []
    for c, k in enumerate(range(0, len(mine), per_call)):
        row_len = row_lens[c % len(row_lens)]
        out = fn([torch.tensor(d, dtype=torch.int64) for d in mine[k : k + per_call]], row_len)
        if out is None:
            return None
        if not isinstance(out, dict):
            raise TypeError(f"return a dict of tensors, got {type(out).__name__}")
        missing = {"input_ids", "position_ids", "mask"} - set(out)
        if missing:
            raise KeyError(f"the returned dict has no {sorted(missing)}")
        calls.append({k: _plain(out[k], k) for k in ("input_ids", "position_ids", "mask")})
    return calls


def budget_lengths(seed: int, n: int, longest: int, budget: int, world: int) -> list[int]:
    """Notebook 11, exercise 2: ``n`` document lengths from 2 to ``longest``, drawn per check.

    Drawn again until replicas that plan their own shard (dealt round-robin, or in
    contiguous blocks) get unequal batch counts: about one draw in eight would give
    equal counts by luck, and let a plan that does not keep counts equal pass.
    """
    from ezpz_nb.text.plan import budget_batches

    rng = random.Random(seed)
    while True:
        lengths = [rng.randint(2, longest) for _ in range(n)]
        block = -(-n // world)
        for shards in (
            [range(r, n, world) for r in range(world)],
            [range(r * block, min(n, (r + 1) * block)) for r in range(world)],
        ):
            if len({len(budget_batches(lengths, list(s), budget)) for s in shards}) == 1:
                break
        else:
            return lengths


def job_budget_plan(fn: Callable, lengths: list[int], budget: int) -> Any:
    """Notebook 11, exercise 2: this rank's plan, and the steps it took with a gradient all-reduce each.

    The ranks first compare their counts (one all_gather); only when they agree do
    they run the loop, each step one all-reduce, so a wrong plan is reported as
    unequal counts instead of waiting out a hang.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = fn(list(lengths), rank, world, budget)
    if plan is None:
        return None
    plan = [[int(i) for i in batch] for batch in plan]
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([len(plan)]))
    steps = 0
    if len({int(c) for c in counts}) == 1:
        for batch in plan:
            grad = torch.tensor([float(sum(lengths[i] for i in batch))])
            dist.all_reduce(grad)  # stands in for the gradient all-reduce
            steps += 1
    return plan, steps
