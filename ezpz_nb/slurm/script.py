"""A job as data (:class:`JobSpec`) and the sbatch script it becomes (:func:`render`).

The script is the whole job: a learner can read it line by line, or submit it by hand
(``sbatch job.sbatch``) and get the same ranks, outputs and ledger as ``ez.submit``.
Kubernetes takes the same spec (:mod:`ezpz_nb.slurm.k8s`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["JobSpec", "render", "check_time"]

_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


def check_time(time: str) -> str:
    """``time`` if Slurm reads it as a limit (``MM``, ``HH:MM:SS``, ``D-HH:MM``...)."""
    if not isinstance(time, str):
        raise ValueError(
            f"time={time!r} is not a Slurm time limit: pass it as a string, 'HH:MM:SS' "
            "(e.g. time='00:10:00' for ten minutes) or 'D-HH:MM:SS'"
        )
    if not _TIME.match(time):
        raise ValueError(
            f"time={time!r} is not a Slurm time limit: write it as 'HH:MM:SS' (e.g. '00:10:00') "
            "or 'D-HH:MM:SS'"
        )
    return time


@dataclass(frozen=True)
class JobSpec:
    """Everything a job needs, decided in the notebook before anything is submitted.

    Attributes:
        job_dir: The job's folder, on a filesystem every node shares: the packed
            function, the script, each rank's output, reply and ledger.
        nodes: Nodes (one torchrun agent each).
        ranks_per_node: Ranks per node (``torchrun --nproc-per-node``).
        python: The interpreter on the nodes (the notebook's by default: the same venv).
        port: The c10d rendezvous port on the first node.
        time: Slurm's time limit.
        partition: Slurm partition, or None for the cluster's default.
        slurm_args: More ``#SBATCH`` options, e.g. ``("--account=abc", "--gpus-per-node=4")``.
        backend: ``gloo`` or ``nccl``.
        timeout: Seconds the function may take once every rank started, before it is a hang.
        setup: Shell lines run before ``srun`` (``module load ...``, ``source venv/bin/activate``).
        job_name: Slurm's job name.
    """

    job_dir: str
    nodes: int = 2
    ranks_per_node: int = 1
    python: str = "python3"
    port: int = 29500
    time: str = "00:10:00"
    partition: str | None = None
    slurm_args: Sequence[str] = field(default_factory=tuple)
    backend: str = "gloo"
    timeout: float = 120.0
    setup: Sequence[str] = field(default_factory=tuple)
    job_name: str = "ezpz-nb"

    @property
    def world_size(self) -> int:
        """Ranks in all: ``nodes * ranks_per_node``."""
        return self.nodes * self.ranks_per_node


def render(spec: JobSpec) -> str:
    """The sbatch script for ``spec``: every line commented with why it is there."""
    q = shlex.quote
    job = spec.job_dir
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={spec.job_name}",
        f"#SBATCH --nodes={spec.nodes}",
        "# One task per node: torchrun, which starts that node's ranks.",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={spec.time}",
        f"#SBATCH --output={job}/slurm-%j.out",
        f"#SBATCH --chdir={job}",
        "# A node failure ends the job (NODE_FAIL) instead of queueing it again: a second",
        "# attempt would write over the first one's files while the notebook reads them.",
        "#SBATCH --no-requeue",
    ]
    if spec.partition:
        head.append(f"#SBATCH --partition={spec.partition}")
    head += [f"#SBATCH {a}" for a in spec.slurm_args]
    body = [
        "",
        "set -euo pipefail",
        *spec.setup,
        "# The first node of the allocation hosts torchrun's c10d rendezvous. Its address",
        "# comes from Slurm (NodeAddr): a node's name need not resolve on every site.",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'addr=$(scontrol show node "$head" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        "",
        "# srun starts one torchrun per node; torchrun starts the ranks and sets RANK,",
        "# WORLD_SIZE, MASTER_ADDR, which the rank side reads (ez.launch's own code path).",
        "# --kill-on-bad-exit: one node failing ends the others, no rank waits forever.",
        "# --log-dir: torchrun's per-rank logs go to the job folder; without it each node",
        "# leaves a torchelastic_* folder in its /tmp.",
        "srun --kill-on-bad-exit=1 \\",
        f"  {q(spec.python)} -m torch.distributed.run \\",
        f"    --nnodes={spec.nodes} --nproc-per-node={spec.ranks_per_node} \\",
        f'    --rdzv-backend=c10d --rdzv-endpoint="$addr:{spec.port}" --rdzv-id="$SLURM_JOB_ID" \\',
        "    --max-restarts=0 \\",
        f"    --log-dir={q(job + '/torchrun')} \\",
        f"    -m ezpz_nb.slurm.rank {q(job)}",
        "",
    ]
    return "\n".join(head + body)
