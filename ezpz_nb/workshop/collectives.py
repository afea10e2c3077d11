"""Notebook 05, exercises 1-2 (after notebook 01): a sum over ranks, a leader's values in a group.

``check_global_sum(fn)``: ``fn(x)`` returns the element-wise sum of ``x`` over all
ranks; ``check_share_from_leader(fn)``: ``fn(x, group)`` gives every rank of ``group``
its leader's ``x``. Each checker runs the learner's function on 4 real gloo ranks
through the job beside it and judges what the ranks returned. A job builds one
rank's inputs, calls the learner's function and sends back only plain values; the
values to sum or share come from a seed drawn per check, so a hard-coded answer
fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, as_text, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_global_sum", "check_share_from_leader"]


def _draw(seed: int, low: int, high: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Integer-valued floats in ``[low, high)``, the same on every rank for one seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).float()


def _tensor_or_type(out: Any) -> Any:
    """A returned tensor as a detached copy; anything else as it is (the checker names it)."""
    return out.detach().clone() if isinstance(out, torch.Tensor) else out


# ----------------------------------------------------------------- 1. all_reduce
def sum_inputs(world: int, seed: int | None) -> list[torch.Tensor]:
    """Each rank's input: the documented ``[r + 1, 10 r]``, or with a seed fresh values."""
    if seed is None:
        return [torch.tensor([r + 1.0, 10.0 * r]) for r in range(world)]
    # Values of 100 or more: their sum is never the first round's, so an answer
    # that ignores the ranks' data cannot pass both rounds.
    return list(_draw(seed, 100, 1000, (world, 2)).unbind(0))


