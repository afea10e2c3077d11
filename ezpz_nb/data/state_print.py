"""Fingerprints of a loader's state, to check that ranks hold the same one without sending it.

:class:`~ezpz_nb.data.checkpoint.LoaderCheckpoint` gathers them over a TP group
before ``dcp.save`` keeps one copy of the group's state.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import torch

__all__ = ["fingerprint", "shape_print", "tracks"]


def fingerprint(value: Any) -> str:
    """A short digest of a state (tensors by their bytes), equal on ranks holding equal states."""
    buf = io.BytesIO()

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                buf.write(repr(k).encode())
                walk(v[k])
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif isinstance(v, torch.Tensor):
            buf.write(v.detach().cpu().contiguous().numpy().tobytes())
        else:
            buf.write(pickle.dumps(v))

    walk(value)
    return hashlib.sha1(buf.getvalue()).hexdigest()[:12]


def shape_print(value: Any) -> Any:
    """A state as a tree of :func:`fingerprint` leaves; dict keys kept, None kept as None."""
    if isinstance(value, dict):
        return {k: shape_print(v) for k, v in value.items()}
    return None if value is None else fingerprint(value)


def tracks(peer: Any, leader: Any) -> bool:
    """Whether a TP peer's :func:`shape_print` agrees with its leader's on all the peer holds.

    A peer that does not load holds None where the leader holds the inner
    loader's state; every value the peer does hold (its step) must be the leader's.
    """
    if peer is None:
        return True
    if isinstance(peer, dict) and isinstance(leader, dict):
        return peer.keys() == leader.keys() and all(tracks(peer[k], leader[k]) for k in peer)
    return bool(peer == leader)
