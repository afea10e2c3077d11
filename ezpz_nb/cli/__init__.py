"""Command line: ``ezpz-nb`` (also ``python -m ezpz_nb``).

Subcommands:

* ``doctor [--budget S]``: is this machine ready for the notebooks? One verdict
  line within 10 s (S); exit status 1, with what to do, when something is missing.
* ``notebooks DIR [--force]``: copy the tutorial notebooks into DIR to edit them;
  files already there are kept (and listed) unless ``--force``.
* ``lab [DIR] [--port N] [--no-browser] [JUPYTER OPTIONS]``: open the tutorial in
  JupyterLab on 127.0.0.1, copying the notebooks into a working folder if they are
  the installed ones.
* ``tour [--out DIR] [--notebooks DIR] [--timeout S] [NAME ...]``: run the
  notebooks headless; write executed copies and figures (PNG) to DIR.
* ``check MODULE:FACTORY [--layout dp=2,tp=2] [--resume] [--json PATH]``: check a
  data loader's distributed contract on real ranks; exit status 1 on a violation.
* ``slurm up|down|status|env``: a two-node Slurm cluster on this machine for ``ez.submit``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ezpz-nb",
        description="ezpz_nb: distributed data loading, taught with real gloo ranks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser(
        "doctor",
        help="check this machine before a workshop (seconds)",
        description="Check Python, torch, ipywidgets, cores, gloo on "
        "loopback, a 4-rank launch, the Jupyter kernel, the widget "
        "frontend and free memory. Exit status 1 when something must be "
        "fixed.",
    )
    doctor.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="S",
        help="seconds until the verdict (default: 10); a busy or slow "
        "machine, or a shared CI runner, may need 60",
    )

    nbs = sub.add_parser(
        "notebooks",
        help="copy the tutorial notebooks into a folder",
        description="Copy the tutorial notebooks into DIR (created if "
        "missing). Files already there are skipped and listed.",
    )
    nbs.add_argument("dir", help="folder to copy them into")
    nbs.add_argument("--force", action="store_true", help="overwrite files already there")

    lab = sub.add_parser(
        "lab",
        help="open the tutorial in JupyterLab (127.0.0.1)",
        description="Run JupyterLab on 127.0.0.1 on the tutorial notebooks. "
        "Installed from a wheel, the notebooks are first copied into DIR "
        "(default ./ezpz_nb_notebooks), keeping files already there; in a "
        "checkout notebooks/ is served as it is. Other options go to "
        "JupyterLab (e.g. --IdentityProvider.token=...).",
    )
    lab.add_argument("dir", nargs="?", default=None, help="working folder for the notebooks")
    lab.add_argument("--port", type=int, default=None, help="port (default: JupyterLab's)")
    lab.add_argument("--no-browser", action="store_true", help="do not open a browser")

    tour = sub.add_parser(
        "tour",
        help="run the notebooks headless and save their figures",
        description="Execute the tutorial notebooks, write the executed "
        "copies and every figure as PNG, and print where they are.",
    )
    tour.add_argument(
        "names", nargs="*", help="only notebooks whose file name contains one of these (e.g. 02)"
    )
    tour.add_argument("--out", default="tour", help="output folder (default: ./tour)")
    tour.add_argument(
        "--notebooks",
        default=None,
        help="folder holding the notebooks (default: ./notebooks, else "
        "the ones installed with ezpz_nb)",
    )
    tour.add_argument(
        "--timeout", type=float, default=120.0, help="seconds one cell may take (default: 120)"
    )
    tour.add_argument("--kernel", default="python3", help="kernel name (default: python3)")

    from ezpz_nb.cli.check import add_parser
    from ezpz_nb.cli.slurm import add_parser as add_slurm

    add_parser(sub)
    add_slurm(sub)
    return parser


def _tour(args: argparse.Namespace) -> int:
    from ezpz_nb.cli.tour import run_tour

    try:
        stops = run_tour(
            args.out, args.notebooks, args.names, timeout=args.timeout, kernel=args.kernel
        )
    except FileNotFoundError as exc:
        print(f"ezpz-nb tour: {exc}", file=sys.stderr)
        return 2
    failed = [s.notebook.name for s in stops if not s.ok]
    if failed:
        print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _notebooks(args: argparse.Namespace) -> int:
    from ezpz_nb.cli.notebooks import copy_notebooks

    try:
        done = copy_notebooks(args.dir, force=args.force)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"ezpz-nb notebooks: {exc}", file=sys.stderr)
        return 2
    print(done.report())
    return 0


def _lab(args: argparse.Namespace, extra: list[str]) -> int:
    from ezpz_nb.cli.lab import run_lab

    try:
        return run_lab(args.dir, port=args.port, open_browser=not args.no_browser, extra=extra)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"ezpz-nb lab: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "doctor":
        from ezpz_nb.cli.doctor import BUDGET_S
        from ezpz_nb.cli.doctor import main as doctor

        if args.budget is not None and not args.budget > 0:
            parser.error(f"--budget must be a number of seconds > 0, got {args.budget}")
        return doctor(BUDGET_S if args.budget is None else args.budget)
    if args.command == "notebooks":
        return _notebooks(args)
    if args.command == "lab":
        return _lab(args, extra)
    if args.command == "check":
        from ezpz_nb.cli.check import run_check

        return run_check(args)
    if args.command == "slurm":
        from ezpz_nb.cli.slurm import run_slurm

        return run_slurm(args)
    return _tour(args)