def job_global_sum(fn: Callable, seed: int) -> Any:
    """Exercise 1: ``fn`` on the documented input, then on one drawn from ``seed``."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = [_tensor_or_type(fn(sum_inputs(world, s)[r].clone())) for s in (None, seed)]
    return None if outs[0] is None else outs


def check_global_sum(
    fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 1: ``fn(x)`` returns the element-wise sum of ``x`` over all ranks.

    Rank ``r`` passes ``[r + 1, 10 r]`` on 4 ranks; every rank must return ``[10, 60]``.
    Then every rank calls ``fn`` again with values drawn for this check, so an
    answer that does not depend on the ranks' data fails.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        got = run_learner(job_global_sum, fn, seed, timeout=timeout, cluster=cluster)
        world = len(got)
        for k, s in enumerate((None, seed)):
            again = " (second call, other inputs)" if k else ""
            inputs = sum_inputs(world, s)
            want = torch.stack(inputs).sum(0)
            for r, outs in enumerate(got):
                out = outs[k]
                if not isinstance(out, torch.Tensor):
                    raise wrong(
                        f"rank {r} returned {type(out).__name__} {out!r}{again}; return a tensor."
                    )
                if out.shape == want.shape and torch.equal(out, inputs[r]):
                    raise wrong(
                        f"rank {r} returned its own input {as_text(out)} instead of the "
                        f"sum over all {world} ranks {as_text(want)}: nothing was exchanged "
                        "between the ranks. Look for the collective of notebook 01 that "
                        "combines every rank's tensor."
                    )
                if out.shape != want.shape or not torch.allclose(out.float(), want):
                    raise wrong(
                        f"rank {r} returned {as_text(out)}{again}, expected the sum over "
                        f"all ranks {as_text(want)} (inputs were "
                        f"{[as_text(i) for i in inputs]}): compute it from x."
                    )
        first = as_text(torch.stack(sum_inputs(world, None)).sum(0))
        return (
            f"All {world} ranks returned {first}, the sum of every rank's input, and the "
            "right sum again for other inputs."
        )

    return judge("global_sum", body)


# ----------------------------------------------------------------- 2. group broadcast
#: Exercise 2's layouts on 4 ranks: (groups as listed to ``new_group``, ``sort_ranks``).
#: Consecutive pairs (the documented one), strided pairs, and groups of other sizes
#: listed out of order with ``sort_ranks=False``, where the group's rank 0 is neither
#: its smallest global rank nor ``r - r % 2``: only asking the group finds the leader.
SHARE_LAYOUTS: tuple[tuple[tuple[tuple[int, ...], ...], bool], ...] = (
    (((0, 1), (2, 3)), True),
    (((0, 2), (1, 3)), True),
    (((3, 2, 1, 0),), False),
    (((2, 0, 3), (1,)), False),
)


def share_leader(groups: tuple[tuple[int, ...], ...], sort_ranks: bool, rank: int) -> int:
    """The global rank of ``rank``'s group leader: the group's rank 0 as torch numbers it."""
    members = next(g for g in groups if rank in g)
    return min(members) if sort_ranks else members[0]


def share_inputs(world: int, seed: int) -> list[torch.Tensor]:
    """Each rank's 3 values, drawn per check: a leader's values must really travel."""
    return list(_draw(seed, 100, 1000, (world, 3)).unbind(0))


def job_share(fn: Callable, seed: int) -> Any:
    """Exercise 2: per layout, rank ``r`` passes its drawn values and its group."""
    r, world = dist.get_rank(), dist.get_world_size()
    outs = []
    for k, (groups, sort_ranks) in enumerate(SHARE_LAYOUTS):
        # Every rank creates every group, in the same order (new_group's contract).
        made = [dist.new_group(list(g), sort_ranks=sort_ranks) for g in groups]
        mine = next(pg for g, pg in zip(groups, made, strict=True) if r in g)
        x = share_inputs(world, seed + k)[r]
        outs.append(_tensor_or_type(fn(x.clone(), mine)))
    return None if all(o is None for o in outs) else outs


# ----------------------------------------------------------------- 2. group broadcast
def _layout_words(groups: tuple[tuple[int, ...], ...], sort_ranks: bool) -> str:
    listed = ", ".join(str(list(g)) for g in groups)
    return f"groups {listed}" + ("" if sort_ranks else " made with sort_ranks=False")


def check_share_from_leader(
    fn: Callable[[torch.Tensor, Any], torch.Tensor],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 2: ``fn(x, group)`` gives every rank of ``group`` the group leader's ``x``.

    4 ranks, several layouts in turn (:data:`SHARE_LAYOUTS`):
    consecutive pairs ``[0, 1]``, ``[2, 3]``; strided pairs; and groups of other
    sizes made with ``new_group(..., sort_ranks=False)``, whose rank 0 is the
    first rank listed, not the smallest. Each rank holds 3 values drawn for this
    check and layout. Every rank must return its group's rank 0's values: only
    asking the group tells which rank that is, and only a collective what it holds.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    def body() -> str:
        seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        got = run_learner(job_share, fn, seed, timeout=timeout, cluster=cluster)
        world = len(got)
        for k, (groups, sort_ranks) in enumerate(SHARE_LAYOUTS):
            inputs = share_inputs(world, seed + k)
            where = f" (layout {k + 1}: {_layout_words(groups, sort_ranks)})"
            for r in range(world):
                out = got[r][k] if isinstance(got[r], list) else got[r]
                leader = share_leader(groups, sort_ranks, r)
                want = inputs[leader]
                if not isinstance(out, torch.Tensor):
                    raise wrong(
                        f"rank {r} returned {type(out).__name__} {out!r}{where}; return a tensor."
                    )
                if out.shape == want.shape and torch.equal(out.float(), want):
                    continue
                held = [
                    q
                    for q in range(world)
                    if out.shape == want.shape and torch.equal(out.float(), inputs[q])
                ]
                if r != leader and held == [r]:
                    raise wrong(
                        f"rank {r} still holds its own values {as_text(out)}{where}: it "
                        f"received nothing from its leader, global rank {leader}, the "
                        "rank its group numbers 0."
                    )
                if held:
                    raise wrong(
                        f"rank {r} holds rank {held[0]}'s values{where}, but its group's "
                        f"rank 0 is global rank {leader}. The leader is whichever rank "
                        "the group numbers 0, not a rank you compute from rank numbers "
                        "(the smallest member, r - r % 2): ask the group, and broadcast "
                        "inside it."
                    )
                raise wrong(
                    f"rank {r} holds {as_text(out)}{where}, expected its group leader's "
                    f"values {as_text(want)} (global rank {leader}'s, drawn for this "
                    "check): only a collective inside the group can bring them."
                )
        return (
            f"In all {len(SHARE_LAYOUTS)} layouts (consecutive and strided pairs, "
            "groups of 1, 3 and 4 listed out of order) every rank held its group "
            "leader's values."
        )

    return judge("share_from_leader", body)
