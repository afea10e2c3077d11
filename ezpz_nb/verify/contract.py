"""``check_contract``: run a loader factory on real ranks and judge what each rank got."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ezpz_nb.ledger import Ledger, Problem, check_records
from ezpz_nb.verify.batches import KEYS
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.ranks import Ranks, run_ranks
from ezpz_nb.verify.report import RULES, Finding, Report, VerifyError

__all__ = ["check_contract", "parse_layout"]

_BIG_INT = re.compile(r"\b\d{12,}\b")
_RULE_OF = {kind: rule for rule, (_, kinds) in RULES.items() for kind in kinds}


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
            name, eq, value = part.partition("=")
            if not eq or not value.strip().isdigit():
                raise VerifyError(f"layout {layout!r}: write it as dp=2,tp=2 (and cp=N if any)")
            sizes[name.strip()] = int(value)
    elif isinstance(layout, Mapping):
        sizes = dict(layout)
    else:
        raise VerifyError(f"layout must be a string like 'dp=2,tp=2' or a dict, got {layout!r}")
    unknown = set(sizes) - {"dp", "tp", "cp"}
    bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1}
    if unknown or bad or not sizes:
        raise VerifyError(
            f"layout {layout!r}: give positive sizes for dp, tp and optionally cp, "
            "e.g. 'dp=2,tp=2' (4 ranks)"
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


def findings_from(
    problems: Iterable[Problem], ledger: Ledger, names: Mapping[int, str]
) -> list[Finding]:
    """The ledger's problems as :class:`Finding` s, samples named by their keys."""
    by_step = {(r.rank, r.epoch, r.step): r for r in ledger.records}
    out = []

    def named(m: re.Match[str]) -> str:
        return names.get(int(m.group()), m.group())

    for p in problems:
        rank, step, sample = p.first
        worker = None
        rec = by_step.get((rank, p.epoch, step)) if rank is not None and step is not None else None
        if (
            rec is not None
            and sample in rec.sample_ids
            and len(rec.worker_ids) == len(rec.sample_ids)
        ):
            worker = rec.worker_ids[rec.sample_ids.index(sample)]
        out.append(
            Finding(
                # Ids hashed from keys read back as the keys.
                _RULE_OF[p.kind],
                p.kind,
                p.epoch,
                _BIG_INT.sub(named, p.message) if names else p.message,
                p.expected,
                rank,
                step,
                None if sample is None else names.get(sample, str(sample)),
                worker,
                ranks=list(p.ranks),
            )  # fmt: skip
        )
    return out


def judge(
    ranks: Ranks,
    *,
    what: str,
    grid: Grid,
    epochs: int,
    key: str,
    num_samples: int | None,
    shuffle: bool | None,
    wall_s: float,
) -> Report:
    """Check the records of one run and write the report."""
    outs = ranks.outcomes
    records = [r for o in outs for r in o.records]
    names: dict[int, str] = {}
    for o in outs:
        names.update(o.names)
    n = (
        num_samples
        if num_samples is not None
        else max((o.num_samples or 0 for o in outs), default=0) or None
    )
    if names:  # ids hashed from keys or bytes: range(n) means nothing
        n = None
    # Without a dataset length, an epoch must cover what the epochs saw together.
    universe = None if n is not None or epochs < 2 else {i for r in records for i in r.sample_ids}
    allow = next((o.allowance for o in outs if o.allowance is not None), None)
    if shuffle is None:
        shuffle = any(o.shuffles for o in outs)
    ledger = Ledger(records, n)
    problems = check_records(
        records, n, universe=universe, allowance=allow, shuffle=shuffle, global_batch=True
    )
    if ranks.hung:
        # After a hang the records are only what the ranks published in bunches
        # (observe._PUBLISH_S), and a finished rank's reply is not in the HangError:
        # their step counts are lower bounds set by timing, not evidence. The stack
        # showing where the rank is blocked is the evidence, so the hang is the finding.
        problems = [p for p in problems if p.kind != "step_mismatch"]
    findings = []
    for rank, where in sorted(ranks.hung.items()):
        findings.append(
            Finding(
                "equal_steps",
                "hang",
                max((r.epoch for r in records), default=0),
                f"The loader itself hung (a collective inside it never completed) after at "
                f"least {len([r for r in records if r.rank == rank])} steps: {where}. "
                "Its ranks disagree on how many batches there are, or one rank stopped "
                "early.",
                rank=rank,
                step=len([r for r in records if r.rank == rank]) or None,
            )  # fmt: skip
        )
    findings += findings_from(problems, ledger, names)
    for o in outs:
        if o.phase == "timeout":
            last = o.records[-1] if o.records else None
            findings.append(
                Finding(
                    "equal_steps",
                    "timeout",
                    last.epoch if last else 0,
                    f"Rank {o.rank} was still iterating after {len(o.records)} steps when the "
                    "time ran out: an endless stream (an IterableDataset that never stops, a "
                    "repeat()) gives no epochs to check. Cut it (take(n)) or raise timeout=.",
                    rank=o.rank,
                    step=last.step if last else None,
                )  # fmt: skip
            )
    steps = {
        o.rank: [sum(1 for r in o.records if r.epoch == e) for e in range(epochs)] for o in outs
    }
    seconds = {
        "wall": wall_s,
        "loader": sum(o.loader_s for o in outs),
        "observe": sum(o.observe_s for o in outs),
    }
    key = next((o.key for o in outs if o.key), key)  # "auto" -> the field it found
    return Report(
        what, {"dp": grid.dp, "tp": grid.tp, "cp": grid.cp}, epochs, key, findings, steps,
        seconds, ledger=ledger,
    )  # fmt: skip


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
) -> Report:
    """Run ``make_loader`` on real ranks and check the distributed data contract.

    Every rank calls ``make_loader(layout)`` with its
    :class:`~ezpz_nb.data.groups.Layout` (``dp_rank``, ``tp_rank``, ``cp_rank``, the
    groups), iterates the loader for ``epochs`` epochs (calling ``set_epoch`` on
    it or its sampler before each) and records each batch. No collective runs
    while it iterates, so unequal step counts are measured, not hung on. Then the
    rules of :mod:`ezpz_nb.ledger.checks` judge the records: TP/CP peers hold
    identical bytes at every step; DP replicas hold disjoint samples; every
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

    Returns:
        A :class:`~ezpz_nb.verify.Report` (``.ok``, ``.table()``, ``.to_json()``).

    Raises:
        VerifyError: Bad arguments (before any rank starts), or the factory
            raised, hung, returned something not iterable or batches of another
            structure on some rank, or batches without sample ids: names the rank.
    """
    grid = parse_layout(layout)
    check_args(make_loader, grid, epochs, key, timeout)
    t0 = time.perf_counter()
    ranks = run_ranks(
        make_loader,
        grid,
        timeout=timeout,
        start_method=start_method,
        cluster=cluster,
        epochs=epochs,
        key=key,
    )
    name = getattr(make_loader, "__qualname__", type(make_loader).__name__)
    return judge(
        ranks, what=f"{name} on {grid}", grid=grid, epochs=epochs, key=key,
        num_samples=num_samples, shuffle=shuffle, wall_s=time.perf_counter() - t0,
    )  # fmt: skip
