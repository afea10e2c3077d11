"""What every walkthrough needs besides the idea it teaches.

* :func:`ensure_distributed`: join the process group torchrun describes in the
  environment, or do nothing inside an ``ez.launch`` rank (already joined).
* :func:`destroy_distributed`: tear that group down so that none of its
  threads outlives it (a gloo thread alive at interpreter exit can abort the
  process after all the work was done).
* :func:`run_in_place`: ``ez.launch``'s result list for a process that
  torchrun started (the launcher can use it instead of starting ranks).
* :func:`check_backend` / :func:`device`: gloo on CPU by default, nccl with one
  GPU per rank when asked; asking for nccl without a GPU fails *before* any
  process group exists, with what to do instead.
* :func:`prepare_out` / :func:`ledger_file`: one ledger file per rank
  (``DIR/rank{r}.jsonl``), written step by step, merged later with
  ``Ledger.load(DIR)``.
* :func:`base_parser` / :func:`cli_main`: the command line shared by
  ``python -m torch.distributed.run ... -m ezpz_nb.examples.<name>``.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ezpz_nb.broadcast import flatten_batch, unflatten_batch
from ezpz_nb.groups import release_groups
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

#: Backends the examples accept.
BACKENDS = ("gloo", "nccl")
#: Variables torchrun (and srun/mpiexec wrappers around it) set for each process.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
#: Size of the random-token samples: small, because the walkthroughs are about
#: which sample goes where, not about the tokens.
VOCAB_SIZE = 1024
SEQ_LENGTH = 16


def check_backend(backend: str, local_rank: int | None = None) -> None:
    """Reject a backend this process cannot use, before any process group exists.

    Args:
        backend: ``"gloo"`` or ``"nccl"``.
        local_rank: This process's index on its node (``LOCAL_RANK``); with nccl it
            must name a visible GPU.

    Raises:
        ValueError: Unknown backend, or nccl without a (free) GPU; the message
            says what to run instead.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "nccl":
        return
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        raise ValueError(
            "backend 'nccl' needs one CUDA GPU per rank, but torch sees no GPU here"
            f"{hint}. Use --backend gloo (the default, CPU) on this machine, or run on "
            "a node with GPUs and a CUDA build of torch."
        )
    count = torch.cuda.device_count()
    if local_rank is not None and not 0 <= local_rank < count:
        raise ValueError(
            f"backend 'nccl' gives each rank its own GPU, but this is local rank {local_rank} "
            f"and the node has {count} visible GPU(s). Start at most {count} processes per "
            f"node (torchrun --nproc_per_node={count}), or use --backend gloo."
        )


def ensure_distributed(backend: str = "gloo", timeout_s: float | None = None) -> bool:
    """Join torch.distributed from torchrun's environment, unless already joined.

    Inside an ``ez.launch`` rank (or any initialised process) this does nothing,
    so a walkthrough's worker runs unchanged in a notebook and under torchrun.

    Args:
        backend: Backend to initialise with when this call does initialise.
        timeout_s: Collective timeout in seconds; torch's default is 30 minutes,
            far too long to wait for a teaching example that hangs.

    Returns:
        True if this call created the process group (the caller may destroy
        it), False if one already existed.

    Raises:
        RuntimeError: Not initialised and no torchrun environment to join.
        ValueError: See :func:`check_backend`.
    """
    if dist.is_available() and dist.is_initialized():
        return False
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"torch.distributed is not initialised and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set. Start this under torchrun "
            "(python -m torch.distributed.run --standalone --nproc_per_node=4 -m "
            "ezpz_nb.examples.<name>) or from a notebook with ez.launch(run, world_size=4)."
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    check_backend(backend, local_rank)
    if backend == "nccl":
        # Before init: NCCL binds each rank's communicator to the current device.
        torch.cuda.set_device(local_rank)
    kwargs: dict[str, Any] = {}
    if timeout_s is not None:
        kwargs["timeout"] = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method="env://", **kwargs)
    # Whoever makes the group tears it down (see destroy_distributed): also when
    # the caller (run_in_place under torchrun) never does.
    atexit.register(_destroy_at_exit)
    return True


#: Name of gloo's collective worker threads (two per process group), as Linux shows it.
_GLOO_WORKER_THREAD = "pt_gloo_runloop"


