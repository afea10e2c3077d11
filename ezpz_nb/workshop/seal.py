"""Confine a whole rank before a learner's code runs in it: every thread that can run Python.

:func:`~.confine.call_confined` confines one thread; the rank's other threads stay free,
and Python lets the learner's code rebind what they run: issue 45's fifth trial rebound the
function the rank's main thread replies with, which then wrote notebook 15's state to a
side file once the save had returned. A rank of a check's own, ended after the check, is
sealed instead (:func:`seal_rank`, on its main thread, once every process group the check
needs exists: gloo connects when a group is made, and Landlock then refuses connections):

* the main thread restricts itself (:mod:`.confine`'s Landlock rules, ``writable`` the only
  folders written), and then every thread of the process refuses new sockets
  (:mod:`.no_sockets`, seccomp's thread sync);
* the lifeline watcher (``launcher/rank.py``: it polls the notebook's pipe) restricts
  itself at its next wake, writing nothing;
* gloo's worker threads (``pt_gloo_runloop``, two a group) run a collective's future
  callbacks, so code the learner hands ``work.get_future().then`` would run there: each is
  made to run a callback of the checker's first, which restricts it, writing nothing.

Only then is the learner's code unpickled. A thread started later inherits its starter's
rules. The threads left free run no Python: gloo's socket loop (``gloo_tcp_loop``) and
torch's intra-op pool. :func:`seal_rank` checks that every Python thread is one it sealed
and raises otherwise. Where Landlock is missing it does nothing: the verdict says what was
not judged (:func:`~.confine.confinement`).
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop import confine
from ezpz_nb.workshop.no_sockets import available, refuse_sockets
from ezpz_nb.workshop.stops import CouldNotJudge, wrong

__all__ = ["call_sealed", "packed", "seal_rank"]

#: Rounds of callbacks before a worker thread that was never reached stops the check (a
#: round misses a thread when a callback runs inline: measured up to 1 in 7 on a busy machine).
ROUNDS = 20
#: Seconds a callback waits for the other threads of its group to take theirs.
MEET = 2.0
#: Seconds the lifeline watcher may take to restrict itself (it wakes every half second).
LIFELINE = 10.0


def _tids(comm: str) -> set[int]:
    """Kernel thread ids of this process's threads named ``comm``."""
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == comm:
                    out.add(int(tid))
        except OSError:
            continue  # ended meanwhile
    return out


def _seal_lifeline(abi: int) -> tuple[threading.Event, list[Any]] | None:
    """Ask the lifeline watcher to restrict itself; None where this rank has none."""
    from ezpz_nb.launcher import rank

    if not any(t.name == "ezpz_nb-lifeline" and t.is_alive() for t in threading.enumerate()):
        return None
    done = threading.Event()
    got: list[Any] = []  # the thread's id, or what it raised

    def restrict() -> None:
        try:
            confine.restrict_this_thread([], abi)
            got.append(threading.get_native_id())
        except BaseException as e:  # noqa: BLE001 - said by the main thread, which waits
            got.append(e)
        done.set()

    rank.WATCHER_CALLS.append(restrict)
    return done, got


