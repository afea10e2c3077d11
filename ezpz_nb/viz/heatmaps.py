"""The rank x step picture of sample ids: :func:`heatmap`, and the padding it marks.

One row per rank, one column per sample of each batch, one panel per epoch
stacked top to bottom (so two epochs in the same order look the same, one above
the other, at any number of steps). The figure never grows past
:data:`~ezpz_nb.viz.figure.MAX_WIDTH`: when the cells get too small for their
digits, they keep only their colour (read it on the colour bar), and the
padding marks and empty slots are drawn either way and named in the legend.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    FONT,
    MAX_WIDTH,
    MISSING,
    VERMILLION,
    cp_ranks,
    empty_figure,
    group_separators,
    label_rows,
    new_figure,
    rank_rows,
    row_labels,
    wrap,
)

__all__ = ["heatmap", "repeat_mask"]

# Inches: the rank labels and axis title on the left, the colour bar on the right.
_LEFT, _RIGHT = 1.7, 1.35
_MAX_CELL, _ROW = 0.42, 0.3
# Above this many cells, digits are slow to draw (each is a Text artist).
_ANNOTATE_MAX = 1200


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
    if ids.size == 0 or not (ids >= 0).any():
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


def _tick_stride(steps: int, step_width: float) -> int:
    """Label every n-th step (n = 1, 2, 5, 10, ...) so labels sit >= 0.45 in apart."""
    stride = 1
    while stride < steps and stride * step_width < 0.45:
        stride = stride * 5 // 2 if str(stride)[0] == "2" else stride * 2
    return stride


def _digits_fit(vmax: int, cell_w: float, cell_h: float) -> bool:
    """Whether the widest id fits its cell at :data:`FONT` points (0.6 em a digit, some margin)."""
    return cell_w >= len(str(vmax)) * 0.6 * FONT / 72 + 0.06 and cell_h >= 1.5 * FONT / 72


def _draw_cells(ax: Any, img: np.ndarray, rep: np.ndarray, vmax: int, digits: bool) -> None:
    """Digits in the cells (when they fit) and a frame around each repeat (the padding)."""
    if digits:
        for (y, x), v in np.ndenumerate(img):
            if v >= 0:  # viridis is dark at the low end: white digits there
                color = "white" if v < 0.6 * vmax else "black"
                ax.text(x, y, str(v), ha="center", va="center", fontsize=FONT, color=color)
    for y, x in zip(*np.nonzero(rep), strict=True):
        ax.add_patch(
            Rectangle(
                (x - 0.42, y - 0.4), 0.84, 0.8, fill=False, edgecolor=VERMILLION, linewidth=2.5
            )
        )


def _caption(ledger: Ledger) -> str:
    """What the rows should look like, for this run's layout."""
    tp = max((r.tp_size for r in ledger.records), default=1)
    if cp_ranks(ledger):
        return (
            "Which sample each rank held: the rows of one DP replica (between white lines: "
            "its CP and TP ranks) should match; replicas should differ"
        )
    if tp > 1:
        return (
            "Which sample each rank held: the rows of one TP group (between white lines) "
            "should match; TP groups should differ"
        )
    return "Which sample each rank held: every rank is its own DP replica, so rows should differ"


