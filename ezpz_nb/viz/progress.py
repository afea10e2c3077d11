"""A live display of the steps each rank has done, for runs long enough to watch.

:class:`Progress` listens to ``Cluster.on_event`` (the
:class:`~ezpz_nb.ledger.StepRecord` s that ``record`` publishes as each step
starts), so a rank that falls behind or stops is seen while the others go on.
In a Jupyter kernel it shows one bar per rank; in a terminal or a script, or
with ``EZPZ_NB_PLAIN=1`` (``ezpz-nb tour`` sets it: its executed copies are read
as text), it prints plain text lines instead. ipywidgets is imported only when
bars are built.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ezpz_nb.launcher.kernel import in_jupyter_kernel
from ezpz_nb.launcher.settings import PLAIN_ENV, is_on
from ezpz_nb.ledger import StepRecord

__all__ = ["Progress"]


def _widget_frontend() -> bool:
    """True in a Jupyter kernel (the one kernel check), unless ``EZPZ_NB_PLAIN`` asks for text.

    A kernel run headless (nbmake, nbclient) gets the bars too: they are drawn by
    whatever frontend opens the notebook later, and the run is the learner's run.
    """
    return not is_on(os.environ.get(PLAIN_ENV)) and in_jupyter_kernel()  # PLAIN=0: bars


class Progress:
    """Steps done per rank, updated live while the ranks run.

    Fed by ``Cluster.on_event`` (the :class:`~ezpz_nb.ledger.StepRecord` s that
    ``record`` publishes). In a notebook it shows one bar per rank; in a
    terminal (or with ``EZPZ_NB_PLAIN=1``) it prints a text line every ``interval`` seconds
    and a final line per rank that fell behind.

    Args:
        source: A :class:`~ezpz_nb.Cluster` to attach to, or a world size.
        total: Steps each rank is expected to take (sets the bars' length).
        mode: ``"auto"``, ``"widget"`` or ``"text"``.
        interval: Seconds between redraws (and text lines).
        stream: Where text lines go (default ``sys.stdout``).

    Example:
        >>> with ez.Cluster(4) as c, Progress(c, total=40):
        ...     c.run(train)
    """

    def __init__(
        self,
        source: Any,
        total: int | None = None,
        *,
        mode: str = "auto",
        interval: float = 0.5,
        stream: Any = None,
    ) -> None:
        if mode not in ("auto", "widget", "text"):
            raise ValueError(f"mode must be 'auto', 'widget' or 'text', got {mode!r}")
        self.cluster = None if isinstance(source, int) else source
        self.world_size = source if isinstance(source, int) else source.world_size
        self.total = total
        self.interval = interval
        self.stream = stream
        self.mode = mode if mode != "auto" else ("widget" if _widget_frontend() else "text")
        self.steps = dict.fromkeys(range(self.world_size), 0)
        self.where: dict[int, tuple[int, int, int]] = {}  # rank -> (dp, tp, epoch)
        self._last_draw = 0.0
        self._previous: Callable[[Any], None] | None = None
        self.widget: Any = None
        if self.mode == "widget":
            self._build_widget()
        if self.cluster is not None:
            self._previous = self.cluster.on_event
            self.cluster.on_event = self.update

    def _build_widget(self) -> None:
        import ipywidgets as W
        from IPython.display import display

        most = self.total or 1
        self._bars = [W.IntProgress(0, min=0, max=most, bar_style="info") for _ in self.steps]
        self._labels = [W.Label(f"r{r}") for r in self.steps]
        self._counts = [W.Label("0") for _ in self.steps]
        rows = [
            W.HBox([lab, bar, n])
            for lab, bar, n in zip(self._labels, self._bars, self._counts, strict=True)
        ]
        self.widget = W.VBox(rows)
        self.widget.add_class("ezpz-progress")
        display(self.widget)

    def update(self, event: Any) -> None:
        """Count one event (a ``RankEvent`` carrying a StepRecord; others are ignored)."""
        if self._previous is not None:
            self._previous(event)
        item = getattr(event, "item", event)
        if not isinstance(item, StepRecord):
            return
        self.steps[item.rank] = self.steps.get(item.rank, 0) + 1
        self.where[item.rank] = (item.dp_rank, item.tp_rank, item.epoch)
        now = time.monotonic()
        if now - self._last_draw >= self.interval:
            self._last_draw = now
            self._draw()

    def _label(self, r: int) -> str:
        if r in self.where:
            dp, tp, _ = self.where[r]
            return f"r{r} (dp{dp},tp{tp})"
        return f"r{r}"

    def text(self) -> str:
        """One line: steps done per rank (``/total`` when known)."""
        of = f"/{self.total}" if self.total else ""
        return "steps: " + "  ".join(
            f"{self._label(r)} {n}{of}" for r, n in sorted(self.steps.items())
        )

    def _draw(self) -> None:
        if self.mode == "text":
            print(self.text(), file=self.stream or sys.stdout, flush=True)
            return
        most = max([self.total or 0, *self.steps.values(), 1])
        for r, n in self.steps.items():
            self._bars[r].max = most
            self._bars[r].value = n
            self._labels[r].value = self._label(r)
            self._counts[r].value = f"{n}/{self.total}" if self.total else str(n)

    def behind(self) -> list[int]:
        """Ranks with fewer steps than the rank that took the most."""
        most = max(self.steps.values(), default=0)
        return [r for r, n in sorted(self.steps.items()) if n < most]

    def close(self) -> None:
        """Detach from the cluster and draw the final state (and who fell behind)."""
        if self.cluster is not None:
            self.cluster.on_event = self._previous
            self.cluster = None
        self._draw()
        most = max(self.steps.values(), default=0)
        late = self.behind()
        if self.mode == "widget":
            for r in late:
                self._bars[r].bar_style = "danger"
        elif late:
            for r in late:
                print(
                    f"{self._label(r)} stopped after {self.steps[r]} of {most} steps",
                    file=self.stream or sys.stdout,
                )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
