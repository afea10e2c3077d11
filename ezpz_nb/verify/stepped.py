"""The steps check for endless loaders: ``steps`` batches on every rank, each epoch dealt once.

A loader over a stream is run for exactly ``steps`` batches per rank (an endless
one is cut there, as the training loop cuts it). :func:`check_steps` judges that
every rank yields them all, none empty (a rank that runs out first leaves the others in
a collective; an empty step trains on nothing) and, from the ``epoch`` field each sample
carries, that every epoch all ranks finished dealt each sample to exactly one rank with
shares within one; where the layout has TP/CP peers, that each reads its leader's batches.
Epochs are judged only where they can be known: without that field, a declared
length (``num_samples=N``) cuts each rank's samples into epochs of its share of N
(``len(range(dp_rank, N, dp_size))``, a :class:`~ezpz_nb.data.SteppedLoader` deal);
with neither, coverage is not judged and the report says how to declare them. An
order that repeats is no evidence of an epoch: a stream whose order runs forward then
backward repeats only every two epochs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ezpz_nb.ledger.problem import format_ids
from ezpz_nb.verify.contents import seen_twin
from ezpz_nb.verify.contract import parse_layout
from ezpz_nb.verify.evaluation import judge_peers
from ezpz_nb.verify.observe import Grid
from ezpz_nb.verify.outcomes import EvalReport
from ezpz_nb.verify.report import VerifyError
from ezpz_nb.verify.seen import Seen, dataset_size, run_seen, seen_report
from ezpz_nb.verify.seen_reread import with_contents, with_slices
from ezpz_nb.verify.universe import Universe, beyond_len
from ezpz_nb.verify.verdict import Judgement, Verdict

__all__ = ["check_steps"]


def judge_steps(seen: list[Seen], steps: int) -> Judgement:
    """Every rank yields ``steps`` batches, each holding at least one sample."""
    short = [s for s in seen if len(s.ids) < steps]
    if short:
        first = min(short, key=lambda s: (len(s.ids), s.rank))
        return Judgement(
            "steps", Verdict.FAIL,
            f"rank {first.rank} ran out after {len(first.ids)} of {steps} steps: the others "
            "wait for it in their next collective. Repeat the stream (SteppedLoader) and stop "
            "by step count.",
            rank=first.rank, step=len(first.ids),
        )  # fmt: skip
    # A step on no sample trains on nothing (a mean over none is NaN) while the optimizer and
    # the schedule step on. No honest loader yields one: a DataLoader's last batch under
    # drop_last=False holds the remainder, at least one sample, so an empty batch is made.
    empty = [(step, s.rank) for s in seen for step, ids in enumerate(s.ids) if not ids]
    if empty:
        step, rank = min(empty)
        count = sum(1 for _, r in empty if r == rank)
        return Judgement(
            "steps", Verdict.FAIL,
            f"rank {rank}'s step {step} holds no sample ({count} of its {steps} steps are "
            "empty): a step that trains on nothing (its mean loss is NaN) while the optimizer "
            "and the schedule step on. A loader never yields an empty batch by itself (a last "
            "batch holds the remainder): even out shares with samples (SteppedLoader repeats "
            "the stream), never with empty steps",
            rank=rank, step=step,
        )  # fmt: skip
    return Judgement(
        "steps", Verdict.PASS, f"every rank yielded {steps} batches, none of them empty"
    )


def declared_epochs(seen: list[Seen], num_samples: int | None) -> tuple[list[Seen], str] | str:
    """Each rank's epochs cut from its share of the declared length, with how; else why not.

    ``seen`` are the DP leaders in DP-rank order: replica ``d`` takes
    ``len(range(d, N, dp_size))`` samples an epoch.
    """
    if num_samples is None:
        return (
            "the batches carry no 'epoch' field and no epoch length was declared, so the "
            "epochs cannot be told apart: pass num_samples=N (the samples of one epoch), or "
            "tag each sample with its epoch ({'index': i, 'epoch': e}, as SteppedLoader does)"
        )
    out = []
    for d, s in enumerate(seen):
        share = len(range(d, num_samples, len(seen)))
        flat = iter(range(sum(map(len, s.ids))))
        eps = [[next(flat) // max(share, 1) for _ in ids] for ids in s.ids]
        out.append(replace(s, epochs=eps))
    return out, (
        f"; epochs cut from the declared num_samples={num_samples}: replica d's epoch is its "
        f"next len(range(d, {num_samples}, {len(seen)})) samples"
    )


def judge_coverage(
    seen: list[Seen], num_samples: int | None, length: int | None = None
) -> Judgement:
    """In each epoch every rank finished, each sample on exactly one rank, shares within one.

    Without an ``epoch`` field the epochs are cut from a declared length
    (:func:`declared_epochs`); with neither the rule is not judged. ``length`` (the
    dataset's own, not declared) sets only which samples an epoch must cover.
    """
    how = ""
    if any(s.epochs is None for s in seen):
        got = declared_epochs(seen, num_samples)
        if isinstance(got, str):
            return Judgement("balanced_coverage", Verdict.NOT_JUDGED, got)
        seen, how = got
    outcome = _coverage(
        seen, num_samples if num_samples is not None else length, num_samples is not None
    )
    return replace(outcome, reason=outcome.reason + how) if how else outcome


def _coverage(seen: list[Seen], num_samples: int | None, declared: bool = False) -> Judgement:
    """Each finished epoch on every rank: each sample of the universe once, shares within one;
    with ``num_samples`` declared, no id past it (a padded copy under a fresh id)."""
    owner: dict[tuple[int, int], int] = {}
    ranks = [s.rank for s in seen]
    shares: dict[int, dict[int, int]] = defaultdict(lambda: dict.fromkeys(ranks, 0))
    for s in seen:
        for step, (ids, eps) in enumerate(zip(s.ids, s.epochs or [], strict=True)):
            for i, e in zip(ids, eps, strict=True):
                if (e, i) in owner and owner[(e, i)] == s.rank:
                    return Judgement(
                        "balanced_coverage", Verdict.FAIL,
                        f"epoch {e}: rank {s.rank} took sample {i} twice: its own share of the "
                        "epoch repeats a sample (sampling with replacement, a stream restarted within "
                        "the epoch, or DataLoader workers that each yield the whole share): deal "
                        "each epoch as a permutation cut into one share per rank",
                        rank=s.rank, step=step, sample=str(i),
                    )  # fmt: skip
                if (e, i) in owner:
                    return Judgement(
                        "balanced_coverage", Verdict.FAIL,
                        f"epoch {e}: sample {i} went to rank {owner[(e, i)]} and again to rank "
                        f"{s.rank}: the ranks' shares of an epoch overlap (sampling with replacement, or "
                        "ranks that do not cut one permutation of the epoch): give every rank "
                        "the same permutation (seed + epoch) and take share perm[rank::world]",
                        rank=s.rank, step=step, sample=str(i),
                    )  # fmt: skip
                owner[(e, i)] = s.rank
                shares[e][s.rank] += 1
    beyond = sorted(k for k in owner if not 0 <= k[1] < (num_samples or 0))
    if declared and beyond:  # in any epoch, ended or not: the ids past it are samples too
        ids = sorted({i for _, i in beyond})
        return Judgement(
            "balanced_coverage", Verdict.FAIL,
            f"epoch {beyond[0][0]} dealt sample id(s) outside range({num_samples}) "
            f"({len(ids)} in all: {format_ids(ids)}), but num_samples={num_samples} says there "
            f"are {num_samples} samples: each such id is a sample trained on beyond them (a "
            "padded copy under a fresh id repeats a sample); deal each sample once an epoch, "
            "or declare num_samples= the samples there are",
            rank=owner[beyond[0]], sample=str(beyond[0][1]),
        )  # fmt: skip
    finished = min(max((e for eps in s.epochs or [] for e in eps), default=0) for s in seen)
    if finished == 0:
        return Judgement(
            "balanced_coverage", Verdict.NOT_JUDGED,
            "no sample was dealt twice, but no epoch ended on every rank within these steps: "
            "raise steps to cover one epoch",
        )  # fmt: skip
    universe = set(range(num_samples)) if num_samples is not None else {i for _, i in owner}
    for e in range(finished):
        missing = sorted(universe - {i for (ep, i) in owner if ep == e})
        if missing:
            return Judgement(
                "balanced_coverage", Verdict.FAIL,
                f"epoch {e} ended on every rank without sample {missing[0]} "
                f"({len(missing)} missing)",
                sample=str(missing[0]),
            )  # fmt: skip
        sizes = shares[e]
        if max(sizes.values()) - min(sizes.values()) > 1:
            big = max(sizes, key=lambda r: sizes[r])
            return Judgement(
                "balanced_coverage", Verdict.FAIL,
                f"epoch {e}: shares per rank {list(sizes.values())} differ by more than one",
                rank=big,
            )  # fmt: skip
    if num_samples is None:  # the universe is the ids seen: a sample never dealt is not
        return Judgement(  # among them (the eleventh trial's stream that skips sample 0)
            "balanced_coverage", Verdict.NOT_JUDGED,
            f"{finished} epoch(s) ended on every rank, each dealing the same {len(universe)} "
            f"ids once, shares within one (epoch 0: {list(shares[0].values())}), but the "
            "dataset's length is unknown (no len(loader.dataset)), so a sample never dealt "
            "cannot be seen: pass num_samples=",
        )  # fmt: skip
    return Judgement(
        "balanced_coverage", Verdict.PASS,
        f"{finished} epoch(s) ended on every rank, each dealing all {len(universe)} samples "
        f"once, shares within one (epoch 0: {list(shares[0].values())})",
    )  # fmt: skip


def check_steps(
    make_loader: Callable[..., Any],
    layout: str | Mapping[str, int] | Grid = "dp=2",
    *,
    steps: int,
    key: str = "auto",
    num_samples: int | None = None,
    timeout: float = 60.0,
    cluster: Any = None,
) -> EvalReport:
    """Run a (possibly endless) loader for ``steps`` batches on real ranks and judge it.

    A few samples are read again from ``loader.dataset`` in the rank after the run, as in
    :func:`~ezpz_nb.verify.check_eval`: one delivered with another sample's data fails
    ``balanced_coverage``; where none can be read again, its reason says contents are trusted.

    Args:
        make_loader: ``make_loader(layout) -> iterable of batches`` with sample ids
            and, for the coverage rule, an ``epoch`` field per sample (or a
            declared ``num_samples``, which sets the epochs' length).
        layout: ``"dp=3"``, a dict or a ``Grid``.
        steps: Batches to take on every rank.
        key: The field naming each sample.
        num_samples: The samples of one epoch: declares the universe and, for
            batches without an ``epoch`` field, where each rank's epochs end. By
            default the universe is ``len(loader.dataset)``, else every sample seen.
        timeout: Seconds for the whole run.
        cluster: Run on this warm :class:`ezpz_nb.Cluster` (its size must match).

    Returns:
        An :class:`~ezpz_nb.verify.EvalReport` with rules ``steps`` (every rank
        yields them all, none empty, so the counts are equal) and ``balanced_coverage``,
        and ``tp_identical`` where the layout has TP/CP peers.

    Raises:
        VerifyError: Bad arguments (before any rank starts), a hang, or the loader raised.
    """
    grid = parse_layout(layout)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise VerifyError(f"steps must be a positive int, got {steps!r}")
    seen = run_seen(make_loader, grid, key, "weight", steps, timeout, cluster, num_samples)
    dp_seen = [s for s in seen if s.counts]
    size = dataset_size(seen, None)
    beyond = (
        beyond_len([s.dataset for s in seen], Universe(frozenset(range(size)), size, ""))
        if num_samples is None and size is not None
        else ""
    )
    twin = seen_twin(seen)
    judged = [
        judge_steps(seen, steps),
        replace(twin, rule="balanced_coverage") if twin is not None
        else Judgement("balanced_coverage", Verdict.FAIL, f"range({size}) (len(dataset)) is "
                       f"short: {beyond}") if beyond
        else judge_coverage(dp_seen, num_samples, size),
    ]  # fmt: skip
    judged[1] = with_contents(judged[1], seen, "steps")  # ids that name their data
    # Only the leaders' samples are dealt: the peers follow, CP peers holding each sample.
    peers = with_slices(judge_peers(seen, grid), seen, "steps")
    judged += [peers] if peers is not None else []
    return seen_report(make_loader, grid, f"{steps} steps", "steps", judged, seen)
