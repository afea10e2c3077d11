"""Exercise of notebook 15: the loader's ``state_dict``/``load_state_dict`` for DCP.

The learner writes two functions, called on every rank:

* ``loader_state(loader, layout) -> dict``: what this rank puts under ``"data"``
  in ``dcp.save`` (the loader is a :class:`~ezpz_nb.data.resumable.ShardStream`);
* ``load_loader_state(loader, layout, state)``: restore from what ``dcp.load``
  filled in (its template is ``loader_state`` of a fresh loader).

:func:`check_loader_state` runs them on 4 real gloo ranks at two layouts, ``dp 2 x
tp 2`` and ``dp 4 x tp 1``, with a dataset size, two loader seeds, two save steps and
the loader's batch size (two distinct, one odd: :func:`~.dcp_places.draw_batches`) drawn
per check: each seed's loader is run to both steps (four places), then fresh
loaders, on ranks the saves never ran in, load each place's checkpoint and run the rest of the epoch. Each
rank's resumed batches must equal the straight run's, samples and masked tokens.

What the checker trusts stays where the learner's code never runs. The straight runs are
computed in the checker's own process; the load job is never told a step; the loads run
on ranks the learner's save never ran in (a rank job the save rebinds, or a state it keeps
in a warm rank's memory, does not reach them), in an order drawn on the checker's side.
Only what DCP holds reaches a load: each checkpoint is read through its own metadata and
written anew under a path the save never saw, and every folder the save wrote is gone
first (a file put beside or inside the checkpoint is not carried). At each place the save
never sees the run's own loader: two *twins* (loaders built with other seeds and dataset
sizes, set to the place) are saved, their checkpoints must hold the same (a random token
or a counter naming a side file differs), and one of them is loaded into a loader of the
run's own seed (a side file named from the loader's seed is not found). A state kept
outside the checkpoint under the rank or the step holds the last of the saves only, and a
drawn step turns down an answer that skips a fixed count. What a right answer may keep is
what describes the place: one key with the offset, replayed in a fresh loader, passes.

The saves may write nothing but their checkpoints (:mod:`.confine`'s Landlock rules and
:mod:`.no_sockets`' seccomp filter, on Linux): a state kept in a file of the learner's own
(``/tmp``, ``/dev/shm``, the notebook's folder), sent over any socket (TCP, UDP, unix: a
server the learner started before the check included) or started in a program is refused,
and what a save leaves running below the ranks (a child process serving it) or in System V
shared memory is ended and named (:mod:`.dcp_guard`). Nothing may sit beside DCP's own
files, judged before anything reads a checkpoint, and no process outside the check's ranks
can find the folders (issue 45's seventh trial: a process the notebook started earlier
copied what a save left beside its checkpoint): they are named by random bits under a
parent no process may list, and the save ranks are not dumpable. They run on ranks of the check's
own whose every thread is confined before the learner's code is unpickled (:mod:`.seal`),
so code a save rebinds for the rank to run after it (the reply it sends, issue 45's fifth
trial) or hands gloo's threads is refused alike; those ranks are ended after the saves.
The loads (and the learner's ``loader_state``, which a load calls for its template) run
on load ranks of the check's own, sealed alike (writes only into the check's folders, which
the checker removes), in a thread with no writes at all. Where Landlock is missing the
verdict says which of these were not judged. Not closed: a thread the learner started in
the notebook's own process (it can read the folders' names there), taking what a save
writes beside its checkpoint and removing it before the checker looks; a save that makes
its rank dumpable again for a process outside to read the folder's name from ``/proc``.

The wrong answers it names are the ones that lose data in real jobs: one key for every
rank (DCP keeps one rank's copy: the others replay that rank's shard), only rank 0
saving (the others start over), the RNG forgotten (the right samples, other masks).
:data:`CORPUS` holds them beside right answers, one of them unusual.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ezpz_nb.data.groups import make_layout
from ezpz_nb.workshop import confine, dcp_guard, dcp_watch
from ezpz_nb.workshop.confine import call_confined
from ezpz_nb.workshop.dcp_copy import rebuild_part
from ezpz_nb.workshop.dcp_corpus import CORPUS
from ezpz_nb.workshop.dcp_places import (
    BATCH,
    WORLD,
    Case,
    Point,
    Seen,
    diagnose,
    draw_batches,
    draw_case,
    place,
    seen,
    stream,
    twins_differ,
)
from ezpz_nb.workshop.seal import call_sealed, packed
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, not_done, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = [
    "BATCH",
    "CORPUS",
    "EXERCISE",
    "Case",
    "check_loader_state",
    "draw_case",
    "shared_load_ranks",
    "stream",
]

EXERCISE = "loader_state"
#: The layouts every check runs, as ``(dp, tp)``: a DP rank is not ``rank // 2`` at both.
LAYOUTS = ((2, 2), (4, 1))

StateFn = Callable[[Any, Any], dict[str, Any]]
LoadFn = Callable[[Any, Any, dict[str, Any]], None]


class _Learners:
    """A ``Stateful`` that asks the learner's two functions."""

    def __init__(self, loader: Any, layout: Any, save: StateFn, load: LoadFn) -> None:
        self.loader, self.layout, self.save, self.load = loader, layout, save, load

    def state_dict(self) -> dict[str, Any]:
        return self.save(self.loader, self.layout)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load(self.loader, self.layout, state)


