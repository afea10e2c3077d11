"""What every walkthrough needs besides the idea it teaches.

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
* :func:`base_parser` / :func:`cli_main`: the command line shared by
  ``python -m torch.distributed.run ... -m ezpz_nb.examples.<name>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ezpz_nb._dist import destroy_distributed, uses_nccl
from ezpz_nb.data.tree import flatten_batch, unflatten_batch
from ezpz_nb.launcher.torchrun import (
    BACKENDS,
    TORCHRUN_VARS,
    check_backend,
    ensure_distributed,
    in_torchrun_env,
    run_in_place,
)
from ezpz_nb.ledger import Ledger, RecordingLoader

__all__ = [
    "BACKENDS",
    "SEQ_LENGTH",
    "TORCHRUN_VARS",
    "VOCAB_SIZE",
    "add_switch",
    "base_parser",
    "check_backend",
    "cli_main",
    "destroy_distributed",
    "device",
    "ensure_distributed",
    "in_torchrun_env",
    "ledger_file",
    "ledger_path",
    "prepare_out",
    "run_epochs",
    "run_in_place",
    "to_device",
]

#: Size of the random-token samples: small, because the walkthroughs are about
#: which sample goes where, not about the tokens.
VOCAB_SIZE = 1024
SEQ_LENGTH = 16


def device() -> torch.device:
    """The device this rank's batches belong on: its GPU under nccl, else the CPU."""
    if uses_nccl():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def to_device(batch: Any, dev: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``dev``; other leaves are kept."""
    tree, tensors = flatten_batch(batch)
    return unflatten_batch(tree, [t.to(dev, non_blocking=True) for t in tensors])


def run_epochs(loader: RecordingLoader, epochs: int, *, set_epoch: bool = True) -> None:
    """Iterate ``loader`` for ``epochs`` passes, moving each batch to :func:`device`.

    The move stands in for a training step: it is where a model would take the
    batch, and under nccl it is the copy a TP leader's loaded batch needs.

    Args:
        loader: The recording loader of this rank.
        epochs: Number of passes.
        set_epoch: Call ``set_epoch(epoch)`` before each pass (forgetting it
            repeats the same order every epoch).
    """
    dev = device()
    for epoch in range(epochs):
        if set_epoch:
            loader.set_epoch(epoch)
        for batch in loader:
            to_device(batch, dev)


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


def add_switch(parser: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    """Add ``--name`` / ``--no-name`` for a boolean worker parameter."""
    parser.add_argument(
        f"--{name}", action=argparse.BooleanOptionalAction, default=default, help=help
    )


def base_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every walkthrough takes on the command line.

    Each one adds its own on top; the names match the worker's parameters
    (``--tp-size`` is ``tp_size``), so :func:`cli_main` can pass them through.
    """
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default=None, help="folder for the ledger files, one per rank (rank{r}.jsonl)"
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="gloo",
        help="gloo on CPU (default) or nccl with one GPU per rank",
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
    p.add_argument(
        "--tp-size",
        type=int,
        default=2,
        help="ranks per tensor-parallel group; one that divides --nproc_per_node keeps each "
        "group on one node (rank 0 warns when a group spans nodes)",
    )
    p.add_argument("--num-samples", type=int, default=64, help="dataset length")
    p.add_argument("--batch-size", type=int, default=4, help="samples per batch per DP replica")
    p.add_argument("--epochs", type=int, default=2, help="passes over the data")
    p.add_argument("--seed", type=int, default=1337, help="shuffle seed (same on every rank)")
    return p


_LAUNCH_ONLY = ("backend", "timeout", "check")


def cli_main(
    run: Callable[..., Ledger], parser: argparse.ArgumentParser, argv: Sequence[str] | None = None
) -> int:
    """Parse options, join torchrun's group, run the worker, report on rank 0.

    Every rank writes its own ledger file (when ``--out`` is given); rank 0 also
    gathers all ledgers and prints the summary, so one look at the log says
    whether the run was sound even when the files are spread over nodes.

    Returns:
        The process exit status: 0, or 1 with ``--check`` and a problem found.
        A rank that raises prints its traceback and exits with status 1 at once.
    """
    args = parser.parse_args(argv)
    try:
        created = ensure_distributed(args.backend, args.timeout)
    except (RuntimeError, ValueError) as exc:
        # Nothing has started yet: a usage message, not a traceback.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        status = _run_and_report(run, args)
    except BaseException:
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
    if args.out is not None:
        print(
            f"Ledger files in {args.out}/ (one per rank); in a notebook: "
            f"Ledger.load({str(args.out)!r})",
            flush=True,
        )
    # One failing process is enough for torchrun to report the job failed.
    return 1 if args.check and merged.check() else 0
