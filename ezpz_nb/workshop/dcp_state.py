"""Exercise of notebook 15: the loader's ``state_dict``/``load_state_dict`` for DCP.

The learner writes two functions, called on every rank:

* ``loader_state(loader, layout) -> dict``: what this rank puts under ``"data"``
  in ``dcp.save`` (the loader is a :class:`~ezpz_nb.data.resumable.ShardStream`);
* ``load_loader_state(loader, layout, state)``: restore from what ``dcp.load``
  filled in (its template is ``loader_state`` of a fresh loader).

:func:`check_loader_state` runs them on 4 real gloo ranks at two layouts, ``dp 2 x
tp 2`` and ``dp 4 x tp 1``, with a dataset size, two loader seeds and two save steps
drawn per check: each seed's loader is run to both steps (four places), then fresh
loaders, on fresh ranks, load each place's checkpoint and run the rest of the epoch. Each
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

Not closed (it cannot be told from a right answer by what the checkpoint holds): a side
file in a fixed folder named by a hash of the whole state, the loader's RNG included.

The wrong answers it names are the ones that lose data in real jobs: one key for every
rank (DCP keeps one rank's copy: the others replay that rank's shard), only rank 0
saving (the others start over), the RNG forgotten (the right samples, other masks).
:data:`CORPUS` holds them beside right answers, one of them unusual.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ezpz_nb.data.groups import layout_table, make_layout
from ezpz_nb.data.resumable import ShardStream
from ezpz_nb.models import RuleTokenDataset
from ezpz_nb.workshop.dcp_copy import rebuild_part
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, not_done, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["CORPUS", "EXERCISE", "Case", "check_loader_state", "draw_case", "stream"]

EXERCISE = "loader_state"
WORLD, BATCH = 4, 2
#: The layouts every check runs, as ``(dp, tp)``: a DP rank is not ``rank // 2`` at both.
LAYOUTS = ((2, 2), (4, 1))

StateFn = Callable[[Any, Any], dict[str, Any]]
LoadFn = Callable[[Any, Any, dict[str, Any]], None]
Seen = list[tuple[list[int], int]]


@dataclass(frozen=True)
class Case:
    """One drawn layout: the dataset's size, two loader seeds, the two save steps, and twins.

    Both seeds' loaders are saved at both steps before any checkpoint is loaded: a state
    kept outside the checkpoint under the step (or under the seed) holds the last save of
    the four only. What is saved at each place is never the loader itself but two *twins*:
    loaders built with another seed and dataset size (``twins``, two per place), set to the
    loader's place. Their states must come out the same, and the one loaded goes to a
    loader built with the case's own seed.
    """

    dp: int
    tp: int
    num_samples: int
    seeds: tuple[int, int]
    stops: tuple[int, int]
    #: ``(seed, dataset size)`` of each twin, in the order seed, step, copy.
    twins: tuple[tuple[int, int], ...] = ()


def draw_case(rng: random.Random, dp: int, tp: int) -> Case:
    """A dataset size, two seeds, two distinct save steps inside the epoch (>= 4 steps), and
    two twins per place, each with its own seed and a larger dataset (all seeds distinct)."""
    num_samples = dp * BATCH * rng.randint(4, 7)
    steps = num_samples // (dp * BATCH)
    first, second = sorted(rng.sample(range(1, steps), 2))
    seeds = rng.sample(range(1, 2**20), 2 + 2 * 2 * 2)
    twins = tuple((s, num_samples + dp * BATCH * rng.randint(1, 3)) for s in seeds[2:])
    return Case(dp, tp, num_samples, (seeds[0], seeds[1]), (first, second), twins)


def stream(dp_rank: int, dp_size: int, num_samples: int, seed: int) -> ShardStream:
    """The exercise's loader for one DP rank: its shard of the seed's rule sequences."""
    ds = RuleTokenDataset(num_samples=num_samples, seed=seed)
    return ShardStream(ds, BATCH, dp_rank, dp_size, seed=seed)


class _Learners:
    """A ``Stateful`` that asks the learner's two functions."""

    def __init__(self, loader: Any, layout: Any, save: StateFn, load: LoadFn) -> None:
        self.loader, self.layout, self.save, self.load = loader, layout, save, load

    def state_dict(self) -> dict[str, Any]:
        return self.save(self.loader, self.layout)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load(self.loader, self.layout, state)


def _seen(batches: Any) -> Seen:
    return [(b["index"].tolist(), int(b["input_ids"].sum())) for b in batches]


#: What the save job gets, per place: each DP rank's state there (computed by the checker)
#: and the place's twins, each ``(checkpoint path, twin's seed, twin's dataset size)``.
Plan = list[tuple[dict[int, dict[str, Any]], list[tuple[str, int, int]]]]


