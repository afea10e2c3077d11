"""Pictures of a sample ledger: which rank held which samples, and who loaded them.

Every function takes a :class:`~ezpz_nb.ledger.Ledger` from a real run and
returns a :class:`matplotlib.figure.Figure` that shows itself as a PNG in a
notebook (see :mod:`ezpz_nb.viz.figure`). What each figure draws is also kept as
plain arrays in ``fig.ezpz_data``, so tests (and curious learners) can check
the numbers rather than the pixels.

The pictures of the ranks themselves (:func:`~ezpz_nb.viz.ranks.timeline`,
:func:`~ezpz_nb.viz.ranks.layout`) live in :mod:`ezpz_nb.viz.ranks`; one
``from ezpz_nb import viz`` gives every figure.

Colours: sample ids use viridis, DP replicas cividis, and marks use the
Okabe-Ito palette, all legible to colour-blind readers.

Example::

    ledger = Ledger.from_results(ez.launch(train, world_size=4))
    viz.heatmap(ledger)          # identical rows inside a TP group?
    viz.coverage(ledger)         # every sample seen exactly once?
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    GREY,
    MISSING,
    ORANGE,
    VERMILLION,
    cp_ranks,
    empty_figure,
    group_separators,
    label_rows,
    new_figure,
    rank_rows,
    row_labels,
)

__all__ = [
    "coverage",
    "heatmap",
    "loaded_vs_received",
    "repeat_mask",
]

# Above this many cells, numbers inside cells are unreadable and slow to draw.
_ANNOTATE_MAX = 400


def _nice_stride(n: int, ticks: int = 12) -> int:
    """A tick step of 1, 2 or 5 times a power of ten giving at most ~``ticks`` ticks."""
    step = 1
    while n / step > ticks:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


def _epoch_matrix(ledger: Ledger, epoch: int, rows: list[tuple[int, int, int]]) -> np.ndarray:
    """:meth:`Ledger.sample_matrix` with its rows (global rank order) put in ``rows`` order."""
    index = {r: i for i, r in enumerate(ledger.ranks())}
    return ledger.sample_matrix(epoch)[[index[r] for r, _, _ in rows]]


def repeat_mask(ids: np.ndarray, dp: np.ndarray) -> np.ndarray:
    """Mark every copy of a sample after the first one, per epoch.

    A batch slot is ``(dp replica, step, position)``: TP peers share it. The
    slots are ordered the way DistributedSampler deals indices out (step, then
    position, then replica), so the first slot holding an id is the original and
    any other slot holding it is a repeat: with ``drop_last=False`` exactly the
    padding the sampler appended.

    Args:
        ids: ``(rows, steps, batch)`` sample ids, -1 where absent.
        dp: DP replica of each row.

    Returns:
        Boolean array shaped like ``ids``; True on repeats.
    """
    rows, steps, width = ids.shape
    mask = np.zeros(ids.shape, dtype=bool)
    if ids.size == 0:
        return mask
    dp = np.asarray(dp, dtype=np.int64)
    # Slot code grows in dealing order: (step, position) major, replica minor.
    order = np.arange(steps * width, dtype=np.int64).reshape(1, steps, width)
    code = order * (int(dp.max()) + 1) + dp.reshape(rows, 1, 1)
    valid = ids >= 0
    flat_ids, flat_code = ids[valid], code[valid]
    first = np.full(int(flat_ids.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, flat_ids, flat_code)
    mask[valid] = flat_code != first[flat_ids]
    return mask


def _annotate(ax: Any, img: np.ndarray, repeats: np.ndarray, vmax: float) -> None:
    for (y, x), v in np.ndenumerate(img):
        if v < 0:
            continue
        dark = v < 0.6 * vmax  # viridis is dark at the low end
        box = (
            {"boxstyle": "square,pad=0.15", "fill": False, "edgecolor": VERMILLION, "linewidth": 2}
            if repeats[y, x]
            else None
        )
        ax.text(
            x,
            y,
            str(v),
            ha="center",
            va="center",
            fontsize=7,
            color="white" if dark else "black",
            bbox=box,
        )


def heatmap(ledger: Ledger, epoch: int | None = None) -> Figure:
    """Rank x step picture of the sample ids each rank held.

    Rows are global ranks labelled ``r3 (dp1,tp1)``, grouped by TP group
    (white lines between groups); each step spans one column per batch
    position. Look for identical rows inside a TP group, different rows across
    groups, and the marked repeats (samples another slot already had, i.e.
    DistributedSampler's padding). Several epochs are drawn side by side so a
    missing reshuffle (no ``set_epoch``) shows as two identical panels.

    Args:
        ledger: Records of a real run.
        epoch: Draw only this epoch; ``None`` draws every recorded epoch.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``labels``, ``epochs``,
        ``ids[epoch]`` (``(rows, steps, batch)`` int64, -1 absent) and
        ``repeats[epoch]`` (bool, same shape).
    """
    rows = rank_rows(ledger)
    epochs = ledger.epochs() if epoch is None else [epoch]
    dp = np.array([d for _, d, _ in rows], dtype=np.int64)
    labels = row_labels(ledger, rows)
    data: dict[str, Any] = {
        "ranks": [r for r, _, _ in rows],
        "labels": labels,
        "epochs": epochs,
        "ids": {},
        "repeats": {},
    }
    for e in epochs:
        data["ids"][e] = _epoch_matrix(ledger, e, rows)
        data["repeats"][e] = repeat_mask(data["ids"][e], dp)
    vmax = max([1] + [int(m.max()) for m in data["ids"].values() if m.size])
    cells = sum(m.shape[1] * m.shape[2] for m in data["ids"].values())
    fig = new_figure(
        3.0 + min(cells, 60) * 0.28 + 1.5 * len(epochs),
        1.6 + 0.3 * max(len(rows), 2),
        rows=len(rows),
    )
    axes = fig.subplots(1, max(len(epochs), 1), sharey=True, squeeze=False)[0]
    cmap = colormaps["viridis"].with_extremes(bad=MISSING)
    image = None
    for ax, e in zip(axes, epochs, strict=False):
        ids, reps = data["ids"][e], data["repeats"][e]
        n_rows, steps, width = ids.shape
        img = ids.reshape(n_rows, steps * width)
        image = ax.imshow(
            np.ma.masked_less(img, 0),
            cmap=cmap,
            vmin=0,
            vmax=vmax,
            aspect="auto",
            interpolation="nearest",
        )
        rep2 = reps.reshape(n_rows, steps * width)
        if img.size <= _ANNOTATE_MAX:
            _annotate(ax, img, rep2, vmax)
        elif rep2.any():
            yy, xx = np.nonzero(rep2)
            ax.scatter(
                xx, yy, marker="X", s=45, facecolor=VERMILLION, edgecolor="black", linewidths=0.6
            )
        if width > 1 and steps <= 60:
            for s in range(1, steps):
                ax.axvline(s * width - 0.5, color="white", linewidth=0.8)
        stride = _nice_stride(steps)
        ax.set_xticks(
            [s * width + (width - 1) / 2 for s in range(0, steps, stride)],
            [str(s) for s in range(0, steps, stride)],
        )
        group_separators(ax, rows)
        ax.set_xlabel("step (one column per sample in the batch)" if width > 1 else "step")
        ax.set_title(f"epoch {e}: {int(reps.sum())} repeated cell(s)", fontsize=10)
    label_rows(axes[0], rows, labels)
    axes[0].set_ylabel("global rank (dp, cp, tp)" if cp_ranks(ledger) else "global rank (dp, tp)")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="sample id", shrink=0.9, fraction=0.04, pad=0.02)
    group = "one DP replica: its CP and TP ranks" if cp_ranks(ledger) else "one TP group"
    fig.suptitle(
        f"Which sample each rank held: rows between white lines ({group}) should match,\n"
        "groups should differ; boxed/x = a sample another slot already had (padding)",
        fontsize=11,
    )
    fig.ezpz_data = data
    return fig


def coverage(ledger: Ledger) -> Figure:
    """For each sample id and epoch, which DP replica saw it.

    Cells take the colour of the replica that held the sample; vermillion with
    an ``x`` marks a sample seen by more than one replica (its gradient counts
    twice), white with a dot a sample no rank saw (dropped).

    Args:
        ledger: Records of a real run; ``ledger.num_samples`` sets the id range
            (else the largest id seen).

    Returns:
        The figure; ``fig.ezpz_data`` holds ``epochs``, ``num_samples``,
        ``replica`` (``(epochs, samples)``: the replica, -1 never seen, -2 several)
        and ``replicas_seen`` (how many distinct replicas saw each sample).
    """
    epochs = ledger.epochs()
    n = ledger.num_samples
    if n is None:
        n = 1 + max((i for r in ledger.records for i in r.sample_ids), default=-1)
    if not epochs or n <= 0:
        return empty_figure(
            "Coverage",
            {
                "epochs": epochs,
                "num_samples": max(n, 0),
                "replica": np.zeros((0, 0), dtype=np.int64),
                "replicas_seen": np.zeros((0, 0), dtype=np.int64),
            },
        )
    dp_size = max((r.dp_size for r in ledger.records), default=1)
    seen = np.zeros((len(epochs), n, dp_size), dtype=bool)
    row = {e: i for i, e in enumerate(epochs)}
    for r in ledger.records:
        ids = [i for i in r.sample_ids if 0 <= i < n]
        seen[row[r.epoch], ids, r.dp_rank] = True
    count = seen.sum(axis=2)
    replica = np.where(count == 1, seen.argmax(axis=2), np.where(count == 0, -1, -2))
    palette = colormaps["cividis"](np.linspace(0.15, 0.95, max(dp_size, 2)))[:dp_size]
    rgba = np.ones((len(epochs), n, 4))
    one = replica >= 0
    rgba[one] = palette[replica[one]]
    rgba[replica == -2] = (0.835, 0.369, 0.0, 1.0)  # vermillion
    fig = new_figure(8.0 + min(n, 80) * 0.06, 1.8 + 0.5 * max(len(epochs), 1))
    ax = fig.subplots()
    ax.imshow(rgba, aspect="auto", interpolation="nearest")
    for val, marker, color in ((-2, "x", "black"), (-1, ".", "black")):
        yy, xx = np.nonzero(replica == val)
        if len(xx) and n <= 400:
            ax.scatter(xx, yy, marker=marker, s=20, color=color, linewidths=1)
    ax.set_yticks(range(len(epochs)), [f"epoch {e}" for e in epochs])
    ax.set_xlabel("sample id")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [Patch(color=palette[k], label=f"DP replica {k}") for k in range(min(dp_size, 8))]
    handles += [
        Patch(facecolor=VERMILLION, label="seen by several replicas (x)"),
        Patch(facecolor="white", edgecolor="black", label="never seen (.)"),
    ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )
    dups, never = int((replica == -2).sum()), int((replica == -1).sum())
    fig.suptitle(
        f"Coverage: every sample should be seen by exactly one DP replica per epoch\n"
        f"{dups} duplicate(s) (x), {never} never seen (.) over {len(epochs)} epoch(s)",
        fontsize=11,
    )
    fig.ezpz_data = {"epochs": epochs, "num_samples": n, "replica": replica, "replicas_seen": count}
    return fig


def loaded_vs_received(ledger: Ledger) -> Figure:
    """Per rank, how many batches it loaded itself and how many it received.

    With the TP broadcast only each TP group's leader (tp0) loads; its peers
    receive. Without it every rank loads (and does the I/O) itself.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``labels``, ``loaded``
        and ``received`` (batch counts over all epochs, in row order).
    """
    rows = rank_rows(ledger)
    counts: dict[int, dict[str, int]] = defaultdict(lambda: {"loaded": 0, "received": 0})
    for r in ledger.records:
        counts[r.rank]["received" if r.source == "received" else "loaded"] += 1
    loaded = np.array([counts[r]["loaded"] for r, _, _ in rows])
    received = np.array([counts[r]["received"] for r, _, _ in rows])
    fig = new_figure(9.0, 1.6 + 0.3 * max(len(rows), 2), rows=len(rows))
    ax = fig.subplots()
    y = np.arange(len(rows))
    ax.barh(y, loaded, color=BLUE, label="loaded itself")
    ax.barh(y, received, left=loaded, color=ORANGE, hatch="//", label="received by broadcast")
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # rank 0 on top, as in the heatmap
    labels = row_labels(ledger, rows)
    label_rows(ax, rows, labels)
    group_separators(ax, rows, color=GREY)
    ax.set_xlabel("batches (all epochs)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("global rank (dp, tp)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    loaders = int((loaded > 0).sum())
    fig.suptitle(
        f"Loaded vs received: {loaders} of {len(rows)} rank(s) ran the loader (did I/O);\n"
        "with the TP broadcast only the tp0 rank of each TP group should",
        fontsize=11,
    )
    fig.ezpz_data = {
        "ranks": [r for r, _, _ in rows],
        "labels": labels,
        "loaded": loaded,
        "received": received,
    }
    return fig
