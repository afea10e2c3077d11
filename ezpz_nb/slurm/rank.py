"""The rank side of a Slurm job: ``python -m ezpz_nb.slurm.rank JOB_DIR`` under torchrun.

Each rank runs the notebook's function with ``ez.launch``'s own rank-side code under
torchrun (:func:`ezpz_nb.launcher.torchrun.run_in_place`: join the group, run, gather)
and tells its story in files of the shared job folder, which the notebook reads
(:mod:`ezpz_nb.slurm.job`):

=======================  ================================================================
``ranks/rank-R.json``    node, host, pid and local rank, written as the rank starts
``out/rank-R.log``       the rank's stdout and stderr, line by line as printed
``ledger/rank-R.jsonl``  every ``StepRecord`` the rank recorded, as it is taken (the
                         ledger file format; an end line once the function returned)
``stacks/rank-R.txt``    every thread's stack, dumped by faulthandler if the function
                         outlives the job's ``timeout`` (a hang report needs no signal
                         from a notebook that may not reach the node)
``replies/rank-R.pkl``   the launcher's reply: ``Ok(value)``, ``Error`` (the folded
                         traceback's frames) or ``Unpicklable``; written last, atomically
=======================  ================================================================
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import socket
import sys
from pathlib import Path
from typing import IO, Any

from ezpz_nb import events
from ezpz_nb.launcher import torchrun
from ezpz_nb.launcher.failures import encode
from ezpz_nb.launcher.wire import Ok, Unpicklable, dumps, loads_job
from ezpz_nb.ledger import codec
from ezpz_nb.ledger.records import StepRecord

__all__ = ["RUN_MARKER", "main"]

#: The function whose frame marks the rank's main thread in a stack dump.
RUN_MARKER = "_run_job"


def _redirect_output(path: Path) -> None:
    """Send this process's stdout and stderr (and its children's) to ``path``, line by line."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


class _LedgerFile:
    """The rank's ledger file, fed by ``ez.publish``: what ``record(...)`` publishes lands here."""

    def __init__(self, path: Path, rank: int) -> None:
        self.rank, self.steps = rank, 0
        self.file: IO[str] = path.open("w", encoding="utf-8")
        self.file.write(codec.encode_header(None, rank=rank, pid=os.getpid()))
        self.file.flush()

    def __call__(self, item: Any) -> None:
        if isinstance(item, StepRecord):
            self.file.write(codec.encode_step(item))
            self.file.flush()  # a rank killed later keeps the steps it took
            self.steps += 1
        elif isinstance(item, events.RelayedWarning):
            print(f"{item.category.__name__}: {item.text}", file=sys.stderr)

    def close(self, finished: bool) -> None:
        if finished:
            self.file.write(codec.encode_end(self.rank, self.steps))
        self.file.close()


def _run_job(job_dir: Path, rank: int, spec: dict[str, Any]) -> Any:
    """Load the job and run it as ``ez.launch`` does under torchrun; the reply to write."""
    try:
        fn, args, kwargs = loads_job((job_dir / "job.pkl").read_bytes())
    except BaseException as exc:  # noqa: BLE001 - report whatever broke, with our frames
        return encode(exc, ours=True)
    try:
        results = torchrun.run_in_place(
            fn, *args, backend=spec["backend"], timeout_s=spec["timeout"] + 60.0, **kwargs
        )
    except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt too
        # This loop's frames and torchrun.py's are the same in every traceback: left
        # out, as ez.launch's rank loop leaves out its own.
        return encode(exc, loop=(__file__, torchrun.__file__))
    return Ok(results[rank])


def _write_reply(path: Path, reply: Any) -> None:
    try:
        data = dumps(reply)
    except Exception as exc:  # noqa: BLE001 - the return value cannot travel
        kind = type(reply[0]) if isinstance(reply, Ok) else type(reply)
        why = f"{type(exc).__name__}: {exc}"
        data = pickle.dumps(Unpicklable(f"return value (a {kind.__qualname__})", why))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # the notebook never reads half a reply


def main(job_dir: str) -> int:
    """Run this rank's share of the job in ``job_dir``; exit status 1 when it failed."""
    job = Path(job_dir)
    rank = int(os.environ["RANK"])
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    _redirect_output(job / "out" / f"rank-{rank}.log")
    spec = json.loads((job / "spec.json").read_text())
    info = {
        "rank": rank,
        "node": node,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
    }
    (job / "ranks" / f"rank-{rank}.json").write_text(json.dumps(info))
    dump = (job / "stacks" / f"rank-{rank}.txt").open("w")
    # faulthandler's own thread writes the stacks even while this one is blocked in gloo.
    faulthandler.dump_traceback_later(spec["timeout"], file=dump)
    ledger = _LedgerFile(job / "ledger" / f"rank-{rank}.jsonl", rank)
    events.connect(ledger)
    reply = _run_job(job, rank, spec)
    faulthandler.cancel_dump_traceback_later()
    events.connect(None)
    ledger.close(finished=isinstance(reply, Ok))
    sys.stdout.flush()
    sys.stderr.flush()
    _write_reply(job / "replies" / f"rank-{rank}.pkl", reply)
    return 0 if isinstance(reply, Ok) else 1


if __name__ == "__main__":
    status = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once, as an ez.launch rank does: the reply is written and the gather done.
    # A polite exit tears gloo down (seconds, measured: the job ended ~5 s after the
    # replies) and can abort in a destructor after all the work (seen under torchrun:
    # "terminate called without an active exception", SIGABRT, after every rank had finished).
    os._exit(status)
