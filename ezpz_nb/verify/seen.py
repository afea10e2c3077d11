"""What an eval or steps check runs on each rank, and its report: the samples every rank saw.

:func:`run_seen` runs :func:`seen_on_rank` on the ranks (through
:func:`~ezpz_nb.launcher.on_ranks.run_on_ranks`); each rank builds the loader, iterates
it without any collective (unequal step counts are measured, not hung on) and returns
a :class:`Seen`: per step the sample ids, their weights in the batches' own dtype and
epochs. :func:`seen_report` turns the judges' answers into an
:class:`~ezpz_nb.verify.EvalReport`.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.data.tree import find_in_batch, sample_values
from ezpz_nb.verify.batches import observe_batch, resolve_key
from ezpz_nb.verify.cp_slices import CpKeep
from ezpz_nb.verify.observe import Grid, rank_layout
from ezpz_nb.verify.outcomes import EvalReport
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.samples import SEP, sample_contents, sample_tags
from ezpz_nb.verify.seen_reread import REREAD_S, rank_reread
from ezpz_nb.verify.universe import DatasetIds, dataset_ids
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = ["Seen", "dataset_size", "run_seen", "seen_on_rank", "seen_report", "split_values"]


@dataclass
class Seen:
    """One rank's batches as ids, weights and epochs per step, or how its code failed."""

    rank: int
    ids: list[list[int]] = field(default_factory=list)
    weights: list[list[float]] = field(default_factory=list)
    epochs: list[list[int]] | None = None
    names: dict[int, str] = field(default_factory=dict)
    num_samples: int | None = None
    dataset: DatasetIds | None = None  # what the loader's dataset reads (a Subset's indices)
    dtype: str = ""  # the weights' dtype as the batches carry them ("torch.float32")
    error: str = ""
    counts: bool = True  # the first rank of its TP/CP group: the only one whose samples count
    # Per step, a digest of each sample's data (contents.seen_twin: ids stamped on one data).
    contents: list[list[str]] = field(default_factory=list)
    # Per step, a digest of each sample's one-number fields (a loss): split_values.
    tags: list[list[str]] = field(default_factory=list)
    # (id, epoch, step, field:digest, made-up) delivered with other data than dataset[id],
    # and kept samples re-read alike (verify.seen_reread: a DP leader's few, after the run).
    misnamed: list[tuple[int, int, int, str, str]] = field(default_factory=list)
    reread_alike: int = 0
    # (dp_rank, tp_rank, cp_rank, cp_size), and in a CP layout a few samples' values as this
    # rank delivered them and (its replica's leader) read again whole: verify.cp_slices.
    place: tuple[int, int, int, int] | None = None
    cp_kept: dict[tuple[int, int], tuple[int, dict[str, bytes]]] = field(default_factory=dict)
    cp_rows: dict[tuple[int, int], dict[str, list[Any]]] = field(default_factory=dict)


def seen_on_rank(
    make_loader: Callable[..., Any], grid: Grid, key: str, weight: str, limit: int | None,
    salt: int = 0, size: int | None = None,
) -> Seen:  # fmt: skip
    """Build and iterate the loader on this rank (at most ``limit`` batches); run by the
    launcher. ``salt``: the same on every rank of a check, and ``size``: the samples declared
    (else the dataset's length), pick the CP samples kept (:func:`.cp_slices.picked`)."""
    layout = rank_layout(grid)
    seen = Seen(layout.rank, counts=layout.tp_rank == 0 and layout.cp_rank == 0)
    seen.place = layout.dp_rank, layout.tp_rank, layout.cp_rank, layout.cp_size
    try:
        loader = make_loader(layout)
        seen.dataset = dataset_ids(loader)
        reread = rank_reread(loader, seen.counts, weight)
        seen.num_samples = seen.dataset.length if seen.dataset is not None else None
        # No epoch per batch here (an eval's one pass; a steps run's come per sample): every
        # sample is kept under epoch 0, a later delivery of an id replacing its earlier one
        # alike on every CP peer (they read the same ids in the same order: judge_peers).
        cp = CpKeep(layout, reread, salt, seen.num_samples if size is None else size)
        seen.cp_kept, seen.cp_rows = cp.kept, cp.rows
        for batch in loader:
            ids, names, _, _ = observe_batch(batch, key)
            w = sample_values(batch, weight)
            e = sample_values(batch, "epoch")
            if w is not None and not seen.dtype:
                # Kept until judged: the tolerance of a sum depends on it.
                seen.dtype = str(getattr(find_in_batch(batch, weight), "dtype", "float64"))
            weights = [float(x) for x in w] if w is not None else [1.0] * len(ids)
            epochs = [int(x) for x in e] if e is not None else None
            if len(weights) != len(ids) or (epochs is not None and len(epochs) != len(ids)):
                raise ValueError(
                    f"batch {len(seen.ids)} holds {len(ids)} samples but {len(weights)} "
                    f"{weight!r} values and {len(epochs or ids)} 'epoch' values: give one per sample"
                )
            seen.ids.append(ids)
            field_key = resolve_key(batch, key)
            seen.contents.append(sample_contents(batch, field_key, len(ids)))
            seen.tags.append(sample_tags(batch, frozenset({field_key, weight, "epoch"}), len(ids)))
            reread.see(batch, ids, field_key, 0, len(seen.ids) - 1)
            cp.see(batch, ids, field_key, 0, len(seen.ids) - 1)
            seen.names.update(names)
            seen.weights.append(weights)
            if epochs is not None:
                seen.epochs = seen.epochs if seen.epochs is not None else []
                seen.epochs.append(epochs)
            if limit is not None and len(seen.ids) >= limit:
                break
        seen.misnamed = reread.judge(time.monotonic() + REREAD_S)
        cp.read(0, time.monotonic() + REREAD_S)
        seen.reread_alike = reread.alike
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
    num_samples: int | None = None,
) -> list[Seen]:
    """Check the arguments, run :func:`seen_on_rank` on every rank, raise the first failure.
    ``num_samples``: the samples declared (a dataset of positions is longer), or None.

    Raises:
        VerifyError: Bad arguments (before any rank starts), a hang, or the loader raised.
    """
    from ezpz_nb.launcher.errors import HangError, RankError, WorldSizeError
    from ezpz_nb.launcher.on_ranks import run_on_ranks

    if not callable(make_loader):
        raise VerifyError("make_loader must be a function: def make_loader(layout): return loader")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise VerifyError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    # The salt picks the samples a CP layout's ranks keep (verify.cp_slices), unknown to the loader.
    salt = random.SystemRandom().getrandbits(32)
    args = (make_loader, grid, key, weight, limit, salt, num_samples)
    try:
        out = run_on_ranks(seen_on_rank, args, world_size=grid.world_size, timeout=timeout,
                           cluster=cluster, what=f"layout {grid}")  # fmt: skip
    except WorldSizeError as exc:
        raise VerifyError(str(exc)) from None
    except HangError as exc:
        raise VerifyError(f"{_why_hung(exc, timeout)}:\n{exc}") from exc
    except RankError as exc:
        raise VerifyError(f"a rank died while iterating the loader:\n{exc}") from exc
    failed = [s for s in out if s.error]
    if failed:
        raise VerifyError(
            f"rank {failed[0].rank}: the loader raised:\n{failed[0].error}", failed[0].rank
        )
    return list(out)


