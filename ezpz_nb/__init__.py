"""ezpz_nb: learn distributed data loading with real gloo ranks started from a notebook.

Quick start::

    import ezpz_nb as ez
    import torch.distributed as dist

    ez.launch(lambda: dist.get_rank(), world_size=4)   # -> [0, 1, 2, 3]

The names below load their module on first use, not at ``import ezpz_nb``: a rank
process imports this package too, and must load only the rank side of the launcher
(what it runs), not the notebook side (clusters, the session, the pool).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ezpz_nb._lazy import lazy

# Each public name and the module it lives in; adding a name is one line here.
_WHERE = {
    # launching (ezpz_nb.launcher)
    "Cluster": "ezpz_nb.launcher.cluster",
    "EzpzError": "ezpz_nb.errors",
    "HangError": "ezpz_nb.launcher.errors",
    "MAX_WORLD_SIZE": "ezpz_nb.launcher.settings",
    "RankError": "ezpz_nb.launcher.errors",
    "RankEvent": "ezpz_nb.launcher.wire",
    "RankFailure": "ezpz_nb.launcher.errors",
    "RankStack": "ezpz_nb.launcher.errors",
    "RunInterrupted": "ezpz_nb.launcher.errors",
    "START_METHODS": "ezpz_nb.launcher.settings",
    "launch": "ezpz_nb.launcher.on_ranks",
    "publish": "ezpz_nb.events",
    "warm_up": "ezpz_nb.launcher.session",
    # the same function on a Slurm cluster (ezpz_nb.slurm, notebook 18)
    "submit": "ezpz_nb.slurm.submission",
    # data loading, the ezpz API (ezpz_nb.data, ezpz_nb.data.groups)
    "DataLayoutWarning": "ezpz_nb.data",
    "Layout": "ezpz_nb.data.groups",
    "RandomTokenDataset": "ezpz_nb.data",
    "ShardError": "ezpz_nb.data",
    "SteppedLoader": "ezpz_nb.data",
    "TPBroadcastDataLoader": "ezpz_nb.data",
    "TPLeaderError": "ezpz_nb.data",
    "WeightedShard": "ezpz_nb.data",
    "get_random_dataset_fsdp_tp": "ezpz_nb.data",
    "global_mean": "ezpz_nb.data",
    "layout_table": "ezpz_nb.data.groups",
    "make_layout": "ezpz_nb.data.groups",
    # what each rank saw (ezpz_nb.ledger); figures and widgets live in ezpz_nb.viz
    # (imported on demand: matplotlib and ipywidgets are heavy)
    "Ledger": "ezpz_nb.ledger",
    "Problem": "ezpz_nb.ledger",
    "RecordingLoader": "ezpz_nb.ledger",
    "StepRecord": "ezpz_nb.ledger",
    "record": "ezpz_nb.ledger",
}

__version__ = "0.1.0"

__all__ = sorted([*_WHERE, "load_ipython_extension"])


_getattr, __dir__ = lazy(__name__, _WHERE)


def __getattr__(name: str) -> Any:
    try:
        return _getattr(name)
    except ModuleNotFoundError:
        # `ezpz-nb doctor` imports this package where torch may be missing: only a
        # name that needs torch says so, and says what to do. Any missing module counts
        # when torch is missing: a Python without torch often lacks our other
        # dependencies too (cloudpickle is imported before torch on the launch path).
        if importlib.util.find_spec("torch") is not None:
            raise
        raise ImportError(
            f"ezpz_nb.{name} needs PyTorch, which is not installed in this Python "
            f"({sys.executable}). Install it, e.g. `pip install torch`, then check the "
            "machine with `ezpz-nb doctor`."
        ) from None


def load_ipython_extension(ipython: Any) -> None:  # ipython: IPython's own shell type
    """``%load_ext ezpz_nb``: registers the ``%%ranks`` cell magic."""
    from ezpz_nb.launcher.session import warm_up
    from ezpz_nb.magic import register

    register(ipython)
    warm_up()


def _warm_up_in_a_kernel() -> None:
    """In a Jupyter kernel the forkserver starts importing torch now, while the learner
    reads, so the first launch takes a fraction of a second (EZPZ_NB_WARMUP=0: not).

    Anywhere else (a rank, a script, torchrun, the doctor) nothing is loaded here:
    without ipykernel imported this is no kernel, and asking costs nothing.
    """
    if "ipykernel" not in sys.modules:
        return
    try:
        from ezpz_nb.launcher.session import warm_up
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        return  # the first name used says what to install
    warm_up()


_warm_up_in_a_kernel()