#: What the save job gets, per place: each DP rank's state there (computed by the checker)
#: and the place's twins, each ``(checkpoint path, twin's seed, twin's dataset size)``.
Plan = list[tuple[dict[int, dict[str, Any]], list[tuple[str, int, int]]]]
#: Per layout: ``(tp, batch, plan)``.
Plans = list[tuple[int, int, Plan]]


def _save_part(plans: Plans, learners: bytes, sealed: bool) -> None:
    """Rank side: every layout's saves, where they may write only inside their checkpoint
    folders: on a rank of the check's own, the whole rank sealed (:mod:`.seal`: its main
    thread runs them, and no thread of it is free); on warm ranks, a confined thread
    (:mod:`.confine`). The learner's functions are unpickled there too."""
    for tp, *_ in plans:  # every group is made before anything is confined
        make_layout(tp_size=tp)
    writable = sorted(
        {os.path.dirname(path) for *_, plan in plans for _, twins in plan for path, _, _ in twins}
    )
    if sealed:  # no process outside reads a path from its /proc/<pid>/fd (ended after)
        confine.undumpable()
    (call_sealed if sealed else call_confined)(_save_places, learners, writable, plans)


def _save_places(save: StateFn, load: LoadFn, plans: Plans) -> None:
    """At each place, each twin (a loader of another seed and size) set to this DP rank's
    state there, and saved. The run's own loader, seed and size never come here."""
    import torch.distributed.checkpoint as dcp

    for tp, batch, plan in plans:
        layout = make_layout(tp_size=tp)
        for states, twins in plan:
            for path, twin_seed, twin_size in twins:
                twin = stream(layout.dp_rank, layout.dp_size, twin_size, twin_seed, batch)
                twin.load_state_dict(states[layout.dp_rank])
                dcp.save({"data": _Learners(twin, layout, save, load)}, checkpoint_id=path)


def _rebuild_part(
    jobs: list[tuple[list[str], str]], dirs: list[str], tps: list[int], sealed: bool
) -> Any:
    """Rank side: :func:`~.dcp_copy.rebuild_part`, confined to this check's folders (what a
    checkpoint's pickles run as they are read may write nowhere else). ``sealed``: on load
    ranks of the check's own, the whole rank is sealed (:mod:`.seal`), the groups of every
    layout ``tps`` made first, so the loads after run sealed too."""
    for tp in tps:
        make_layout(tp_size=tp)
    return (call_sealed if sealed else call_confined)(rebuild_part, None, dirs, jobs)


#: The load ranks :func:`shared_load_ranks` keeps, while it runs.
_SHARED: list[Any] = []


