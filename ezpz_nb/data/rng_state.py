"""A process's random number generators, captured and restored for a bit-exact resume.

What a training process draws from, and so what a resume must bring back (each is
captured only when the process has it, so a CPU job saves no CUDA state and a job
without numpy saves no numpy state):

* ``"torch"``: torch's CPU generator. A ``DataLoader`` draws its workers' base seed
  from it at ``iter()``, so restoring it before the loader's iterator is made gives
  the workers their old seeds too.
* ``"python"``: the ``random`` module's generator.
* ``"numpy"``: numpy's legacy global generator (``np.random.seed``/``np.random.rand``),
  when numpy is imported: augmentation code often draws from it.
* ``"cuda"``: the generator of this rank's current CUDA device (dropout, random
  masks on the GPU), when CUDA is initialised. Only that device's: on a GPU cluster
  every rank owns one device, and restoring it onto the current device lets a resume
  run on another device index.
* ``"dtensor"``: the states DTensor's RNG tracker keeps apart from the device's own
  generator (``rng_states``, in torch releases that keep them; torch 2.13's
  ``OffsetBasedRNGTracker`` draws from the device generator, which ``"cuda"`` holds).

Not state, so not here: ``torch.use_deterministic_algorithms(True)`` needs
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment before CUDA starts, and the
NCCL algorithm depends on the topology (docs/checkpoint.md's checklist).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

__all__ = ["capture_rng", "restore_rng"]


def _dtensor_tracker() -> Any:
    """DTensor's RNG tracker if DTensor made one in this process, else None."""
    module = sys.modules.get("torch.distributed.tensor._random")
    return getattr(module, "_rng_tracker", None)


def capture_rng() -> dict[str, Any]:
    """Every generator this process has, by name (see the module docstring).

    Never initialises CUDA or imports numpy to read them: a generator the process has
    not started has nothing to restore.
    """
    states: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        states["numpy"] = np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        states["cuda"] = torch.cuda.get_rng_state(device)
    kept = getattr(_dtensor_tracker(), "rng_states", None)
    if kept:
        states["dtensor"] = {name: s.clone() for name, s in kept.items()}
    return states


def restore_rng(states: dict[str, Any]) -> list[str]:
    """Put back what :func:`capture_rng` saved; returns the names restored, in order.

    A state this process cannot take (CUDA saved, none here; a DTensor state with no
    tracker yet) is left out of the list: the caller sees what a resume misses.
    """
    done = []
    if "torch" in states:
        torch.set_rng_state(states["torch"])
        done.append("torch")
    if "python" in states:
        random.setstate(states["python"])
        done.append("python")
    if "numpy" in states:
        import numpy as np  # saved by a process that had it: restoring needs it here

        np.random.set_state(states["numpy"])
        done.append("numpy")
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"], torch.cuda.current_device())
        done.append("cuda")
    kept = getattr(_dtensor_tracker(), "rng_states", None)
    if "dtensor" in states and kept is not None:
        for name, s in states["dtensor"].items():
            kept[name] = s.clone()
        done.append("dtensor")
    return done
