"""What every walkthrough needs besides the idea it teaches.

* :func:`begin` and :func:`record_epochs`: the skeleton every walkthrough shares.
  ``begin`` joins torchrun's process group (nothing to do inside an ``ez.launch``
  rank), prepares the ledger folder and builds the DP x TP layout; the walkthrough
  builds its loader (its one idea); ``record_epochs`` records it over the epochs,
  one training step per batch, and returns the rank's ledger.
* :func:`ensure_distributed`, :func:`check_backend`, :func:`run_in_place` (from
  :mod:`ezpz_nb.launcher.torchrun`): join torchrun's process group, or do nothing
  inside an ``ez.launch`` rank; nccl without a GPU fails before any group exists.
* :func:`destroy_distributed` (from :mod:`ezpz_nb._dist`): tear the group down so
  that none of its threads outlives it (a gloo thread alive at interpreter exit
  can abort the process after all the work was done).
* :func:`device`: the rank's GPU under nccl, else the CPU.
* :func:`prepare_out` / :func:`ledger_file`: one ledger file per rank
  (``DIR/rank{r}.jsonl``), written step by step, merged later with
  ``Ledger.load(DIR)``.
* :func:`cli_main`: the command line of ``python -m torch.distributed.run ...
  -m ezpz_nb.examples.<name>``, built from the worker's own signature
  (:func:`parser_for`), so each default is declared once.
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
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

from ezpz_nb._dist import collective_device as device
from ezpz_nb._dist import destroy_distributed
from ezpz_nb.data.groups import Layout, make_layout
from ezpz_nb.data.tree import flatten_batch, unflatten_batch
from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.torchrun import (
    BACKENDS,
    TORCHRUN_VARS,
    check_backend,
    ensure_distributed,
    in_torchrun_env,
    run_in_place,
)
from ezpz_nb.ledger import Ledger, record

__all__ = [
    "BACKENDS",
    "SEQ_LENGTH",
    "SHARD_OVER",
    "TORCHRUN_VARS",
    "VOCAB_SIZE",
    "ShardOver",
    "UsageError",
    "begin",
    "check_backend",
    "cli_main",
    "destroy_distributed",
    "device",
    "ensure_distributed",
    "in_torchrun_env",
    "ledger_file",
    "ledger_path",
    "parser_for",
    "prepare_out",
    "record_epochs",
    "run_in_place",
    "to_device",
]

#: Size of the random-token samples: small, because the walkthroughs are about
#: which sample goes where, not about the tokens.
VOCAB_SIZE = 1024
SEQ_LENGTH = 16

#: What the sampler shards over: the DP replicas (right) or the whole world
#: (the pitfall of ``dp_group=None``: TP peers get different samples).
ShardOver = Literal["dp", "world"]
SHARD_OVER: tuple[str, ...] = get_args(ShardOver)

#: What a walkthrough does with each batch: ``step(batch, epoch, index)``; a float it
#: returns is the step's loss, logged in the ledger beside the batch.
Step = Callable[[Any, int, int], float | None]


def to_device(batch: Any, dev: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``dev``; other leaves are kept."""
    tree, tensors = flatten_batch(batch)
    return unflatten_batch(tree, [t.to(dev, non_blocking=True) for t in tensors])


def begin(tp_size: int, out: str | Path | None = None) -> Layout:
    """Start a walkthrough on this rank: join the group, prepare ``out``, lay out DP x TP.

    Joins torchrun's process group when run under torchrun (inside an
    ``ez.launch`` rank the group exists already), empties the ledger folder
    ``out`` of an earlier run's files, and returns this rank's layout.
    """
    ensure_distributed()
    prepare_out(out)
    return make_layout(tp_size)


def _move(batch: Any, epoch: int, index: int) -> None:
    # Stands in for a training step: where a model would take the batch; under nccl
    # it is the copy a TP leader's loaded batch needs.
    to_device(batch, device())


def record_epochs(
    loader: Any,
    layout: Layout,
    epochs: int,
    *,
    out: str | Path | None = None,
    set_epoch: bool = True,
    step: Step = _move,
) -> Ledger:
    """Run ``epochs`` passes over ``loader``, recording what every step held.

    Args:
        loader: This rank's loader (the walkthrough's idea).
        layout: This rank's place in the DP x TP layout (:func:`begin`).
        epochs: Number of passes.
        out: Ledger folder: the file ``rank{r}.jsonl`` there grows by one line per
            step, so a rank that is killed still leaves the steps it took.
        set_epoch: Call ``set_epoch(epoch)`` before each pass (forgetting it
            repeats the same order every epoch).
        step: Called as ``step(batch, epoch, index)`` for each batch; a float it
            returns is logged as the step's loss. Default: move the batch to
            :func:`device`.

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`; merge the ranks' with
        ``Ledger.from_results``.
    """
    with record(loader, layout, path=ledger_file(out)) as rec:
        for epoch in range(epochs):
            if set_epoch:
                rec.set_epoch(epoch)
            for index, batch in enumerate(rec):
                loss = step(batch, epoch, index)
                if loss is not None:
                    rec.log_loss(loss)
    return rec.ledger()


def ledger_path(out: str | Path, rank: int) -> Path:
    """The file rank ``rank`` writes its ledger to inside folder ``out``."""
    return Path(out) / f"rank{rank}.jsonl"


def prepare_out(out: str | Path | None) -> None:
    """Make ``out`` and remove ledger files of an earlier run (call on every rank).

    A stale ``rank7.jsonl`` from an 8-rank run would otherwise be merged into
    a later 4-rank run's ledger. One process per node cleans (nodes may not
    share the folder), and a barrier keeps every rank from writing before that.
    """
    if out is None:
        return
    rank = dist.get_rank()
    if int(os.environ.get("LOCAL_RANK", rank)) == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        for old in Path(out).glob("rank*.jsonl"):
            old.unlink(missing_ok=True)
    dist.barrier()


def ledger_file(out: str | Path | None) -> Path | None:
    """This rank's ledger file in folder ``out`` (None if ``out`` is None).

    Pass it to ``record(..., path=...)``: the file then grows by one line per
    step, so a rank that is killed still leaves the steps it took.
    """
    return None if out is None else ledger_path(out, dist.get_rank())


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
        # group's timeout. Exit now with the traceback; torchrun stops the others.
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
