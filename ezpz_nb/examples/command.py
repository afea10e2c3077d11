"""A walkthrough's command line under torchrun, read off its worker's signature.

* :func:`cli_main`: the command line of ``python -m torch.distributed.run ...
  -m ezpz_nb.examples.<name>``: parse, join torchrun's group, run the worker,
  gather every rank's ledger and report on rank 0.
* :func:`parser_for`: the parser, built from the worker's own signature and
  docstring, so each default is declared once.
"""

from __future__ import annotations

import argparse
import collections.abc
import inspect
import os
import re
import sys
import traceback
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from ezpz_nb._dist import destroy_distributed
from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.torchrun import BACKENDS, ensure_distributed
from ezpz_nb.ledger import Ledger

__all__ = ["UsageError", "cli_main", "parser_for"]


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each option's default in its help."""


def _arg_docs(doc: str) -> dict[str, str]:
    """Each parameter's text in a Google-style docstring's ``Args:`` section."""
    section = re.search(r"^Args:\n(.*?)(?:\n\S|\Z)", inspect.cleandoc(doc), re.M | re.S)
    found: dict[str, str] = {}
    name = None
    for line in (section.group(1) if section else "").splitlines():
        head = re.match(r" {4}(\w+): (.*)", line)
        if head:
            name, text = head.groups()
            found[name] = text
        elif name is not None and line.strip():
            found[name] += " " + line.strip()
    # Plain text on a terminal (no ``code`` or :role:`names`); argparse formats with %.
    plain = {k: re.sub(r":\w+:`~?([^`]+)`", r"\1", v).replace("``", "") for k, v in found.items()}
    return {k: v.replace("%", "%%") for k, v in plain.items()}


def _takes_code(hint: Any) -> bool:
    """True for a ``Callable`` hint, alone or ``| None``."""
    kinds = [hint, *typing.get_args(hint)]
    return any(typing.get_origin(k) is collections.abc.Callable for k in kinds)


def _optional_of(hint: Any) -> type:
    """``int`` for ``int | None``; ``str`` for a folder (``str | Path | None``) or no hint."""
    kinds = [a for a in typing.get_args(hint) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float) else str


def parser_for(run: Callable[..., Ledger], description: str | None) -> argparse.ArgumentParser:
    """The command line of a walkthrough, read off its worker's signature.

    Each parameter of ``run`` becomes an option of the same name (``tp_size`` is
    ``--tp-size``) with the same default and, as help, its line in the docstring's
    ``Args:`` section; a bool becomes ``--name`` / ``--no-name``, a ``Literal`` gives
    the choices. On top come the options of the launch itself: ``--backend``,
    ``--timeout`` and ``--check``.
    """
    p = argparse.ArgumentParser(description=description, formatter_class=_Formatter)
    hints = typing.get_type_hints(run)
    helps = _arg_docs(run.__doc__ or "")
    for name, param in inspect.signature(run).parameters.items():
        default = param.default
        if default is inspect.Parameter.empty:
            raise TypeError(f"{run.__qualname__}: parameter {name!r} needs a default")
        flag, hint, text = f"--{name.replace('_', '-')}", hints.get(name), helps.get(name)
        if _takes_code(hint):
            continue  # a function (a notebook's own code) has no command line form
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif typing.get_origin(hint) is typing.Literal:
            p.add_argument(flag, choices=typing.get_args(hint), default=default, help=text)
        else:  # int, float, or an optional int or folder that defaults to None
            kind = type(default) if default is not None else _optional_of(hint)
            p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="gloo",
        help="gloo on CPU or nccl with one GPU per rank",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="collective timeout in seconds (torch's defaults: 30 min on gloo, 10 min on nccl)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 if the merged ledger shows a problem",
    )
    return p


_LAUNCH_ONLY = ("backend", "timeout", "check")


class UsageError(EzpzError, ValueError):
    """Options of a walkthrough that cannot work together: it exits 2 before any group starts."""


def cli_main(
    run: Callable[..., Ledger],
    description: str | None,
    argv: Sequence[str] | None = None,
    check_args: Callable[..., None] | None = None,
) -> int:
    """Parse options, join torchrun's group, run the worker, report on rank 0.

    Every rank writes its own ledger file (when ``--out`` is given); rank 0 also
    gathers all ledgers and prints the summary, so one look at the log says
    whether the run was sound even when the files are spread over nodes.

    Args:
        run: The walkthrough's worker; its signature makes the command line
            (:func:`parser_for`).
        description: The ``--help`` text (the walkthrough module's docstring).
        argv: The options (default: ``sys.argv[1:]``).
        check_args: Called with ``run``'s options before any process group
            starts; a :class:`UsageError` it raises is the usage message and
            exit status 2 (under torchrun, on every rank, with no traceback).

    Returns:
        The process exit status: 0, or 1 with ``--check`` and a problem found.
        A rank that raises prints its traceback and exits with status 1 at once.
    """
    parser = parser_for(run, description)
    args = parser.parse_args(argv)
    try:
        if check_args is not None:
            check_args(**{k: v for k, v in vars(args).items() if k not in _LAUNCH_ONLY})
    except UsageError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        created = ensure_distributed(args.backend, args.timeout)
    except (RuntimeError, ValueError) as exc:
        # Nothing has started yet: a usage message, not a traceback.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        status = _run_and_report(run, args)
    except BaseException:  # noqa: BLE001 - whatever failed: say so and exit at once
        # A rank whose collective failed cannot leave cleanly: tearing the group
        # down (even a normal exit) waits for its pending collective until the
        # group's timeout. Exit now with the traceback; this node's torchrun stops
        # its other ranks (other nodes' ranks fail on their own, or time out).
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if created:
        destroy_distributed()
    return status


def _run_and_report(run: Callable[..., Ledger], args: argparse.Namespace) -> int:
    kwargs = {k: v for k, v in vars(args).items() if k not in _LAUNCH_ONLY}
    ledger = run(**kwargs)
    parts: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(ledger, parts, dst=0)
    if parts is None:
        return 0
    merged = Ledger.from_results(parts)
    print(merged.summary(), flush=True)
    if merged.timings():
        # The run timed its steps (record(timings=True)): say who waits for data.
        print(merged.diagnose(), flush=True)
    if args.out is not None:
        print(
            f"Ledger files in {args.out}/ (one per rank); in a notebook: "
            f"Ledger.load({str(args.out)!r})",
            flush=True,
        )
    # One failing process is enough for torchrun to report the job failed.
    return 1 if args.check and merged.check() else 0
