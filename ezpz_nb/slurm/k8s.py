"""The same job on Kubernetes, on paper: a Kubeflow ``PyTorchJob`` made from the same :class:`JobSpec`.

What differs from Slurm, and why the manifest looks as it does:

* No scheduler-made allocation: the Kubeflow training operator makes one pod per
  node (a ``Master`` and ``nodes - 1`` ``Worker`` replicas) and sets ``MASTER_ADDR``,
  ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` (of the pod) and ``PET_NNODES`` /
  ``PET_NPROC_PER_NODE``, which torchrun reads: the same ``torchrun`` line, the
  rendezvous on the master pod's service name instead of the first node's address.
* No shared filesystem by default: the job folder (the packed function, the replies,
  each rank's ledger) is a volume every pod mounts (a ``ReadWriteMany`` claim), or the
  ledger goes to object storage and the notebook reads it from there.
* The image replaces the site's modules and venvs: the notebook's packages, baked in.
"""

from __future__ import annotations

import json
from typing import Any

from ezpz_nb.slurm.script import JobSpec

__all__ = ["manifest", "to_yaml"]


def _replica(spec: JobSpec, image: str, claim: str, count: int) -> dict[str, Any]:
    command = [
        "python", "-m", "torch.distributed.run",
        f"--nnodes={spec.nodes}", f"--nproc-per-node={spec.ranks_per_node}",
        "--max-restarts=0", "-m", "ezpz_nb.slurm.rank", spec.job_dir,
    ]  # fmt: skip
    return {
        "replicas": count,
        "restartPolicy": "Never",
        "template": {
            "spec": {
                "containers": [
                    {
                        # The operator looks for the container named "pytorch".
                        "name": "pytorch",
                        "image": image,
                        "command": command,
                        "volumeMounts": [{"name": "jobs", "mountPath": spec.job_dir}],
                    }
                ],
                "volumes": [{"name": "jobs", "persistentVolumeClaim": {"claimName": claim}}],
            }
        },
    }


def manifest(spec: JobSpec, *, image: str, claim: str = "ezpz-nb-jobs") -> dict[str, Any]:
    """A ``kubeflow.org/v1`` ``PyTorchJob`` running ``spec``'s ranks.

    Args:
        spec: The job, as ``ez.submit`` made it (its ``job_dir`` becomes the mount path).
        image: A container image with the notebook's packages (torch, ezpz_nb).
        claim: A ``ReadWriteMany`` PersistentVolumeClaim holding the job folders.
    """
    replicas = {"Master": _replica(spec, image, claim, 1)}
    if spec.nodes > 1:
        replicas["Worker"] = _replica(spec, image, claim, spec.nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": spec.job_name},
        "spec": {
            # torchrun's per-node process count: the operator passes it as PET_NPROC_PER_NODE.
            "nprocPerNode": str(spec.ranks_per_node),
            "runPolicy": {"cleanPodPolicy": "All", "activeDeadlineSeconds": _seconds(spec.time)},
            "pytorchReplicaSpecs": replicas,
        },
    }


def _seconds(time: str) -> int:
    """Slurm's ``D-HH:MM:SS`` (or shorter) time limit in seconds."""
    days, _, clock = time.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        parts += [0] * (3 - len(parts))
    elif len(parts) < 3:  # minutes[:seconds]
        parts = [0, *parts, *([0] * (2 - len(parts)))]
    h, m, s = parts
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s


def to_yaml(doc: dict[str, Any]) -> str:
    """The manifest as YAML (PyYAML when installed; else JSON, which is YAML too)."""
    try:
        import yaml
    except ModuleNotFoundError:
        return json.dumps(doc, indent=2) + "\n"
    return str(yaml.safe_dump(doc, sort_keys=False))
