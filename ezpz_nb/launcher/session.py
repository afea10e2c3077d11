"""The notebook side's own state, in one place: its clusters, the standby pool, the
``%%ranks`` magic's state, warm-up.

A notebook (or a script) holds one :data:`SESSION`: the clusters it started and
has not closed (so "the running cluster" means the latest one, and an exiting
kernel closes them all), the standby pool its spawned ranks come from (handed to each
cluster's processes), and what ``%%ranks`` keeps between cells (its own cluster, its
cells' count). The few other module globals (the shutdown hook, and on the rank side
the runtime) are listed with their reasons in docs/architecture.md, "State kept at
module level".
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing.forkserver
import multiprocessing.util  # before our atexit hook is registered, see close_all
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from ezpz_nb.launcher.children import main_hidden
from ezpz_nb.launcher.pool import StandbyPool, size_from_env
from ezpz_nb.launcher.shutdown import on_kernel_shutdown
from ezpz_nb.launcher.startup import (
    default_start_method,
    forkserver_context,
    should_warm_up,
)


class LiveCluster(Protocol):
    """What the session needs of a cluster (``ezpz_nb.launcher.cluster.Cluster``).

    A protocol, not an import: the session sits below the cluster module.
    """

    world_size: int
    timeout: float

    @property
    def closed(self) -> bool: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...

    def run(self, fn: Any, /, *args: Any, **kwargs: Any) -> list[Any]: ...


__all__ = ["SESSION", "LiveCluster", "RanksState", "Session", "warm_up"]


@dataclass
class RanksState:
    """What the ``%%ranks`` magic keeps between cells."""

    #: The cluster ``%%ranks`` started itself, if any (closed when it starts another).
    cluster: LiveCluster | None = None
    _serials: itertools.count = field(default_factory=lambda: itertools.count(1))

    def next_serial(self) -> int:
        """A number for the next ``%%ranks`` cell, unique in this session (its file name)."""
        return next(self._serials)


class Session:
    """The clusters of this notebook process, and what they share.

    Args:
        pool: The standby pool (spawn) the session's clusters take ranks from.
    """

    def __init__(self, pool: StandbyPool) -> None:
        # By start order; weak, so a cluster the notebook dropped is not kept alive here.
        self._live: weakref.WeakValueDictionary[int, LiveCluster] = weakref.WeakValueDictionary()
        self._serial = itertools.count()
        #: Standby rank processes under spawn: they outlive any one cluster.
        self.pool = pool
        #: The ``%%ranks`` magic's state.
        self.ranks = RanksState()

    def register(self, cluster: LiveCluster) -> int:
        """Note a cluster whose ranks just started; returns its key for :meth:`forget`."""
        key = next(self._serial)
        self._live[key] = cluster
        on_kernel_shutdown(self.close_all)
        return key

    def forget(self, key: int) -> None:
        """The cluster under ``key`` is closed."""
        self._live.pop(key, None)

    def live(self) -> list[LiveCluster]:
        """Clusters started in this process and not yet closed, oldest first."""
        return [c for _, c in sorted(self._live.items(), key=lambda kv: kv[0]) if not c.closed]

    def close_all(self) -> None:
        """Kill every live cluster's ranks and the standby pool (at exit, or when the
        kernel shuts down). The pool first: a killed cluster would refill it."""
        self.pool.close()
        for c in self.live():
            try:
                c.kill()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass


#: This process's session.
SESSION = Session(StandbyPool())


@atexit.register
def _close_all() -> None:
    # Runs before multiprocessing's own exit hook (atexit is last-in, first-out),
    # which would otherwise wait forever for ranks that are not daemons.
    SESSION.close_all()


def warm_up(session: Session = SESSION) -> bool:
    """In a Jupyter kernel, prepare ranks now, so the first launch is fast.

    With the forkserver (Linux), start it: its one ``import torch`` (about a second)
    then happens while the learner reads, instead of inside the first launch.
    Under spawn (macOS, Windows, ``EZPZ_NB_START_METHOD=spawn``), start the standby
    pool (:mod:`.pool`): a launch's worth of spawned ranks that import torch now.
    Either only starts processes (milliseconds); a launch that comes before they
    are ready waits for them as the first launch always did. Not in a plain script
    or under torchrun, nor with ``EZPZ_NB_WARMUP=0``.

    Returns:
        True when the forkserver or the pool was started (or already running).

    Raises:
        StartMethodError: ``EZPZ_NB_START_METHOD`` is set to something this
            platform cannot run (checked first, so ``import ezpz_nb`` says so).
    """
    method = default_start_method()
    if not should_warm_up():
        return False
    # The kernel may exit before any launch: its shutdown must still let the
    # forkserver (or the pool) and the resource tracker go and leave no folder behind.
    on_kernel_shutdown(session.close_all)
    if method == "spawn":
        size = size_from_env(os.environ)
        if size and not session.pool.size:
            session.pool.start(size)
        return size > 0
    forkserver_context()
    with main_hidden("forkserver"):
        multiprocessing.forkserver.ensure_running()
    return True
