"""Evaluation and step-count checks: where a repeated or dropped sample is a violation.

``check_contract`` judges a training loader, where ``DistributedSampler``'s padding
is an expected cost. An evaluation metric has no such slack: :func:`check_eval`
fails a sample counted twice (padding) or never (``drop_last``), summing the
``weight`` field each batch carries (weight 0 marks padding), and fails unequal
step counts when the eval step makes a collective (FSDP's forward does).
:func:`check_steps` runs an endless loader for ``steps`` batches and judges that
every rank yields them all and that each epoch (read from an ``epoch`` field)
deals every sample once, the ranks' shares within one.

Each rank iterates without any collective, so unequal step counts are measured,
not hung on.
"""

from __future__ import annotations

import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.data.tree import find_in_batch
from ezpz_nb.verify.batches import observe_batch
from ezpz_nb.verify.contract import parse_layout
from ezpz_nb.verify.observe import Grid, rank_layout
from ezpz_nb.verify.outcomes import EvalReport
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = ["Seen", "check_eval", "dataset_size", "run_seen", "seen_on_rank", "seen_report"]


@dataclass
class Seen:
    """One rank's batches as ids, weights and epochs per step, or how its code failed."""

    rank: int
    ids: list[list[int]] = field(default_factory=list)
    weights: list[list[float]] = field(default_factory=list)
    epochs: list[list[int]] | None = None
    names: dict[int, str] = field(default_factory=dict)
    num_samples: int | None = None
    error: str = ""
    counts: bool = True  # the first rank of its TP/CP group: the only one whose samples count


def _flat(values: Any) -> list[Any]:
    out = values.tolist() if hasattr(values, "tolist") else values
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _dataset_length(loader: Any) -> int | None:
    # A shard wrapper (WeightedShard, Subset) keeps the whole dataset in .dataset.
    ds: Any = getattr(loader, "dataset", None)
    while hasattr(ds, "dataset"):
        ds = ds.dataset
    try:
        return len(ds)
    except TypeError:
        return None


def seen_on_rank(
    make_loader: Callable[..., Any], grid: Grid, key: str, weight: str, limit: int | None
) -> Seen:
    """Build and iterate the loader on this rank (at most ``limit`` batches); run by the launcher."""
    layout = rank_layout(grid)
    seen = Seen(layout.rank, counts=layout.tp_rank == 0 and layout.cp_rank == 0)
    try:
        loader = make_loader(layout)
        seen.num_samples = _dataset_length(loader)
        for batch in loader:
            ids, names, _, _ = observe_batch(batch, key)
            w = find_in_batch(batch, weight)
            e = find_in_batch(batch, "epoch")
            weights = [float(x) for x in _flat(w)] if w is not None else [1.0] * len(ids)
            epochs = [int(x) for x in _flat(e)] if e is not None else None
            if len(weights) != len(ids) or (epochs is not None and len(epochs) != len(ids)):
                raise ValueError(
                    f"batch {len(seen.ids)} holds {len(ids)} samples but {len(weights)} "
                    f"{weight!r} values and {len(epochs or ids)} 'epoch' values: give one per sample"
                )
            seen.ids.append(ids)
            seen.names.update(names)
            seen.weights.append(weights)
            if epochs is not None:
                seen.epochs = seen.epochs if seen.epochs is not None else []
                seen.epochs.append(epochs)
            if limit is not None and len(seen.ids) >= limit:
                break
    except BaseException:  # noqa: BLE001 - the user's code: reported with its rank, never raised here
        seen.error = traceback.format_exc()
    return seen


def run_seen(
    make_loader: Any,
    grid: Grid,
    key: str,
    weight: str,
    limit: int | None,
    timeout: Any,
    cluster: Any,
) -> list[Seen]:
    """Check the arguments, run :func:`seen_on_rank` on every rank, raise the first failure.

    Raises:
        VerifyError: Bad arguments (before any rank starts), a hang, or the loader raised.
    """
    from ezpz_nb.launcher import launch
    from ezpz_nb.launcher.errors import HangError, RankError

    if not callable(make_loader):
        raise VerifyError("make_loader must be a function: def make_loader(layout): return loader")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise VerifyError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if cluster is not None and cluster.world_size != grid.world_size:
        raise VerifyError(
            f"layout {grid} needs {grid.world_size} ranks but the cluster has "
            f"{cluster.world_size}: pass a Cluster(world_size={grid.world_size}) or none"
        )
    args = (make_loader, grid, key, weight, limit)
    saved = cluster.timeout if cluster is not None else None
    try:
        if cluster is None:
            out = launch(seen_on_rank, *args, world_size=grid.world_size, timeout=timeout)
        else:
            cluster.timeout = timeout
            out = cluster.run(seen_on_rank, *args)
    except (HangError, RankError) as exc:
        raise VerifyError(
            f"the loader did not finish on every rank within {timeout:g} s (an endless loader: "
            f"use check_steps(..., steps=N)), or a rank died:\n{exc}"
        ) from exc
    finally:
        if cluster is not None:
            cluster.timeout = saved
    failed = [s for s in out if s.error]
    if failed:
        raise VerifyError(
            f"rank {failed[0].rank}: the loader raised:\n{failed[0].error}", failed[0].rank
        )
    return list(out)


def _name(seen: list[Seen], i: int) -> str:
    return next((s.names[i] for s in seen if i in s.names), str(i))


