"""Live widgets: an explorer that reruns real ranks as you move its controls, and a progress display.

* :func:`~ezpz_nb.examples.explore.explore_rank` (in :mod:`ezpz_nb.examples.explore`,
  importable from here too) is what every rank runs: build the DP/TP layout and the
  loader from the settings, run the epochs through a recorder, return the
  rank's ledger. Notebooks call it directly with ``ez.launch``.
* :class:`Explorer` keeps a live :class:`~ezpz_nb.Cluster`; each change of a
  control (debounced, so dragging a slider starts one run, not dozens) runs
  :func:`explore_rank` on it and redraws the plots.
* :class:`~ezpz_nb.viz.progress.Progress` (in :mod:`ezpz_nb.viz.progress`, importable
  from here too) shows steps per rank while a run is in flight.

ipywidgets is imported only when a widget is built.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
import traceback
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.examples.explore import explore_rank
from ezpz_nb.ledger import Ledger
from ezpz_nb.viz.outputs import Debouncer, error_outputs, png_output, text_output
from ezpz_nb.viz.progress import Progress

__all__ = ["Explorer", "ExplorerClosed", "Progress", "explore_rank"]


class ExplorerClosed(EzpzError):
    """An :class:`Explorer` was asked to run after :meth:`Explorer.close`."""


class Explorer:
    """Controls for every loading setting; each change reruns real ranks and redraws.

    Display it as the last expression of a cell. Runs happen on a persistent
    :class:`~ezpz_nb.Cluster` (restarted only when the world size changes).

    Args:
        world_size: Initial number of ranks (slider 1-8).
        tp_size: Initial TP size (choices: the divisors of the world size).
        num_samples: Initial dataset length.
        batch_size: Initial batch size.
        drop_last: Initial ``drop_last``.
        shuffle: Initial ``shuffle``.
        epochs: Initial number of epochs (drawn side by side).
        set_epoch: Initial ``set_epoch`` on/off.
        broadcast: Initial TP broadcast on/off.
        dp_group: Initially pass ``dp_group`` to the sampler.
        debounce: Seconds to wait after the last change before running; 0 runs
            synchronously inside the change (tests, scripts).
        plots: Names of :mod:`ezpz_nb.viz` functions to draw after each run.
        timeout: Seconds a run may take before it is reported as hung.
        run: Run once right away.

    Attributes:
        controls: ``{name: widget}``; set ``.value`` to drive it from code.
        output: The ``ipywidgets.Output`` the plots are drawn into.
        widget: The whole explorer (a ``VBox``).
        ledger: Ledger of the latest successful run.
        error: Exception of the latest run, or ``None``.
        runs: Number of runs so far.
    """

    def __init__(
        self,
        world_size: int = 4,
        tp_size: int = 2,
        num_samples: int = 10,
        batch_size: int = 2,
        *,
        drop_last: bool = False,
        shuffle: bool = True,
        epochs: int = 2,
        set_epoch: bool = True,
        broadcast: bool = True,
        dp_group: bool = True,
        debounce: float = 0.3,
        plots: tuple[str, ...] = ("heatmap", "coverage"),
        timeout: float = 30.0,
        run: bool = True,
    ) -> None:
        import ipywidgets as W

        from ezpz_nb.data.groups import valid_tp_sizes

        style = {"description_width": "initial"}
        self.controls: dict[str, Any] = {
            "world_size": W.IntSlider(
                world_size, min=1, max=8, description="world size", style=style
            ),
            "tp_size": W.Dropdown(
                options=valid_tp_sizes(world_size),
                value=tp_size,
                description="tp size",
                style=style,
            ),
            "num_samples": W.IntSlider(
                num_samples, min=1, max=64, description="dataset length", style=style
            ),
            "batch_size": W.IntSlider(
                batch_size, min=1, max=16, description="batch size", style=style
            ),
            "epochs": W.IntSlider(epochs, min=1, max=3, description="epochs", style=style),
            "drop_last": W.Checkbox(drop_last, description="drop_last"),
            "shuffle": W.Checkbox(shuffle, description="shuffle"),
            "set_epoch": W.Checkbox(set_epoch, description="set_epoch"),
            "broadcast": W.Checkbox(broadcast, description="broadcast within TP"),
            "dp_group": W.Checkbox(dp_group, description="pass dp_group"),
        }
        self.output = W.Output(layout={"border": "1px solid #ccc"})
        self.status = W.HTML()
        c = self.controls
        sliders = W.VBox(
            [c[k] for k in ("world_size", "tp_size", "num_samples", "batch_size", "epochs")]
        )
        boxes = W.VBox(
            [c[k] for k in ("drop_last", "shuffle", "set_epoch", "broadcast", "dp_group")]
        )
        self.widget = W.VBox([W.HBox([sliders, boxes]), self.status, self.output])
        self.widget.add_class("ezpz-explorer")
        self.plots = tuple(plots)
        self.timeout = timeout
        self.ledger: Ledger | None = None
        self.error: BaseException | None = None
        self.runs = 0
        self.closed = False
        self._cluster: Any = None
        self._run_lock = threading.Lock()
        self._syncing = False
        self._debouncer = Debouncer(debounce, self.refresh)
        for w in self.controls.values():
            w.observe(self._changed, names="value")
        if run:
            self.refresh()

    # ---------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def config(self) -> dict[str, Any]:
        """The current control values, as keyword arguments of :func:`explore_rank`."""
        cfg = {k: w.value for k, w in self.controls.items()}
        cfg.pop("world_size")
        return cfg

    def _changed(self, change: dict[str, Any]) -> None:
        if self._syncing or self.closed:
            return
        if change["owner"] is self.controls["world_size"]:
            self._sync_tp_choices()
        self.status.value = "<i>waiting for the controls to settle...</i>"
        self._debouncer.poke()

    def _sync_tp_choices(self) -> None:
        from ezpz_nb.data.groups import valid_tp_sizes

        tp = self.controls["tp_size"]
        choices = valid_tp_sizes(self.controls["world_size"].value)
        self._syncing = True  # changing the options must not start a run of its own
        try:
            keep = tp.value if tp.value in choices else max(d for d in choices if d <= 2)
            tp.options = choices
            tp.value = keep
        finally:
            self._syncing = False

    def set(self, **values: Any) -> Ledger | None:
        """Set several controls at once and run once, now (for notebook cells and tests).

        Args:
            **values: Control names (see :attr:`controls`) and their new values.

        Returns:
            What :meth:`refresh` returns.

        Raises:
            KeyError: On an unknown control name.
            ExplorerClosed: After :meth:`close`.
        """
        if self.closed:
            raise ExplorerClosed(
                "this explorer was closed (its ranks are stopped): run its cell again for a new one"
            )
        unknown = set(values) - set(self.controls)
        if unknown:
            raise KeyError(f"unknown control(s) {sorted(unknown)}; known: {sorted(self.controls)}")
        if "world_size" in values:
            self._syncing = True
            try:
                self.controls["world_size"].value = values["world_size"]
            finally:
                self._syncing = False
            self._sync_tp_choices()
        self._syncing = True  # one run for all of them, below
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._syncing = False
        self._debouncer.cancel()
        return self.refresh()

    # ---------------------------------------------------------------- running
    def _cluster_for(self, world_size: int) -> Any:
        from ezpz_nb.launcher import Cluster

        if self._cluster is not None and (
            self._cluster.closed or self._cluster.world_size != world_size
        ):
            self._cluster.close()
            self._cluster = None
        if self._cluster is None:
            self._cluster = Cluster(world_size, timeout=self.timeout)
        return self._cluster

    def refresh(self) -> Ledger | None:
        """Run the current settings on the ranks now and redraw (synchronous).

        Returns:
            The merged ledger, or ``None`` if the run failed (see :attr:`error`)
            or the explorer is closed.
        """
        with self._run_lock:  # a timer thread and a direct call never overlap
            if self.closed:  # a change pending when it was closed must not start ranks
                return None
            world = self.controls["world_size"].value
            cfg = self.config()
            self.status.value = f"<i>running on {world} rank(s)...</i>"
            logs = io.StringIO()
            started = time.monotonic()
            outputs: list[dict[str, Any]] = []
            try:
                with contextlib.redirect_stdout(logs), contextlib.redirect_stderr(logs):
                    results = self._cluster_for(world).run(explore_rank, **cfg)
                self.ledger, self.error = Ledger.from_results(results), None
            except Exception as exc:  # noqa: BLE001 - shown to the learner, kept on .error
                self.ledger, self.error = None, exc
            self.runs += 1
            took = time.monotonic() - started
            try:
                verdict = self._draw(outputs)
            except Exception:  # noqa: BLE001 - a timer callback has nowhere else to report
                outputs.append(text_output(traceback.format_exc(), "stderr"))
                verdict = "drawing failed"
            if logs.getvalue().strip():
                outputs.append(text_output("rank output:\n" + logs.getvalue(), "stderr"))
            self.output.outputs = tuple(outputs)
            self.status.value = (
                f"run {self.runs}: world {world}, tp {cfg['tp_size']} - {verdict} ({took:.1f} s)"
            )
            return self.ledger

    def _draw(self, outputs: list[dict[str, Any]]) -> str:
        """Append the summary and figures of the latest run; return a short verdict."""
        from ezpz_nb import viz  # matplotlib only where something is drawn

        if self.ledger is not None:
            outputs.append(text_output(self.ledger.summary()))
            for name in self.plots:
                fig = getattr(viz, name)(self.ledger)
                outputs.append(png_output(viz.png_bytes(fig), f"{name} of run {self.runs}"))
            return "all checks passed" if self.ledger.ok else "problems found (see summary)"
        outputs += error_outputs(self.error)
        partial = Ledger.from_events(getattr(self.error, "events", []))
        if partial.records:  # show how far each rank got before it failed
            fig = viz.timeline(partial, self.error)
            outputs.append(png_output(viz.png_bytes(fig), f"timeline of run {self.runs}"))
        return "the run failed"

    def close(self) -> None:
        """Stop the ranks and any pending run, for good: the controls are disabled.

        Closed means closed: a later change of a control starts nothing, and
        :meth:`set` raises :class:`ExplorerClosed`. Run the cell again for a new explorer.
        """
        self.closed = True
        self._debouncer.cancel()
        with self._run_lock:  # let a run in flight finish drawing first
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        for w in self.controls.values():
            w.disabled = True
        self.status.value = "<b>closed</b>: its ranks are stopped; run the cell again for a new one"

    def __enter__(self) -> Explorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
