"""``check_resume``: does a run stopped and resumed in fresh ranks see what a straight run sees?"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ezpz_nb.ledger import Ledger, StepRecord, check_records
from ezpz_nb.verify.contract import check_args, parse_layout
from ezpz_nb.verify.hints import resume_hint
from ezpz_nb.verify.judge import findings_from, judge
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.ranks import Ranks, run_ranks
from ezpz_nb.verify.report import Finding, Report, VerifyError

__all__ = ["SCENARIOS", "check_resume"]

#: The ways to stop a run, each a chain of stops ``(epoch, steps into the part)``
#: computed from the straight run's steps per epoch ``n``.
SCENARIOS: dict[str, Callable[[int], list[tuple[int, int]]]] = {
    "mid-epoch": lambda n: [(0, max(1, n // 2))],
    "epoch boundary": lambda n: [(1, 0)],
    # Stopped again before the resumed part took a step: state that was just loaded.
    "right after a resume": lambda n: [(0, max(1, n // 2)), (0, 0)],
    # The chain: resume, take a step, save, resume again. A state that stays at the
    # loaded position (prime-rl #3332) or counts only since the resume (datasets
    # #8308) passes every stop above and fails here.
    "steps after a resume": lambda n: [(0, max(1, n // 3)), (0, 1)],
}


#: Why a resumed batch holds the straight run's samples with other contents.
DRAWS_HINT = (
    "the resumed loader drew other random values (masks, crops, noise): its RNG's state "
    "was not saved and restored with its place (put generator.get_state() in state_dict)"
)


def _divergence(
    scenario: str, straight: Ledger, merged: Ledger, names: Mapping[int, str], changed: str,
    draws: bool = False,
) -> list[Finding]:  # fmt: skip
    out = []

    def same(x: StepRecord, y: StepRecord) -> bool:
        # draws: the batches' contents (digests) must match too, not only their ids.
        return x.sample_ids == y.sample_ids and (not draws or x.digest == y.digest)

    for epoch in straight.epochs():
        for rank in straight.ranks():
            a, b = straight.steps(rank, epoch), merged.steps(rank, epoch)
            at = next(
                (i for i in range(max(len(a), len(b)))
                 if i >= len(a) or i >= len(b) or not same(a[i], b[i])),
                None,
            )  # fmt: skip
            if at is None:
                continue
            got = b[at] if at < len(b) else None
            want = a[at] if at < len(a) else None
            sample = next(
                (
                    i
                    for i in (got.sample_ids if got else ())
                    if not want or i not in want.sample_ids
                ),
                got.sample_ids[0] if got and got.sample_ids else None,
            )
            worker = None
            if (
                got is not None
                and sample in got.sample_ids
                and len(got.worker_ids) == len(got.sample_ids)
            ):
                worker = got.worker_ids[got.sample_ids.index(sample)]
            said = (f"got {list(got.sample_ids)[:6]}" if got else "got no batch") + (
                f", the straight run {list(want.sample_ids)[:6]}"
                if want
                else ", the straight run had none"
            )
            redrawn = bool(got and want and got.sample_ids == want.sample_ids)
            if got and redrawn:
                said = f"the same samples {list(got.sample_ids)[:6]} with other contents"
            out.append(
                Finding(
                    "resume",
                    "divergence",
                    epoch,
                    f"[{scenario}] epoch {epoch}: rank {rank} first differs from the straight "
                    f"run at step {at} ({said}).",
                    rank=rank,
                    step=at,
                    sample=None if sample is None else names.get(sample, str(sample)),
                    worker=worker,
                    hint=DRAWS_HINT if redrawn else resume_hint(a, b, at, changed, scenario),
                )  # fmt: skip
            )
            break  # the first rank that diverges in this epoch; later epochs still count
    return out


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
        cluster: Run the parts of ``cluster``'s world size on its warm ranks (each
            part still builds a fresh loader and loads the saved state, as under
            torchrun) instead of fresh ranks: many checks then pay the starts once.
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
                    timeout=timeout, start_method=start_method, cluster=cluster)  # fmt: skip
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
    run: dict[str, Any] = dict(timeout=timeout, start_method=start_method, key=key)

    def on(g: Grid) -> Any:
        return cluster if cluster is not None and cluster.world_size == g.world_size else None

    straight = run_ranks(make_loader, grid, epochs=epochs, options=opts, cluster=on(grid), **run)
    name = getattr(make_loader, "__qualname__", type(make_loader).__name__)
    what = f"resuming {name} on {grid}" + (f", resumed on {grid2}" if grid2 != grid else "")
    report = judge(
        straight, what=what, grid=grid, epochs=epochs, key=key, num_samples=None,
        shuffle=None, wall_s=0.0,
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
    names = {i: n for o in straight.outcomes for i, n in o.names.items()}
    n = report.ledger.num_samples
    universe = None if n is not None else {i for r in report.ledger.records for i in r.sample_ids}
    for scenario in scenarios:
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
                    stop=absolute, states=states, options=o, cluster=on(g), **run,
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
            parts.append(Ledger([r for x in part.outcomes for r in x.records]))
            for x in part.outcomes:
                names.update(x.names)
            if absolute is not None:
                states = _states(part, grid2.world_size)
                at_epoch = absolute[0]
        else:
            report.findings += _judge_parts(
                scenario, parts, report.ledger, n, universe, names, changed, grid2 != grid,
                getattr(make_loader, "compare_draws", False),
            )  # fmt: skip
    report.scenarios = list(scenarios)
    report.seconds["wall"] = time.perf_counter() - t0
    return report


def _judge_parts(
    scenario: str,
    parts: list[Ledger],
    straight: Ledger,
    n: int | None,
    universe: set[int] | None,
    names: Mapping[int, str],
    changed: str,
    moved: bool = False,
    draws: bool = False,
) -> list[Finding]:
    """Exactly-once over the joined parts, and where they first leave the straight run.

    Resumed at another layout (``moved``), a rank's share of the rest of the epoch is
    cut anew, so its batches differ from the straight run's even when the loader
    re-shards its position exactly (MosaicML streaming does): there the divergence
    is expected as long as the joined parts saw every sample exactly once.
    With ``draws`` (the factory's ``compare_draws``) a batch must also hold the
    straight run's contents (its digest): a loader that forgets its RNG resumes
    with the right samples and other masks.
    """
    merged = Ledger.merge_runs(*parts)
    problems = [
        p
        for p in check_records(merged.records, n, universe=universe)
        if p.kind in ("dp_duplicate", "never_seen", "rank_duplicate")
    ]
    out = [
        replace(f, message=f"[{scenario}] {f.message}")
        for f in findings_from(problems, merged, names)
    ]
    diverged = _divergence(scenario, straight, merged, names, changed, draws)
    if moved and not problems:
        why = (
            "resumed at another layout: each rank's share of the rest of the epoch is cut "
            "anew, and the joined parts still saw every sample exactly once"
        )
        diverged = [replace(f, expected=why, hint="") for f in diverged]
    return out + diverged
