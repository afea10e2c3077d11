"""``check_contract``: run a loader factory on real ranks and judge what each rank got."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ezpz_nb.ledger.memory import BUDGET, MIB, summarise
from ezpz_nb.verify.batches import KEYS
from ezpz_nb.verify.judge import judge
from ezpz_nb.verify.observe import Grid, Outcome
from ezpz_nb.verify.ranks import run_ranks
from ezpz_nb.verify.report import Finding, Report, VerifyError

__all__ = ["check_contract", "judge_memory", "parse_layout"]

_COPY_HINT = (
    "a dataset of Python objects (a list of dicts or strings) in a forked worker is copied "
    "page by page as reference counts are touched: hold it as numpy arrays, an Arrow table "
    "or a memory-mapped file (docs/memory.md)"
)


def parse_layout(layout: str | Mapping[str, int] | Grid) -> Grid:
    """``"dp=2,tp=2"`` (or ``{"dp": 2, "tp": 2}``; ``cp`` optional) as a :class:`Grid`.

    Raises:
        VerifyError: Unknown names, or sizes that are not positive ints.
    """
    if isinstance(layout, Grid):
        return layout
    if isinstance(layout, str):
        sizes: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in layout.split(","))):
            name, eq, value = (x.strip() for x in part.partition("="))
            if not eq or not value.isdigit():
                raise VerifyError(
                    f"layout {layout!r}: {part!r} is not NAME=SIZE; write it as dp=2,tp=2 "
                    "(and cp=N if any)"
                )
            if name in sizes:
                raise VerifyError(
                    f"layout {layout!r}: {name} is given twice ({name}={sizes[name]} and "
                    f"{name}={value}); give each axis once, e.g. 'dp=2,tp=2'"
                )
            sizes[name] = int(value)
    elif isinstance(layout, Mapping):
        sizes = dict(layout)
    else:
        raise VerifyError(f"layout must be a string like 'dp=2,tp=2' or a dict, got {layout!r}")
    unknown = sorted(set(sizes) - {"dp", "tp", "cp"})
    if unknown or not sizes:
        raise VerifyError(
            f"layout {layout!r}: "
            + (f"unknown axis {unknown[0]!r}; " if unknown else "no axis; ")
            + "the axes are dp, tp and optionally cp, e.g. 'dp=2,tp=2' (4 ranks)"
        )
    bad = [k for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise VerifyError(
            f"layout {layout!r}: {bad[0]}={sizes[bad[0]]!r} is not a positive int; every axis "
            "needs at least one rank, e.g. 'dp=2,tp=2' (4 ranks)"
        )
    return Grid(sizes.get("dp", 1), sizes.get("tp", 1), sizes.get("cp", 1))


def check_args(make_loader: Any, grid: Grid, epochs: Any, key: Any, timeout: Any) -> None:
    """Reject bad input before any rank starts."""
    from ezpz_nb.launcher import MAX_WORLD_SIZE

    if not callable(make_loader):
        raise VerifyError(
            f"make_loader must be a function taking the rank's Layout and returning a loader, "
            f"got {type(make_loader).__name__}: def make_loader(layout): return DataLoader(...)"
        )
    if grid.world_size > MAX_WORLD_SIZE:
        raise VerifyError(f"layout {grid} needs {grid.world_size} ranks; at most {MAX_WORLD_SIZE}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise VerifyError(f"epochs must be a positive int, got {epochs!r}")
    if not isinstance(key, str) or not key:
        raise VerifyError(
            f"key must be {' or '.join(map(repr, KEYS))} or a field name, got {key!r}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise VerifyError(f"timeout must be a number of seconds > 0, got {timeout!r}")


def _memory_args(bound: Any, budget: Any) -> None:
    if bound is not None and (
        isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound < 0
    ):
        raise VerifyError(
            f"max_worker_growth_mib must be a number of MiB >= 0 (or None), got {bound!r}"
        )
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1:
        raise VerifyError(
            f"memory_budget must be a share of wall time in (0, 1], e.g. 0.01, got {budget!r}"
        )


def judge_memory(report: Report, outcomes: list[Outcome], bound_mib: float | None) -> Report:
    """Fill ``report.memory`` from the ranks' samples and judge its ``worker_memory`` rule.

    Without a bound the rule is "not asked" (the figures are shown; a PASS stays a
    PASS). With one, a worker whose private memory grew by more than ``bound_mib``
    over its epoch is a violation; no worker read twice (no workers, a platform
    that cannot read memory, a loop too short for the sampler's budget) leaves it
    "not judged".
    """
    growth = summarise(s for o in outcomes for s in o.memory)
    report.memory = [
        {"rank": g.rank, "worker": g.worker, "epoch": g.epoch, "start_mib": g.start / MIB,
         "peak_mib": g.peak / MIB, "growth_mib": g.growth / MIB, "samples": g.samples}
        for g in growth
    ]  # fmt: skip
    # One reading is no growth: a worker counts only when read at least twice.
    judged = [g for g in growth if g.worker >= 0 and g.samples >= 2]
    worst = max(judged, key=lambda g: g.growth, default=None)
    if bound_mib is None:
        said = (
            f"largest worker growth {worst.growth / MIB:+.1f} MiB ({worst.name}, epoch "
            f"{worst.epoch}); pass max_worker_growth_mib to judge it"
            if worst is not None
            else "no worker read twice within memory_budget (memory_budget=1.0 reads at every "
            "step); pass max_worker_growth_mib to judge it"
        )
        report.not_asked["worker_memory"] = said
    elif worst is None:
        report.not_judged["worker_memory"] = (
            "no DataLoader worker's memory was read twice (num_workers=0, an iterator "
            "without torch's workers, a platform where it cannot be read, or a loop too "
            "short for memory_budget: pass memory_budget=1.0 to read at every step)"
        )
    elif worst.growth > bound_mib * MIB:
        report.findings.append(
            Finding(
                "worker_memory", "worker_growth", worst.epoch,
                f"{worst.name}'s private memory grew by {worst.growth / MIB:.1f} MiB over "
                f"epoch {worst.epoch} (peak {worst.peak / MIB:.1f} MiB), above the bound of "
                f"{bound_mib:g} MiB",
                rank=worst.rank, worker=worst.worker, hint=_COPY_HINT, ranks=[worst.rank],
            )
        )  # fmt: skip
    return report


def check_contract(
    make_loader: Callable[..., Any],
    layout: str | Mapping[str, int] | Grid = "dp=2",
    *,
    epochs: int = 2,
    key: str = "auto",
    num_samples: int | None = None,
    shuffle: bool | None = None,
    timeout: float = 60.0,
    start_method: str | None = None,
    cluster: Any = None,
    max_worker_growth_mib: float | None = None,
    memory_budget: float = BUDGET,
) -> Report:
    """Run ``make_loader`` on real ranks and check the distributed data contract.

    Every rank calls ``make_loader(layout)`` with its
    :class:`~ezpz_nb.data.groups.Layout` (``dp_rank``, ``tp_rank``, ``cp_rank``, the
    groups), iterates the loader for ``epochs`` epochs (calling ``set_epoch`` on
    it or its sampler before each) and records each batch. No collective runs
    while it iterates, so unequal step counts are measured, not hung on. Then the
    rules of :mod:`ezpz_nb.ledger.checks` judge the records: TP/CP peers hold
    identical bytes at every step (CP peers their own slices, which together must hold
    each of a few samples read again from the dataset: :mod:`~ezpz_nb.verify.cp_slices`);
    DP replicas hold disjoint samples; every
    sample is seen exactly once per epoch (or the report says why not, e.g.
    ``drop_last``); every rank takes the same number of steps; the global batch
    keeps its size; the order changes between epochs when shuffling.

    Under torchrun it runs in place on torchrun's ranks (the layout must match
    ``WORLD_SIZE``) and every rank gets the report.

    Args:
        make_loader: ``make_loader(layout) -> iterable of batches``; defined in a
            notebook cell or a module (it is sent to the ranks by value).
        layout: ``"dp=2,tp=2"`` (``cp=N`` optional), a dict, or a ``Grid``.
        epochs: Epochs to run.
        key: How to tell samples apart: ``"auto"`` (an ``index`` field, else a
            ``__key__`` as webdataset and streaming give), a field name, or
            ``"digest"`` (a sample's bytes: identical samples count as one).
        num_samples: Dataset length for the exactly-once rule; by default the
            loader's ``len(loader.dataset)``, else every id any epoch saw.
        shuffle: Check that the order changes between epochs; by default when
            the loader's sampler says it shuffles.
        timeout: Seconds for the whole run; a loader still running at 3/4 of
            it is reported as endless, a hung one is stopped and reported.
        start_method: The launcher's start method (see :func:`ezpz_nb.launch`).
        cluster: Run on this :class:`ezpz_nb.Cluster` (its world size must
            match the layout) instead of fresh ranks: several checks then pay
            the ranks' imports once. Its ranks are stopped if the loader hangs.
        max_worker_growth_mib: The ``worker_memory`` rule's bound: a DataLoader
            worker whose private memory grows by more over its epoch fails it.
            None (the default): the peak and growth of each rank and worker are
            reported, the rule is "not asked" and never stops a PASS.
        memory_budget: Share of wall time the memory readings may take
            (:class:`~ezpz_nb.ledger.memory.MemorySampler`; 1.0 reads at every step).

    Returns:
        A :class:`~ezpz_nb.verify.Report` (``.ok``, ``.table()``, ``.to_json()``).

    Raises:
        VerifyError: Bad arguments (before any rank starts), or the factory
            raised, hung, returned something not iterable or batches of another
            structure on some rank, or batches without sample ids: names the rank.
    """
    grid = parse_layout(layout)
    check_args(make_loader, grid, epochs, key, timeout)
    _memory_args(max_worker_growth_mib, memory_budget)
    t0 = time.perf_counter()
    ranks = run_ranks(
        make_loader,
        grid,
        timeout=timeout,
        start_method=start_method,
        cluster=cluster,
        epochs=epochs,
        key=key,
        memory_budget=float(memory_budget),
        # Picks the samples a CP layout's ranks keep (verify.cp_slices), unknown to the loader.
        salt=random.SystemRandom().getrandbits(32),
    )
    name = getattr(make_loader, "__qualname__", type(make_loader).__name__)
    report = judge(
        ranks, what=f"{name} on {grid}", grid=grid, epochs=epochs, key=key,
        num_samples=num_samples, shuffle=shuffle, wall_s=time.perf_counter() - t0,
    )  # fmt: skip
    return judge_memory(report, ranks.outcomes, max_worker_growth_mib)
