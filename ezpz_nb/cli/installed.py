"""The doctor's questions about what is installed: Python, torch, ezpz_nb, Jupyter.

Each ``check_*`` returns a :class:`~ezpz_nb.cli.report.Check` that says what to do
when something is missing. :func:`start_kernel_check` asks the ``python3`` kernel's
own Python, alongside the other checks.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from ezpz_nb.cli.report import Check

__all__ = [
    "check_ezpz_nb",
    "check_ipywidgets",
    "check_notebook_extra",
    "check_python",
    "check_torch",
    "check_widget_frontend",
    "start_kernel_check",
]

# The oldest versions the notebooks are tested to need (pyproject.toml's lower bounds).
PYTHON_MIN = (3, 10)
TORCH_MIN = (2, 13)  # pyproject.toml's floor: the oldest torch the tests passed on
IPYWIDGETS_MIN = (8, 0)
# The JupyterLab extension that draws ipywidgets (the ``jupyterlab_widgets`` package).
WIDGET_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
_PIP = f"{Path(sys.executable).name} -m pip install"


def _version(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def _installed(package: str, minimum: tuple[int, ...], fix: str) -> Check:
    try:
        found = metadata.version(package)
    except metadata.PackageNotFoundError:
        return Check(package, False, "not installed", fix)
    if _version(found) < minimum:
        need = ".".join(map(str, minimum))
        return Check(package, False, f"{found}, older than {need}", fix)
    return Check(package, True, found)


def check_python() -> Check:
    """Python 3.10 or newer."""
    found = sys.version.split()[0]
    if sys.version_info[:2] < PYTHON_MIN:
        return Check(
            "python",
            False,
            f"{found} at {sys.executable}",
            "install Python 3.10 or newer and install ezpz_nb with it",
        )
    return Check("python", True, f"{found} at {sys.executable}")


def check_ezpz_nb() -> Check:
    """Which ezpz_nb runs (an instructor may find two installs), and its notebooks."""
    import ezpz_nb
    from ezpz_nb.cli.notebooks import shipped_files
    from ezpz_nb.cli.resources import notebooks_dir

    where = f"{ezpz_nb.__version__} at {Path(ezpz_nb.__file__).parent}"
    try:
        count = sum(p.suffix == ".ipynb" for p in shipped_files(notebooks_dir()))
    except FileNotFoundError:
        count = 0
    if not count:
        return Check(
            "ezpz_nb",
            False,
            f"{where}, without its notebooks",
            "reinstall ezpz_nb from its wheel (it carries the notebooks)",
        )
    return Check("ezpz_nb", True, f"{where}, {count} notebooks")


def check_torch() -> Check:
    """A torch build new enough, with torch.distributed and gloo."""
    fix = f"{_PIP} 'torch>=2.13' (an official build: it includes gloo)"
    found = _installed("torch", TORCH_MIN, fix)
    if not found.ok:
        return found
    try:
        import torch.distributed as dist
    except ImportError as exc:  # installed but broken, e.g. a missing shared library
        return Check("torch", False, f"{found.detail} but it cannot be imported: {exc}", fix)
    if not (dist.is_available() and dist.is_gloo_available()):
        return Check("torch", False, f"{found.detail} without torch.distributed's gloo", fix)
    return Check("torch", True, f"{found.detail} with gloo")


def check_ipywidgets() -> Check:
    """ipywidgets 8, which the progress bars and the explorer use."""
    return _installed("ipywidgets", IPYWIDGETS_MIN, f"{_PIP} 'ipywidgets>=8'")


def check_notebook_extra() -> Check:
    """What the notebooks need beyond the library (the ``notebook`` extra: torchdata for 09)."""
    try:
        requires = metadata.requires("ezpz_nb") or []
    except metadata.PackageNotFoundError:
        return Check(
            "notebook extra",
            None,
            "ezpz_nb's metadata is not installed",
            f"{_PIP} 'ezpz_nb[notebook]' (from its wheel or repository)",
        )
    wanted = [
        r.split(";")[0].strip()
        for r in requires
        if re.search(r"""extra\s*==\s*["']notebook["']""", r)
    ]
    missing: list[str] = []
    found: list[str] = []
    for spec in wanted:
        name, _, minimum = spec.partition(">=")
        check = _installed(name.strip(), _version(minimum) if minimum else (0,), "")
        (found if check.ok else missing).append(f"{name.strip()} {check.detail}")
    if missing:
        specs = " ".join(f"'{s}'" for s in wanted)
        return Check(
            "notebook extra",
            False,
            "; ".join(missing),
            f"{_PIP} {specs} (the notebook extra: ezpz_nb[notebook])",
        )
    return Check("notebook extra", True, ", ".join(found) or "nothing needed")


