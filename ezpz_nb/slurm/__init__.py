"""Notebook functions on a Slurm cluster: ``ez.submit``, and a local cluster to try it on.

* :func:`submit` (``ez.submit``) sends a function to Slurm under ``srun`` + ``torchrun``
  and returns a :class:`SlurmJob`: output streamed into the cell, ``.result()``,
  ``.ledger()``, ``.cancel()``; failures as ``ez.launch`` tells them.
* :class:`LocalSlurm` (``ezpz-nb slurm up|down|status|env``) starts a two-node
  cluster on this machine from Debian's packages.
* :mod:`.k8s` renders the same job for Kubernetes.

Modules: ``script`` (the job spec and its sbatch script), ``submission`` (``submit``:
the job folder, then sbatch), ``rank`` (the rank side), ``commands`` (Slurm's commands),
``outcome`` (what a job folder says), ``job`` (the handle), ``local`` (the local cluster)
and ``pids`` (its processes), ``k8s``, ``errors``.

The names load their module on first use: each rank runs ``python -m
ezpz_nb.slurm.rank``, which imports this package first and needs none of the
notebook side.
"""

from __future__ import annotations

from ezpz_nb._lazy import lazy

_WHERE = {
    "JobSpec": "ezpz_nb.slurm.script",
    "LocalSlurm": "ezpz_nb.slurm.local",
    "SlurmError": "ezpz_nb.slurm.errors",
    "SlurmInterrupted": "ezpz_nb.slurm.errors",
    "SlurmJob": "ezpz_nb.slurm.job",
    "SlurmJobError": "ezpz_nb.slurm.errors",
    "render": "ezpz_nb.slurm.script",
    "submit": "ezpz_nb.slurm.submission",
}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy(__name__, _WHERE)
