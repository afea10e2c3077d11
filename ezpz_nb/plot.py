"""Pictures of a sample ledger: who saw which samples, when, and where ranks stopped.

Every function takes a :class:`~ezpz_nb.ledger.Ledger` from a real run (except
:func:`layout`) and returns a :class:`matplotlib.figure.Figure`, drawn without
pyplot so nothing is shown twice in a notebook and nothing piles up in memory
(the figures show themselves as PNG through ``_repr_png_``).
What each figure draws is also kept as plain arrays in ``fig.ezpz_data``, so
tests (and curious learners) can check the numbers rather than the pixels.

Colours: sample ids use viridis, DP replicas cividis, and marks use the
Okabe-Ito palette, all legible to colour-blind readers.

Example::

    ledger = Ledger.from_results(ez.launch(train, world_size=4))
    plot.heatmap(ledger)          # identical rows inside a TP group?
    plot.coverage(ledger)         # every sample seen exactly once?
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from ezpz_nb.groups import layout_table
from ezpz_nb.ledger import Ledger

__all__ = [
    "EzFigure",
    "coverage",
    "heatmap",
    "layout",
    "loaded_vs_received",
    "png_bytes",
    "repeat_mask",
    "timeline",
]

# Okabe-Ito: distinguishable with every common colour-vision deficiency.
BLUE, ORANGE, SKY, GREEN, YELLOW = "#0072B2", "#E69F00", "#56B4E9", "#009E73", "#F0E442"
VERMILLION, PURPLE, GREY = "#D55E00", "#CC79A7", "#999999"
_MISSING = "#e8e8e8"
# Above this many cells, numbers inside cells are unreadable and slow to draw.
_ANNOTATE_MAX = 400


class EzFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in notebooks, pyplot or not.

    Attributes:
        ezpz_data: The arrays the figure draws (see each plot function).
    """

    ezpz_data: dict[str, Any]

    def _repr_png_(self) -> bytes:
        return png_bytes(self)


