"""What a check finds (:class:`Problem`) and what a loader's settings allow (:class:`Allowance`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Allowance", "Problem", "ProblemKind", "format_ids"]

#: What a check can find (each one explained in :mod:`ezpz_nb.ledger.checks`).
ProblemKind = Literal[
    "dp_duplicate",
    "never_seen",
    "tp_mismatch",
    "step_mismatch",
    "rank_duplicate",
    "batch_size",
    "order_unchanged",
    # documents of packed rows (ezpz_nb.text.check_documents)
    "doc_never_seen",
    "doc_duplicate",
]


@dataclass(frozen=True)
class Problem:
    """One finding of :meth:`~ezpz_nb.ledger.Ledger.check`.

    Attributes:
        kind: ``"dp_duplicate"``, ``"never_seen"``, ``"tp_mismatch"``,
            ``"step_mismatch"``, ``"rank_duplicate"``, ``"batch_size"`` or
            ``"order_unchanged"`` (see :mod:`ezpz_nb.ledger.checks`); for packed
            text, ``"doc_never_seen"`` and ``"doc_duplicate"``
            (:func:`ezpz_nb.text.check_documents`, ``samples`` are document ids).
        message: What happened and what it means, in plain words.
        epoch: The epoch it concerns.
        ranks: Global ranks involved.
        samples: Sample ids involved (duplicated or never seen).
        steps: Steps involved (TP mismatches).
        expected: Empty for a violation; else why the loader's own settings
            make it expected (e.g. ``drop_last``), given an :class:`Allowance`.
        first: ``(rank, step, sample)`` where it first shows, each None where
            it does not apply (a sample never seen has no rank or step).
    """

    kind: ProblemKind
    message: str
    epoch: int
    ranks: tuple[int, ...] = ()
    samples: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    expected: str = ""
    first: tuple[int | None, int | None, int | None] = (None, None, None)


@dataclass(frozen=True)
class Allowance:
    """What a loader's settings allow, so the checks can tell a choice from a bug.

    Attributes:
        sampler_drop_last: The DistributedSampler's ``drop_last`` (it drops
            fewer than ``dp_size`` samples when True, pads as many by
            repetition when False); None when there is no such sampler.
        loader_drop_last: The DataLoader's ``drop_last`` (True drops each
            replica's last partial batch; False keeps it, so the last global
            batch is smaller); None when unknown.
        batch_size: The DataLoader's batch size per replica, when known.
    """

    sampler_drop_last: bool | None = None
    loader_drop_last: bool | None = None
    batch_size: int | None = None


def format_ids(values: Iterable[int], limit: int = 8) -> str:
    """Sample ids for a message, sorted: the first ``limit`` of them, then "..." if more."""
    vals = sorted(values)
    shown = ", ".join(str(v) for v in vals[:limit])
    return f"[{shown}{', ...' if len(vals) > limit else ''}]"
