"""Slurm's own commands, called for the notebook: which cluster, sbatch, scontrol, scancel.

Every call names its cluster through ``SLURM_CONF`` in the child's environment only,
so the notebook's own environment is never changed. Which cluster (:func:`find_conf`):
``SLURM_CONF`` if the notebook has it, else the cluster ``ezpz-nb slurm up`` started,
else the site's own (Slurm's default config).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ezpz_nb.slurm.errors import SlurmError
from ezpz_nb.slurm.local import PACKAGES, LocalSlurm

__all__ = ["JobInfo", "Slurm", "find_conf"]

#: States after which a job runs no more.
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
_FIELD = re.compile(r"(\w+)=(\S*)")
#: What sbatch says when no controller answers or no configuration names one.
_NO_CLUSTER = re.compile(
    r"configuration source|configuration file|Unable to contact slurm controller", re.I
)


def find_conf() -> str | None:
    """The ``slurm.conf`` to use: ``$SLURM_CONF``, the local cluster's, or None (the site's)."""
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    local = LocalSlurm.from_pointer()
    return str(local.conf) if local is not None else None


@dataclass(frozen=True)
class JobInfo:
    """One look at a job through ``scontrol show job``.

    Attributes:
        state: ``PENDING``, ``RUNNING``, ``COMPLETING``, ``COMPLETED``, ``TIMEOUT``... or
            ``GONE`` once Slurm forgot the job.
        reason: Slurm's reason (``Resources``, ``TimeLimit``, ``None``...), as squeue shows it.
        nodes: The node list (``n[1-2]``), or "" while pending.
        fields: Every ``key=value`` scontrol gave.
    """

    state: str
    reason: str = ""
    nodes: str = ""
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def ended(self) -> bool:
        """True once no process of the job runs (COMPLETING is not ended yet)."""
        return self.state in ENDED or self.state == "GONE"


class Slurm:
    """Slurm's commands for one cluster (``conf``: its slurm.conf, or None for the site's)."""

    def __init__(self, conf: str | None = None) -> None:
        self.conf = conf
        missing = [c for c in ("sbatch", "scontrol", "scancel", "squeue") if not shutil.which(c)]
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not found: no Slurm client here. On a cluster, run the "
                "notebook on a login node; on Debian or Ubuntu, `sudo apt-get install -y "
                f"--no-install-recommends {PACKAGES}` then `ezpz-nb slurm up` starts a local one."
            )

    def env(self) -> dict[str, str]:
        """The environment Slurm's commands (and so the job) get."""
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def _run(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, check=False, timeout=timeout
        )

    def sbatch(self, script: str) -> str:
        """Submit ``script`` (a path); the job id, or a SlurmError quoting sbatch."""
        out = self._run("sbatch", "--parsable", script)
        if out.returncode != 0:
            said = " / ".join(line.strip() for line in (out.stderr or out.stdout).splitlines())
            if _NO_CLUSTER.search(said):
                raise SlurmError(
                    f"no Slurm cluster answers here: {said!r}. Start the local one with "
                    "`ezpz-nb slurm up` (Linux, as root; notebook 18's first cell does it), "
                    "or run the notebook on a cluster's login node."
                )
            raise SlurmError(
                f"Slurm refused the job: {said!r}. Check the partition (`sinfo` lists them), "
                "the time limit and the other slurm_args."
            )
        return out.stdout.strip().split(";")[0]

    def show(self, job_id: str) -> JobInfo:
        """What Slurm says of ``job_id`` now."""
        out = self._run("scontrol", "show", "job", "-o", job_id)
        if out.returncode != 0 or "JobState=" not in out.stdout:
            return JobInfo("GONE")
        fields = dict(_FIELD.findall(out.stdout))
        return JobInfo(
            fields.get("JobState", "UNKNOWN"),
            fields.get("Reason", ""),
            fields.get("NodeList", "") if fields.get("NodeList") != "(null)" else "",
            tuple(fields.items()),
        )

    def in_queue(self, job_id: str) -> bool:
        """True while ``squeue`` still lists the job (pending, running or completing)."""
        out = self._run("squeue", "-h", "-j", job_id, "-o", "%i")
        return out.returncode == 0 and job_id in out.stdout.split()

    def scancel(self, job_id: str) -> None:
        """Cancel the job (every step, every process)."""
        self._run("scancel", job_id)
