"""Only what DCP holds: notebook 15's checkpoints read back, written anew, digested per key.

A rank job of :mod:`ezpz_nb.workshop.dcp_state`'s checker, run on ranks the learner's save
never ran in. Each checkpoint is read through its own metadata (what ``dcp.save`` wrote and
named there, nothing else in its folder) and the one to be loaded is written anew under a
path the save never saw. Each key's value is digested so that the checker's own process
can compare two checkpoints of one place without reading what the learner wrote.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["digests", "rebuild_part"]


def rebuild_part(items: list[tuple[list[str], str]]) -> list[tuple[int, list[dict[str, str]]]]:
    """Each place's twin checkpoints read through DCP alone, the first written anew at its
    destination; :func:`digests` of each twin. Every rank takes every world-size-th place.

    Args:
        items: Per place, ``([twin checkpoint, ...], destination)``.

    Returns:
        ``(place index, [digests of each twin])`` for this rank's places.
    """
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    out = []
    for j in range(dist.get_rank(), len(items), dist.get_world_size()):
        twins, dest = items[j]
        each: list[dict[str, str]] = []
        for path in twins:
            flat = f"{path}.pt"
            dcp_to_torch_save(path, flat)
            if not each:
                torch_save_to_dcp(flat, dest)
            each.append(digests(torch.load(flat, weights_only=False)))
        out.append((j, each))
    return out


class _Canonical(pickle.Pickler):
    """A pickler that writes each tensor as its dtype, shape and bytes: pickling a tensor
    itself adds a random serialization id, so two equal states would differ."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous().reshape(-1)
            return (str(t.dtype), tuple(obj.shape), t.view(torch.uint8).numpy().tobytes())
        return None


def digests(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{key path: sha256 of its value}`` for a nested dict of DCP's values (tensors by
    their dtype, shape and bytes; anything else as pickled)."""
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for k, v in tree.items():
            out.update(digests(v, f"{prefix}/{k}"))
        return out
    buf = io.BytesIO()
    _Canonical(buf, protocol=4).dump(tree)
    return {prefix: hashlib.sha256(buf.getvalue()).hexdigest()}