def _why_hung(exc: Any, timeout: float) -> str:
    """Why the loader did not finish, as the hung ranks' stacks show it."""
    stacks = [s for s in exc.stacks.values() if s.state != "finished"]
    blocked = sorted(s.rank for s in stacks if s.in_collective)
    if blocked:
        return (
            f"the loader did not finish on every rank within {timeout:g} s: rank(s) {blocked} "
            "blocked in a collective inside the loader that the other ranks never joined "
            "(ranks that disagree on how many batches there are, or one that stopped early)"
        )
    return (
        f"the loader did not finish on every rank within {timeout:g} s, with no collective on "
        "the stacks: still iterating (an endless loader: use check_steps(..., steps=N))"
    )


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


def _at(rows: list[list[str]], step: int, k: int, count: int) -> str:
    row = rows[step] if step < len(rows) else []
    return row[k] if len(row) == count else ""


def split_values(seen: list[Seen]) -> Judgement | None:
    """The first sample delivered twice or more with weight > 0 and the same contents (a
    padded copy and its original at 0.5 each) whose one-number fields (a loss) differ
    between the deliveries, as a failure whose ``rule`` the caller fills in; None: none.

    The weights of an id may sum to 1 while a copy carries a made-up value (a loss of 0)
    under the real id: the weighted mean is then off though every id counts once. The same
    input (contents: tokens, pixels; or none at all) gives the same loss and label, so such
    copies must agree in every one-number field but the id and the weight. Deliveries whose
    contents differ are pieces of one sample (a document's chunks, weights summed) or views
    of it (test-time augmentation), rightly valued apart: not judged here.
    """
    first: dict[tuple[int, str], tuple[str, int, int]] = {}
    for s in (s for s in seen if s.counts):  # TP/CP peers share their leader's samples
        for step, (ids, ws) in enumerate(zip(s.ids, s.weights, strict=True)):
            for k, (i, w) in enumerate(zip(ids, ws, strict=True)):
                if w == 0:  # padding at weight 0 counts nothing, whatever it holds
                    continue
                tags = _at(s.tags, step, k, len(ids))
                was = first.setdefault(
                    (i, _at(s.contents, step, k, len(ids))), (tags, s.rank, step)
                )
                if was[0] == tags:
                    continue
                mine, theirs = set(tags.split(SEP)), set(was[0].split(SEP))
                differ = sorted({t.rpartition(":")[0].lstrip("/") for t in mine ^ theirs})
                name = s.names.get(i, str(i))
                return Judgement(
                    "", Verdict.FAIL,
                    f"sample {name} is delivered twice with weight > 0 and the same contents "
                    f"(rank {was[1]} step {was[2]}, rank {s.rank} step {step}), holding other "
                    f"values ({', '.join(x or 'a value' for x in differ)}): split weights "
                    "average the deliveries, so a copy with a made-up value (a loss of 0) under "
                    "a real id biases the metric while the weights still sum to 1; deliver the "
                    "sample's very values in each copy, or give the repeat weight 0 (distinct "
                    "pieces of one sample, a document's chunks, must carry their own contents)",
                    rank=s.rank, step=step, sample=name,
                )  # fmt: skip
    return None