@contextlib.contextmanager
def shared_load_ranks() -> Iterator[None]:
    """Every check inside that saves on a warm cluster passed in loads on one cluster of the
    checker's own (a test module's checks: the ranks' imports of DCP, most of a check's
    time, paid once); a check of its own (no cluster) loads on sealed ranks of its own.

    Sound because nothing of a save reaches them but its checkpoint: the saves run
    elsewhere, confined, and what they leave running is ended; the loads run confined and
    what the ranks keep in memory from one check is about another check's draws. Outside
    it (a learner's notebook) each check starts fresh load ranks and leaves none behind.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.launcher import Cluster

    with Cluster(world_size=WORLD, timeout=4 * CHECK_TIMEOUT) as ranks:
        _SHARED.append(ranks)
        try:
            yield
        finally:
            _SHARED.remove(ranks)


def _load_part(items: list[tuple[int, int, int, int, str]], learners: bytes) -> list[Seen]:
    """Rank side: the loads, in a thread that may write nothing (see :mod:`.confine`)."""
    for tp, *_ in items:  # the groups are made before the thread is confined
        make_layout(tp_size=tp)
    resumed: list[Seen] = call_confined(_load_places, learners, [], items)
    return resumed


def _load_places(
    save: StateFn, load: LoadFn, items: list[tuple[int, int, int, int, str]]
) -> list[Seen]:
    """Each checkpoint ``(tp, size, seed, batch, path)`` loaded into a fresh loader, the rest
    of the epoch run. It is never told the step a checkpoint was saved at."""
    import torch.distributed.checkpoint as dcp

    resumed = []
    for tp, num_samples, seed, batch, path in items:
        layout = make_layout(tp_size=tp)
        loader = stream(layout.dp_rank, layout.dp_size, num_samples, seed, batch)
        dcp.load({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
        resumed.append(seen(loader))
    return resumed


def _run_check(cases: list[Case], save: StateFn, load: LoadFn, cluster: Any) -> bool:
    """Save every case, then load every checkpoint on other ranks; stop at a fault. Return
    whether the saves ran on sealed ranks (:mod:`.seal`), not in a warm rank's thread.

    What the checker trusts stays on this side: the straight runs are computed here, the
    load job is told no step, and the loads run on ranks the learner's save never ran in (a
    rank job the save rebinds, or a state it keeps in the rank's memory, does not reach
    them). Only what DCP holds reaches a load: the saves may write nothing but their
    checkpoints and leave no process behind (:mod:`.confine`), each checkpoint is read
    through its metadata and written anew under a path the save never saw, and every folder
    the save wrote is gone before the first load. The save job gets each place's states,
    never the run's seed or size; the two twins of each place must hold the same (a random
    name or a counter differs), and a name made of the loader's seed names the twin's.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import run_job

    rng, timeout = random.Random(), 4 * CHECK_TIMEOUT
    points: list[Point] = []
    learners = packed("loader_state or load_loader_state", save, load)
    # Folders no process outside the check can find (issue 45's seventh trial: a process
    # the notebook started copied a file a save left beside its checkpoint).
    folders = dcp_guard.Folders()
    folder, dirs = folders.make, folders.made
    watch: list[dcp_watch.Watch] = []  # what the saves write, told by the kernel

    try:
        with contextlib.ExitStack() as own:
            savers, pids, sealed = dcp_guard.savers(cluster, WORLD, timeout, own)
            before = (confine.processes_below(pids), confine.ipc_objects())
            plans: Plans = []
            for case in cases:
                plan: Plan = []
                twins = iter(case.twins)
                for seed in case.seeds:
                    for stop in case.stops:
                        made = [(folder(), *next(twins)) for _ in range(2)]
                        plan.append((place(case, seed, stop), made))
                        points.append(Point(case, seed, stop, tuple(p for p, _, _ in made)))
                plans.append((case.tp, case.batch, plan))
            dests = [folder() for _ in points]  # the rebuilt copies' (the last folders made)
            watch.append(dcp_watch.Watch([path for p in points for path in p.twins]))
            with dcp_guard.confined_save():
                run_job(
                    _save_part, plans, learners, sealed,
                    world_size=WORLD, timeout=timeout, cluster=savers,
                )  # fmt: skip
            dcp_guard.left_behind(
                pids,
                before,
                lambda dead: run_job(
                    confine.reap, dead, world_size=WORLD, timeout=timeout, cluster=savers
                ),
            )
        saved = [path for p in points for path in p.twins]
        folders.check()  # before anything reads a checkpoint: DCP's files alone, unreached
        watch[0].judge()
        for path in saved:
            dcp_guard.only_dcp_files(path)
        # Which twin is loaded, and in what order: drawn here, after the saves.
        firsts = [rng.randrange(2) for _ in points]
        jobs = [
            ([p.twins[f], p.twins[1 - f]], dest)
            for p, f, dest in zip(points, firsts, dests, strict=True)
        ]
        order = rng.sample(range(len(points)), len(points))
        items = [
            (c.tp, c.num_samples, points[j].seed, c.batch, jobs[j][1])
            for j, c in ((j, points[j].case) for j in order)
        ]
        with contextlib.ExitStack() as own:
            # Sealed saves load on sealed ranks of their own; warm saves (tests) may share.
            shared = _SHARED[-1] if _SHARED and not _SHARED[-1].closed and not sealed else None
            fresh = shared if shared not in (None, cluster) else None
            if fresh is None:
                fresh = own.enter_context(Cluster(world_size=WORLD, timeout=timeout))
            tps = sorted({c.tp for c in cases})
            with dcp_guard.confined_load():
                rebuilt = run_job(
                    _rebuild_part, jobs, dirs, tps, fresh is not shared,
                    world_size=WORLD, timeout=timeout, cluster=fresh,
                )  # fmt: skip
                folders.check()
                for path in saved:  # nothing the saves wrote outlives the rebuild
                    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                back = run_job(
                    _load_part, items, learners, world_size=WORLD, timeout=timeout, cluster=fresh
                )
    finally:
        for w in watch:
            w.close()
        folders.close()
    at = {j: k for k, j in enumerate(order)}
    digests = {j: twins for part in rebuilt for j, twins in part}
    for j, p in enumerate(points):  # judged in the order drawn: layout, seed, step
        resumed = [r[at[j]] if isinstance(r, list) and len(r) == len(order) else None for r in back]
        why = diagnose(p, resumed) or twins_differ(digests[j])
        if why:
            c = p.case
            raise wrong(
                f"on dp {c.dp} x tp {c.tp} with batches of {c.batch}, saved after step {p.stop} "
                f"(offset {p.stop * c.batch} of each DP rank's shard): {why}"
            )
    return sealed


