"""What the plot modules share: a Figure that shows itself as PNG, the colours, rank rows.

Figures are drawn without pyplot so nothing is shown twice in a notebook and
nothing piles up in memory; :class:`EzFigure` shows itself through
``_repr_png_`` instead. Colours come from palettes legible to colour-blind
readers: Okabe-Ito for marks, viridis and cividis for values.
"""

from __future__ import annotations

import io
import math
import textwrap
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine

from ezpz_nb.ledger import Ledger

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
BLUE, ORANGE, SKY, GREEN, YELLOW = "#0072B2", "#E69F00", "#56B4E9", "#009E73", "#F0E442"
VERMILLION, PURPLE, GREY = "#D55E00", "#CC79A7", "#999999"
MISSING = "#d9d9d9"  # an empty batch slot: light grey, drawn in the legends that show it

# What a notebook shows: PNGs at DPI (``_repr_png_``, the widgets, and matplotlib's
# inline backend, which renders at the figure's own dpi), at their own width up to the
# output area's, WIDTH_PX: 848 px measured in JupyterLab 4 in a 1280 px wide browser
# window with the file browser open. Wider images are scaled down to fit, so figures
# stay within MAX_WIDTH, and no text is smaller than FONT points (FONT * DPI / 72 =
# 10 px, above the 9 px that tests/test_figure_legibility.py requires).
DPI = 90
WIDTH_PX = 840
MAX_WIDTH = WIDTH_PX / DPI
FONT = 8
# Output metadata: JupyterLab shows the image at its own width, never scaled down.
UNCONFINED = {"unconfined": True}


class EzFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in notebooks, pyplot or not.

    Attributes:
        ezpz_data: The arrays the figure draws (see each plot function).
    """

    ezpz_data: dict[str, Any]

    def _repr_png_(self) -> bytes:
        return png_bytes(self)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        # Only metadata: the PNG itself comes from _repr_png_, or from matplotlib's inline
        # backend where it is on (it renders at the figure's dpi). "unconfined": JupyterLab
        # shows the image at its own width, scrolling a narrow output instead of shrinking
        # the text below legibility (figures fit the usual output width anyway, MAX_WIDTH).
        return {}, {"image/png": UNCONFINED}


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """Render ``fig`` to PNG bytes (for widgets, files and notebook display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def new_figure(width: float, height: float, rows: int = 0) -> EzFigure:
    """An :class:`EzFigure` of at most :data:`MAX_WIDTH` x 14 inches with a canvas (no pyplot)."""
    # Constrained layout measures every tick label before drawing: worth it for
    # small figures, but it doubles the render time of a 64-rank one.
    big = rows > 24
    fig = EzFigure(
        figsize=(min(width, MAX_WIDTH), min(height, 14.0)),
        dpi=DPI,
        layout=None if big else "constrained",
    )
    engine = fig.get_layout_engine()
    if isinstance(engine, ConstrainedLayoutEngine):
        # a margin, so no label touches the edge of the image
        engine.set(w_pad=0.08, h_pad=0.06)
    else:
        fig.subplots_adjust(left=0.13, right=0.9, top=0.9, bottom=0.08, wspace=0.05)
    FigureCanvasAgg(fig)  # a canvas makes savefig/print_png work without pyplot
    return fig


def rank_label(rank: int, dp: int, tp: int, cp: int | None = None) -> str:
    """``r3 (dp1,tp1)``, or ``r3 (dp0,cp1,tp1)`` with CP: how every figure names a rank."""
    return f"r{rank} (dp{dp},tp{tp})" if cp is None else f"r{rank} (dp{dp},cp{cp},tp{tp})"


def cp_ranks(ledger: Ledger) -> dict[int, int] | None:
    """``{rank: cp_rank}`` when the run used context parallelism, else None."""
    if all(r.cp_size == 1 for r in ledger.records):
        return None
    return {r.rank: r.cp_rank for r in ledger.records}


def rank_rows(ledger: Ledger) -> list[tuple[int, int, int]]:
    """``(rank, dp_rank, tp_rank)`` per recorded rank, DP replicas kept together
    (inside one, by CP then TP position: the order of the ranks in the mesh)."""
    pos = ledger.layout()
    cp = cp_ranks(ledger) or {}
    return sorted(((r, *pos[r]) for r in pos), key=lambda x: (x[1], cp.get(x[0], 0), x[2], x[0]))


def row_labels(ledger: Ledger, rows: list[tuple[int, int, int]]) -> list[str]:
    """:func:`rank_label` of each row, with its CP position when the run had CP."""
    cp = cp_ranks(ledger)
    return [rank_label(*x, cp=None if cp is None else cp[x[0]]) for x in rows]


def label_rows(
    ax: Any,
    rows: list[tuple[int, int, int]],
    labels: list[str] | None = None,
    row_height: float = 0.3,
) -> None:
    """Y tick labels for rank rows (``labels``, else :func:`rank_label`), thinned to fit.

    ``row_height`` (inches) sets how many labels fit: one every ~1.4 lines of text.
    """
    fit = max(1, int(len(rows) * row_height / (1.4 * FONT / 72)))
    every = max(1, math.ceil(len(rows) / fit))
    ticks = list(range(0, len(rows), every))
    names = labels if labels is not None else [rank_label(*x) for x in rows]
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=FONT)


def wrap(text: str, width: float, fontsize: float) -> str:
    """``text`` broken between words into lines that fit ``width`` inches at ``fontsize``.

    Lines already broken stay broken; the width of a character is taken as 0.6 em
    (DejaVu Sans averages about 0.5-0.6: wider, to keep a margin).
    """
    chars = max(20, int(width * 72 / (0.6 * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def group_separators(ax: Any, rows: list[tuple[int, int, int]], color: str = "white") -> None:
    """A horizontal line wherever the DP replica changes: between lines sits one TP group."""
    for i in range(1, len(rows)):
        if rows[i][1] != rows[i - 1][1]:
            ax.axhline(i - 0.5, color=color, linewidth=2.5)


def empty_figure(what: str, data: dict[str, Any]) -> EzFigure:
    """A small figure that says the ledger is empty (a run that failed before step 0)."""
    fig = new_figure(6.0, 1.5)
    fig.text(0.5, 0.5, f"{what}: the ledger has no steps to draw", ha="center", va="center")
    fig.ezpz_data = data
    return fig