def _save_part(tp: int, plan: Plan, save: StateFn, load: LoadFn) -> None:
    """Rank side: at each place, each twin (a loader of another seed and size) set to this
    DP rank's state there, and saved. The run's own loader, seed and size never come here."""
    import torch.distributed.checkpoint as dcp

    layout = make_layout(tp_size=tp)
    for states, twins in plan:
        for path, twin_seed, twin_size in twins:
            twin = stream(layout.dp_rank, layout.dp_size, twin_size, twin_seed)
            twin.load_state_dict(states[layout.dp_rank])
            dcp.save({"data": _Learners(twin, layout, save, load)}, checkpoint_id=path)


def _place(case: Case, seed: int, stop: int) -> dict[int, dict[str, Any]]:
    """Each DP rank's loader state after ``stop`` steps of the seed's run, computed here."""
    states = {}
    for d in range(case.dp):
        loader = stream(d, case.dp, case.num_samples, seed)
        it = iter(loader)
        for _ in range(stop):
            next(it)
        states[d] = loader.state_dict()
    return states


def _load_part(items: list[tuple[int, int, int, str]], save: StateFn, load: LoadFn) -> list[Seen]:
    """Rank side: each checkpoint ``(tp, size, seed, path)`` loaded into a fresh loader, the
    rest of the epoch run. It is never told the step a checkpoint was saved at."""
    import torch.distributed.checkpoint as dcp

    resumed = []
    for tp, num_samples, seed, path in items:
        layout = make_layout(tp_size=tp)
        loader = stream(layout.dp_rank, layout.dp_size, num_samples, seed)
        dcp.load({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
        resumed.append(_seen(loader))
    return resumed


@dataclass(frozen=True)
class _Point:
    """One place as the checker knows it: its run, seed, step and its twins' paths at save."""

    case: Case
    seed: int
    stop: int
    twins: tuple[str, ...]


def _straight(case: Case, seed: int) -> dict[int, Seen]:
    """Each DP rank's whole epoch, computed here, where no learner code runs."""
    return {d: _seen(stream(d, case.dp, case.num_samples, seed)) for d in range(case.dp)}


def _ids(got: Any) -> list[list[int]] | None:
    try:
        return [list(b) for b, _ in got]
    except (TypeError, ValueError):
        return None  # not batches at all: judged as different from every run


def _diagnose(point: _Point, resumed: list[Any]) -> str:
    """Why the resumed batches differ, the worst loss first; "" when every rank matches."""
    case, stop = point.case, point.stop
    straight = _straight(case, point.seed)
    found: dict[int, str] = {}  # severity -> the first rank's diagnosis
    layout = layout_table(WORLD, case.tp)
    for rank, got in enumerate(resumed):
        dp_rank = layout[rank][1]
        want = straight[dp_rank][stop:]
        if got == want:
            continue
        ids, own = _ids(got) or [], [b for b, _ in want]
        flat, own_flat = [i for b in ids for i in b], [i for b in own for i in b]
        other = next(
            (d for d, s in straight.items() if d != dp_rank and ids == [b for b, _ in s[stop:]]),
            None,
        )
        if other is not None:
            found.setdefault(
                0,
                (
                    f"rank {rank} (DP rank {dp_rank}) resumed DP rank {other}'s place and "
                    f"replays its samples {flat[:6]}; its own {own_flat[:6]} are never seen. Every "
                    "rank wrote the same keys, and DCP kept one copy of each (not always from one "
                    "rank): key the state by DP rank, layout.dp_rank (rank // tp: TP is "
                    "innermost), not the global rank or rank % dp"
                ),
            )
        elif ids and stop >= 2 and ids == [b for b, _ in straight[dp_rank][stop - 1 :]][: len(ids)]:
            found.setdefault(
                1,
                (
                    f"rank {rank} (DP rank {dp_rank}) resumed one batch before the saved place "
                    f"({flat[:6]}, where the straight run went on with {own_flat[:6]}): the "
                    "state after step k already counts batch k; restore the offset as saved"
                ),
            )
        elif ids and ids == [b for b, _ in straight[dp_rank][: len(ids)]]:
            found.setdefault(
                1,
                (
                    f"rank {rank} (DP rank {dp_rank}) started its shard over ({flat[:6]}, "
                    "already trained on): its own state was not in the checkpoint (only rank 0 "
                    "saving?)"
                    + (", or it resumed one batch before the saved place" if stop == 1 else "")
                    + ". Every DP rank must save its own place"
                ),
            )
        elif ids == own:
            step = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            found.setdefault(
                2,
                (
                    f"rank {rank} got the right samples but other masked tokens from step "
                    f"{stop + step} on: the loader's RNG (its generator's state) was not saved, "
                    "not restored, or restored from another rank or from outside this checkpoint "
                    "(a file or memory that a later save overwrote)"
                ),
            )
        else:
            found.setdefault(
                3,
                f"rank {rank} resumed with samples {flat[:6]}, the straight run's were "
                f"{own_flat[:6]}: restore from the state dcp.load hands you, not from anything "
                "kept outside the checkpoint or counted in steps",
            )
    return found[min(found)] if found else ""


def _run_check(cases: list[Case], save: StateFn, load: LoadFn, cluster: Any) -> None:
    """Save every case on ``cluster``, then load every checkpoint on fresh ranks; stop at a fault.

    What the checker trusts stays on this side: the straight runs are computed here, the
    load job is told no step, and the loads run on ranks the learner's save never ran in (a
    rank job the save rebinds, or a state it keeps in the rank's memory, does not reach
    them). Only what DCP holds reaches a load: each checkpoint is read through its metadata
    and written anew under a path the save never saw, and every folder the save wrote is
    gone before the first load. The save job gets each place's states, never the run's
    seed or size; the two twins of each place must hold the same (a random name or a
    counter differs), and a name made of the loader's seed names the twin's, not the run's.
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import run_job

    rng, timeout = random.Random(), 4 * CHECK_TIMEOUT
    dirs: list[str] = []
    points: list[_Point] = []

    def folder() -> str:
        dirs.append(tempfile.mkdtemp(prefix="ezpz-nb15-"))
        return os.path.join(dirs[-1], "checkpoint")

    try:
        for case in cases:
            plan: Plan = []
            twins = iter(case.twins)
            for seed in case.seeds:
                for stop in case.stops:
                    made = [(folder(), *next(twins)) for _ in range(2)]
                    plan.append((_place(case, seed, stop), made))
                    points.append(_Point(case, seed, stop, tuple(path for path, _, _ in made)))
            run_job(
                _save_part, case.tp, plan, save, load,
                world_size=WORLD, timeout=timeout, cluster=cluster,
            )  # fmt: skip
        saved = [path for p in points for path in p.twins]
        for path in saved:
            if not os.path.exists(os.path.join(path, ".metadata")):
                raise wrong(
                    f"dcp.save left no checkpoint at {path}: return the state from "
                    "loader_state and let dcp.save write it"
                )
        # Which twin is loaded, and in what order: drawn here, after the saves.
        firsts = [rng.randrange(2) for _ in points]
        jobs = [
            ([p.twins[f], p.twins[1 - f]], folder()) for p, f in zip(points, firsts, strict=True)
        ]
        order = rng.sample(range(len(points)), len(points))
        items = [
            (points[j].case.tp, points[j].case.num_samples, points[j].seed, jobs[j][1])
            for j in order
        ]
        with Cluster(world_size=WORLD, timeout=timeout) as fresh:
            rebuilt = run_job(rebuild_part, jobs, world_size=WORLD, timeout=timeout, cluster=fresh)
            for path in saved:  # nothing the saves wrote outlives the rebuild
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            back = run_job(
                _load_part, items, save, load, world_size=WORLD, timeout=timeout, cluster=fresh
            )
    finally:
        for path in dirs:
            shutil.rmtree(path, ignore_errors=True)
    at = {j: k for k, j in enumerate(order)}
    digests = {j: twins for part in rebuilt for j, twins in part}
    for j, p in enumerate(points):  # judged in the order drawn: layout, seed, step
        resumed = [r[at[j]] if isinstance(r, list) and len(r) == len(order) else None for r in back]
        why = _diagnose(p, resumed) or _twins_differ(digests[j])
        if why:
            raise wrong(f"on dp {p.case.dp} x tp {p.case.tp}, saved after step {p.stop}: {why}")


def _twins_differ(digests: list[dict[str, str]]) -> str:
    """Why two loaders at one place gave different checkpoints; "" when they match."""
    one, two = digests
    keys = sorted(k for k in one.keys() | two.keys() if one.get(k) != two.get(k))
    if not keys:
        return ""
    named = ", ".join(k.removeprefix("/data/") for k in keys[:3])
    return (
        f"two loaders at the same place (the same shard, offset and RNG, built with other seeds) "
        f"gave checkpoints that differ under {named}. loader_state must return the loader's "
        "place, the same for the same place (what loader.state_dict() holds), not a name, a "
        "counter or a token that points to something kept outside the checkpoint"
    )


def check_loader_state(
    loader_state: StateFn | None, load_loader_state: LoadFn | None, *, cluster: Any = None
) -> CheckResult:
    """Save and load through DCP on real ranks with the learner's functions; print the verdict.

    Args:
        loader_state, load_loader_state: The learner's functions (None: not done).
        cluster: A warm ``ez.Cluster`` of 4 ranks for the saves (default, or closed
            since: fresh ranks). The loads always run on fresh ranks, which the
            learner's save never ran in.
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
        rng = random.Random()  # fresh per check: no answer fits a fixed step or layout
        cases = [draw_case(rng, dp, tp) for dp, tp in rng.sample(LAYOUTS, len(LAYOUTS))]
        _run_check(cases, loader_state, load_loader_state, cluster)
        runs = "; ".join(
            f"dp {c.dp} x tp {c.tp}, saved after steps {c.stops[0]} and {c.stops[1]}" for c in cases
        )
        return (
            f"every rank resumed from each checkpoint (two loader seeds per layout) with the "
            f"straight run's samples and masked tokens, through dcp.save and dcp.load in fresh "
            f"loaders on fresh ranks, and two loaders set to each place saved the same state "
            f"({runs})."
        )

    return judge(EXERCISE, body)


# ---------------------------------------------------------------- the corpus
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
