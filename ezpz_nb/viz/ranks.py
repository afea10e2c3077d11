"""Pictures of the ranks themselves: how far each one got in a run, and the dp x tp layout.

:func:`timeline` draws the steps each rank took and, after a failed run, what
each rank was doing when the run ended: which ranks left early (the cause of a
hang) and which were left waiting in a collective. :func:`layout` draws the
world as a grid of TP and DP groups. Both are importable from :mod:`ezpz_nb.viz`;
what they draw is kept in ``fig.ezpz_data`` as for every plot function.
"""

from __future__ import annotations

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from ezpz_nb.data.groups import layout_table
from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREEN,
    GREY,
    MAX_WIDTH,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    cp_ranks,
    new_figure,
    rank_label,
    wrap,
)

__all__ = ["layout", "timeline"]

# status -> (marker, colour, legend text, also the title's words). The order is
# the title's: the ranks that caused the failure first, then those left waiting.
_STATUS_STYLE = {
    "short": ("|", VERMILLION, "finished early (fewer steps)"),
    "finished": (">", ORANGE, "finished while the others waited"),
    "raised": ("X", VERMILLION, "raised an exception"),
    "died": ("X", VERMILLION, "died"),
    "hung": ("o", PURPLE, "hung, waiting in a call"),
    "stopped": ("s", GREY, "stopped by the launcher while waiting"),
}


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


def _ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 0 and 2``, ``ranks 0, 1 and 5``; long lists cut short."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 6:
        return f"{len(ranks)} ranks ({', '.join(map(str, ranks[:4]))}, ...)"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _verdict(by_status: dict[str, list[int]], error: BaseException | None) -> str:
    """One clause per status, in :data:`_STATUS_STYLE` order, naming its ranks."""
    stacks = getattr(error, "stacks", None) or {}
    calls = sorted({f"{stacks[k].call}()" for k in by_status.get("hung", []) if stacks[k].call})
    waiting = f"hung, waiting in {', '.join(calls)}" if calls else _STATUS_STYLE["hung"][2]
    phrase = {s: waiting if s == "hung" else style[2] for s, style in _STATUS_STYLE.items()}
    parts = [f"{_ranks_text(ks)} {phrase[s]}" for s, ks in by_status.items() if s in phrase]
    return "; ".join(parts) if parts else "all ranks took the same steps"


