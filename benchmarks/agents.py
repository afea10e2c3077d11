"""Wall time of notebook 14's torchrun jobs on this machine, one row per job, in one run.

Each job is what the notebook runs, from the notebook's own worker file (read from the
stored notebook): the checker's run (with its restart), two simulated nodes with logs, the elastic
restart, and a node that never arrives. The notebook states its budget from these.

    .venv/bin/python benchmarks/agents.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from ezpz_nb.agents.agents import AgentError, AgentRun, torchrun
from ezpz_nb.agents.by_hand import WORKER_NAME, check_worker, worker_from_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "14_torchrun_by_hand.ipynb"


def _jobs(worker: Path, tmp: Path) -> dict[str, Callable[[], AgentRun]]:
    def alone() -> AgentRun:
        try:
            return torchrun(worker, nnodes=2, start_nodes=[0], join_timeout_s=4, echo=False)
        except AgentError as exc:  # the deadline: report it as a row, not a crash
            assert exc.run is not None
            return exc.run

    return {
        "checker: 2 nodes x 3 ranks, tp 2, a rank killed, one restart": lambda: check_worker(
            worker, seed=0
        )[0],
        "1 node x 2 ranks, tp 2 (checker run 1 under nccl, < 6 GPUs)": lambda: torchrun(
            worker, "--tp-size", "2", "--out", str(tmp / "a"), "--epochs", "1",
            nproc_per_node=2, echo=False,
        ),
        "2 nodes x 1 rank, tp 2 (checker run 2 under nccl, < 6 GPUs)": lambda: torchrun(
            worker, "--tp-size", "2", "--out", str(tmp / "b"), "--epochs", "1",
            nnodes=2, nproc_per_node=1, echo=False,
        ),
        "2 nodes x 2 ranks, logs, tee, filter (section 5)": lambda: torchrun(
            worker, "--tp-size", "2", "--out", str(tmp / "c"), "--epochs", "1",
            nnodes=2, nproc_per_node=2, log_dirs=[tmp / "l0", tmp / "l1"], tee="3",
            local_ranks_filter="0", echo=False,
        ),
        "elastic restart, 2 ranks, max-restarts 1": lambda: torchrun(
            worker, "--out", str(tmp / "d"), "--checkpoint-every", "2", "--kill", "1:1:3",
            nproc_per_node=2, max_restarts=1, echo=False,
        ),
        "node never arrives, join_timeout 4 s": alone,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each job")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ezpz-bench-agents-") as tmp_name:
        tmp = Path(tmp_name)
        worker = tmp / WORKER_NAME
        worker.write_text(worker_from_notebook(NOTEBOOK))
        times: dict[str, list[float]] = {}
        status: dict[str, str] = {}
        for r in range(args.rounds):
            for name, job in _jobs(worker, tmp / f"round{r}").items():
                run = job()
                times.setdefault(name, []).append(run.elapsed_s)
                status[name] = (
                    "ok" if run.ok else "failed as meant" if "never" in name else "FAILED"
                )
    print(f"| job | median s (of {args.rounds}) | min s | max s | outcome |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        print(
            f"| {name} | {statistics.median(ts):.1f} | {min(ts):.1f} | {max(ts):.1f} "
            f"| {status[name]} |"
        )
    print(f"| **sum of medians** | {sum(statistics.median(t) for t in times.values()):.1f} | | | |")


if __name__ == "__main__":
    main()
