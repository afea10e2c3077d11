"""Notebook 15's checker around the learner's saves: only the checkpoint may hold the state.

:func:`savers` picks the ranks the saves run on (ranks of the check's own, sealed; a warm
cluster passed in, a confined thread) and makes each a child subreaper;
:func:`confined_save` and :func:`confined_load` say why a refusal stopped a save or a load; :func:`left_behind` finds what
a save left running or shared (processes, System V objects), ends it and says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop import confine
from ezpz_nb.workshop.stops import wrong

__all__ = ["confined_load", "confined_save", "left_behind", "savers"]


def savers(
    cluster: Any, world: int, timeout: float, own: contextlib.ExitStack
) -> tuple[Any, list[int], bool]:
    """The ranks the saves run on, their pids, and whether they are sealed (:mod:`.seal`).

    By default a cluster of the checker's own, closed by ``own`` (its ranks sealed for the
    saves, so ended with the check). A warm ``cluster`` passed in (tests: the verdicts
    that need no seal) runs them in a confined thread, unless it is gone or runs a thread
    the learner started earlier (it could write what the saves leave in memory).
    """
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import run_job

    live = cluster if cluster is not None and not cluster.closed else None
    if live is not None:
        ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=live)
        if not any(threads for _, threads in ranks):
            return live, [pid for pid, _ in ranks], False
    fresh = own.enter_context(Cluster(world_size=world, timeout=timeout))
    ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=fresh)
    return fresh, [pid for pid, _ in ranks], True


#: Said after a save that raised where writes are refused (the learner's message first).
_ONLY_THE_CHECKPOINT = (
    "loader_state ran where it may write only inside its checkpoint: a file of its own "
    "(in /tmp, /dev/shm, the notebook's folder), a socket (TCP, UDP or unix) or a program "
    "is refused, from the save and from any code it leaves the rank to run later. The "
    "state must be in the checkpoint: return it from loader_state"
)


def confined_save() -> contextlib.AbstractContextManager[None]:
    """Add what was refused, and why, to a save that raised on a refused write."""
    return confine.refusals_explained(_ONLY_THE_CHECKPOINT)


#: Said after a load that raised where files and sockets are refused.
_ONLY_FROM_THE_CHECKPOINT = (
    "load_loader_state ran where it may write nothing and open no socket (TCP, UDP or unix): "
    "a state kept outside the checkpoint cannot be fetched. The state must be in the "
    "checkpoint: restore it from the state dcp.load hands you"
)


def confined_load() -> contextlib.AbstractContextManager[None]:
    """Add what was refused, and why, to a load that raised on a refused file or socket."""
    return confine.refusals_explained(_ONLY_FROM_THE_CHECKPOINT)


def left_behind(
    pids: list[int],
    before: tuple[dict[int, str], dict[Any, int]],
    reap: Callable[[list[int]], Any],
) -> None:
    """Stop at what the saves left below the save ranks (processes, System V shared memory
    or message queues, which Landlock does not cover); end it first, and ``reap`` (on the
    ranks) the processes ended and those that had exited."""
    left = confine.end_below(pids, set(before[0]))
    dead = [p for p in confine.processes_below(pids, zombies=True) if p not in before[0]]
    if dead:
        reap(dead)
    ours = {*pids, *left}
    ipc = [k for k, pid in confine.ipc_objects().items() if k not in before[1] and pid in ours]
    for kind, ident in ipc:
        confine.remove_ipc(kind, ident)
    named = [f"pid {p}: {c[:60]}" for p, c in sorted(left.items())[:3]]
    named += [f"System V {kind} {ident}" for kind, ident in ipc[:3]]
    if named:
        raise wrong(
            f"the saves left {'; '.join(named)} behind (ended now). What outlives the save "
            "holds the state outside the checkpoint: the state must be in the checkpoint, "
            "and loader_state must start nothing and share nothing"
        )
