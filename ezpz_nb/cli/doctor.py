"""``ezpz-nb doctor``: is this machine ready for the notebooks? Answers in seconds.

For an instructor checking 30 laptops before the day, and for notebook 00,
which runs the same checks. No Jupyter is started: the checks look at what is
installed, start real gloo ranks twice (2 ranks on loopback, then the notebooks'
usual 4) and ask the ``python3`` kernel's own Python whether it can import ezpz_nb.

Every check that fails says what to do. The verdict line comes within
:data:`BUDGET_S` seconds (``--budget``) even when ranks hang: the launches run
in a background thread whose result is not waited for past the budget.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from ezpz_nb._machine import available_memory
from ezpz_nb.wrapping import wrap_message

__all__ = [
    "BUDGET_S",
    "NOTEBOOK_RANKS",
    "Check",
    "Report",
    "available_memory",
    "run_checks",
]

# The verdict line is printed within this many seconds of the command's start
# (``ezpz-nb doctor --budget S`` changes it).
BUDGET_S = 10.0
# The most ranks a notebook starts: 06_explorer's world-size slider goes up to 8.
NOTEBOOK_RANKS = 8
# The oldest versions the notebooks are tested to need (pyproject.toml's lower bounds).
PYTHON_MIN = (3, 10)
TORCH_MIN = (2, 2)
IPYWIDGETS_MIN = (8, 0)
# The JupyterLab extension that draws ipywidgets (the ``jupyterlab_widgets`` package).
WIDGET_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
_PIP = f"{Path(sys.executable).name} -m pip install"


@dataclass
class Check:
    """One line of the doctor's report.

    Attributes:
        name: What was checked (``"torch"``, ``"4-rank launch"``...).
        ok: True passed, False failed, None could not tell (a warning, not a failure).
        detail: What was found.
        fix: What to do about it (set when ``ok`` is not True).
    """

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    def __str__(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "warn"}[self.ok]
        line = f"  {mark}  {self.name:<17} {self.detail}"
        return line + (f"\n        what to do: {self.fix}" if self.fix else "")


@dataclass
class Report:
    """Every check, and how long they took together.

    Attributes:
        checks: In the order they are printed.
        seconds: Wall time from the start of the checks to the verdict.
    """

    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return all(c.ok is not False for c in self.checks)

    @property
    def verdict(self) -> str:
        """The one line that answers "is this machine ready?"."""
        failed = [c.name for c in self.checks if c.ok is False]
        warned = [c.name for c in self.checks if c.ok is None]
        took = f"{self.seconds:.1f} s"
        if failed:
            return (
                f"ezpz-nb doctor: NOT READY: {len(failed)} of {len(self.checks)} checks "
                f"failed ({', '.join(failed)}); do what each FAIL line says, then run "
                f"ezpz-nb doctor again ({took})"
            )
        note = f", {len(warned)} warning(s) ({', '.join(warned)})" if warned else ""
        return f"ezpz-nb doctor: READY: {len(self.checks)} checks passed{note} ({took})"

    def __str__(self) -> str:
        # What a notebook prints (00): broken between words to fit its output column. The
        # command line prints each check as it finishes, and the verdict as one line.
        return wrap_message("\n".join([*(str(c) for c in self.checks), self.verdict]))


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
    fix = f"{_PIP} 'torch>=2.2' (an official build: it includes gloo)"
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


def check_cores() -> Check:
    """How many cores this process may use (fewer only makes the notebooks slower)."""
    try:
        from ezpz_nb.launcher.startup import cores
    except ImportError:  # no working torch (reported above): the launcher cannot load
        n = os.cpu_count() or 1
    else:
        n = cores()
    detail = f"{n} (each of r ranks gets max(1, {n} // r) threads)"
    if n < 2:
        return Check("cores", None, detail, "the notebooks run, more slowly: ranks take turns")
    return Check("cores", True, detail)


def _rank_memory() -> int:
    """This rank's share of memory in bytes: PSS on Linux (shared pages split fairly)."""
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def _hello() -> tuple[float, int]:
    """On every rank: the all_reduce of the ranks' numbers, and this rank's memory."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item(), _rank_memory()


def launch_fix() -> str:
    """What to do when ranks cannot meet over gloo."""
    from ezpz_nb.launcher.startup import LOOPBACK as address

    named = os.environ.get("GLOO_SOCKET_IFNAME")
    if named:
        return (
            f"GLOO_SOCKET_IFNAME is set to {named!r}: unset it (ezpz_nb binds gloo to "
            f"{address}, the loopback address, by itself), and check again"
        )
    return (
        f"check that nothing (a firewall, a VPN client) blocks connections on {address}; "
        "the error says more"
    )


def _describe(exc: BaseException, limit: int = 300) -> str:
    """One line about a failed launch: for a RankError, the first failing rank's message."""
    from ezpz_nb.launcher.errors import RankError

    if isinstance(exc, RankError) and exc.ranks:
        first = exc.failures[exc.ranks[0]]
        text = f"RankError on rank(s) {exc.ranks}: {first.message}"
    else:
        lines = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _launch_name(world_size: int) -> str:
    # The first launch (2 ranks) answers "does gloo work here?"; the second times the usual 4.
    return "gloo on loopback" if world_size == 2 else f"{world_size}-rank launch"