def png_bytes(fig: Figure, dpi: int = 90) -> bytes:
    """Render ``fig`` to PNG bytes (for widgets, files and notebook display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _figure(width: float, height: float, rows: int = 0) -> Figure:
    # Constrained layout measures every tick label before drawing: worth it for
    # small figures, but it doubles the render time of a 64-rank one.
    big = rows > 24
    fig = EzFigure(figsize=(min(width, 20.0), min(height, 14.0)),
                   layout=None if big else "constrained")
    if big:
        fig.subplots_adjust(left=0.13, right=0.9, top=0.9, bottom=0.08, wspace=0.05)
    FigureCanvasAgg(fig)  # a canvas makes savefig/print_png work without pyplot
    return fig


def _label(rank: int, dp: int, tp: int) -> str:
    return f"r{rank} (dp{dp},tp{tp})"


def _rows(ledger: Ledger) -> list[tuple[int, int, int]]:
    """``(rank, dp_rank, tp_rank)`` per recorded rank, TP groups kept together."""
    pos = ledger.layout()
    return sorted(((r, *pos[r]) for r in pos), key=lambda x: (x[1], x[2], x[0]))


def _label_rows(ax: Any, rows: list[tuple[int, int, int]]) -> None:
    every = max(1, math.ceil(len(rows) / 32))  # more labels than that are unreadable
    ticks = list(range(0, len(rows), every))
    ax.set_yticks(ticks, [_label(*rows[i]) for i in ticks], fontsize=8 if len(rows) <= 16 else 6)


def _group_separators(ax: Any, rows: list[tuple[int, int, int]], color: str = "white") -> None:
    # A line wherever the DP replica changes: between lines sits one TP group.
    for i in range(1, len(rows)):
        if rows[i][1] != rows[i - 1][1]:
            ax.axhline(i - 0.5, color=color, linewidth=2.5)


def _nothing(what: str, data: dict[str, Any]) -> Figure:
    """A small figure that says the ledger is empty (a run that failed before step 0)."""
    fig = _figure(6.0, 1.5)
    fig.text(0.5, 0.5, f"{what}: the ledger has no steps to draw", ha="center", va="center")
    fig.ezpz_data = data
    return fig


def _nice_stride(n: int, ticks: int = 12) -> int:
    """A tick step of 1, 2 or 5 times a power of ten giving at most ~``ticks`` ticks."""
    step = 1
    while n / step > ticks:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


def _epoch_matrix(ledger: Ledger, epoch: int, rows: list[tuple[int, int, int]]) -> np.ndarray:
    """Sample ids as ``(rows, steps, batch)``, -1 where a rank had nothing."""
    index = {r: i for i, (r, _, _) in enumerate(rows)}
    recs = [r for r in ledger.records if r.epoch == epoch]
    steps = max((r.step + 1 for r in recs), default=0)
    width = max((len(r.sample_ids) for r in recs), default=0)
    out = np.full((len(rows), steps, width), -1, dtype=np.int64)
    for r in recs:
        out[index[r.rank], r.step, : len(r.sample_ids)] = r.sample_ids
    return out


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
    if ids.size == 0:
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


def _annotate(ax: Any, img: np.ndarray, repeats: np.ndarray, vmax: float) -> None:
    for (y, x), v in np.ndenumerate(img):
        if v < 0:
            continue
        dark = v < 0.6 * vmax  # viridis is dark at the low end
        box = {"boxstyle": "square,pad=0.15", "fill": False, "edgecolor": VERMILLION,
               "linewidth": 2} if repeats[y, x] else None
        ax.text(x, y, str(v), ha="center", va="center", fontsize=7,
                color="white" if dark else "black", bbox=box)


def heatmap(ledger: Ledger, epoch: int | None = None) -> Figure:
    """Rank x step picture of the sample ids each rank held.

    Rows are global ranks labelled ``r3 (dp1,tp1)``, grouped by TP group
    (white lines between groups); each step spans one column per batch
    position. Look for identical rows inside a TP group, different rows across
    groups, and the marked repeats (samples another slot already had, i.e.
    DistributedSampler's padding). Several epochs are drawn side by side so a
    missing reshuffle (no ``set_epoch``) shows as two identical panels.

    Args:
        ledger: Records of a real run.
        epoch: Draw only this epoch; ``None`` draws every recorded epoch.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``labels``, ``epochs``,
        ``ids[epoch]`` (``(rows, steps, batch)`` int64, -1 absent) and
        ``repeats[epoch]`` (bool, same shape).
    """
    rows = _rows(ledger)
    epochs = ledger.epochs() if epoch is None else [epoch]
    dp = np.array([d for _, d, _ in rows], dtype=np.int64)
    data: dict[str, Any] = {"ranks": [r for r, _, _ in rows], "labels": [_label(*x) for x in rows],
                            "epochs": epochs, "ids": {}, "repeats": {}}
    for e in epochs:
        data["ids"][e] = _epoch_matrix(ledger, e, rows)
        data["repeats"][e] = repeat_mask(data["ids"][e], dp)
    vmax = max([1] + [int(m.max()) for m in data["ids"].values() if m.size])
    cells = sum(m.shape[1] * m.shape[2] for m in data["ids"].values())
    fig = _figure(3.0 + min(cells, 60) * 0.28 + 1.5 * len(epochs), 1.6 + 0.3 * max(len(rows), 2),
                  rows=len(rows))
    axes = fig.subplots(1, max(len(epochs), 1), sharey=True, squeeze=False)[0]
    cmap = colormaps["viridis"].with_extremes(bad=_MISSING)
    image = None
    for ax, e in zip(axes, epochs, strict=False):
        ids, reps = data["ids"][e], data["repeats"][e]
        n_rows, steps, width = ids.shape
        img = ids.reshape(n_rows, steps * width)
        image = ax.imshow(np.ma.masked_less(img, 0), cmap=cmap, vmin=0, vmax=vmax,
                          aspect="auto", interpolation="nearest")
        rep2 = reps.reshape(n_rows, steps * width)
        if img.size <= _ANNOTATE_MAX:
            _annotate(ax, img, rep2, vmax)
        elif rep2.any():
            yy, xx = np.nonzero(rep2)
            ax.scatter(xx, yy, marker="X", s=45, facecolor=VERMILLION, edgecolor="black",
                       linewidths=0.6)
        if width > 1 and steps <= 60:
            for s in range(1, steps):
                ax.axvline(s * width - 0.5, color="white", linewidth=0.8)
        stride = _nice_stride(steps)
        ax.set_xticks([s * width + (width - 1) / 2 for s in range(0, steps, stride)],
                      [str(s) for s in range(0, steps, stride)])
        _group_separators(ax, rows)
        ax.set_xlabel("step (one column per sample in the batch)" if width > 1 else "step")
        ax.set_title(f"epoch {e}: {int(reps.sum())} repeated cell(s)", fontsize=10)
    _label_rows(axes[0], rows)
    axes[0].set_ylabel("global rank (dp, tp)")
    if image is not None:
        fig.colorbar(image, ax=list(axes), label="sample id", shrink=0.9, fraction=0.04, pad=0.02)
    fig.suptitle("Which sample each rank held: rows between white lines (one TP group) should match,\n"
                 "groups should differ; boxed/x = a sample another slot already had (padding)",
                 fontsize=11)
    fig.ezpz_data = data
    return fig


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
        return _nothing("Coverage", {"epochs": epochs, "num_samples": max(n, 0),
                                     "replica": np.zeros((0, 0), dtype=np.int64),
                                     "replicas_seen": np.zeros((0, 0), dtype=np.int64)})
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
    fig = _figure(8.0 + min(n, 80) * 0.06, 1.8 + 0.5 * max(len(epochs), 1))
    ax = fig.subplots()
    ax.imshow(rgba, aspect="auto", interpolation="nearest")
    for val, marker, color in ((-2, "x", "black"), (-1, ".", "black")):
        yy, xx = np.nonzero(replica == val)
        if len(xx) and n <= 400:
            ax.scatter(xx, yy, marker=marker, s=20, color=color, linewidths=1)
    ax.set_yticks(range(len(epochs)), [f"epoch {e}" for e in epochs])
    ax.set_xlabel("sample id")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [Patch(color=palette[k], label=f"DP replica {k}") for k in range(min(dp_size, 8))]
    handles += [Patch(facecolor=VERMILLION, label="seen by several replicas (x)"),
                Patch(facecolor="white", edgecolor="black", label="never seen (.)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    dups, never = int((replica == -2).sum()), int((replica == -1).sum())
    fig.suptitle(f"Coverage: every sample should be seen by exactly one DP replica per epoch\n"
                 f"{dups} duplicate(s) (x), {never} never seen (.) over {len(epochs)} epoch(s)",
                 fontsize=11)
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
    rows = _rows(ledger)
    counts: dict[int, dict[str, int]] = defaultdict(lambda: {"loaded": 0, "received": 0})
    for r in ledger.records:
        counts[r.rank]["received" if r.source == "received" else "loaded"] += 1
    loaded = np.array([counts[r]["loaded"] for r, _, _ in rows])
    received = np.array([counts[r]["received"] for r, _, _ in rows])
    fig = _figure(9.0, 1.6 + 0.3 * max(len(rows), 2), rows=len(rows))
    ax = fig.subplots()
    y = np.arange(len(rows))
    ax.barh(y, loaded, color=BLUE, label="loaded itself")
    ax.barh(y, received, left=loaded, color=ORANGE, hatch="//", label="received by broadcast")
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # rank 0 on top, as in the heatmap
    _label_rows(ax, rows)
    _group_separators(ax, rows, color=GREY)
    ax.set_xlabel("batches (all epochs)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("global rank (dp, tp)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    loaders = int((loaded > 0).sum())
    fig.suptitle(f"Loaded vs received: {loaders} of {len(rows)} rank(s) ran the loader (did I/O);\n"
                 "with the TP broadcast only the tp0 rank of each TP group should", fontsize=11)
    fig.ezpz_data = {"ranks": [r for r, _, _ in rows], "labels": [_label(*x) for x in rows],
                     "loaded": loaded, "received": received}
    return fig


def _error_status(error: BaseException | None) -> dict[int, tuple[str, str, str]]:
    """``{rank: (status, note, short note)}`` from a HangError's stacks or a RankError's failures."""
    out: dict[int, tuple[str, str, str]] = {}
    for rank, st in (getattr(error, "stacks", None) or {}).items():
        if st.state == "finished":
            out[rank] = ("finished", st.describe(), "finished; the others wait for it")
        else:
            where = f" at {st.where}" if st.where else ""
            out[rank] = ("hung", st.describe(), f"hung in {st.call or '?'}(){where}")
    for rank, f in (getattr(error, "failures", None) or {}).items():
        status = {"exception": "raised", "stopped": "stopped"}.get(f.kind, "died")
        short = {"raised": f"raised {f.exc_type}", "stopped": "stopped while waiting"}
        out[rank] = (status, f"rank {rank}: {f.message}", short.get(status, f.message))
    return out


# status -> (marker, colour, legend text)
_STATUS_STYLE = {
    "raised": ("X", VERMILLION, "raised an exception"),
    "died": ("X", VERMILLION, "died"),
    "hung": ("o", PURPLE, "hung in a call"),
    "stopped": ("s", GREY, "stopped by the launcher"),
    "short": ("|", VERMILLION, "fewer steps than the others"),
}


def timeline(ledger: Ledger, error: BaseException | None = None) -> Figure:
    """Steps each rank took, epoch after epoch, and where it stopped, raised or hung.

    Bars should end together: a rank whose bar is shorter left the others
    waiting for it in their next collective.

    Args:
        ledger: Records of the run (``Ledger.from_events(err.events)`` after a failure).
        error: The :class:`~ezpz_nb.HangError` (its ``.stacks``) or
            :class:`~ezpz_nb.RankError` (its ``.failures``) the run raised, if any.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``epochs``, ``steps``
        (``{epoch: {rank: n}}``), ``total`` (``{rank: n}``), ``status``
        (``{rank: "ok" | "short" | "raised" | "hung" | "stopped" | "died" | "finished"}``;
        "short": fewer steps than the others without failing)
        and ``notes`` (``{rank: text}``).
    """
    info = _error_status(error)
    pos = ledger.layout()
    ranks = sorted(set(pos) | set(info))
    epochs = ledger.epochs()
    steps = {e: dict.fromkeys(ranks, 0) for e in epochs}
    for r in ledger.records:
        steps[r.epoch][r.rank] = max(steps[r.epoch][r.rank], r.step + 1)
    total = {k: sum(steps[e][k] for e in epochs) for k in ranks}
    most = max(total.values(), default=0)
    status, notes, short = {}, {}, {}
    for k in ranks:
        status[k], notes[k], short[k] = info.get(k, ("ok", "", ""))
        if status[k] in ("ok", "finished") and total[k] < most:
            # It left early without failing: the others wait for it in their next collective.
            status[k] = "short"
            notes[k] = notes[k] or f"rank {k}: stopped after {total[k]} of {most} steps"
            short[k] = f"stopped after {total[k]} of {most} steps"
    fig = _figure(10.0, 1.6 + 0.3 * max(len(ranks), 2), rows=len(ranks))
    ax = fig.subplots()
    start = 0
    for i, e in enumerate(epochs):
        width = max(steps[e].values(), default=0)
        for y, k in enumerate(ranks):
            if steps[e][k]:
                ax.broken_barh([(start, steps[e][k])], (y - 0.35, 0.7),
                               color=BLUE if i % 2 == 0 else SKY)
        if i:
            ax.axvline(start, color=GREY, linestyle=":", linewidth=1)
        ax.text(start, -0.7, f"epoch {e}", fontsize=8, va="bottom")
        start += width
    for y, k in enumerate(ranks):
        if status[k] in _STATUS_STYLE:
            marker, color, _ = _STATUS_STYLE[status[k]]
            ax.scatter([total[k]], [y], marker=marker, s=200 if marker == "|" else 80, color=color,
                       zorder=3, linewidths=3 if marker == "|" else 1.5)
        if len(ranks) <= 16 and short[k]:
            text = short[k] if len(short[k]) <= 50 else short[k][:49] + "..."
            ax.text(total[k] + max(most, 1) * 0.03, y, text, fontsize=7, va="center")
    labels = [_label(k, *pos[k]) if k in pos else f"r{k} (no steps)" for k in ranks]
    ax.set_yticks(range(len(ranks)), labels, fontsize=8 if len(ranks) <= 16 else 6)
    ax.set_ylim(len(ranks) - 0.5, -1.0)
    ax.set_xlim(0, max(most, 1) * (1.7 if len(ranks) <= 16 and any(short.values()) else 1.05))
    ax.set_xlabel("steps taken (epochs one after another)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("global rank")
    handles = [Patch(color=BLUE, label="steps")] + [
        Patch(color=c, label=text) for s, (_, c, text) in _STATUS_STYLE.items()
        if s in status.values()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    groups = [f"{s} {[k for k in ranks if status[k] == s]}" for s in _STATUS_STYLE
              if s in status.values()]
    verdict = "; ".join(groups) if groups else "all ranks took the same steps"
    fig.suptitle(f"Step timeline: bars should end together ({verdict})", fontsize=11)
    fig.ezpz_data = {"ranks": ranks, "epochs": epochs, "steps": steps, "total": total,
                     "status": status, "notes": notes}
    return fig


def layout(world_size: int, tp_size: int) -> Figure:
    """The world as a ``dp x tp`` grid: rows are TP groups, columns DP groups.

    TP peers (a row) split one model and must hold the same batch; DP groups (a
    column) hold different shards of the data.

    Args:
        world_size: Number of ranks.
        tp_size: Ranks per TP group; must divide ``world_size``.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``grid`` (``(dp, tp)`` array of
        global ranks), ``tp_groups`` and ``dp_groups`` (lists of rank lists).

    Raises:
        ValueError: If ``tp_size`` does not divide ``world_size``.
    """
    table = layout_table(world_size, tp_size)
    dp_size = world_size // tp_size
    grid = np.zeros((dp_size, tp_size), dtype=np.int64)
    for rank, d, t in table:
        grid[d, t] = rank
    fig = _figure(3.5 + 1.1 * tp_size, 1.6 + 0.55 * dp_size, rows=dp_size)
    ax = fig.subplots()
    # Light Okabe-Ito colours, one per TP position, so black text stays readable.
    light = [SKY, ORANGE, YELLOW, PURPLE, GREEN]
    cmap = ListedColormap([light[t % len(light)] for t in range(tp_size)])
    ax.imshow(np.tile(np.arange(tp_size), (dp_size, 1)), cmap=cmap,
              norm=BoundaryNorm(np.arange(tp_size + 1) - 0.5, tp_size), aspect="auto")
    small = world_size <= 32
    for (d, t), rank in np.ndenumerate(grid):
        text = f"r{rank}\n(dp{d},tp{t})" if small else f"r{rank}"
        ax.text(t, d, text, ha="center", va="center", fontsize=8 if small else 6)
    for d in range(dp_size):  # a frame around each TP group
        ax.add_patch(Rectangle((-0.45, d - 0.42), tp_size - 0.1, 0.84, fill=False,
                               edgecolor="black", linewidth=1.5))
    ax.set_xticks(range(tp_size), [f"tp{t}" for t in range(tp_size)])
    ax.set_yticks(range(dp_size), [f"dp{d}" for d in range(dp_size)])
    ax.set_xlabel("tp_rank (each column is a DP group)")
    ax.set_ylabel("dp_rank (each row is a TP group)")
    ax.set_title(f"world {world_size} = dp {dp_size} x tp {tp_size}: each framed row shares one "
                 "batch,\neach column holds different data", fontsize=10)
    fig.ezpz_data = {"grid": grid, "tp_groups": [list(map(int, row)) for row in grid],
                     "dp_groups": [list(map(int, col)) for col in grid.T]}
    return fig
