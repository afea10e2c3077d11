"""Where each rank wrapped into its next epoch, on the ledger's rank x step grid: :func:`epoch_wraps`.

A loader stopped by step count (``SteppedLoader``) gives each rank its own epoch
counter: a rank with a shorter share wraps sooner. One row per rank, one column
per batch slot; a cell shows the sample id and is coloured by that sample's
epoch; a vertical bar marks each wrap, inside the batch where it happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import FONT, MAX_WIDTH, VERMILLION, empty_figure, new_figure

__all__ = ["epoch_wraps"]


def epoch_wraps(ledger: Ledger, epochs: Mapping[int, Sequence[Sequence[int]]]) -> Figure:
    """Rank x step grid of sample ids, coloured by each rank's own epoch, wraps marked.

    Args:
        ledger: One pass recorded on every rank (``record(loader)``, one epoch label).
        epochs: ``{rank: [[epoch of each sample] for each step]}``, e.g. the
            ``"epoch"`` field of ``SteppedLoader``'s batches.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``ids`` and ``epochs``
        (``(ranks, slots)`` int arrays, -1 absent) and ``wraps`` (``{rank: [slot
        index where a new epoch starts]}``).
    """
    ranks = sorted(epochs)
    if not ranks or not ledger.records:
        return empty_figure("epoch wraps (no steps)", {"ranks": [], "wraps": {}})
    epoch0 = ledger.epochs()[0]
    slots = max(sum(len(e) for e in epochs[r]) for r in ranks)
    ids = np.full((len(ranks), slots), -1, dtype=np.int64)
    eps = np.full_like(ids, -1)
    wraps: dict[int, list[int]] = {}
    for row, r in enumerate(ranks):
        flat_ids = ledger.sample_ids(r, epoch0)
        flat_eps = [e for step in epochs[r] for e in step]
        ids[row, : len(flat_ids)] = flat_ids
        eps[row, : len(flat_eps)] = flat_eps
        wraps[r] = [k for k in range(1, len(flat_eps)) if flat_eps[k] > flat_eps[k - 1]]
    batch = max(1, len(epochs[ranks[0]][0]) if epochs[ranks[0]] else 1)
    width = min(MAX_WIDTH, 1.6 + 0.28 * slots)
    fig = new_figure(width, 1.3 + 0.38 * len(ranks), rows=len(ranks))
    ax = fig.add_subplot()
    top = max(1, int(eps.max()))
    ax.imshow(
        np.ma.masked_less(eps, 0), cmap=colormaps["cividis"], vmin=0, vmax=top, aspect="auto",
        interpolation="nearest",
    )  # fmt: skip
    for (row, k), i in np.ndenumerate(ids):
        if i >= 0:
            shade = "black" if eps[row, k] > top / 2 else "white"
            ax.text(k, row, str(i), ha="center", va="center", fontsize=FONT, color=shade)
    for row, r in enumerate(ranks):
        for k in wraps[r]:
            ax.plot([k - 0.5, k - 0.5], [row - 0.5, row + 0.5], color=VERMILLION, linewidth=3)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=FONT)
    ticks = list(range(0, slots, batch))
    ax.set_xticks(ticks, [str(t // batch) for t in ticks], fontsize=FONT)
    ax.set_xlabel(
        "step (each batch's samples side by side; colour: the rank's epoch)", fontsize=FONT
    )
    ax.set_title("Each rank's own epochs: vermillion bars mark where it wrapped", fontsize=FONT + 1)
    fig.ezpz_data = {"ranks": ranks, "ids": ids, "epochs": eps, "wraps": wraps}
    return fig
