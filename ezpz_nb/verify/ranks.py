"""Start the ranks of a check (or run in place under torchrun) and collect what they observed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.ledger import StepRecord
from ezpz_nb.verify.observe import Grid, Outcome, Ready, run_rank
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.writes import run_rank_watched

__all__ = ["Ranks", "run_ranks"]

# A rank stops iterating at this share of the timeout, so an endless loader is
# reported as such (with what it yielded) before the launcher's timeout stops it.
_BUDGET_SHARE = 0.75


@dataclass
class Ranks:
    """What the ranks of one run gave back: outcomes, and where any hung."""

    outcomes: list[Outcome]
    hung: dict[int, str] = field(default_factory=dict)  # rank -> where it was blocked
    in_collective: set[int] = field(
        default_factory=set
    )  # hung ranks with a collective on the stack


def _raise_failures(outcomes: Iterable[Outcome]) -> None:
    failed = sorted(
        (o for o in outcomes if o.phase in ("factory", "iterate", "key")), key=lambda o: o.rank
    )
    if not failed:
        return
    o = failed[0]
    what = {
        "factory": "make_loader raised",
        "iterate": "iterating the loader raised",
        "key": "its batches cannot be told apart",
    }[o.phase]
    others = f" (also on ranks {[f.rank for f in failed[1:]]})" if len(failed) > 1 else ""
    raise VerifyError(f"rank {o.rank}: {what}{others}:\n{o.error.rstrip()}", rank=o.rank)


def _check_structures(outcomes: list[Outcome]) -> None:
    seen = {o.rank: o.structure for o in outcomes if o.structure}
    if len(set(seen.values())) > 1:
        base = min(seen)
        odd = min(r for r, s in seen.items() if s != seen[base])
        raise VerifyError(
            f"rank {odd}'s batches have another structure than rank {base}'s:\n"
            f"  rank {base}: {seen[base]}\n  rank {odd}: {seen[odd]}\n"
            "Every rank must build the same loader (only its shard may differ): the "
            "training step would treat the batches differently.",
            rank=odd,
        )


def run_ranks(
    make_loader: Callable[..., Any],
    grid: Grid,
    *,
    timeout: float,
    start_method: str | None = None,
    cluster: Any = None,
    **job: Any,
) -> Ranks:
    """Run :func:`~ezpz_nb.verify.observe.run_rank` on ``grid``'s ranks (or in place under torchrun).

    Raises:
        VerifyError: The factory failed, hung or made batches of different
            structure on some rank, or a rank process died; names the rank.
    """
    from ezpz_nb.launcher.errors import HangError, RankError, WorldSizeError
    from ezpz_nb.launcher.on_ranks import run_on_ranks

    args = (make_loader, grid, job.pop("epochs"), job.pop("key"), timeout * _BUDGET_SHARE)
    # A resume check watches the files the loader writes (a position kept beside the state).
    job_fn: Callable[..., Any] = run_rank_watched if job.pop("watch_writes", False) else run_rank
    try:
        # On a cluster, its ranks are kept between checks: imports (datasets...) are paid
        # once per rank; the timeout holds for this run only.
        outcomes = run_on_ranks(
            job_fn, args, job, world_size=grid.world_size, timeout=timeout, cluster=cluster,
            start_method=start_method, what=f"layout {grid}",
        )  # fmt: skip
    except WorldSizeError as exc:
        raise VerifyError(str(exc)) from None
    except HangError as exc:
        published = [e.item for e in exc.events]
        _raise_failures(x for x in published if isinstance(x, Outcome))
        ready = {x.rank for x in published if isinstance(x, Ready)}
        stuck = {r: s.describe() for r, s in exc.stacks.items() if s.state != "finished"}
        in_factory = sorted(set(stuck) - ready)
        if in_factory:
            raise VerifyError(
                f"rank {in_factory[0]}: make_loader did not return within {timeout:g} s "
                f"(ranks {in_factory} still inside it):\n  "
                + "\n  ".join(stuck.values())
                + "\nAll ranks were stopped.",
                rank=in_factory[0],
            ) from exc
        records: dict[int, list[StepRecord]] = {}
        for x in published:
            for rec in x if isinstance(x, list) else [x]:
                if isinstance(rec, StepRecord):
                    records.setdefault(rec.rank, []).append(rec)
        partial = [Outcome(rank=r, records=records.get(r, [])) for r in range(grid.world_size)]
        inside = {r for r, s in exc.stacks.items() if s.in_collective}
        return Ranks(partial, hung=stuck, in_collective=inside)
    except RankError as exc:
        raise VerifyError(
            f"rank {exc.ranks[0] if exc.ranks else '?'} died while running the loader "
            f"(no Python exception to report):\n{exc}",
            rank=exc.ranks[0] if exc.ranks else None,
        ) from exc
    _raise_failures(outcomes)
    _check_structures(outcomes)
    return Ranks(list(outcomes))
