"""Notebook 15's corpus: right answers and wrong ones its checker is tested against.

``name -> (loader_state, load_loader_state, expected status)``. The wrong answers are the
ones that lose data in real jobs: one key for every rank (DCP keeps one rank's copy), only
rank 0 saving (the others start over), the RNG forgotten (the right samples, other masks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

__all__ = ["CORPUS"]

StateFn = Callable[[Any, Any], dict[str, Any]]
LoadFn = Callable[[Any, Any, dict[str, Any]], None]


def _keyed(loader: Any, layout: Any) -> dict[str, Any]:
    return {f"dp_rank_{layout.dp_rank}": loader.state_dict()}


def _load_keyed(loader: Any, layout: Any, state: dict[str, Any]) -> None:
    loader.load_state_dict(state[f"dp_rank_{layout.dp_rank}"])


def _by_global_rank(loader: Any, layout: Any) -> dict[str, Any]:
    # Unusual but right: every rank its own key (TP peers write copies), the RNG as a list.
    s = loader.state_dict()
    return {f"rank{dist.get_rank()}": {**s, "generator": s["generator"].tolist()}}


def _load_by_global_rank(loader: Any, layout: Any, state: dict[str, Any]) -> None:
    import torch

    s = dict(state[f"rank{dist.get_rank()}"])
    s["generator"] = torch.tensor(s["generator"], dtype=torch.uint8)
    loader.load_state_dict(s)


def _one_key(loader: Any, layout: Any) -> dict[str, Any]:
    return {"loader": loader.state_dict()}


def _load_one_key(loader: Any, layout: Any, state: dict[str, Any]) -> None:
    loader.load_state_dict(state["loader"])


def _rank0_only(loader: Any, layout: Any) -> dict[str, Any]:
    return {"loader": loader.state_dict()} if dist.get_rank() == 0 else {}


def _load_rank0_only(loader: Any, layout: Any, state: dict[str, Any]) -> None:
    if "loader" in state:
        loader.load_state_dict(state["loader"])


def _no_rng(loader: Any, layout: Any) -> dict[str, Any]:
    s = loader.state_dict()
    return {f"dp_rank_{layout.dp_rank}": {"shard": s["shard"], "offset": s["offset"]}}


#: ``name -> (loader_state, load_loader_state, expected status)``: right answers and dodges.
CORPUS: dict[str, tuple[StateFn, LoadFn, str]] = {
    "keyed by DP rank": (_keyed, _load_keyed, "correct"),
    "keyed by global rank, RNG as a list (unusual)": (
        _by_global_rank,
        _load_by_global_rank,
        "correct",
    ),
    "one key for every rank": (_one_key, _load_one_key, "wrong"),
    "only rank 0 saves": (_rank0_only, _load_rank0_only, "wrong"),
    "RNG forgotten": (_no_rng, _load_keyed, "wrong"),
}
