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
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREEN,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    new_figure,
    wrap,
)

__all__ = ["memory_growth"]

_COLOURS = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY)
#: The rank's own line: it looks alike in every storage (the workers' lines are what
#: tell storages apart), so it is drawn thin and grey, behind them.
_RANK = "rank"
_RANK_LABEL = "the rank itself"
_TAKEAWAY = "a line that climbs is a worker copying the dataset as it reads it"


def _lines(samples: list[MemorySample]) -> dict[str, np.ndarray]:
    """``{"worker 0": [[step, MiB], ...], "rank": ...}`` of one rank's first epoch."""
    epoch = min((s.epoch for s in samples), default=0)
    out: dict[str, list[tuple[int, float]]] = {}
    for s in sorted(samples, key=lambda s: s.step):
        if s.epoch == epoch:
            name = _RANK if s.worker < 0 else f"worker {s.worker}"
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
        title = f"Each rank's DataLoader workers, private memory per step: {_TAKEAWAY}"
    else:
        _check_runs(runs, rank)
        panels = {
            name: _lines([s for s in led.memory if s.rank == rank]) for name, led in runs.items()
        }
        title = f"Rank {rank}'s DataLoader workers, private memory per step: {_TAKEAWAY}"
    if not any(panels.values()):
        return _no_samples()
    n = len(panels)
    width = min(2.6 * n, 9.3)
    fig = new_figure(width, 2.9)
    axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
    growth: dict[str, float] = {}
    for ax, (panel, lines) in zip(axes, panels.items(), strict=False):
        workers = [name for name in lines if name != _RANK]
        for i, name in enumerate(workers):
            xy = lines[name]
            ax.plot(xy[:, 0], xy[:, 1], "-", color=_COLOURS[i % len(_COLOURS)], label=name, lw=1.6)
        if _RANK in lines:
            xy = lines[_RANK]
            ax.plot(xy[:, 0], xy[:, 1], "--", color="0.5", label=_RANK_LABEL, lw=1.0, zorder=1)
        ends = [lines[w][:, 1] for w in workers if len(lines[w])]
        growth[panel] = max((float(w[-1] - w[0]) for w in ends), default=0.0)
        ax.set_title(f"{panel}\nlargest worker growth {growth[panel]:+.0f} MiB", fontsize=FONT)
        ax.set_xlabel("step", fontsize=FONT)
        ax.tick_params(labelsize=FONT)
    axes[0].set_ylabel("private memory (MiB)", fontsize=FONT)
    axes[0].legend(fontsize=FONT, loc="upper left")
    fig.suptitle(wrap(title, width - 0.2, FONT + 1), fontsize=FONT + 1)
    fig.ezpz_data = {"lines": panels, "growth": growth}
    return fig


def _check_runs(runs: object, rank: int) -> None:
    """A ``{name: Ledger}`` that holds ``rank``'s samples, or an error saying what to pass."""
    if not isinstance(runs, Mapping) or not all(isinstance(v, Ledger) for v in runs.values()):
        got = type(runs).__name__
        if isinstance(runs, Mapping):
            got = f"{{name: {type(next(iter(runs.values()))).__name__}}}"
        raise TypeError(
            f"memory_growth takes a Ledger or {{name: Ledger}}, got {got}. From cluster.run or "
            "ez.launch, merge the ranks' ledgers first: Ledger.from_results([m.ledger for m "
            "in got]) for measure_workers' results, Ledger.from_results(results) for ledgers."
        )
    have = sorted({s.rank for led in runs.values() for s in led.memory})
    if have and rank not in have:
        raise ValueError(
            f"rank={rank} took no memory samples here; the ranks that did: "
            f"{', '.join(map(str, have))}"
        )


def _no_samples() -> Figure:
    """A small figure saying there is nothing to draw, and how to record it."""
    fig = new_figure(6.0, 1.2)
    fig.text(
        0.5,
        0.5,
        "no memory samples in this ledger: record(loader, memory=True) takes them",
        ha="center",
        va="center",
        fontsize=FONT + 1,
    )
    fig.ezpz_data = {"lines": {}, "growth": {}}
    return fig
