"""Realized shares of a mixture against its target, per global batch and cumulative."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator, PercentFormatter

from ezpz_nb.viz.figure import BLUE, FONT, GREEN, ORANGE, new_figure, wrap

__all__ = ["mix_shares"]

_COLORS = (BLUE, ORANGE, GREEN)


def mix_shares(
    shares: Mapping[str, Mapping[str, np.ndarray]],
    weights: Sequence[float],
    names: Sequence[str],
    title: str = "",
) -> Figure:
    """One row per design, two panels (each global batch | cumulative), a line per source.

    Args:
        shares: ``{design: {"batch": a, "cumulative": a, "batch_tokens": a,
            "cumulative_tokens": a}}``, each ``a`` a ``batches x sources`` array of
            shares (see :func:`ezpz_nb.data.mixture.realized_shares`); the token arrays
            are optional (drawn dashed).
        weights: Target share of each source (dotted lines).
        names: Each source's name (at most 3 sources).
        title: A title above the panels.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``shares`` and ``weights``.
    """
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    fig = new_figure(9.3, 1.9 * len(shares) + 1.2)
    axes = fig.subplots(len(shares), 2, sharex=True, sharey=True, squeeze=False)
    for row, (design, parts) in enumerate(shares.items()):
        for col, scope in enumerate(("batch", "cumulative")):
            ax = axes[row][col]
            for s in range(len(w)):
                color = _COLORS[s % len(_COLORS)]
                ax.axhline(w[s], color=color, linestyle=":", linewidth=1.2)
                ax.plot(parts[scope][:, s], color=color, linewidth=1.6)
                if f"{scope}_tokens" in parts:
                    ax.plot(
                        parts[f"{scope}_tokens"][:, s], color=color, linestyle="--", linewidth=1.1
                    )
            what = "each global batch" if scope == "batch" else "cumulative"
            ax.set_title(f"{design}: {what}", fontsize=FONT + 1)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.tick_params(labelsize=FONT)
            if col == 0:
                ax.set_ylabel("share", fontsize=FONT + 1)
            if row == len(shares) - 1:
                ax.set_xlabel("global batch", fontsize=FONT + 1)
    handles = [Line2D([], [], color=_COLORS[s], linewidth=2) for s in range(len(w))]
    labels = [f"{n} (target {w[s]:.0%})" for s, n in enumerate(names)]
    handles += [
        Line2D([], [], color="black", linewidth=1.6),
        Line2D([], [], color="black", linestyle="--", linewidth=1.1),
        Line2D([], [], color="black", linestyle=":", linewidth=1.2),
    ]
    labels += ["in samples", "in tokens", "target"]
    # Below the panels, never over them: a legend inside would hide the lines it names.
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=FONT, frameon=False)
    if title:
        fig.suptitle(wrap(title, 9.0, FONT + 3), fontsize=FONT + 3)
    fig.ezpz_data = {"shares": {k: dict(v) for k, v in shares.items()}, "weights": w}
    return fig
