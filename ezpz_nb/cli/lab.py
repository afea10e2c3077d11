"""``ezpz-nb lab [DIR]``: open the tutorial in JupyterLab, on 127.0.0.1 only.

In a checkout the repository's ``notebooks/`` is served as it is (``make lab``
runs this). Installed from a wheel, the notebooks live inside the package,
where edits are lost on the next install: they are copied to a working folder
first (DIR, default ``./ezpz_nb_notebooks``), keeping files already there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ezpz_nb.cli.notebooks import NotebookCopy, copy_notebooks
from ezpz_nb.cli.resources import is_packaged, notebooks_dir

__all__ = ["HIDDEN", "START", "WORKDIR", "jupyter_args", "lab_folder", "run_lab"]

# Where an installed ezpz_nb copies its notebooks when no folder is named.
WORKDIR = "ezpz_nb_notebooks"
# The notebook the lab opens on, instead of JupyterLab's Launcher.
START = "00_setup_check.ipynb"
# Not the learner's: the notebooks' sources and their build script (in a checkout), on
# top of what jupyter_server hides anyway (its default list, repeated: setting replaces it).
HIDDEN = ("_cells", "_build.py", "__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~")


def lab_folder(folder: str | Path | None = None) -> tuple[Path, NotebookCopy | None]:
    """The folder to serve, copying the notebooks there first when needed.

    Args:
        folder: The learner's folder; default: a checkout's ``notebooks/`` as it is,
            or ``./ezpz_nb_notebooks`` for an installed package.

    Returns:
        The folder and what was copied into it (``None`` when nothing needed copying).
    """
    source = notebooks_dir()
    if folder is None:
        if not is_packaged(source):
            return source, None
        folder = Path.cwd() / WORKDIR
    folder = Path(folder).expanduser()
    if folder.exists() and folder.resolve() == source.resolve():
        return source, None
    return folder.resolve(), copy_notebooks(folder, source=source)


def jupyter_args(
    folder: Path,
    *,
    port: int | None = None,
    open_browser: bool = True,
    extra: list[str] | None = None,
) -> list[str]:
    """The ``jupyter lab`` options: loopback only, ``folder`` as root, root allowed.

    The lab opens on notebook 00 (when ``folder`` has it) and does not list the
    notebooks' sources (``_cells/``, ``_build.py``): only what is the learner's.
    """
    args = ["--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={folder}"]
    if (folder / START).exists():
        args.append(f"--LabApp.default_url=/lab/tree/{START}")
    args += [f"--ContentsManager.hide_globs={glob}" for glob in HIDDEN]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # JupyterLab refuses to run as root unless told; containers and CI boxes often are.
        args.append("--ServerApp.allow_root=True")
    if port is not None:
        args += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if not open_browser:
        args.append("--ServerApp.open_browser=False")
    return args + list(extra or [])


def run_lab(
    folder: str | Path | None = None,
    *,
    port: int | None = None,
    open_browser: bool = True,
    extra: list[str] | None = None,
) -> int:
    """Copy the notebooks if needed, then run JupyterLab on them until it is stopped.

    On POSIX this process becomes the server (``exec``): Ctrl-C or SIGTERM reach
    JupyterLab itself, which shuts its kernels down, and nothing of this process
    (torch, the launcher's exit hooks) stays around in it.

    Returns:
        JupyterLab's exit status (where ``exec`` is not available).
    """
    where, copy = lab_folder(folder)
    if copy is not None and (copy.copied or copy.overwritten or copy.skipped):
        print(copy.report(), flush=True)
    print(f"ezpz-nb lab: serving {where} on 127.0.0.1", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        *jupyter_args(where, port=port, open_browser=open_browser, extra=extra),
    ]
    if os.name == "posix":
        sys.stderr.flush()
        os.execv(sys.executable, cmd)
    return subprocess.call(cmd)  # pragma: no cover - Windows