def _gloo_worker_threads() -> int:
    """How many gloo collective worker threads this process has (0 where unknown)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # not Linux: nothing to count
        return 0
    count = 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == _GLOO_WORKER_THREAD
        except OSError:  # the thread ended meanwhile
            pass
    return count


def destroy_distributed() -> int:
    """Destroy the process group and free every group object, joining their threads.

    ``dist.destroy_process_group()`` alone is not enough. It unregisters the
    groups, but a gloo group's C++ object, and its two worker threads, live as
    long as a Python object refers to it (a Layout, a loader, our group
    cache). A worker thread drops its reference to a finished collective
    *after* the caller's ``wait()`` returned; the collective holds tensors
    whose Python objects can only be freed with the GIL. If that thread asks
    for the GIL once the interpreter is finalizing, CPython ends it with
    ``pthread_exit``, whose unwinding through torch's ``noexcept`` destructor
    calls ``std::terminate``: "terminate called without an active exception",
    SIGABRT, exit -6 after all the work was done, and torchrun reports the job
    FAILED. Freeing the group objects instead runs their destructors here,
    which release the GIL and join the threads: teardown is over when this
    returns.

    Returns:
        The number of gloo worker threads still alive afterwards: 0 unless
        something outside ezpz_nb still holds a group object (then a warning
        on stderr says so).
    """
    release_groups()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    # Groups held only by reference cycles (an exception's frames) are freed now,
    # not at some later collection that might come during interpreter exit.
    gc.collect()
    left = _gloo_worker_threads()
    if left:
        print(f"ezpz_nb: {left} gloo worker thread(s) outlive destroy_process_group(): "
              "something still refers to a process group (a Layout or a loader kept in "
              "a global?), and such a thread can abort this process as it exits. Drop "
              "those references before the end.", file=sys.stderr, flush=True)
    return left


def _destroy_at_exit() -> None:
    # atexit runs before the interpreter starts finalizing: the threads can still
    # take the GIL here, so joining them is safe.
    destroy_distributed()


def in_torchrun_env() -> bool:
    """True when torchrun (or srun/mpiexec around it) set this process's rank variables."""
    return all(v in os.environ for v in TORCHRUN_VARS)


def run_in_place(fn: Callable[..., Any], *args: Any, backend: str = "gloo",
                 timeout_s: float | None = None, **kwargs: Any) -> list[Any]:
    """``ez.launch``'s contract for a process torchrun already started.

    Joins the group (:func:`ensure_distributed`), runs ``fn`` in this process
    and gathers every rank's result, so code written for ``ez.launch`` gets the
    same answer, a list in rank order, on every rank. The launcher can call this
    instead of starting ranks when :func:`in_torchrun_env` is true.

    Returns:
        ``[result of rank 0, result of rank 1, ...]`` on every rank.
    """
    ensure_distributed(backend, timeout_s)
    value = fn(*args, **kwargs)
    results: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(results, value)
    return results


def device() -> torch.device:
    """The device this rank's batches belong on: its GPU under nccl, else the CPU."""
    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()).lower():
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
    parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=default,
                        help=help)


def base_parser(description: str | None) -> argparse.ArgumentParser:
    """The options every walkthrough takes on the command line.

    Each one adds its own on top; the names match the worker's parameters
    (``--tp-size`` is ``tp_size``), so :func:`cli_main` can pass them through.
    """
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None,
                   help="folder for the ledger files, one per rank (rank{r}.jsonl)")
    p.add_argument("--backend", choices=BACKENDS, default="gloo",
                   help="gloo on CPU (default) or nccl with one GPU per rank")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="collective timeout in seconds (torch's default is 30 min)")
    p.add_argument("--check", action="store_true",
                   help="exit with status 1 if the merged ledger shows a problem")
    p.add_argument("--tp-size", type=int, default=2, help="ranks per tensor-parallel group")
    p.add_argument("--num-samples", type=int, default=64, help="dataset length")
    p.add_argument("--batch-size", type=int, default=4, help="samples per batch per DP replica")
    p.add_argument("--epochs", type=int, default=2, help="passes over the data")
    p.add_argument("--seed", type=int, default=1337, help="shuffle seed (same on every rank)")
    return p


_LAUNCH_ONLY = ("backend", "timeout", "check")


def cli_main(run: Callable[..., Ledger], parser: argparse.ArgumentParser,
             argv: Sequence[str] | None = None) -> int:
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
        print(f"Ledger files in {args.out}/ (one per rank); in a notebook: "
              f"Ledger.load({str(args.out)!r})", flush=True)
    # One failing process is enough for torchrun to report the job failed.
    return 1 if args.check and merged.check() else 0
