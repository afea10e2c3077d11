"""``ezpz-nb check MODULE:FACTORY --layout dp=2,tp=2``: a loader's contract from the shell.

Exit status: 0 when no rule is broken, 1 on a violation (or, with ``--strict``, a
rule not judged: a report that is NOT ALL JUDGED exits 0 only without it, and says
so on stderr), 2 when the check could not run (bad input: a layout, the factory
cannot be imported, or fails on a rank). Under torchrun it runs in place on
torchrun's ranks, rank 0 prints, and every rank exits with the same status; torchrun
itself exits 1 whenever a rank exits non-zero, so read the ranks' ``exitcode`` in
its summary (2: bad input) or the message rank 0 prints.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "load_factory", "run_check"]


def add_parser(sub: Any) -> None:
    """Add the ``check`` subcommand to the dispatcher's subparsers."""
    check = sub.add_parser(
        "check",
        help="check a data loader's distributed contract on real ranks",
        description="Start the ranks of LAYOUT, call FACTORY(layout) on each, iterate the "
        "loader it returns and check the distributed data contract (TP peers identical, "
        "DP replicas disjoint, every sample once an epoch, equal steps, constant global "
        "batch, reshuffled epochs). Exit status 1 on a violation, 2 when the check "
        "cannot run.",
    )
    check.add_argument(
        "factory",
        metavar="MODULE:FACTORY",
        help="e.g. myproject.data:make_loader or path/to/file.py:make_loader",
    )
    check.add_argument(
        "--layout", default="dp=2", help="ranks, e.g. dp=2,tp=2 or dp=2,cp=2 (default: dp=2)"
    )
    check.add_argument("--epochs", type=int, default=2, help="epochs to run (default: 2)")
    check.add_argument(
        "--key", default="auto", help="how samples are told apart: auto, digest or a field name"
    )
    check.add_argument(
        "--timeout", type=float, default=60.0, help="seconds for the run (default: 60)"
    )
    check.add_argument(
        "--resume", action="store_true", help="also stop and resume the loader (needs state_dict)"
    )
    check.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    check.add_argument(
        "--strict", action="store_true", help="exit 1 when a rule was not judged, too"
    )


def load_factory(spec: str) -> Any:
    """``module:name`` or ``file.py:name`` -> the function.

    Raises:
        ValueError: Not of that form, or nothing of that name there.
    """
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{spec!r}: write MODULE:FACTORY, e.g. myproject.data:make_loader")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"{target}: no such file")
        # Import it as a module named after the file, from its folder, so the ranks
        # (which get functions by reference) can import it too.
        sys.path.insert(0, str(path.parent))
        module = importlib.import_module(path.stem)
    else:
        sys.path.insert(0, os.getcwd())  # as `python -m` does
        module = importlib.import_module(target)
    try:
        return getattr(module, name)
    except AttributeError:
        raise ValueError(f"{target} has no {name!r}") from None


def run_check(args: argparse.Namespace) -> int:
    """Run the check the arguments describe; returns the exit status."""
    from ezpz_nb.verify import Verdict, VerifyError, check_contract, check_resume

    try:
        factory = load_factory(args.factory)
    except (ValueError, ImportError) as exc:
        return _cannot_run(exc)
    kwargs = dict(epochs=args.epochs, key=args.key, timeout=args.timeout)
    try:
        report = check_contract(factory, args.layout, **kwargs)
        reports = [report]
        if args.resume:
            reports.append(check_resume(factory, args.layout, **kwargs))
    except VerifyError as exc:
        return _cannot_run(exc)
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank has the report
        for r in reports:
            print(r.table())
        if args.json:
            import json

            Path(args.json).write_text(json.dumps([r.to_dict() for r in reports], indent=2))
    if any(r.failed for r in reports):
        return 1
    if any(r.outcome is not Verdict.PASS for r in reports):  # no violation, not all judged
        if args.strict:
            return 1
        if os.environ.get("RANK", "0") == "0":
            print("NOT ALL JUDGED: exit 0 (no rule broken); --strict exits 1", file=sys.stderr)
    return 0


def _exit_together(code: int) -> None:
    """Under torchrun: meet the other ranks, then leave at once with ``code``.

    torchrun stops the ranks still running once one exits non-zero (they would show
    SIGTERM, not 2), and a Python exit with torch loaded takes long enough for that.
    Bad input is found on every rank alike: after a barrier each leaves without the
    interpreter's teardown (``os._exit``), so they all exit before torchrun looks. A
    rank that never comes is waited for 10 s, then not.
    """
    from ezpz_nb.launcher.torchrun import ensure_distributed

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import torch.distributed as dist

        ensure_distributed("gloo", timeout_s=10)
        dist.barrier()
    except Exception:  # noqa: BLE001 - best effort: the status is the same whether or not they met
        pass
    os._exit(code)


def _cannot_run(exc: Exception) -> int:
    """Say why the check could not run (rank 0 only under torchrun); the status is 2."""
    from ezpz_nb.launcher.torchrun import in_torchrun_env

    torchrun = in_torchrun_env()
    if os.environ.get("RANK", "0") == "0":
        under = ""
        if torchrun:
            under = (
                " (every rank exits 2; torchrun itself reports any failed rank as exit 1: "
                "its summary lists each rank's exitcode)"
            )
        print(
            f"ezpz-nb check: {exc}\nexit status 2: the check could not run{under}", file=sys.stderr
        )
    if torchrun:
        _exit_together(2)
    return 2
