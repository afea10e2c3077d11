"""The loss of a training run, step by step, against a reference run: :func:`loss_curves`.

The losses come from the ledger (``RecordingLoader.log_loss`` writes one per
step), so the same file that says which rank held which sample also says what
the model learnt from it. As for every figure, what is drawn is kept in
``fig.ezpz_data``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREEN,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    new_figure,
    wrap,
)

__all__ = ["loss_curves"]

_COLOURS = (BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY, YELLOW)


def _curve(run: Ledger | Sequence[float]) -> np.ndarray:
    if isinstance(run, Ledger):
        return np.array([loss for _, _, loss in run.losses()], dtype=np.float64)
    return np.asarray(run, dtype=np.float64).reshape(-1)


def loss_curves(
    runs: Mapping[str, Ledger | Sequence[float]], reference: str | None = None
) -> Figure:
    """One loss curve per run, steps of all epochs one after another.

    Args:
        runs: ``{name: ledger or list of losses}``; a ledger gives the losses
            it logged (:meth:`~ezpz_nb.ledger.Ledger.losses`).
        reference: Name of the run the others are compared with (drawn
            dashed, black); each other run's legend entry gives its largest
            absolute distance from it over the steps both took.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``losses`` (``{name: array}``) and
        ``max_gap`` (``{name: largest |loss - reference loss|}``, only with a
        reference).

    Raises:
        KeyError: ``reference`` is not one of ``runs``.
    """
    losses = {name: _curve(run) for name, run in runs.items()}
    if reference is not None and reference not in losses:
        raise KeyError(f"reference {reference!r} is not one of the runs {list(losses)}")
    gaps: dict[str, float] = {}
    fig = new_figure(7.5, 3.4)
    ax = fig.subplots()
    colours = iter(_COLOURS * (1 + len(losses) // len(_COLOURS)))
    for name, y in losses.items():
        if name == reference:
            continue
        label = name
        if reference is not None:
            ref = losses[reference]
            n = min(len(y), len(ref))
            gaps[name] = float(np.max(np.abs(y[:n] - ref[:n]))) if n else float("nan")
            label = f"{name}: max |gap| {gaps[name]:.2g}"
        ax.plot(np.arange(len(y)), y, color=next(colours), linewidth=1.8, label=label)
    if reference is not None:
        ref = losses[reference]
        ax.plot(
            np.arange(len(ref)),
            ref,
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=f"{reference} (reference)",
        )
    ax.set_xlabel("step (epochs one after another)", fontsize=FONT + 1)
    ax.set_ylabel("training loss", fontsize=FONT + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.tick_params(labelsize=FONT)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=FONT, loc="upper right", frameon=False)
    title = "Loss per step"
    if reference is not None:
        title += f": curves on the dashed one are the same training as {reference!r}"
    fig.suptitle(wrap(title, 7.1, FONT + 3), fontsize=FONT + 3)
    fig.ezpz_data = {"losses": losses, "max_gap": gaps}
    return fig
