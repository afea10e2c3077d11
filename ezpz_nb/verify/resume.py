"""``check_resume``: does a run stopped and resumed in fresh ranks see what a straight run sees?"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ezpz_nb.ledger import Ledger
from ezpz_nb.verify.contract import check_args, parse_layout
from ezpz_nb.verify.divergence import Evidence, judge_parts, one_cause
from ezpz_nb.verify.judge import epoch_universe, judge
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.ranks import Ranks, run_ranks
from ezpz_nb.verify.report import Finding, Report, VerifyError

__all__ = ["SCENARIOS", "check_resume"]

#: The ways to stop a run, each a chain of stops ``(epoch, steps into the part)``
#: computed from the straight run's steps per epoch ``n``.
SCENARIOS: dict[str, Callable[[int], list[tuple[int, int]]]] = {
    "mid-epoch": lambda n: [(0, max(1, n // 2))],
    # Saved after the epoch's iterator ended (a loop that saves once per epoch).
    "epoch boundary": lambda n: [(1, 0)],
    # Saved right after an epoch's last batch, before its iterator ends: where a loop
    # that saves every k steps saves. A position taken modulo the epoch's length reads 0
    # there and replays the whole epoch.
    "after an epoch's last batch": lambda n: [(0, n)],
    # Saved right after the first batch of the second epoch (after its set_epoch).
    "after an epoch's first batch": lambda n: [(1, 1)],
    # Stopped again before the resumed part took a step: state that was just loaded.
    "right after a resume": lambda n: [(0, max(1, n // 2)), (0, 0)],
    # The chain: resume, take a step, save, resume again. A state that stays at the
    # loaded position (prime-rl #3332) or counts only since the resume (datasets
    # #8308) passes every stop above and fails here.
    "steps after a resume": lambda n: [(0, max(1, n // 3)), (0, 1)],
}


def _states(ranks: Ranks, world: int) -> list[Any]:
    saved = [o.state for o in sorted(ranks.outcomes, key=lambda o: o.rank)]
    if any(s is None for s in saved):
        missing = [o.rank for o in ranks.outcomes if o.state is None]
        raise VerifyError(
            f"rank {missing[0]}: the loader gave no state to resume from (it ran out before "
            "the stop, or has no state_dict()): resume checks need a loader with "
            "state_dict/load_state_dict, e.g. torchdata's StatefulDataLoader",
            rank=missing[0],
        )
    # Another world size: rank r resumes from the state of old rank r (mod the old
    # world). A loader that cannot re-shard its state shows it in the verdict.
    return [saved[r % len(saved)] for r in range(world)]


class _Fresh:
    """Fresh ranks for one check's resumed parts, one set a world size, started when first
    needed (under torchrun none: the parts run in torchrun's processes, which stay)."""

    def __init__(self, timeout: float, start_method: str | None) -> None:
        self.timeout, self.start_method = timeout, start_method
        self.clusters: dict[int, Any] = {}

    def get(self, grid: Grid) -> Any:
        from ezpz_nb.launcher.cluster import Cluster
        from ezpz_nb.launcher.torchrun import in_torchrun_env

        if in_torchrun_env():
            return None
        at = grid.world_size
        if at not in self.clusters:
            self.clusters[at] = Cluster(grid.world_size, self.timeout,
                                        start_method=self.start_method)  # fmt: skip
        return self.clusters[at]

    def close(self) -> None:
        for c in self.clusters.values():
            c.close()


def _writes(ranks: Ranks, make_loader: Any) -> str:
    """The first file a rank's loader wrote, named with its rank ("" when none); a DCP
    check's own checkpoint folder does not count (:mod:`ezpz_nb.verify.dcp`)."""
    from ezpz_nb.verify.dcp import ThroughDcp

    own = make_loader.root if isinstance(make_loader, ThroughDcp) else None
    for o in sorted(ranks.outcomes, key=lambda o: o.rank):
        for path in o.writes:
            if own is None or not os.path.abspath(path).startswith(os.path.abspath(own)):
                return f"rank {o.rank}: {path}"
    return ""


def check_resume(
    make_loader: Callable[..., Any],
    layout: str | Mapping[str, int] | Grid = "dp=2",
    *,
    epochs: int = 2,
    scenarios: Sequence[str] = tuple(SCENARIOS),
    resume_layout: str | Mapping[str, int] | Grid | None = None,
    options: Mapping[str, Any] | None = None,
    resume_options: Mapping[str, Any] | None = None,
    key: str = "auto",
    shuffle: bool | None = None,
    num_samples: int | None = None,
    timeout: float = 60.0,
    start_method: str | None = None,
    cluster: Any = None,
    via: str = "state_dict",
) -> Report:
    """Compare a straight run with runs stopped and resumed in fresh ranks.

    The loader must have ``state_dict()`` and ``load_state_dict()`` (torchdata's
    ``StatefulDataLoader``...). For each scenario each part of the run starts
    fresh ranks (as a restarted job does; under torchrun, which cannot restart
    its processes, each part builds a fresh loader in them): it builds the loader, calls
    ``set_epoch``, loads the state the previous part saved, iterates to the next
    stop and saves ``state_dict()`` there. The parts' records are joined
    (:meth:`~ezpz_nb.ledger.Ledger.merge_runs`) and judged: exactly once per epoch,
    and the first divergence from the straight run, per epoch, with its rank,
    worker and step and a likely cause.

    Args:
        make_loader: ``make_loader(layout, **options) -> stateful loader``.
        layout: The layout of the straight run and the first part.
        epochs: Epochs of the whole run.
        scenarios: Which stops to try (keys of :data:`SCENARIOS`).
        resume_layout: Resume at another layout (another world size).
        options: Keyword arguments for ``make_loader`` (e.g. ``num_workers``).
        resume_options: Keyword arguments for the resumed parts (another
            worker count); default ``options``.
        key, timeout, start_method: As for :func:`check_contract` (timeout per part).
        shuffle: As for :func:`check_contract`: ``False`` says the order is meant to
            repeat (the reshuffle rule is then "not asked", no obstacle to a PASS).
        num_samples: As for :func:`check_contract`: the samples of one epoch, for the
            exactly-once rule where the loader's dataset does not say (the report asks
            for it then).
        cluster: Run the straight run and each first part (those of ``cluster``'s
            world size) on its warm ranks; the resumed parts always start fresh ranks,
            so that only the state carries the position (not a rank's memory). Files
            the loader writes are watched in every part (:mod:`ezpz_nb.verify.writes`):
            a loader that writes leaves the resume "not judged", naming the path.
        via: ``"state_dict"`` (each rank's state through the notebook) or ``"dcp"``
            (saved and loaded with ``torch.distributed.checkpoint``, keyed per DP
            rank, and the batches' contents compared too, so a forgotten RNG
            fails: :mod:`ezpz_nb.verify.dcp`).

    Returns:
        A :class:`Report` whose ``resume`` rule fails on a divergence.

    Raises:
        VerifyError: Bad arguments, a failing factory (naming the rank), or a
            loader without state.
    """
    if via != "state_dict":
        from ezpz_nb.verify.dcp import resume_via

        args = dict(layout=layout, epochs=epochs, scenarios=scenarios, options=options,
                    resume_layout=resume_layout, resume_options=resume_options, key=key,
                    shuffle=shuffle, num_samples=num_samples, timeout=timeout,
                    start_method=start_method, cluster=cluster)  # fmt: skip
        return resume_via(via, check_resume, make_loader, **args)
    grid = parse_layout(layout)
    grid2 = parse_layout(resume_layout) if resume_layout is not None else grid
    check_args(make_loader, grid, epochs, key, timeout)
    from ezpz_nb.launcher.torchrun import in_torchrun_env

    if in_torchrun_env() and grid2.world_size != grid.world_size:
        raise VerifyError(
            f"under torchrun the parts run in torchrun's {grid.world_size} processes: "
            f"resume_layout={grid2} needs {grid2.world_size}; check another world size "
            "from a notebook or a plain script (ranks of its own)"
        )
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        raise VerifyError(f"scenarios must be some of {list(SCENARIOS)}, got {list(scenarios)}")
    opts, opts2 = (
        dict(options or {}),
        dict(resume_options if resume_options is not None else options or {}),
    )
    t0 = time.perf_counter()
    run: dict[str, Any] = dict(timeout=timeout, start_method=start_method, key=key,
                               keep_fields=True, watch_writes=True)  # fmt: skip

    def on(g: Grid) -> Any:
        return cluster if cluster is not None and cluster.world_size == g.world_size else None

    straight = run_ranks(make_loader, grid, epochs=epochs, options=opts, cluster=on(grid), **run)
    writes = _writes(straight, make_loader)
    name = getattr(make_loader, "__qualname__", type(make_loader).__name__)
    what = f"resuming {name} on {grid}" + (f", resumed on {grid2}" if grid2 != grid else "")
    report = judge(
        straight, what=what, grid=grid, epochs=epochs, key=key, num_samples=num_samples,
        shuffle=shuffle, wall_s=0.0,
    )  # fmt: skip
    changed = ""
    if grid2 != grid:
        changed = (
            f"resumed at another layout ({grid} -> {grid2}): a saved position counts "
            "batches of the old shard, which the new shard does not match"
        )
    elif opts2 != opts:
        changed = (
            f"resumed with other loader options ({opts} -> {opts2}): a DataLoader's "
            "state is per worker and cannot be split over another worker count"
        )
    per_epoch = min(n[0] for n in report.steps.values()) if report.steps else 0
    ev = Evidence(changed=changed)
    ev.add(straight.outcomes)
    n, universe, _, _ = epoch_universe(straight.outcomes, None, bool(ev.names))
    moved = ""
    # A resumed part runs on fresh ranks, never the warm ones: what a rank kept in its
    # memory is gone, as after a restart; only the state carries over. One fresh set for
    # every resumed part of this check (its start is the cost): the first part to resume
    # there finds nothing the warm ranks kept, and a later one only what an earlier resumed
    # part kept, so a position kept in memory fails at the first.
    fresh = _Fresh(timeout, start_method)
    try:
        for scenario in scenarios:
            ev.notes.clear()  # what a load skipped speaks for its own scenario
            parts: list[Ledger] = []
            states: list[Any] | None = None
            at_epoch = 0
            for i, stop in enumerate([*SCENARIOS[scenario](per_epoch), None]):
                g, o = (grid, opts) if i == 0 else (grid2, opts2)
                # Stops count from the part's start: (epochs further, steps into that epoch).
                absolute = None if stop is None else (at_epoch + stop[0], stop[1])
                try:
                    part = run_ranks(
                        make_loader, g, epochs=epochs - at_epoch, start_epoch=at_epoch,
                        stop=absolute, states=states, options=o,
                        cluster=on(g) if i == 0 else fresh.get(g), **run,
                    )  # fmt: skip
                except VerifyError as exc:
                    if i == 0 or "make_loader raised" in str(exc):
                        raise
                    # The loader itself refused the state: that is the verdict on resuming.
                    report.findings.append(
                        Finding(
                            "resume",
                            "resume_error",
                            at_epoch,
                            f"[{scenario}] the resumed loader failed: {exc}",
                            rank=exc.rank,
                            hint=changed or "the saved state does not fit the new loader",
                        )  # fmt: skip
                    )
                    break
                writes = writes or _writes(part, make_loader)
                parts.append(Ledger([r for x in part.outcomes for r in x.records]))
                moved = moved or next((f"rank {x.rank}: {x.state_note}" for x in part.outcomes
                                       if x.state_note), "")  # fmt: skip
                ev.add(part.outcomes)
                if absolute is not None:
                    states = _states(part, grid2.world_size)
                    at_epoch = absolute[0]
            else:
                report.findings += judge_parts(
                    scenario, parts, report.ledger, n, universe, ev, moved=grid2 != grid
                )
    finally:
        fresh.close()

    report.findings = one_cause(report.findings)
    failed = any(f.rule == "resume" and f.violation for f in report.findings)
    if writes and not failed:
        report.not_judged["resume"] = (
            f"the loader wrote files while it ran ({writes}): a position kept in a file "
            "beside the state resumes on this machine only, and the check cannot tell a "
            "state from a side file; keep the position in state_dict() itself (epoch, "
            "batches taken, RNG state), or write files outside the loader"
        )
    elif moved and not failed:
        report.not_judged["resume"] = (
            f"state_dict() asked twice at one stop gave two states ({moved} differs): the "
            "state is a ticket to a position kept elsewhere (a file, the rank's memory), "
            "which a restart on another machine would not find; return the position itself "
            "(epoch, batches taken, RNG state) so that equal positions give equal states"
        )
    report.scenarios = list(scenarios)
    report.seconds["wall"] = time.perf_counter() - t0
    return report
