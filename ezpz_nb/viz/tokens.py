"""Tokens, not samples: document lengths, real and pad tokens per rank and step, packed rows.

* :func:`doc_lengths`: how long the documents are (log scale), against the row length;
* :func:`token_counts`: real and pad tokens of each rank at each step, so a rank that
  computes longer than the others (or pads more) stands out;
* :func:`packed_rows`: packed rows drawn token by token, coloured by document.

As for every figure, what is drawn is kept in ``fig.ezpz_data``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.figure import (
    BLUE,
    FONT,
    GREEN,
    GREY,
    MISSING,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    new_figure,
    wrap,
)

__all__ = ["doc_lengths", "packed_rows", "token_counts"]

_COLOURS = (BLUE, ORANGE, GREEN, VERMILLION, SKY, PURPLE, YELLOW)


def doc_lengths(lengths: Sequence[int], row_len: int | None = None) -> Figure:
    """Histogram of document lengths in tokens (log-spaced bins), the row length marked.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``lengths``, ``bins``, ``counts`` and
        ``longer_than_row`` (documents a row cannot hold whole).
    """
    arr = np.asarray(lengths, dtype=np.int64)
    bins = np.geomspace(max(1, arr.min()), arr.max() + 1, 20)
    counts, _ = np.histogram(arr, bins)
    fig = new_figure(7.5, 2.8)
    ax = fig.subplots()
    ax.hist(arr, bins.tolist(), color=BLUE)
    ax.set_xscale("log")
    longer = int((arr > row_len).sum()) if row_len else 0
    if row_len:
        ax.axvline(row_len, color=VERMILLION, linewidth=1.8, label=f"row length {row_len}")
        ax.legend(fontsize=FONT, frameon=False, loc="upper left")
    ax.set_xlabel("tokens per document (log scale)", fontsize=FONT + 1)
    ax.set_ylabel("documents", fontsize=FONT + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=FONT)
    title = f"{len(arr)} documents, {int(arr.min())} to {int(arr.max())} tokens"
    if row_len:
        title += f"; {longer} longer than a row"
    fig.suptitle(wrap(title, 7.1, FONT + 3), fontsize=FONT + 3)
    fig.ezpz_data = {"lengths": arr, "bins": bins, "counts": counts, "longer_than_row": longer}
    return fig


def token_counts(
    counts: Ledger | Mapping[int, Sequence[tuple[int, int]]], title: str = "", epoch: int = 0
) -> Figure:
    """Real (solid) and pad (light) tokens of every rank at every step, bars side by side.

    Args:
        counts: A ledger (its token counts, format version 4) or ``{rank:
            [(real_tokens, pad_tokens) per step]}``; ranks may have taken different
            numbers of steps (a missing step draws nothing).
        title: What the run was; the figure adds the pad share and the spread.
        epoch: With a ledger, the epoch to draw.

    Raises:
        ValueError: A ledger whose batches did not say their token counts.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``ranks``, ``real`` and ``pad``
        (``ranks x steps`` arrays, -1 where a rank took no such step), ``pad_share``
        (pad / all tokens of the whole run) and ``spread`` (per step, most real
        tokens minus fewest, over the ranks that took it).
    """
    if isinstance(counts, Ledger):
        ledger = counts
        counts = {
            r: [(s.real_tokens, s.pad_tokens) for s in ledger.steps(r, epoch)]
            for r in sorted(ledger.layout())
        }
        if any(a < 0 for steps in counts.values() for a, _ in steps):
            raise ValueError(
                "this ledger has no token counts: record batches with real_tokens and "
                "pad_tokens, doc_ids or an attention_mask (ezpz_nb.text's collates add them)"
            )
    ranks = sorted(counts)
    steps = max((len(counts[r]) for r in ranks), default=0)
    real = -np.ones((len(ranks), steps), dtype=np.int64)
    pad = -np.ones_like(real)
    for i, r in enumerate(ranks):
        for s, (a, b) in enumerate(counts[r]):
            real[i, s], pad[i, s] = a, b
    taken = real >= 0
    total = int(real[taken].sum() + pad[taken].sum())
    share = float(pad[taken].sum() / total) if total else 0.0
    spread = np.array(
        [int(np.ptp(real[taken[:, s], s])) if taken[:, s].any() else 0 for s in range(steps)]
    )
    fig = new_figure(7.5, 3.2)
    ax = fig.subplots()
    width = 0.8 / max(1, len(ranks))
    for i, r in enumerate(ranks):
        x = np.arange(steps)[taken[i]] + (i - (len(ranks) - 1) / 2) * width
        colour = _COLOURS[i % len(_COLOURS)]
        ax.bar(x, real[i][taken[i]], width, color=colour, label=f"rank {r}")
        ax.bar(x, pad[i][taken[i]], width, bottom=real[i][taken[i]], color=colour, alpha=0.3)
    ax.set_xlabel("step", fontsize=FONT + 1)
    ax.set_ylabel("tokens (light: padding)", fontsize=FONT + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=FONT)
    ax.legend(fontsize=FONT, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    head = f"{title}: " if title else ""
    fig.suptitle(
        wrap(
            f"{head}{share:.0%} of the tokens are padding; real tokens differ by up to "
            f"{int(spread.max()) if steps else 0} between ranks in one step",
            7.1,
            FONT + 3,
        ),
        fontsize=FONT + 3,
    )
    fig.ezpz_data = {"ranks": ranks, "real": real, "pad": pad, "pad_share": share, "spread": spread}
    return fig


def packed_rows(doc_ids: np.ndarray | Sequence[Sequence[int]], title: str = "") -> Figure:
    """Packed rows token by token, each segment of a document in its own colour, padding grey.

    Args:
        doc_ids: ``(rows, L)`` document of each token, -1 for padding.
        title: What the rows are.

    Returns:
        The figure; ``fig.ezpz_data`` holds ``doc_ids`` and ``segments`` (per row,
        the documents in order).
    """
    ids = np.asarray(doc_ids, dtype=np.int64)
    colour_of = np.zeros_like(ids)
    segments = []
    order: dict[int, int] = {}  # a document's colour: by first appearance, the same in every row
    for r, row in enumerate(ids):
        starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        docs = [int(row[s]) for s in starts if row[s] >= 0]
        segments.append(docs)
        for s, e in zip(starts, [*starts[1:], len(row)], strict=True):
            d = int(row[s])
            if d >= 0:
                order.setdefault(d, len(order))
            colour_of[r, s:e] = 0 if d < 0 else 1 + order[d] % len(_COLOURS)
    fig = new_figure(7.5, 0.5 + 0.32 * len(ids))
    ax = fig.subplots()
    cmap = ListedColormap([MISSING, *_COLOURS])
    ax.imshow(colour_of, aspect="auto", cmap=cmap, vmin=0, vmax=len(_COLOURS), interpolation="none")
    ax.set_yticks(range(len(ids)), [f"row {r}" for r in range(len(ids))], fontsize=FONT)
    ax.set_xlabel("token position in the row", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    ax.legend(
        handles=[
            Patch(color=MISSING, label="padding"),
            # 8 colours cycle over dozens of documents: a colour names no document, a
            # change of colour is where the next one starts.
            Patch(
                color=GREY,
                label=f"colour change:\nnext document\n({len(_COLOURS)} colours, reused)",
            ),
        ],
        fontsize=FONT,
        frameon=False,
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    n_docs = len({d for s in segments for d in s})
    head = f"{title}: " if title else ""
    fig.suptitle(
        wrap(
            f"{head}{len(ids)} rows hold pieces of {n_docs} document{'s' * (n_docs != 1)}",
            7.1,
            FONT + 3,
        ),
        fontsize=FONT + 3,
    )
    fig.ezpz_data = {"doc_ids": ids, "segments": segments}
    return fig
