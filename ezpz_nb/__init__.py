"""ezpz_nb: learn distributed data loading with real gloo ranks started from a notebook.

Quick start::

    import ezpz_nb as ez
    import torch.distributed as dist

    ez.launch(lambda: dist.get_rank(), world_size=4)   # -> [0, 1, 2, 3]
"""

from __future__ import annotations

import sys
from typing import Any

try:
    from ezpz_nb.data import (
        DataLayoutWarning,
        RandomTokenDataset,
        ShardError,
        SteppedLoader,
        TPBroadcastDataLoader,
        TPLeaderError,
        WeightedShard,
        get_random_dataset_fsdp_tp,
        global_mean,
    )
    from ezpz_nb.data.groups import Layout, layout_table, make_layout
    from ezpz_nb.errors import EzpzError
    from ezpz_nb.events import publish
    from ezpz_nb.launcher import MAX_WORLD_SIZE, START_METHODS, Cluster, launch
    from ezpz_nb.launcher.errors import (
        HangError,
        RankError,
        RankFailure,
        RankStack,
        RunInterrupted,
    )
    from ezpz_nb.launcher.session import warm_up
    from ezpz_nb.launcher.wire import RankEvent
    from ezpz_nb.ledger import Ledger, Problem, RecordingLoader, StepRecord, record
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    # Without torch nothing here works, but `ezpz-nb doctor` (which imports this
    # package first) must still run and say what to install.
    _NO_TORCH: ModuleNotFoundError | None = exc
else:
    _NO_TORCH = None

__version__ = "0.1.0"

__all__ = [
    # launching (ezpz_nb.launcher)
    "Cluster",
    "EzpzError",
    "HangError",
    "MAX_WORLD_SIZE",
    "RankError",
    "RankEvent",
    "RankFailure",
    "RankStack",
    "RunInterrupted",
    "START_METHODS",
    "launch",
    "load_ipython_extension",
    "publish",
    # data loading, the ezpz API (ezpz_nb.data, ezpz_nb.data.groups)
    "DataLayoutWarning",
    "Layout",
    "RandomTokenDataset",
    "ShardError",
    "SteppedLoader",
    "TPBroadcastDataLoader",
    "TPLeaderError",
    "WeightedShard",
    "get_random_dataset_fsdp_tp",
    "global_mean",
    "layout_table",
    "make_layout",
    # what each rank saw (ezpz_nb.ledger); figures and widgets live in ezpz_nb.viz
    # (imported on demand: matplotlib and ipywidgets are heavy)
    "Ledger",
    "Problem",
    "RecordingLoader",
    "StepRecord",
    "record",
]


def load_ipython_extension(ipython) -> None:  # ipython: IPython's own shell type
    """``%load_ext ezpz_nb``: registers the ``%%ranks`` cell magic."""
    from ezpz_nb.magic import register

    register(ipython)
    warm_up()


if _NO_TORCH is None:
    # In a Jupyter kernel the forkserver starts importing torch now, while the learner
    # reads, so the first launch takes a fraction of a second (EZPZ_NB_WARMUP=0: not).
    warm_up()
else:

    def __getattr__(name: str) -> Any:
        raise ImportError(
            f"ezpz_nb.{name} needs PyTorch, which is not installed in this Python "
            f"({sys.executable}). Install it, e.g. `pip install torch`, then check the "
            "machine with `ezpz-nb doctor`."
        )
