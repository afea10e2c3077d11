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

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREY,
    MAX_WIDTH,
    ORANGE,
    VERMILLION,
    empty_figure,
    group_separators,
    label_rows,
    new_figure,
    rank_rows,
    row_labels,
)

__all__ = ["coverage", "loaded_vs_received"]


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
    fig = new_figure(MAX_WIDTH, 2.0 + 0.5 * max(len(epochs), 1))
    ax = fig.subplots()
    ax.imshow(rgba, aspect="auto", interpolation="nearest")
    for val, marker, color in ((-2, "x", "black"), (-1, ".", "black")):
        yy, xx = np.nonzero(replica == val)
        if len(xx) and n <= 400:
            ax.scatter(xx, yy, marker=marker, s=20, color=color, linewidths=1)
    ax.set_yticks(range(len(epochs)), [f"epoch {e}" for e in epochs], fontsize=FONT)
    ax.set_xlabel("sample id", fontsize=FONT + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=FONT)
    handles = [Patch(color=palette[k], label=f"DP replica {k}") for k in range(min(dp_size, 8))]
    handles += [
        Patch(facecolor=VERMILLION, label="seen by several replicas (x)"),
        Patch(facecolor="white", edgecolor="black", label="never seen (.)"),
    ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=FONT, frameon=False
    )
    dups, never = int((replica == -2).sum()), int((replica == -1).sum())
    fig.suptitle(
        f"Coverage: every sample should be seen by exactly one DP replica per epoch\n"
        f"{dups} duplicate(s) (x), {never} never seen (.) over {len(epochs)} epoch(s)",
        fontsize=FONT + 3,
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
    ax.set_xlabel("batches (all epochs)", fontsize=FONT + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_ylabel("global rank (dp, tp)", fontsize=FONT + 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=FONT, frameon=False)
    loaders = int((loaded > 0).sum())
    fig.suptitle(
        f"Loaded vs received: {loaders} of {len(rows)} rank(s) ran the loader (did I/O);\n"
        "with the TP broadcast only the tp0 rank of each TP group should",
        fontsize=FONT + 3,
    )
    fig.ezpz_data = {
        "ranks": [r for r, _, _ in rows],
        "labels": labels,
        "loaded": loaded,
        "received": received,
    }
    return fig
