"""``ez.submit``: pack a notebook function, make its job folder and script, hand it to sbatch.

The job folder (on a filesystem every node shares) holds the packed function, what the
ranks read (``spec.json``) and the script (:func:`write_job`); :mod:`.rank` documents
what the ranks write there, and the :class:`~ezpz_nb.slurm.job.SlurmJob` it returns reads it.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from ezpz_nb.launcher.startup import check_args, pack_job
from ezpz_nb.slurm.commands import Slurm, find_conf
from ezpz_nb.slurm.job import SlurmJob
from ezpz_nb.slurm.local import free_port
from ezpz_nb.slurm.script import JobSpec, check_time, render

__all__ = ["submit", "write_job"]

#: The job folder's subfolders, one per kind of file a rank writes (see :mod:`.rank`).
SUBFOLDERS = ("out", "ranks", "replies", "stacks", "ledger")


def _job_root(root: str | Path | None, conf: str | None) -> Path:
    if root is not None:
        return Path(root)
    if (
        conf is not None
        and Path(conf).name == "slurm.conf"
        and (Path(conf).parent / "jobs").is_dir()
    ):
        return Path(conf).parent / "jobs"  # the local cluster's: removed with it
    return Path.home() / "ezpz-nb-jobs"


def submit(
    fn: Callable[..., Any],
    *args: Any,
    nodes: int = 2,
    ranks_per_node: int = 1,
    partition: str | None = None,
    time: str = "00:10:00",
    slurm_args: Sequence[str] = (),
    setup: Sequence[str] = (),
    timeout: float = 120.0,
    backend: str = "gloo",
    job_root: str | Path | None = None,
    python: str | None = None,
    echo: TextIO | None = None,
    **kwargs: Any,
) -> SlurmJob:
    """Send ``fn(*args, **kwargs)`` to Slurm; it runs on every rank, as under ``ez.launch``.

    ``nodes`` x ``ranks_per_node`` ranks start under ``srun`` + ``torchrun`` (c10d
    rendezvous on the first node); each runs ``ez.launch``'s rank-side code. The
    script is saved in the job folder (``job.script``) and printed.

    Args:
        fn: The function (a notebook cell's function travels by value).
        nodes, ranks_per_node: The layout: ``nodes * ranks_per_node`` ranks.
        partition: Slurm partition (None: the cluster's default).
        time: Slurm's time limit (``HH:MM:SS``).
        slurm_args: More ``#SBATCH`` options (``"--account=abc"``, ``"--gpus-per-node=4"``).
        setup: Shell lines before srun (``module load ...``, ``source .../activate``).
        timeout: Seconds the ranks may run before it is a hang (``HangError``).
        backend: ``gloo`` or ``nccl``.
        job_root: Where job folders go; on a cluster, a filesystem every node shares.
        python: The interpreter on the nodes (default: this one).
        echo: Where to show output (default: stdout, the cell).

    Returns:
        The :class:`SlurmJob`; ``.result()`` waits for it.

    Raises:
        SlurmError: No Slurm here, or Slurm refused the job (its words quoted).
        LaunchTypeError: ``fn`` or an argument cannot be sent (nothing was submitted).
    """
    check_args(nodes * ranks_per_node, timeout, None, None, backend, ranks_here=False)
    check_time(time)
    job = pack_job(fn, args, kwargs)  # unpicklable input fails before anything is submitted
    conf = find_conf()
    slurm = Slurm(conf)
    folder = _job_root(job_root, conf) / f"{_stamp()}-{uuid.uuid4().hex[:6]}"
    spec = JobSpec(
        job_dir=str(folder),
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        python=python or sys.executable,
        port=free_port(),
        time=time,
        partition=partition,
        slurm_args=tuple(slurm_args),
        backend=backend,
        timeout=float(timeout),
        setup=tuple(setup),
    )
    script = write_job(spec, job)
    handle = SlurmJob(slurm, spec, slurm.sbatch(str(script)), echo=echo)
    handle._say(f"[slurm] submitted job {handle.job_id}: {handle.script}")
    return handle


def write_job(spec: JobSpec, packed: bytes) -> Path:
    """Make ``spec``'s job folder: the packed job, what the ranks read, the script; its path.

    Args:
        spec: The job; its ``job_dir`` is made if missing.
        packed: The function and its arguments, as ``pack_job`` made them.
    """
    folder = Path(spec.job_dir)
    for sub in SUBFOLDERS:
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "job.pkl").write_bytes(packed)
    (folder / "spec.json").write_text(
        json.dumps({"timeout": spec.timeout, "backend": spec.backend})
    )
    script = folder / "job.sbatch"
    script.write_text(render(spec))
    return script


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