def _launch(world_size: int, timeout: float) -> tuple[Check, list[int]]:
    """Launch ``world_size`` ranks that all_reduce; a check and each rank's memory."""
    from ezpz_nb.launcher import launch

    name = _launch_name(world_size)
    start = time.monotonic()
    try:
        results = launch(_hello, world_size=world_size, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, reported
        return Check(name, False, _describe(exc), launch_fix()), []
    took = time.monotonic() - start
    want = float(sum(range(world_size)))
    if any(total != want for total, _ in results):
        return Check(
            name, False, f"all_reduce gave {[t for t, _ in results]}, not {want}", launch_fix()
        ), []
    return (
        Check(name, True, f"{world_size} ranks, all_reduce correct, {took:.2f} s"),
        [mem for _, mem in results],
    )


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


def check_memory(rank_bytes: list[int], available: int | None) -> Check:
    """Enough free memory for :data:`NOTEBOOK_RANKS` ranks of the size just measured."""
    gib = 1024**3
    if not rank_bytes:
        free = "" if available is None else f"{available / gib:.1f} GiB free; "
        return Check(
            "memory", None, f"{free}rank size unknown (no launch succeeded)", "fix the launch first"
        )
    need = NOTEBOOK_RANKS * max(rank_bytes) + _rank_memory()  # the ranks and this kernel
    if available is None:
        return Check(
            "memory",
            None,
            "could not read the free memory here",
            f"make sure about {need / gib:.1f} GiB is free for {NOTEBOOK_RANKS} ranks",
        )
    detail = (
        f"{available / gib:.1f} GiB free, {NOTEBOOK_RANKS} ranks need about {need / gib:.1f} GiB"
    )
    if available < need:
        return Check(
            "memory",
            False,
            detail,
            "close other programs (browsers, IDEs) and run ezpz-nb doctor again",
        )
    return Check("memory", True, detail)


def _in_thread(fn: Callable[[], Any], wait: float) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; (finished, result) after at most ``wait`` seconds."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()), daemon=True, name="ezpz-nb-doctor")
    thread.start()
    thread.join(max(wait, 0.0))
    return bool(box), (box[0] if box else None)


def process_age() -> float:
    """Seconds since this process started (Linux; 0.0 where it cannot be read).

    ``ezpz-nb doctor`` counts its budget from there: importing torch before the
    first check is part of what the instructor waits for.
    """
    try:
        with open("/proc/self/stat") as fh:
            # Field 22 (after the parenthesised command name) is the start time in ticks.
            started = int(fh.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as fh:
            return max(0.0, float(fh.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return 0.0


def run_checks(
    echo: Callable[[str], None] | None = None,
    *,
    started: float | None = None,
    budget: float = BUDGET_S,
) -> Report:
    """Run every check; the report's verdict is ready within ``budget`` seconds.

    Args:
        echo: Called with each check's line as soon as it is known (e.g. ``print``).
        started: ``time.monotonic()`` when the budget began; default now.
        budget: Seconds from ``started`` to the verdict. The launches get what the
            other checks leave; on a busy machine the first one (which imports torch
            in a helper process) may need more than the default.

    Returns:
        The :class:`Report`; ``report.ok`` is False when something must be fixed.
    """
    start = time.monotonic() if started is None else started
    deadline = start + budget - 0.5  # for the last, quick checks and the verdict
    report = Report()

    def add(check: Check) -> None:
        report.checks.append(check)
        if echo is not None:
            echo(str(check))

    kernel_check = start_kernel_check()  # runs alongside the rest
    for check in (
        check_python,
        check_ezpz_nb,
        check_torch,
        check_ipywidgets,
        check_notebook_extra,
        check_cores,
    ):
        add(check())
    launcher_loads = all(c.ok for c in report.checks if c.name in ("ezpz_nb", "torch"))
    if launcher_loads:
        from ezpz_nb.cli.traps import trap_checks

        for trap in trap_checks():
            add(trap)
    frontend = check_widget_frontend()  # before the launches: they get what is left
    rank_bytes: list[int] = []
    # Ranks need a working torch (and this ezpz_nb); without them the launch would only
    # repeat the failure above.
    if launcher_loads:
        # Ranks that hang give HangError after `timeout`; the thread keeps the budget
        # even if starting them hangs (the start waits longer than the run timeout).
        for world_size in (2, 4):
            left = deadline - time.monotonic()
            done, result = _in_thread(partial(_launch, world_size, max(left, 1.0)), left)
            if not done:
                add(
                    Check(
                        _launch_name(world_size),
                        False,
                        f"no answer within {max(left, 0):.1f} s",
                        _slow_fix(budget),
                    )
                )
                break
            check, rank_bytes = result
            add(check)
            if not check.ok:
                break
    add(kernel_check(deadline - time.monotonic()))
    add(frontend)
    add(check_memory(rank_bytes, available_memory()))
    report.seconds = time.monotonic() - start
    return report


def _slow_fix(budget: float) -> str:
    return (
        f"this machine may only be busy or slow (the first launch imports torch in a "
        f"helper process): close other programs, or allow more time with "
        f"ezpz-nb doctor --budget {max(60, int(budget) * 3)}; if the ranks still do "
        f"not answer, {launch_fix()}"
    )


def main(budget: float = BUDGET_S) -> int:
    """``ezpz-nb doctor``: print each check, then the verdict; 0 when ready, 1 when not.

    Args:
        budget: Seconds from the start of the command to the verdict.
    """
    started = time.monotonic() - process_age()
    print("ezpz-nb doctor: checking this machine for the ezpz_nb notebooks", flush=True)
    report = run_checks(echo=lambda line: print(line, flush=True), started=started, budget=budget)
    print(report.verdict, flush=True)
    return 0 if report.ok else 1
