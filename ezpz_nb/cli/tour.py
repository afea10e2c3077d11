"""A headless tour: run the tutorial notebooks and keep what they show.

For people without a browser (or a CI log reader): every notebook is executed
top to bottom with nbclient; the executed copy and each figure it drew (as a
PNG file) are written to an output folder, and the paths are printed.

Usage::

    python -m ezpz_nb tour                 # all notebooks, into ./tour
    python -m ezpz_nb tour --out /tmp/t 02 # only notebooks whose name contains "02"
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ezpz_nb.cli.resources import notebooks_dir

__all__ = ["TourStop", "find_notebooks", "run_notebook", "run_tour"]


@dataclass
class TourStop:
    """What executing one notebook produced.

    Attributes:
        notebook: The source notebook.
        executed: Where the executed copy was written.
        figures: PNG files written, in cell order.
        seconds: Wall time of the execution.
        error: The error that stopped the notebook, or ``None`` if it ran through.
    """

    notebook: Path
    executed: Path
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when every cell ran."""
        return self.error is None


def default_notebook_dir() -> Path:
    """``notebooks/`` of the current folder, else the notebooks installed with the package."""
    here = Path.cwd() / "notebooks"
    if here.is_dir():
        return here
    return notebooks_dir()


def find_notebooks(folder: str | Path, only: Iterable[str] = ()) -> list[Path]:
    """The tutorial notebooks in ``folder``, in name order.

    Args:
        folder: Where to look.
        only: If given, keep notebooks whose file name contains one of these strings.
    """
    only = list(only)
    found = sorted(p for p in Path(folder).glob("*.ipynb") if not p.name.startswith("_"))
    return [p for p in found if not only or any(s in p.name for s in only)]


def _write_figures(nb: dict, folder: Path) -> list[Path]:
    """Save every ``image/png`` output of an executed notebook; return the paths."""
    paths = []
    for i, cell in enumerate(nb.get("cells", [])):
        pngs = [
            o["data"]["image/png"]
            for o in cell.get("outputs", [])
            if "image/png" in o.get("data", {})
        ]
        for k, png in enumerate(pngs):
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"cell{i:02d}{'' if len(pngs) == 1 else f'_{k}'}.png"
            path.write_bytes(base64.b64decode(png))
            paths.append(path)
    return paths


def run_notebook(
    path: str | Path, out_dir: str | Path, *, timeout: float = 120.0, kernel: str = "python3"
) -> TourStop:
    """Execute one notebook and write its executed copy and figures under ``out_dir``.

    Cells run with the notebook's own folder as working directory, as in
    JupyterLab and under nbmake, and with ``EZPZ_NB_PLAIN=1`` so progress is
    printed as text (kept in the executed copy) rather than drawn as a widget.
    A failing cell stops the notebook; what ran
    until then is still written.

    Args:
        path: The notebook to run.
        out_dir: Receives ``<name>.ipynb`` and ``<name>/cellNN.png``.
        timeout: Seconds any one cell may take.
        kernel: Kernel name to run it with.

    Returns:
        A :class:`TourStop` describing what was written.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path, out = Path(path), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(path.parent)}}
    )
    # Plain text progress: the executed copy is read as a file, where a widget
    # (which needs a live frontend) would show nothing. The kernel gets this
    # process's environment plus the switch that ezpz_nb.viz.progress reads.
    env = {**os.environ, "EZPZ_NB_PLAIN": "1"}
    error = None
    start = time.monotonic()
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        # The first lines name the cell and the exception; the rest is the traceback.
        error = "\n".join(str(exc).strip().splitlines()[-3:])
    except Exception as exc:  # noqa: BLE001 - a dead kernel or a timeout: report, go on
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    executed = out / path.name
    nbformat.write(nb, executed)
    figures = _write_figures(nb, out / path.stem)
    return TourStop(path, executed, figures, seconds, error)


def run_tour(
    out_dir: str | Path = "tour",
    notebooks: str | Path | None = None,
    only: Iterable[str] = (),
    *,
    timeout: float = 120.0,
    kernel: str = "python3",
    echo: bool = True,
) -> list[TourStop]:
    """Run every tutorial notebook; print where the executed copies and figures are.

    Args:
        out_dir: Output folder (created).
        notebooks: Folder of notebooks; default :func:`default_notebook_dir`.
        only: Keep notebooks whose name contains one of these strings.
        timeout: Seconds any one cell may take.
        kernel: Kernel name.
        echo: Print progress and the final listing.

    Returns:
        One :class:`TourStop` per notebook, in order.
    """
    folder = Path(notebooks) if notebooks is not None else default_notebook_dir()
    paths = find_notebooks(folder, only)
    if not paths:
        raise FileNotFoundError(
            f"no notebooks found in {folder}" + (f" matching {list(only)}" if only else "")
        )
    stops = []
    for p in paths:
        if echo:
            print(f"running {p.name} ...", flush=True)
        stop = run_notebook(p, out_dir, timeout=timeout, kernel=kernel)
        stops.append(stop)
        if echo:
            state = "ok" if stop.ok else f"FAILED\n    {stop.error}"
            print(f"  {stop.seconds:5.1f} s, {len(stop.figures)} figure(s): {state}", flush=True)
    if echo:
        print(f"\nExecuted notebooks and figures are in {Path(out_dir).resolve()}:")
        for s in stops:
            print(f"  {s.executed}")
            for f in s.figures:
                print(f"    {f}")
    return stops