def check_loader_state(
    loader_state: StateFn | None, load_loader_state: LoadFn | None, *, cluster: Any = None
) -> CheckResult:
    """Save and load through DCP on real ranks with the learner's functions; print the verdict.

    Args:
        loader_state, load_loader_state: The learner's functions (None: not done).
        cluster: None (a learner's check): the saves run on 4 ranks of the checker's
            own, every thread of each confined first (:mod:`.seal`), ended after (~3 s).
            A warm ``ez.Cluster`` of 4 ranks (tests of the verdicts that need no seal):
            the saves run there in a confined thread, and the verdict says what that
            leaves unjudged (closed since, or running a thread the learner started: ranks
            of the checker's own). The save ranks are made child subreapers. The loads run
            on ranks the learner's save never ran in: fresh ones, or those
            :func:`shared_load_ranks` keeps.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        if loader_state is None or load_loader_state is None:
            raise not_done("write loader_state and load_loader_state, then run this cell")
        if not (callable(loader_state) and callable(load_loader_state)):
            raise wrong(
                "loader_state and load_loader_state must be functions: "
                "def loader_state(loader, layout): return {...}"
            )
        rng = random.Random()  # fresh per check: no answer fits a fixed step, layout or batch
        layouts = rng.sample(LAYOUTS, len(LAYOUTS))
        cases = [
            draw_case(rng, dp, tp, batch)
            for (dp, tp), batch in zip(layouts, draw_batches(rng), strict=True)
        ]
        sealed = _run_check(cases, loader_state, load_loader_state, cluster)
        runs = "; ".join(
            f"dp {c.dp} x tp {c.tp}, batches of {c.batch}, saved after steps {c.stops[0]} and "
            f"{c.stops[1]}"
            for c in cases
        )
        missing = confine.confinement(confine.landlock_abi())
        if not sealed:
            missing.append(
                "code a save leaves the warm ranks' other threads (saves on the cluster "
                "passed in; leave cluster out to judge it)"
            )
        unjudged = f" Not judged here: {'; '.join(missing)}." if missing else ""
        return (
            f"every rank resumed from each checkpoint (two loader seeds per layout) with the "
            f"straight run's samples and masked tokens, through dcp.save and dcp.load in fresh "
            f"loaders on ranks the saves never ran in, two loaders set to each place saved the same state, and "
            f"the saves wrote nothing outside their checkpoints ({runs}).{unjudged}"
        )

    return judge(EXERCISE, body)
