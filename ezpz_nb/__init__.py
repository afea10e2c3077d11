"""ezpz_nb: learn distributed data loading with real gloo ranks started from a notebook.

Quick start::

    import ezpz_nb as ez
    import torch.distributed as dist

    ez.launch(lambda: dist.get_rank(), world_size=4)   # -> [0, 1, 2, 3]
"""

from __future__ import annotations

from ezpz_nb.errors import EzpzError, HangError, RankError, RankEvent, RankFailure, RankStack
from ezpz_nb.launch import MAX_WORLD_SIZE, START_METHODS, Cluster, launch, publish

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "EzpzError",
    "HangError",
    "MAX_WORLD_SIZE",
    "RankError",
    "RankEvent",
    "RankFailure",
    "RankStack",
    "START_METHODS",
    "launch",
    "load_ipython_extension",
    "publish",
]


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own type
    """``%load_ext ezpz_nb``: registers the ``%%ranks`` cell magic."""
    from ezpz_nb.magic import register

    register(ipython)