def _seal_workers(abi: int) -> set[int]:
    """Restrict every gloo worker thread through callbacks of the checker's; their tids.

    In each group, as many collectives at once as the group has worker threads; each
    callback restricts its thread and waits for the others, so each lands on another
    thread. A callback made after its collective finished runs in the calling thread
    instead: the ranks then agree on another round (every rank makes the same calls).
    """
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    groups = list(c10d._world.pg_map)
    sealed: set[int] = set()
    main = threading.main_thread()
    for _ in range(ROUNDS):
        for group in groups:
            # A group's worker threads: its gloo options say how many (the same on every rank).
            options = getattr(group._get_backend(torch.device("cpu")), "options", None)
            each = max(1, int(getattr(options, "_threads", 2)))
            meet = threading.Barrier(each, timeout=MEET)

            def restrict(fut: Any, meet: threading.Barrier = meet) -> None:
                if threading.current_thread() is main:
                    meet.abort()  # ran inline (the collective had finished): none waits
                    return
                tid = threading.get_native_id()
                if tid not in sealed:
                    confine.restrict_this_thread([], abi)
                    sealed.add(tid)
                try:
                    meet.wait()
                except threading.BrokenBarrierError:
                    pass  # a peer ran inline: this round missed a thread

            futures = []
            for _ in range(each):
                work = dist.all_reduce(torch.zeros(1), group=group, async_op=True)
                futures.append(work.get_future().then(restrict))
            for fut in futures:
                fut.wait()
        missing = torch.tensor([len(_tids("pt_gloo_runloop") - sealed)])
        dist.all_reduce(missing, op=dist.ReduceOp.MAX)
        if not int(missing):
            return sealed
    raise CouldNotJudge(
        f"gloo's worker threads could not all be confined in {ROUNDS} rounds (on a busy "
        "machine a callback can miss its thread)"
    )


def _refuse_new_groups() -> None:
    """A new process group connects anew, which a sealed rank refuses: said in words, not
    as gloo's "Cannot resolve 127.0.0.1" (the tenth trial's ``dist.new_group`` answer)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "this check's ranks make no new process group: a group opens connections of "
            "its own, which the check refuses (it counts what crosses between the ranks). "
            "Use the default group, or the group the exercise hands you."
        )

    for name in ("new_group", "new_subgroups", "new_subgroups_by_enumeration"):
        for where in (dist, c10d):
            if hasattr(where, name):
                setattr(where, name, refused)


def seal_rank(writable: list[str]) -> None:
    """Rank side, main thread, before any learner code is unpickled: confine every thread
    of this rank that can run Python (see the module's docstring). Irreversible: the rank
    is ended after the check. Nothing where Landlock is missing."""
    abi = confine.landlock_abi()
    if abi < 1:
        return
    lifeline = _seal_lifeline(abi)
    sealed = _seal_workers(abi)
    _refuse_new_groups()  # the rank is ended after the check: nothing else needs them
    confine.restrict_this_thread(writable, abi)
    if available() is None:
        refuse_sockets(all_threads=True)
    sealed.add(threading.get_native_id())
    if lifeline is not None:
        done, got = lifeline
        if not done.wait(LIFELINE):
            raise CouldNotJudge("the rank's lifeline watcher did not confine itself")
        if isinstance(got[0], BaseException):
            raise got[0]
        sealed.add(got[0])
    free = [t.name for t in threading.enumerate() if t.native_id not in sealed]
    if free:
        raise CouldNotJudge(f"threads {free} of this rank run unconfined")


def call_sealed(
    job: Callable[..., Any], learners: bytes | None, writable: list[str], *args: Any
) -> Any:
    """``job(*pickle.loads(learners), *args)`` on this sealed rank's main thread: the rank
    is sealed first (:func:`seal_rank`), then the learner's functions are unpickled."""
    seal_rank(writable)
    head = pickle.loads(learners) if learners is not None else ()
    return job(*head, *args)


def packed(what: str, *fns: Callable[..., Any]) -> bytes:
    """The learner's functions pickled in the notebook (source file names kept, so a
    traceback shows the learner's line), for the ranks to unpickle once confined: code a
    pickle runs as it is read (an object's ``__reduce__``) runs confined too. ``what``
    names them in the verdict when they cannot be sent."""
    from ezpz_nb.launcher.wire import dumps

    try:
        return dumps(fns)
    except Exception as e:  # noqa: BLE001 - anything that cannot be sent is the answer's
        raise wrong(
            f"{what} cannot be sent to the ranks ({e}): define it at the top level of a "
            "cell, using nothing that holds a lock, a file or a socket"
        ) from None