def start_kernel_check() -> Callable[[float], Check]:
    """Start asking the ``python3`` kernel's own Python whether it finds ezpz_nb.

    The question runs alongside the other checks; the returned function waits
    at most the given seconds for the answer and turns it into a :class:`Check`.
    A ``python3`` kernel of another Python (e.g. in ``~/.local/share/jupyter``)
    shadows the one installed with ezpz_nb: the notebooks then fail on import.
    """
    fix = (
        f"{sys.executable} -m ipykernel install "
        f"{'--sys-prefix' if sys.prefix != sys.base_prefix else '--user'} --name python3"
    )

    def now(check: Check) -> Callable[[float], Check]:
        return lambda wait: check

    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError:
        return now(
            Check(
                "jupyter kernel",
                False,
                "jupyter_client is not installed",
                f"{_PIP} ipykernel jupyterlab",
            )
        )
    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return now(Check("jupyter kernel", False, "no kernel named python3", fix))
    python = spec.argv[0]
    major, minor = sys.version_info[:2]
    if python in ("python", f"python{major}", f"python{major}.{minor}"):
        # jupyter_client starts such a kernel with the Python that runs Jupyter (this one).
        python = sys.executable
    # Without the working folder on sys.path: in a checkout it holds ezpz_nb/, which
    # the kernel (started in the notebooks' folder) would not see.
    probe = (
        "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "import importlib.util as u; "
        "missing = [m for m in ('ezpz_nb', 'ipykernel') if u.find_spec(m) is None]; "
        "print(' '.join(missing)); sys.exit(1 if missing else 0)"
    )
    try:
        proc = subprocess.Popen(
            [python, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as exc:
        return now(Check("jupyter kernel", False, f"python3 runs {python}: {exc}", fix))

    def finish(wait: float) -> Check:
        wait = max(wait, 0.1)  # the launches may have used the whole budget
        try:
            out, _ = proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Check(
                "jupyter kernel",
                None,
                f"python3 runs {python}, which did not answer within {wait:.1f} s",
                "run ezpz-nb doctor again",
            )
        if proc.returncode != 0:
            missing = out.strip() or f"exit status {proc.returncode}"
            return Check(
                "jupyter kernel",
                False,
                f"python3 runs {python}, which lacks: {missing}",
                f"the python3 kernel found first ({spec.resource_dir}) "
                f"belongs to another Python: remove that folder, or install ezpz_nb "
                f"(it brings ipykernel) into {python}",
            )
        return Check("jupyter kernel", True, f"python3 runs {python}")

    return finish


def check_widget_frontend() -> Check:
    """JupyterLab and the extension that draws ipywidgets in it."""
    fix = f"{_PIP} 'jupyterlab>=4' 'ipywidgets>=8' (in the Python that runs JupyterLab)"
    lab = _installed("jupyterlab", (4, 0), fix)
    if not lab.ok:
        return Check("widget frontend", False, f"jupyterlab {lab.detail}", fix)
    from jupyter_core.paths import jupyter_path

    for folder in jupyter_path("labextensions"):
        if (Path(folder) / WIDGET_EXTENSION / "package.json").is_file():
            return Check("widget frontend", True, f"JupyterLab {lab.detail}, {WIDGET_EXTENSION}")
    return Check(
        "widget frontend", False, f"JupyterLab {lab.detail} without {WIDGET_EXTENSION}", fix
    )