def heatmap(ledger: Ledger, epoch: int | None = None) -> Figure:
    """Rank x step picture of the sample ids each rank held.

    Rows are global ranks labelled ``r3 (dp1,tp1)``, grouped by TP group
    (white lines between groups); each step spans one column per batch
    position; each epoch is a panel, stacked top to bottom. Look for identical
    rows inside a TP group, different rows across groups, and the framed
    repeats (samples another slot already had, i.e. DistributedSampler's
    padding). Two epochs in the same order (no ``set_epoch``) are two identical
    panels. Cells show their id while the digits fit, else only its colour.

    Args:
        ledger: Records of a real run.
        epoch: Draw only this epoch; ``None`` draws every recorded epoch.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``labels``, ``epochs``,
        ``ids[epoch]`` (``(rows, steps, batch)`` int64, -1 absent),
        ``repeats[epoch]`` (bool, same shape) and ``digits`` (whether the
        cells show their ids).
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
    if not rows or not epochs:
        return empty_figure("Heatmap", {**data, "digits": False})
    for e in epochs:
        data["ids"][e] = _epoch_matrix(ledger, e, rows)
        data["repeats"][e] = repeat_mask(data["ids"][e], dp)
    vmax = max([1] + [int(m.max()) for m in data["ids"].values() if m.size])
    n_rows, panels = max(len(rows), 1), max(len(epochs), 1)
    columns = max([1] + [m.shape[1] * m.shape[2] for m in data["ids"].values()])
    cell_w = min(_MAX_CELL, (MAX_WIDTH - _LEFT - _RIGHT) / columns)
    cell_h = min(_ROW, 9.0 / (n_rows * panels))  # stays within new_figure's 14 in
    cells = sum(m.size for m in data["ids"].values())
    data["digits"] = cells <= _ANNOTATE_MAX and _digits_fit(vmax, cell_w, cell_h)
    width = max(6.5, _LEFT + _RIGHT + columns * cell_w)
    hint = "" if data["digits"] else " Cells too small for digits: read ids on the colour bar."
    title = wrap(_caption(ledger) + "." + hint, width - 0.4, FONT + 2)
    missing = any((m < 0).any() for m in data["ids"].values())
    legend = int(missing) + int(any(r.any() for r in data["repeats"].values()))
    fig = new_figure(
        width,
        0.75 + 0.2 * title.count("\n") + panels * (n_rows * cell_h + 0.55) + 0.25 * legend,
        rows=len(rows) * panels,
    )
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    cmap = colormaps["viridis"].with_extremes(bad=MISSING)
    image = None
    for i, (ax, e) in enumerate(zip(axes, epochs, strict=False)):
        ids, reps = data["ids"][e], data["repeats"][e]
        _, steps, batch = ids.shape
        img = ids.reshape(len(rows), steps * batch)
        image = ax.imshow(
            np.ma.masked_less(img, 0),
            cmap=cmap,
            vmin=0,
            vmax=vmax,
            aspect="auto",
            interpolation="nearest",
        )
        _draw_cells(ax, img, reps.reshape(img.shape), vmax, data["digits"])
        if batch > 1 and steps * batch * cell_w >= 2 * steps * 0.05:
            for s in range(1, steps):
                ax.axvline(s * batch - 0.5, color="white", linewidth=1.2)
        stride = _tick_stride(steps, batch * cell_w)
        ax.set_xticks(
            [s * batch + (batch - 1) / 2 for s in range(0, steps, stride)],
            [str(s) for s in range(0, steps, stride)],
            fontsize=FONT,
        )
        ax.set_xlim(-0.5, columns - 0.5)
        group_separators(ax, rows)
        label_rows(ax, rows, labels, row_height=cell_h)
        # Counted once per batch slot: TP peers share a slot and its repeat.
        n_rep = len({(dp[y], x) for y, x in zip(*np.nonzero(reps.reshape(img.shape)), strict=True)})
        ax.set_title(
            f"epoch {e}: "
            + (f"{n_rep} repeated sample(s), framed" if n_rep else "no sample repeated"),
            fontsize=FONT + 1,
            loc="left",
        )
        if i == panels - 1:
            ax.set_xlabel(
                "step (one column per sample of the batch)" if batch > 1 else "step",
                fontsize=FONT + 1,
            )
    fig.supylabel(
        "global rank (dp, cp, tp)" if cp_ranks(ledger) else "global rank (dp, tp)",
        fontsize=FONT + 1,
    )
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes), shrink=0.9, fraction=0.05, pad=0.02)
        bar.set_label("sample id", fontsize=FONT + 1)
        bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # ids are whole numbers
        bar.ax.tick_params(labelsize=FONT)
    handles = []
    if any(r.any() for r in data["repeats"].values()):
        handles.append(
            Patch(
                fill=False,
                edgecolor=VERMILLION,
                linewidth=2.5,
                label="repeat: a sample another slot already had (the sampler's padding)",
            )
        )
    if missing:
        handles.append(Patch(facecolor=MISSING, label="empty slot: no sample there"))
    if handles:
        fig.legend(handles=handles, loc="outside lower left", fontsize=FONT, frameon=False)
    fig.suptitle(title, fontsize=FONT + 2)
    fig.ezpz_data = data
    return fig