def timeline(ledger: Ledger, error: BaseException | None = None) -> Figure:
    """Steps each rank took, epoch after epoch, and where it stopped, raised or hung.

    Bars should end together. After a hang the title names the ranks that
    finished early (the cause: they left, or took fewer steps) apart from the
    ranks they left waiting in a collective (hung), whose bars are often the
    longer ones.

    Args:
        ledger: Records of the run (``Ledger.from_events(err.events)`` after a failure).
        error: The :class:`~ezpz_nb.HangError` (its ``.stacks``) or
            :class:`~ezpz_nb.RankError` (its ``.failures``) the run raised, if any.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``epochs``, ``steps``
        (``{epoch: {rank: n}}``), ``total`` (``{rank: n}``), ``status``
        (``{rank: "ok" | "short" | "finished" | "raised" | "died" | "hung" | "stopped"}``;
        "short": finished with fewer steps than the others; "finished": returned
        while the others hung, without fewer steps), ``notes`` (``{rank: text}``),
        ``verdict`` (``{status: [ranks]}`` for every status but "ok", in the
        title's order) and ``title``.
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
            notes[k] = notes[k] or f"rank {k}: finished after {total[k]} of {most} steps"
            short[k] = f"finished early: {total[k]} of {most} steps"
    by_status = {s: [k for k in ranks if status[k] == s] for s in _STATUS_STYLE}
    by_status = {s: ks for s, ks in by_status.items() if ks}

    beside = len(ranks) <= 16 and any(short.values())
    fig = new_figure(10.0, 2.2 + 0.3 * max(len(ranks), 2), rows=len(ranks))
    ax = fig.subplots()
    start, spans = 0, []
    for i, e in enumerate(epochs):
        width = max(steps[e].values(), default=0)
        for y, k in enumerate(ranks):
            if steps[e][k]:
                ax.broken_barh(
                    [(start, steps[e][k])], (y - 0.35, 0.7), color=BLUE if i % 2 == 0 else SKY
                )
        if i:
            ax.axvline(start, color=GREY, linestyle=":", linewidth=1)
        spans.append((start, width))
        start += width
    for y, k in enumerate(ranks):
        if status[k] in _STATUS_STYLE:
            marker, color, _ = _STATUS_STYLE[status[k]]
            ax.scatter(
                [total[k]],
                [y],
                marker=marker,
                s=200 if marker == "|" else 80,
                color=color,
                zorder=3,
                linewidths=3 if marker == "|" else 1.5,
                clip_on=False,
            )
        if beside and short[k]:
            # Beside the frame, so the x axis ends where the data does.
            text = short[k] if len(short[k]) <= 40 else short[k][:39] + "..."
            ax.annotate(
                text, (1.02, y), xycoords=("axes fraction", "data"), fontsize=FONT, va="center"
            )
    cp = cp_ranks(ledger) or {}
    labels = [
        rank_label(k, *pos[k], cp=cp.get(k)) if k in pos else f"r{k} (no steps)" for k in ranks
    ]
    ax.set_yticks(range(len(ranks)), labels, fontsize=FONT)
    ax.set_ylim(max(len(ranks), 1) - 0.5, -0.5)
    ax.set_xlim(0, max(most, 1) + 0.25)
    ax.set_xlabel("steps taken (epochs one after another)", fontsize=FONT + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=FONT)
    ax.set_ylabel("global rank", fontsize=FONT + 1)
    if len(epochs) > 1:  # which span of steps is which epoch, above the frame
        top = ax.secondary_xaxis("top")
        narrow = min(w for _, w in spans) < 0.12 * max(most, 1)
        top.set_xticks(
            [a + w / 2 for a, w in spans], [f"e{e}" if narrow else f"epoch {e}" for e in epochs]
        )
        top.tick_params(length=0, labelsize=FONT)
    handles = [Patch(color=BLUE, label="steps")] + [
        Patch(color=_STATUS_STYLE[s][1], label=_STATUS_STYLE[s][2]) for s in by_status
    ]
    fig.legend(handles=handles, loc="outside lower left", fontsize=FONT, frameon=False, ncols=3)
    title = f"Step timeline: bars should end together\n{_verdict(by_status, error)}"
    fig.suptitle(wrap(title, MAX_WIDTH - 0.4, FONT + 3), fontsize=FONT + 3)
    fig.ezpz_data = {
        "ranks": ranks,
        "epochs": epochs,
        "steps": steps,
        "total": total,
        "status": status,
        "notes": notes,
        "verdict": by_status,
        "title": title,
    }
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
    fig = new_figure(3.5 + 1.1 * tp_size, max(2.8, 1.6 + 0.55 * dp_size), rows=dp_size)
    ax = fig.subplots()
    # Light Okabe-Ito colours, one per TP position, so black text stays readable.
    light = [SKY, ORANGE, YELLOW, PURPLE, GREEN]
    cmap = ListedColormap([light[t % len(light)] for t in range(tp_size)])
    ax.imshow(
        np.tile(np.arange(tp_size), (dp_size, 1)),
        cmap=cmap,
        norm=BoundaryNorm(np.arange(tp_size + 1) - 0.5, tp_size),
        aspect="auto",
    )
    small = world_size <= 32
    for (d, t), rank in np.ndenumerate(grid):
        text = f"r{rank}\n(dp{d},tp{t})" if small else f"r{rank}"
        ax.text(t, d, text, ha="center", va="center", fontsize=FONT)
    for d in range(dp_size):  # a frame around each TP group
        ax.add_patch(
            Rectangle(
                (-0.45, d - 0.42), tp_size - 0.1, 0.84, fill=False, edgecolor="black", linewidth=1.5
            )
        )
    ax.set_xticks(range(tp_size), [f"tp{t}" for t in range(tp_size)], fontsize=FONT)
    ax.set_yticks(range(dp_size), [f"dp{d}" for d in range(dp_size)], fontsize=FONT)
    ax.set_xlabel("tp_rank (each column is a DP group)", fontsize=FONT + 1)
    ax.set_ylabel("dp_rank (each row is a TP group)", fontsize=FONT + 1)
    ax.set_title(
        wrap(
            f"world {world_size} = dp {dp_size} x tp {tp_size}: each framed row shares one "
            "batch, each column holds different data",
            3.0 + 1.1 * tp_size,
            FONT + 2,
        ),
        fontsize=FONT + 2,
    )
    fig.ezpz_data = {
        "grid": grid,
        "tp_groups": [list(map(int, row)) for row in grid],
        "dp_groups": [list(map(int, col)) for col in grid.T],
    }
    return fig
