"""``ezpz-nb doctor``: is this machine ready for the notebooks? Answers in seconds.

For an instructor checking 30 laptops before the day, and for notebook 00,
which runs the same checks. No Jupyter is started: the checks look at what is
installed, start real gloo ranks twice (2 ranks on loopback, then the notebooks'
usual 4) and ask the ``python3`` kernel's own Python whether it can import ezpz_nb.

Every check that fails says what to do. The verdict line comes within
:data:`BUDGET_S` seconds (``--budget``) even when ranks hang: the launches run
in a background thread whose result is not waited for past the budget.

This module orders the checks and keeps the budget; the checks themselves are in
:mod:`~ezpz_nb.cli.installed` (what is installed), :mod:`~ezpz_nb.cli.probes` (real
ranks) and :mod:`~ezpz_nb.cli.traps` (settings that make a notebook slow or hang),
each returning a :class:`~ezpz_nb.cli.report.Check`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from ezpz_nb._machine import available_memory
from ezpz_nb.cli.installed import (
    check_ezpz_nb,
    check_ipywidgets,
    check_notebook_extra,
    check_python,
    check_torch,
    check_widget_frontend,
    start_kernel_check,
)
from ezpz_nb.cli.probes import (
    check_cores,
    check_memory,
    check_shm,
    launch_check,
    launch_fix,
    launch_name,
)
from ezpz_nb.cli.report import Check, Report
from ezpz_nb.cli.traps import trap_checks

__all__ = ["BUDGET_S", "main", "process_age", "run_checks"]

# The verdict line is printed within this many seconds of the command's start
# (``ezpz-nb doctor --budget S`` changes it).
BUDGET_S = 10.0


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
            done, result = _in_thread(partial(launch_check, world_size, max(left, 1.0)), left)
            if not done:
                add(
                    Check(
                        launch_name(world_size),
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
    add(check_shm())
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
