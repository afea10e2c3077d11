"""Every figure of ezpz_nb.viz stays legible at the sizes the notebooks draw it.

A figure is rendered the way a notebook shows it (PNG at ``viz.figure.DPI``), then
scaled to fit an output ``WIDTH_PX`` wide (JupyterLab beside its file browser on a
laptop; browsers shrink wider images, never enlarge narrower ones). Every text
actually drawn must then be at least 9 px tall, no two drawn texts may overlap,
and no tick of a whole-number axis may read like ``2.5``.

The ledgers are built in-process from torch's own DistributedSampler at the
shapes the notebooks use (ranks, TP size, samples, batch, epochs): the figures
only read a ledger, so no ranks are needed to draw them; tests/test_plot.py
checks what they draw against real runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from torch.utils.data import DistributedSampler

from ezpz_nb import RankError, RankFailure, viz
from ezpz_nb.ledger import Ledger, StepRecord, StepTimes
from ezpz_nb.viz.figure import DPI, WIDTH_PX
from ezpz_nb.wrapping import COLUMNS, wrap_message

MIN_PX = 9.0


def sampler_ledger(
    world: int,
    tp: int,
    num_samples: int,
    batch: int,
    epochs: int = 1,
    *,
    cp: int = 1,
    drop_last: bool = False,
    set_epoch: bool = True,
    rank_seeded: bool = False,
    stop: dict[int, int] | None = None,
) -> Ledger:
    """What ranks sharding with DistributedSampler over their DP group record.

    ``stop`` cuts ranks short: ``{rank: steps it took}`` (in its last epoch).
    ``rank_seeded`` gives every rank its own bytes for the same ids.
    """
    dp_size = world // (tp * cp)
    records = []
    for e in range(epochs):
        for d in range(dp_size):
            sampler = DistributedSampler(
                range(num_samples), num_replicas=dp_size, rank=d, seed=7, drop_last=drop_last
            )
            if set_epoch:
                sampler.set_epoch(e)
            idx = list(sampler)
            batches = [tuple(idx[i : i + batch]) for i in range(0, len(idx), batch)]
            for c in range(cp):
                for t in range(tp):
                    rank = (d * cp + c) * tp + t
                    taken = batches
                    if stop and rank in stop and e == epochs - 1:
                        taken = batches[: stop[rank]]
                    for step, ids in enumerate(taken):
                        salt = str(rank) if rank_seeded else ""
                        records.append(
                            StepRecord(
                                e,
                                step,
                                rank,
                                d,
                                dp_size,
                                t,
                                tp,
                                ids,
                                "loaded" if t == 0 else "received",
                                hashlib.blake2b(
                                    f"{ids}{salt}".encode(), digest_size=16
                                ).hexdigest(),
                                cp_rank=c,
                                cp_size=cp,
                                loss=3.5 / (1 + e * len(batches) + step),
                            )
                        )
    return Ledger(records, num_samples)


def rank_error(ranks: list[int], stopped: list[int]) -> RankError:
    """A RankError as the launcher raises it: ``ranks`` raised, ``stopped`` were stopped."""
    failures = {
        r: RankFailure(
            rank=r,
            kind="exception",
            exc_type="KeyError",
            message="KeyError: 'input_ids'",
        )
        for r in ranks
    }
    failures |= {
        r: RankFailure(rank=r, kind="stopped", exc_type="", message="stopped while waiting")
        for r in stopped
    }
    return RankError(failures)


def timed_ledger(world: int, steps: int, slow: int | None = None) -> Ledger:
    """Step records with times, as notebook 12's runs record them; ``slow`` waits 5x for data."""
    records = []
    for step in range(steps):
        at = 0.05 * step
        for rank in range(world):
            data = 0.01 * (5 if rank == slow else 1)
            times = StepTimes(data, 0.01, 0.004, 0.0, at + data + 0.01, at + data + 0.011)
            records.append(
                StepRecord(0, step, rank, rank, world, 0, 1, (rank,), "loaded", "d", times=times)
            )
    return Ledger(records)


