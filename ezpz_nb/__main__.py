"""Command line: ``python -m ezpz_nb`` (also installed as ``ezpz-nb``).

Subcommands:

* ``tour [--out DIR] [--notebooks DIR] [--timeout S] [NAME ...]``: run the
  tutorial notebooks headless; write executed copies and figures (PNG) to DIR.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ezpz_nb",
                                     description="ezpz_nb: distributed data loading, taught "
                                     "with real gloo ranks.")
    sub = parser.add_subparsers(dest="command", required=True)
    tour = sub.add_parser("tour", help="run the notebooks headless and save their figures",
                          description="Execute the tutorial notebooks, write the executed "
                          "copies and every figure as PNG, and print where they are.")
    tour.add_argument("names", nargs="*",
                      help="only notebooks whose file name contains one of these (e.g. 02)")
    tour.add_argument("--out", default="tour", help="output folder (default: ./tour)")
    tour.add_argument("--notebooks", default=None,
                      help="folder holding the notebooks (default: ./notebooks, else "
                      "the ones installed with ezpz_nb)")
    tour.add_argument("--timeout", type=float, default=120.0,
                      help="seconds one cell may take (default: 120)")
    tour.add_argument("--kernel", default="python3", help="kernel name (default: python3)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    if args.command == "tour":
        from ezpz_nb.tour import run_tour

        try:
            stops = run_tour(args.out, args.notebooks, args.names, timeout=args.timeout,
                             kernel=args.kernel)
        except FileNotFoundError as exc:
            print(f"ezpz_nb tour: {exc}", file=sys.stderr)
            return 2
        failed = [s.notebook.name for s in stops if not s.ok]
        if failed:
            print(f"{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