def judge_counted_once(seen: list[Seen], num_samples: int | None) -> Judgement:
    """Each sample's weights summed over every rank and step must be exactly 1."""
    total: dict[int, float] = defaultdict(float)
    for s in (s for s in seen if s.counts):  # TP/CP peers share their replica's samples
        for step, (ids, ws) in enumerate(zip(s.ids, s.weights, strict=True)):
            for i, w in zip(ids, ws, strict=True):
                total[i] += w
                if total[i] > 1 + 1e-9:
                    return Judgement(
                        "counted_once", Verdict.FAIL,
                        f"sample {_name(seen, i)} counted again (weights now sum to {total[i]:g}): "
                        "padding that repeats samples (DistributedSampler) needs weight 0 on the "
                        "repeats, or shards that do not repeat",
                        rank=s.rank, step=step, sample=_name(seen, i),
                    )  # fmt: skip
    short = sorted(i for i, w in total.items() if w < 1 - 1e-9 and w > 1e-9)
    if short:
        return Judgement(
            "counted_once", Verdict.FAIL, f"sample {_name(seen, short[0])} has weight {total[short[0]]:g} in all",
            sample=_name(seen, short[0]),
        )  # fmt: skip
    counted = {i for i, w in total.items() if w > 1e-9}
    if num_samples is None or any(s.names for s in seen):
        return Judgement(
            "counted_once", Verdict.NOT_JUDGED,
            f"no sample counted twice ({len(counted)} counted once), but the dataset's length is "
            "unknown, so a dropped sample cannot be seen: pass num_samples=",
        )  # fmt: skip
    missing = sorted(set(range(num_samples)) - counted)
    if missing:
        return Judgement(
            "counted_once", Verdict.FAIL,
            f"{len(missing)} of {num_samples} samples never counted (first: {missing[0]}): "
            "drop_last (or a split that leaves the tail out) biases the metric",
            sample=str(missing[0]),
        )  # fmt: skip
    return Judgement(
        "counted_once", Verdict.PASS, f"all {num_samples} samples counted once, weights summed"
    )


def judge_equal_steps(seen: list[Seen], collective_step: bool) -> Judgement:
    """Equal step counts, needed when each step makes a collective."""
    counts = {s.rank: len(s.ids) for s in seen}
    if len(set(counts.values())) == 1:
        return Judgement("equal_steps", Verdict.PASS, f"every rank took {counts[0]} steps")
    fewest = min(counts, key=lambda r: (counts[r], r))
    parts = ", ".join(f"rank {r}: {n}" for r, n in counts.items())
    if not collective_step:
        return Judgement(
            "equal_steps", Verdict.NOT_JUDGED,
            f"steps differ ({parts}), which is safe only because collective_step=False says the "
            "eval step makes no collective (under FSDP or TP it does)",
        )  # fmt: skip
    return Judgement(
        "equal_steps", Verdict.FAIL,
        f"steps differ ({parts}): rank {fewest} runs out first and the others wait in the next "
        "step's collective (FSDP's all-gather) forever",
        rank=fewest, step=counts[fewest],
    )  # fmt: skip


def check_eval(
    make_loader: Callable[..., Any],
    layout: str | Mapping[str, int] | Grid = "dp=2",
    *,
    key: str = "auto",
    weight: str = "weight",
    num_samples: int | None = None,
    collective_step: bool = True,
    timeout: float = 60.0,
    cluster: Any = None,
) -> EvalReport:
    """Run an evaluation loader once on real ranks and judge whether its metric would be exact.

    Every rank calls ``make_loader(layout)`` and iterates it to its end. A sample's
    weight is its ``weight`` field (1 when batches carry none); the weights of each
    sample summed over every rank must be exactly 1: a repeat (``DistributedSampler``'s
    padding) or a drop (``drop_last``) is a violation here, not "expected".

    Args:
        make_loader: ``make_loader(layout) -> iterable of batches`` with sample ids
            (an ``index`` field, or ``key=``).
        layout: ``"dp=3"`` (``tp``/``cp`` optional), a dict or a ``Grid``.
        key: The field naming each sample (see :func:`check_contract`).
        weight: The field holding each sample's weight (0 marks padding).
        num_samples: The dataset's length; by default ``len(loader.dataset)``,
            followed through ``.dataset`` of shard wrappers.
        collective_step: The eval step makes a collective (FSDP, TP): unequal
            steps then hang, a failure; False leaves that rule not judged.
        timeout: Seconds for the whole run.
        cluster: Run on this warm :class:`ezpz_nb.Cluster` (its size must match).

    Returns:
        An :class:`~ezpz_nb.verify.EvalReport` with rules ``counted_once`` and ``equal_steps``.

    Raises:
        VerifyError: Bad arguments (before any rank starts), a hang, or the loader raised.
    """
    grid = parse_layout(layout)
    if num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        raise VerifyError(f"num_samples must be a positive int or None, got {num_samples!r}")
    seen = run_seen(make_loader, grid, key, weight, None, timeout, cluster)
    n = dataset_size(seen, num_samples)
    judged = [judge_counted_once(seen, n), judge_equal_steps(seen, collective_step)]
    return seen_report(make_loader, grid, "eval", "eval", judged, seen)


def dataset_size(seen: list[Seen], num_samples: int | None) -> int | None:
    """``num_samples`` when given, else the length some rank's dataset reported."""
    if num_samples is not None:
        return num_samples
    return next((s.num_samples for s in seen if s.num_samples), None)


def seen_report(
    make_loader: Callable[..., Any],
    grid: Grid,
    what: str,
    mode: str,
    judged: list[Judgement],
    seen: list[Seen],
) -> EvalReport:
    """The report of an eval or steps check: its judgements and each rank's sample count."""
    name = getattr(make_loader, "__qualname__", "make_loader")
    layout = {"dp": grid.dp, "tp": grid.tp, "cp": grid.cp}
    return EvalReport(f"{name} on {grid}, {what}", layout, mode, judged,
                      {s.rank: len(s.ids) for s in seen})  # fmt: skip
