"""``ez.submit``: pack a notebook function, make its job folder and script, hand it to sbatch.

The job folder (on a filesystem every node shares) holds the packed function, what the
ranks read (``spec.json``) and the script (:func:`write_job`); :mod:`.rank` documents
what the ranks write there, and the :class:`~ezpz_nb.slurm.job.SlurmJob` it returns reads it.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from ezpz_nb.launcher.errors import LaunchTypeError, LaunchValueError
from ezpz_nb.launcher.startup import check_timeout, pack_job
from ezpz_nb.launcher.torchrun import check_backend
from ezpz_nb.slurm.commands import Slurm, find_conf
from ezpz_nb.slurm.job import SlurmJob
from ezpz_nb.slurm.local import free_port
from ezpz_nb.slurm.script import JobSpec, check_time, render

__all__ = ["check_request", "submit", "write_job"]

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
    check_request(fn, args, kwargs, nodes=nodes, ranks_per_node=ranks_per_node,
                  slurm_args=slurm_args, setup=setup)  # fmt: skip
    # Not ez.launch's check_args: its MAX_WORLD_SIZE caps ranks started on one machine;
    # a job's nodes x ranks_per_node (16 x 8 = 128) is the cluster's to allow.
    check_timeout(timeout)
    check_backend(backend)  # each rank checks its own GPU as it joins
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


def check_request(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    nodes: Any,
    ranks_per_node: Any,
    slurm_args: Any,
    setup: Any,
) -> None:
    """Refuse, in ``ez.submit``'s own words, what would only fail after the job queued.

    A queue round trip costs minutes on a real site: an argument the function cannot
    take (``world_size=``, as ``ez.launch`` spells it) or a string where Slurm wants
    lines must fail here, before anything is submitted. ``nodes`` and ``ranks_per_node``
    must be positive ints, with no upper bound here: what a job may ask for is the
    site's to say (``ez.launch``'s cap is for ranks on one machine).
    """
    for name, value in (("nodes", nodes), ("ranks_per_node", ranks_per_node)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise LaunchTypeError(
                f"{name} must be an int, got {type(value).__name__} {value!r}: "
                "e.g. nodes=2, ranks_per_node=2 runs 4 ranks"
            )
        if value < 1:
            raise LaunchValueError(
                f"{name} must be at least 1, got {value}: ez.submit runs nodes x "
                "ranks_per_node ranks (nodes=2, ranks_per_node=2 runs 4)"
            )
    for name, value in (("slurm_args", slurm_args), ("setup", setup)):
        if isinstance(value, str):
            # A string is a sequence of characters: each would become a line of the script.
            raise LaunchTypeError(
                f"{name} must be a list of lines, got one string: write {name}=[{value!r}]"
            )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the ranks will tell
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", type(fn).__name__)
        hint = (
            " ez.submit has no world_size: it runs nodes x ranks_per_node ranks "
            "(nodes=2, ranks_per_node=2 for 4)."
            if "world_size" in kwargs
            else ""
        )
        raise LaunchTypeError(
            f"{name}{signature} cannot be called with these arguments ({exc}): ez.submit "
            f"passes every argument it does not know to the function.{hint} Nothing was "
            "submitted."
        ) from None


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