# The notebooks' figures, by where they are drawn: (name, draw, axes with real-valued ticks).
SHAPES: list[tuple[str, Callable[[], Figure]]] = [
    ("00/03/06 layout 4x2", lambda: viz.layout(4, 2)),
    ("layout 8x1", lambda: viz.layout(8, 1)),
    ("layout 8x8", lambda: viz.layout(8, 8)),
    ("02 padded heatmap", lambda: viz.heatmap(sampler_ledger(4, 1, 10, 1))),
    ("02 dropped coverage", lambda: viz.coverage(sampler_ledger(4, 1, 10, 1, drop_last=True))),
    (
        "02 no set_epoch heatmap",
        lambda: viz.heatmap(sampler_ledger(4, 1, 16, 2, 2, set_epoch=False)),
    ),
    (
        "02/04 hang timeline",
        lambda: viz.timeline(sampler_ledger(4, 1, 10, 1, stop={0: 2, 1: 2}), None),
    ),
    (
        "timeline, raised and stopped, 2 epochs",
        lambda: viz.timeline(sampler_ledger(4, 2, 16, 2, 2, stop={3: 1}), rank_error([3], [0, 1])),
    ),
    (
        "timeline, one step per epoch, 3 epochs",
        lambda: viz.timeline(sampler_ledger(8, 1, 8, 1, 3)),
    ),
    ("03 heatmap dp x tp", lambda: viz.heatmap(sampler_ledger(4, 2, 16, 2))),
    ("03 loaded vs received", lambda: viz.loaded_vs_received(sampler_ledger(4, 2, 16, 2))),
    ("06 heatmap", lambda: viz.heatmap(sampler_ledger(4, 2, 11, 2, 2))),
    ("06 coverage", lambda: viz.coverage(sampler_ledger(4, 2, 11, 2, 2))),
    ("06 explorer: 1 rank, batch 1, 3 epochs", lambda: viz.heatmap(sampler_ledger(1, 1, 64, 1, 3))),
    ("06 explorer: 8 ranks, 3 epochs", lambda: viz.heatmap(sampler_ledger(8, 1, 64, 1, 3))),
    (
        "06 explorer: 8 ranks tp 2, batch 16",
        lambda: viz.heatmap(sampler_ledger(8, 2, 64, 16, 3, drop_last=True)),
    ),
    (
        "06 explorer: one step per epoch",
        lambda: viz.heatmap(sampler_ledger(8, 1, 8, 1, 2)),
    ),
    (
        "06 explorer coverage: 64 samples, 3 epochs",
        lambda: viz.coverage(sampler_ledger(8, 2, 64, 1, 3)),
    ),
    ("06 200 samples, batch 1", lambda: viz.heatmap(sampler_ledger(4, 2, 200, 1))),
    ("07 with CP", lambda: viz.heatmap(sampler_ledger(8, 2, 8, 2, cp=2))),
    ("08 heatmap, 2 epochs", lambda: viz.heatmap(sampler_ledger(4, 2, 64, 8, 2, set_epoch=False))),
    ("08 coverage, no dp_group", lambda: viz.coverage(sampler_ledger(4, 1, 64, 8, 2))),
    (
        "08 digests, rank-seeded",
        lambda: viz.digests(sampler_ledger(4, 2, 64, 8, 2, rank_seeded=True), epoch=0),
    ),
    ("digests, 100 steps", lambda: viz.digests(sampler_ledger(4, 2, 200, 1, rank_seeded=True))),
    (
        "08 loss curves",
        lambda: viz.loss_curves(
            {
                name: sampler_ledger(4, 2, 64, 8, 2)
                for name in ("sound (FSDP2 x TP)", "no dp_group", "rank-seeded, no broadcast")
            }
            | {"one process": [3.5 / (1 + s) for s in range(8)]},
            reference="one process",
        ),
    ),
    ("09 heatmap, world 2", lambda: viz.heatmap(sampler_ledger(2, 1, 12, 2, 2))),
    ("empty ledger", lambda: viz.heatmap(Ledger([], 10))),
    # notebook 12's step timelines: 2 ranks (the baseline, the shuffled run), 3 with a straggler
    ("12 step timeline, 2 ranks", lambda: viz.step_timeline(timed_ledger(2, 16))),
    ("12 step timeline, a straggler", lambda: viz.step_timeline(timed_ledger(3, 16, slow=2))),
    # notebook 11's shapes: 64 documents of 82-7188 tokens, 4 ranks x 13 steps, 6 rows of 256
    ("11 document lengths", lambda: viz.doc_lengths([int(82 * 1.073**i) for i in range(64)], 1024)),
    (
        "11 token counts",
        lambda: viz.token_counts(
            {
                r: [(4096 - 97 * ((r * 5 + s) % 11), 60 + 9 * r) for s in range(14)]
                for r in range(4)
            },
            "token-budget batches, planned globally",
        ),
    ),
    (
        "11 packed rows",
        lambda: viz.packed_rows(
            [[(i * 256 + t) // 90 for t in range(256)] for i in range(5)]
            + [[40] * 86 + [-1] * 170],
            "the first packed rows",
        ),
    ),
    # notebook 17's shape: three designs, 24 global batches of 16, three sources
    ("17 mixture shares", lambda: mix_figure()),
    # notebook 19's shape: four storages, 2 workers each, 64 steps
    ("19 memory growth", lambda: memory_figure()),
]


def mix_figure() -> Figure:
    """Notebook 17's figure, from real plans (tokens: 600, 3000 and 5000 per sample)."""
    from ezpz_nb.data.mixture import METHODS, Mixture, realized_shares

    shares = {}
    for m in METHODS:
        src = Mixture((22, 21, 21), (0.5, 0.3, 0.2), 16, m).plan(24)[:, 0].reshape(24, 16)
        toks = np.array([600, 3000, 5000])[src]
        shares[m] = {
            scope + unit: realized_shares(src, 3, amounts=a, cumulative=scope == "cumulative")
            for scope in ("batch", "cumulative")
            for unit, a in (("", None), ("_tokens", toks))
        }
    names = ("short docs", "medium docs", "long docs")
    return viz.mix_shares(shares, (0.5, 0.3, 0.2), names, "realized share against target")


def memory_figure() -> Figure:
    """Notebook 19's figure: a worker line per worker, the rank's dashed, four storages."""
    from ezpz_nb.ledger.memory import MIB, MemorySample, ProcMemory

    def run(per_step: float) -> Ledger:
        return Ledger(
            [],
            memory=[
                MemorySample(
                    0, w, 10 + w, 0, s, ProcMemory(0, 0, 0, int((9 + per_step * s) * MIB), 0)
                )
                for s in range(64)
                for w in (-1, 0, 1)
            ],
        )

    return viz.memory_growth(
        {"dicts": run(0.25), "numpy": run(0.01), "arrow": run(0.02), "memmap": run(0.0)}
    )


# Axes whose numbers are measurements, not counts: fractions are right there.
REAL_VALUED = {"loss curves": "training loss", "memory growth": "private memory (MiB)"}


@contextmanager
def drawn_texts() -> Iterator[list[Text]]:
    """Record every Text that matplotlib actually draws (ticks out of view are not drawn)."""
    seen: list[Text] = []
    original = Text.draw

    def draw(self: Text, renderer: Any) -> None:
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            seen.append(self)

    Text.draw = draw  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        Text.draw = original  # type: ignore[method-assign]


def render(fig: Figure) -> tuple[list[tuple[Text, Any]], float]:
    """Draw ``fig`` at the notebook's DPI: the drawn texts with their pixel boxes, and the scale."""
    fig.set_dpi(DPI)
    with drawn_texts() as texts:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    scale = min(1.0, WIDTH_PX / (fig.get_figwidth() * DPI))
    return [(t, t.get_window_extent(renderer)) for t in texts], scale


def legend_overlaps(fig: Figure, drawn: set[int]) -> list[str]:
    """Axis labels and tick labels that a legend's box covers (the legend's own texts aside)."""
    renderer = fig.canvas.get_renderer()
    bad = []
    for legend in fig.findobj(Legend):
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                for text in [axis.label, *axis.get_ticklabels()]:
                    if id(text) not in drawn:
                        continue
                    other = text.get_window_extent(renderer)
                    w = min(box.x1, other.x1) - max(box.x0, other.x0)
                    h = min(box.y1, other.y1) - max(box.y0, other.y0)
                    if w > 1 and h > 1:
                        bad.append(text.get_text()[:30])
    return bad


def fractional_ticks(fig: Figure, drawn: set[int], allowed: str | None) -> list[str]:
    """Drawn tick labels like ``2.5`` on axes other than the one labelled ``allowed``."""
    bad = []
    for axis in fig.findobj(Axis):
        if allowed and axis.get_label_text() == allowed:
            continue
        for label in axis.get_ticklabels():
            text = label.get_text().replace("\u2212", "-")
            if id(label) not in drawn:
                continue
            try:
                value = float(text)
            except ValueError:
                continue
            if value != int(value):
                bad.append(text)
    return bad


@pytest.mark.parametrize(("name", "draw"), SHAPES, ids=[s[0] for s in SHAPES])
def test_figure_is_legible_at_notebook_width(name: str, draw: Callable[[], Figure]) -> None:
    """Fonts >= 9 px at the notebook's width, no text cut off or overlapping, no legend over an
    axis label, no fractional counts.

    Guards: 08's heatmaps drawn 2000 px wide and shown at half size (digits unreadable),
    7-point cell digits, overlapping x labels at one step per epoch, the timeline's
    "epoch 0" over its frame, a sample-id colour bar ticked at 2.5 and 7.5, 12's step
    timelines with their legend on the x-axis label.
    """
    fig = draw()
    assert fig.get_figwidth() * DPI <= WIDTH_PX + 1, "wider than the notebook: it gets scaled"
    texts, scale = render(fig)
    assert texts, "nothing was drawn"
    small = [
        (t.get_text()[:30], round(t.get_fontsize() * DPI / 72 * scale, 1))
        for t, _ in texts
        if t.get_fontsize() * DPI / 72 * scale < MIN_PX
    ]
    assert not small, f"text below {MIN_PX} px once shown: {small[:5]}"
    width, height = fig.canvas.get_width_height()
    cut = [
        t.get_text()[:30]
        for t, b in texts
        if b.x0 < -1 or b.y0 < -1 or b.x1 > width + 1 or b.y1 > height + 1
    ]
    assert not cut, f"text cut off at the figure's edge: {cut[:5]}"
    overlaps = []
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if w > 1 and h > 1:
                overlaps.append((a.get_text()[:25], b.get_text()[:25]))
    assert not overlaps, f"{len(overlaps)} pair(s) of texts overlap, e.g. {overlaps[:4]}"
    covered = legend_overlaps(fig, {id(t) for t, _ in texts})
    assert not covered, f"a legend covers the axis labels {covered[:4]}"
    allowed = next((v for k, v in REAL_VALUED.items() if k in name), None)
    bad = fractional_ticks(fig, {id(t) for t, _ in texts}, allowed)
    assert not bad, f"whole-number axis ticked at {bad}"


def test_the_checks_catch_what_they_guard() -> None:
    """The four checks fail on figures made to break them (a check that cannot fail guards nothing).

    Guards: a legibility test that passes whatever is drawn.
    """
    fig = viz.heatmap(sampler_ledger(4, 2, 16, 2))
    fig.set_size_inches(30, 4)  # shown scaled to 900 px: 8-point digits become 3 px
    texts, scale = render(fig)
    assert min(t.get_fontsize() * DPI / 72 * scale for t, _ in texts) < MIN_PX

    fig = viz.layout(4, 2)
    ax = fig.axes[0]
    ax.text(0, 0, "on top of r0", fontsize=10, ha="center", va="center")
    texts, _ = render(fig)
    boxes = [b for t, b in texts if t.get_text() in ("on top of r0", "r0\n(dp0,tp0)")]
    assert len(boxes) == 2 and boxes[0].overlaps(boxes[1])

    fig = viz.coverage(sampler_ledger(4, 1, 5, 1))
    fig.axes[0].set_xticks([0.5, 1.5, 2.5])
    texts, _ = render(fig)
    assert fractional_ticks(fig, {id(t) for t, _ in texts}, None) == ["0.5", "1.5", "2.5"]

    fig = viz.step_timeline(timed_ledger(2, 4))
    fig.legends[0].remove()
    fig.axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5)  # round one's
    texts, _ = render(fig)
    assert fig.axes[0].get_xlabel()[:30] in legend_overlaps(fig, {id(t) for t, _ in texts})


def test_summary_lines_break_between_words_before_the_output_edge() -> None:
    """Guards: summary lines longer than JupyterLab's output area, which it breaks mid-word
    (its output CSS has ``word-break: break-all``)."""
    ledger = sampler_ledger(4, 2, 11, 2, 2, rank_seeded=True)  # padding and TP byte mismatches
    text = ledger.summary()
    assert {p.kind for p in ledger.check()} == {"dp_duplicate", "tp_mismatch"}
    assert max(len(line) for line in text.splitlines()) <= 96
    messages = " ".join(f"- {p.kind}: {p.message}" for p in ledger.check())
    assert messages.split() == [w for w in text.split() if w][-len(messages.split()) :]


def test_notebooks_show_figures_at_their_own_width() -> None:
    """Guards: JupyterLab shrinking a figure (and its text) to fit a narrow output area: the
    display metadata says "unconfined", with matplotlib's inline backend on or off."""
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.pylabtools import select_figure_formats

    fig = viz.layout(4, 2)
    formatter = DisplayFormatter()
    assert formatter.format(fig)[1] == {"image/png": {"unconfined": True}}

    class Shell:  # what select_figure_formats reads: the shell's display formatter
        display_formatter = formatter

    select_figure_formats(Shell, {"png"})  # what `%matplotlib inline` registers
    data, metadata = formatter.format(fig)
    assert "image/png" in data and metadata == {"image/png": {"unconfined": True}}


def test_long_messages_break_between_words_and_keep_their_lines() -> None:
    """Guards issue 35: our one-line messages (verdicts, doctor lines, reports) broken
    mid-word by JupyterLab's output area; and a wrapper that joins lines or cuts a path."""
    words = "the ranks hung (nothing finished within 15 s): rank 2 never reached a collective"
    path = "/very/long/" + "x" * 120 + "/file.py"
    text = f"{words} {words}\n  - item: {words} {words}\n{path}"
    out = wrap_message(text)
    assert out.split() == text.split()  # the same words, in order, none cut
    assert all(len(line) <= COLUMNS for line in out.splitlines() if path not in line)
    assert path in out.splitlines()
    item = out.splitlines().index("  - item: " + out.split("  - item: ")[1].splitlines()[0])
    assert out.splitlines()[item + 1].startswith("    ")  # the item's continuation indented
    assert wrap_message("short\nlines") == "short\nlines"
