"""Private memory of each rank and DataLoader worker, step by step: :func:`memory_growth`.

One panel per rank (or one per run, given several ledgers by name): a line per
worker process, the rank's own line dashed. A forked worker reading Python
objects climbs through the epoch (copy-on-access); one reading a numpy array or
a memory map stays flat. What is drawn is kept in ``fig.ezpz_data``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from ezpz_nb.ledger import Ledger
from ezpz_nb.ledger.memory import MIB, MemorySample
from ezpz_nb.viz.figure import BLUE, FONT, GREEN, ORANGE, PURPLE, SKY, VERMILLION, new_figure

__all__ = ["memory_growth"]

_COLOURS = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY)


def _lines(samples: list[MemorySample]) -> dict[str, np.ndarray]:
    """``{"worker 0": [[step, MiB], ...], "rank": ...}`` of one rank's first epoch."""
    epoch = min((s.epoch for s in samples), default=0)
    out: dict[str, list[tuple[int, float]]] = {}
    for s in sorted(samples, key=lambda s: s.step):
        if s.epoch == epoch:
            name = "rank" if s.worker < 0 else f"worker {s.worker}"
            out.setdefault(name, []).append((s.step, s.memory.private / MIB))
    return {k: np.array(v, dtype=np.float64) for k, v in sorted(out.items())}


def memory_growth(runs: Ledger | Mapping[str, Ledger], *, rank: int = 0) -> Figure:
    """Each worker's private memory (MiB) over the steps of the first epoch.

    Args:
        runs: One ledger (a panel per rank), or ``{name: ledger}`` (a panel per
            run, showing ``rank`` of each: the storages side by side).
        rank: Which rank's workers to draw when ``runs`` is a mapping.

    Returns:
        The figure; ``fig.ezpz_data["lines"]`` is ``{panel: {line: (steps, 2) array
        of [step, MiB]}}`` and ``"growth"`` ``{panel: largest worker growth in MiB}``.
    """
    if isinstance(runs, Ledger):
        panels = {
            f"rank {r}": _lines([s for s in runs.memory if s.rank == r])
            for r in sorted({s.rank for s in runs.memory})
        }
    else:
        panels = {
            name: _lines([s for s in led.memory if s.rank == rank]) for name, led in runs.items()
        }
    n = max(len(panels), 1)
    fig = new_figure(min(2.6 * n, 9.3), 2.6)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    growth: dict[str, float] = {}
    for ax, (panel, lines) in zip(axes, panels.items(), strict=False):
        for i, (name, xy) in enumerate(lines.items()):
            style = "--" if name == "rank" else "-"
            colour = "black" if name == "rank" else _COLOURS[i % len(_COLOURS)]
            ax.plot(xy[:, 0], xy[:, 1], style, color=colour, label=name, lw=1.4)
        workers = [xy[:, 1] for name, xy in lines.items() if name != "rank" and len(xy)]
        growth[panel] = max((float(w[-1] - w[0]) for w in workers), default=0.0)
        ax.set_title(f"{panel}\nworker growth {growth[panel]:+.0f} MiB", fontsize=FONT)
        ax.set_xlabel("step", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel("private memory (MiB)", fontsize=FONT)
    if panels:
        axes[0].legend(fontsize=FONT, loc="upper left")
    fig.ezpz_data = {"lines": panels, "growth": growth}
    return fig
