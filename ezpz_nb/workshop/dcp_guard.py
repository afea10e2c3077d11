"""Notebook 15's checker around the learner's saves: only the checkpoint may hold the state.

:func:`packed` pickles the learner's functions for :func:`~ezpz_nb.workshop.confine.call_confined`
to unpickle in a confined thread; :func:`savers` picks the ranks the saves run on (the warm
cluster, unless it runs a thread the learner started) and makes each a child subreaper;
:func:`confined_save` says why a refused write stopped a save; :func:`left_behind` finds what
a save left running or shared (processes, System V objects), ends it and says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop import confine
from ezpz_nb.workshop.stops import wrong

__all__ = ["confined_save", "left_behind", "packed", "savers"]


def packed(save: Callable[..., Any], load: Callable[..., Any]) -> bytes:
    """The learner's two functions pickled here, to be unpickled in the confined thread."""
    from ezpz_nb.launcher.wire import dumps

    try:
        return dumps((save, load))
    except Exception as e:  # noqa: BLE001 - anything that cannot be sent is the answer's
        raise wrong(
            f"loader_state or load_loader_state cannot be sent to the ranks ({e}): define them "
            "at the top level of a cell, using nothing that holds a lock, a file or a socket"
        ) from None


def savers(
    cluster: Any, world: int, timeout: float, own: contextlib.ExitStack
) -> tuple[Any, list[int]]:
    """The ranks the saves run on, and their pids: the warm ``cluster``, unless it is gone or
    runs a thread the learner started earlier (it could write what the saves leave in
    memory, unconfined); then a cluster of the checker's own, closed by ``own``."""
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import run_job

    live = cluster if cluster is not None and not cluster.closed else None
    if live is not None:
        ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=live)
        if not any(threads for _, threads in ranks):
            return live, [pid for pid, _ in ranks]
    fresh = own.enter_context(Cluster(world_size=world, timeout=timeout))
    ranks = run_job(confine.subreaper, world_size=world, timeout=timeout, cluster=fresh)
    return fresh, [pid for pid, _ in ranks]


#: Said after a save that raised where writes are refused (the learner's message first).
_ONLY_THE_CHECKPOINT = (
    "loader_state ran where it may write only inside its checkpoint: a file of its own "
    "(in /tmp, /dev/shm, the notebook's folder), a socket or a program is refused. The "
    "state must be in the checkpoint: return it from loader_state"
)


def confined_save() -> contextlib.AbstractContextManager[None]:
    """Add what was refused, and why, to a save that raised on a refused write."""
    return confine.refusals_explained(_ONLY_THE_CHECKPOINT)


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
