"""Did TP peers hold the same bytes at each step? :func:`digests`.

Sample ids can agree while the tokens differ: a dataset seeded by rank gives TP
peers the same indices and different data, and the heatmap of ids looks
healthy. Each step record keeps a hash of the batch's bytes
(:attr:`~ezpz_nb.ledger.StepRecord.digest`); this figure compares it with the
one of the rank's TP leader (tp0 of the same DP replica and CP position), step
by step, and marks every cell that differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    FONT,
    MAX_WIDTH,
    MISSING,
    SKY,
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

__all__ = ["digests"]

_LEFT, _MAX_CELL, _ROW = 1.9, 0.6, 0.3
# Hex digits of the digest shown in a cell: enough to tell two batches apart by eye.
_HEX = 4


def digests(ledger: Ledger, epoch: int | None = None) -> Figure:
    """Rank x step grid of batch digests: vermillion where a rank's bytes differ from its TP leader's.

    Each cell is one rank at one step; it shows the first hex digits of the
    hash of the bytes the rank's batch held (while they fit). Light blue: the
    same bytes as the tp0 rank of its group (the leader itself is always
    light blue); vermillion: different bytes, so the TP ranks split one model
    over different data. Without TP (tp 1) every rank is its own leader.

    Args:
        ledger: Records of a real run.
        epoch: Draw only this epoch; ``None`` draws every recorded epoch, one
            after another.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``labels``, ``columns``
        (``[(epoch, step)]``), ``digests`` (``(rows, columns)`` str, ``""``
        absent), ``mismatch`` (bool, True where the rank's bytes differ from
        its leader's) and ``steps_mismatched`` (columns with any mismatch).
    """
    rows = rank_rows(ledger)
    epochs = ledger.epochs() if epoch is None else [epoch]
    columns = [
        (e, s) for e in epochs for s in sorted({r.step for r in ledger.records if r.epoch == e})
    ]
    if not rows or not columns:
        return empty_figure("Digests", {"ranks": [], "columns": [], "steps_mismatched": 0})
    row_of = {r: i for i, (r, _, _) in enumerate(rows)}
    col_of = {c: j for j, c in enumerate(columns)}
    cp = cp_ranks(ledger) or {}
    digest = np.full((len(rows), len(columns)), "", dtype=object)
    for rec in ledger.records:
        if (rec.epoch, rec.step) in col_of:
            digest[row_of[rec.rank], col_of[(rec.epoch, rec.step)]] = rec.digest
    # The leader of a rank's TP group: same DP replica and CP position, lowest tp_rank.
    leader: dict[tuple[int, int], int] = {}
    for i, (r, d, t) in enumerate(rows):
        key = (d, cp.get(r, 0))
        if key not in leader or t < rows[leader[key]][2]:
            leader[key] = i
    lead = np.array([leader[(d, cp.get(r, 0))] for r, d, _ in rows])
    present = digest != ""
    mismatch = present & present[lead] & (digest != digest[lead])
    state = np.where(~present, 0, np.where(mismatch, 2, 1))

    cell_w = min(_MAX_CELL, (MAX_WIDTH - _LEFT - 0.3) / len(columns))
    cell_h = min(_ROW, 9.0 / len(rows))
    show_hex = cell_w >= _HEX * 0.62 * FONT / 72 + 0.08 and cell_h >= 1.5 * FONT / 72
    bad_steps = int(mismatch.any(axis=0).sum())
    width = max(6.5, _LEFT + 0.3 + len(columns) * cell_w)
    title = wrap(
        "Bytes each rank held per step (first hex digits of a hash of the batch): "
        "TP peers must hold the same bytes as their tp0. "
        + (
            f"{bad_steps} of {len(columns)} step(s) have peers with different bytes (vermillion)."
            if bad_steps
            else "Every rank held its leader's bytes."
        ),
        width - 0.4,
        FONT + 2,
    )
    fig = new_figure(width, 1.5 + 0.2 * title.count("\n") + len(rows) * cell_h, rows=len(rows))
    ax = fig.subplots()
    ax.imshow(
        state,
        cmap=ListedColormap([MISSING, SKY, VERMILLION]),
        vmin=0,
        vmax=2,
        aspect="auto",
        interpolation="nearest",
    )
    if show_hex:
        for (y, x), h in np.ndenumerate(digest):
            if h:
                ax.text(x, y, h[:_HEX], ha="center", va="center", fontsize=FONT, family="monospace")
    for j in range(1, len(columns)):  # a thin line between steps, a dotted one between epochs
        same_epoch = columns[j][0] == columns[j - 1][0]
        ax.axvline(j - 0.5, color="white", linewidth=1 if same_epoch else 2.5)
    stride = max(1, int(np.ceil(0.45 / cell_w)))
    ticks = list(range(0, len(columns), stride))
    multi = len(epochs) > 1
    ax.set_xticks(
        ticks,
        [f"e{columns[j][0]}:{columns[j][1]}" if multi else str(columns[j][1]) for j in ticks],
        fontsize=FONT,
    )
    ax.set_xlabel("epoch:step" if multi else f"step of epoch {epochs[0]}", fontsize=FONT + 1)
    group_separators(ax, rows)
    label_rows(ax, rows, row_labels(ledger, rows), row_height=cell_h)
    ax.set_ylabel("global rank (dp, tp)", fontsize=FONT + 1)
    handles = [
        Patch(facecolor=SKY, label="same bytes as its TP leader (tp0)"),
        Patch(facecolor=VERMILLION, label="different bytes: TP computes on mismatched data"),
    ]
    fig.legend(handles=handles, loc="outside lower left", fontsize=FONT, frameon=False, ncols=2)
    fig.suptitle(title, fontsize=FONT + 2)
    data: dict[str, Any] = {
        "ranks": [r for r, _, _ in rows],
        "labels": row_labels(ledger, rows),
        "columns": columns,
        "digests": digest,
        "mismatch": mismatch,
        "steps_mismatched": bad_steps,
    }
    fig.ezpz_data = data
    return fig
