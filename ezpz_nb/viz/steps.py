"""Where each rank's steps went, on one time axis: :func:`step_timeline`.

One row per rank; each step is drawn where it happened, in wall-clock time
from the first step's start: waiting for data, the step's own work, waiting
in the collective for the last rank, then the collective's transfer. A
straggler shows as the row without the waiting bars, whose data (or compute)
bars are as long as the others' waits; the title says which rank it is,
from :meth:`~ezpz_nb.ledger.Ledger.diagnose`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREEN,
    GREY,
    ORANGE,
    VERMILLION,
    empty_figure,
    new_figure,
)

__all__ = ["PARTS", "step_timeline"]

#: The parts of a step, in the order drawn, with their colours.
PARTS = (
    ("data_s", "waiting for data", ORANGE),
    ("compute_s", "compute", BLUE),
    ("other_s", "other (unmarked)", GREY),
    ("wait_s", "waiting for the last rank", VERMILLION),
    ("transfer_s", "collective transfer", GREEN),
    ("end_s", None, ORANGE),  # the epoch's end: waiting on the loader, as data
)


def step_timeline(ledger: Ledger, epoch: int | None = None) -> Figure:
    """Each rank's steps on one wall-clock axis, split into data, compute, wait, transfer.

    Args:
        ledger: A ledger recorded with times (``record(...)``, the default).
        epoch: Only this epoch; by default every epoch.

    Returns:
        A Figure whose ``ezpz_data`` holds ``ranks`` (row order), ``parts`` (the
        part names), ``start`` and ``seconds`` (``(ranks, steps, parts)`` arrays
        of where each part begins, from the first start, and how long it is;
        NaN where a rank took no such step), ``straggler`` (rank or None) and
        ``verdict`` (the diagnosis in words).
    """
    timings = ledger.timings(epoch)
    names = [p[0] for p in PARTS]
    if not timings:
        return empty_figure(
            "step timeline (no step times: record(..., timings=True))",
            {"ranks": [], "parts": names, "straggler": None, "verdict": ""},
        )
    scope = ledger if epoch is None else Ledger([r for r in ledger.records if r.epoch == epoch])
    diagnosis = scope.diagnose()
    ranks = sorted({t.rank for t in timings})
    row = {r: i for i, r in enumerate(ranks)}
    order = sorted({(t.epoch, t.step) for t in timings})
    col = {k: i for i, k in enumerate(order)}
    t0 = min(t.start_at for t in timings)
    start = np.full((len(ranks), len(order), len(PARTS)), np.nan)
    seconds = np.full_like(start, np.nan)
    for t in timings:
        at = t.start_at - t0
        for k, name in enumerate(names):
            d = float(getattr(t, name))
            start[row[t.rank], col[(t.epoch, t.step)], k] = at
            seconds[row[t.rank], col[(t.epoch, t.step)], k] = d
            at += d

    fig = new_figure(9.0, 1.2 + 0.45 * len(ranks), rows=len(ranks))
    ax = fig.add_subplot()
    for k, (_, label, colour) in enumerate(PARTS):
        for i in range(len(ranks)):
            spans = [
                (s, d)
                for s, d in zip(start[i, :, k], seconds[i, :, k], strict=True)
                if np.isfinite(s) and d > 0
            ]
            ax.broken_barh(
                [(1e3 * s, 1e3 * d) for s, d in spans],
                (i - 0.4, 0.8),
                facecolors=colour,
                label=label if i == 0 else None,
            )
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels(
        [f"rank {r} (straggler)" if r == diagnosis.straggler else f"rank {r}" for r in ranks]
    )
    ax.invert_yaxis()
    ax.set_xlabel("wall-clock time from the first step's start (ms)")
    title = (
        f"rank {diagnosis.straggler} is the straggler ({diagnosis.ratio:.1f}x the others "
        "before the collective)"
        if diagnosis.straggler is not None
        else "no straggler: the ranks take about as long before the collective"
    )
    ax.set_title(title)
    # Below the axes, outside them: constrained layout makes room under the x label (a legend
    # anchored to the axes at y=-0.25 sat on the label at 2 and 3 ranks).
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="outside lower center", ncols=len(PARTS) - 1, fontsize=FONT,
        frameon=False,
    )  # fmt: skip
    data: dict[str, Any] = {
        "ranks": ranks,
        "parts": names,
        "start": start,
        "seconds": seconds,
        "straggler": diagnosis.straggler,
        "verdict": diagnosis.text,
    }
    fig.ezpz_data = data
    return fig
