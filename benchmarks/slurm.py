"""A function on Slurm, three ways: ez.submit, a bare sbatch of its script, submitit alone.

One table, medians of ROUNDS: seconds from submit to the first line a rank printed, and
from submit to every rank's ledger in the notebook, for

* ``ez.submit``: the handle's own wait (scontrol polls, output streamed, replies read);
* a bare ``sbatch`` of the script ``ez.submit`` wrote (a fresh folder, same job), timed by
  watching its folder: what the handle adds on top of Slurm and torchrun;
* submitit alone (``AutoExecutor``, 2 nodes x 2 tasks, ``TorchDistributedEnvironment``):
  one task per rank, no torchrun; the same function, its ledgers returned as results.

All on the two-node cluster this script starts (``LocalSlurm``), or the one ``ezpz-nb slurm
up`` started. The workload is notebook 03's DP x TP epoch on 4 ranks. submitit is
installed with ``pip install 'ezpz_nb[slurm]'``; without it its row says so.

    python benchmarks/slurm.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ezpz_nb.examples import tp_broadcast
from ezpz_nb.ledger import Ledger
from ezpz_nb.slurm import LocalSlurm, SlurmJob, submit
from ezpz_nb.slurm.local import free_port, missing_tools
from ezpz_nb.slurm.outcome import read_replies, sample_hash
from ezpz_nb.slurm.submission import write_job

#: Seconds one measurement may take before it reads "hung".
LIMIT_S = 180.0


def one_epoch():
    """Notebook 03's DP x TP epoch (the walkthrough's); prints one line, returns the ledger."""
    import torch.distributed as dist

    ledger = tp_broadcast.run(num_samples=16, batch_size=2, epochs=1)
    print(f"rank {dist.get_rank()}: {len(ledger)} steps", flush=True)
    return ledger


def _wait(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {LIMIT_S:g} s")
        time.sleep(0.05)


def _printed(folder: Path, pattern: str) -> bool:
    """A rank's own line (not a launcher's log) is in one of the files."""
    for f in folder.glob(pattern):
        try:
            if " steps" in f.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def with_submit(root: Path) -> tuple[tuple[float, float, str], SlurmJob]:
    t0 = time.monotonic()
    job = submit(one_epoch, nodes=2, ranks_per_node=2, job_root=root, echo=io.StringIO())
    ledger = job.ledger()
    whole = time.monotonic() - t0
    first = job.first_output - t0 if job.first_output is not None else float("nan")
    return (first, whole, sample_hash(ledger)), job


def with_sbatch(root: Path, done: SlurmJob, env: dict[str, str]) -> tuple[float, float, str]:
    """The script ez.submit wrote for ``done``, in a fresh folder, submitted by hand."""
    folder = root / f"by-hand-{time.monotonic_ns()}"
    spec = dataclasses.replace(done.spec, job_dir=str(folder), port=free_port())
    script = write_job(spec, (done.dir / "job.pkl").read_bytes())
    t0 = time.monotonic()
    subprocess.run(["sbatch", "--parsable", str(script)], env=env, check=True, capture_output=True)
    _wait(lambda: _printed(folder / "out", "rank-*.log"), "first output")
    first = time.monotonic() - t0
    _wait(lambda: len(read_replies(folder)) == 4, "every reply")
    ledger = Ledger.load(folder / "ledger")
    return first, time.monotonic() - t0, sample_hash(ledger)


def submitit_epoch():
    """The same epoch under submitit: one task per rank, torch's env set from Slurm's."""
    import submitit
    import torch.distributed as dist

    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # the local nodes' names resolve nowhere
    dist.init_process_group("gloo")
    try:
        return one_epoch()
    finally:
        dist.destroy_process_group()


def with_submitit(root: Path) -> tuple[float, float, str]:
    import submitit

    folder = root / f"submitit-{time.monotonic_ns()}"
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(nodes=2, tasks_per_node=2, timeout_min=5)
    t0 = time.monotonic()
    job = executor.submit(submitit_epoch)
    _wait(lambda: folder.exists() and _printed(folder, "*_log.out"), "first output")
    first = time.monotonic() - t0
    ledger = Ledger.from_results(job.results())
    return first, time.monotonic() - t0, sample_hash(ledger)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    why = missing_tools()
    found = LocalSlurm.from_pointer()
    if found is None and why:
        print(f"no Slurm cluster to measure: {why}")
        return 0
    local = found or LocalSlurm.start()
    # submitit and sbatch read SLURM_CONF from this process's environment.
    os.environ["SLURM_CONF"] = str(local.conf)
    env = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory(prefix="ezpz-nb-bench-slurm-") as tmp:
            root = Path(tmp)
            rows: dict[str, list[tuple[float, float, str]]] = {
                "ez.submit": [], "bare sbatch of its script": [], "submitit alone": []
            }  # fmt: skip
            try:
                import submitit  # noqa: F401

                has_submitit = True
            except ModuleNotFoundError:
                has_submitit = False
            for _ in range(args.rounds):
                measured, job = with_submit(root)
                rows["ez.submit"].append(measured)
                rows["bare sbatch of its script"].append(with_sbatch(root, job, env))
                if has_submitit:
                    rows["submitit alone"].append(with_submitit(root))
            _print(rows, args.rounds, has_submitit)
    finally:
        if found is None:
            local.stop()
    return 0


def _print(
    rows: dict[str, list[tuple[float, float, str]]], rounds: int, has_submitit: bool
) -> None:
    print(f"2 nodes x 2 ranks, notebook 03's DP x TP epoch; median of {rounds} (seconds)\n")
    print(f"| {'how':<28} | submit -> first output | submit -> ledger | sample-id hash   |")
    print(f"|{'-' * 30}|{'-' * 24}|{'-' * 18}|{'-' * 18}|")
    for name, got in rows.items():
        if not got:
            why = "not installed: pip install 'ezpz_nb[slurm]'" if not has_submitit else "-"
            print(f"| {name:<28} | {why} |")
            continue
        first = statistics.median(g[0] for g in got)
        whole = statistics.median(g[1] for g in got)
        hashes = {g[2] for g in got}
        print(f"| {name:<28} | {first:>22.2f} | {whole:>16.2f} | {'/'.join(hashes):>16} |")


if __name__ == "__main__":
    sys.exit(main())
