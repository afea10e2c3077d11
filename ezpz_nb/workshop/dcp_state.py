"""Exercise of notebook 15: the loader's ``state_dict``/``load_state_dict`` for DCP.

The learner writes two functions, called on every rank:

* ``loader_state(loader, layout) -> dict``: what this rank puts under ``"data"``
  in ``dcp.save`` (the loader is a :class:`~ezpz_nb.data.resumable.ShardStream`);
* ``load_loader_state(loader, layout, state)``: restore from what ``dcp.load``
  filled in (its template is ``loader_state`` of a fresh loader).

:func:`check_loader_state` runs them on 4 real gloo ranks at two layouts, ``dp 2 x
tp 2`` and ``dp 4 x tp 1``, with a dataset size and seed drawn per check: a straight
epoch, then two saves at two drawn steps (two checkpoints), and in a second run fresh
loaders that load each checkpoint and run the rest of the epoch. Each rank's resumed batches must equal the straight run's, samples and masked
tokens. What the checker trusts (the steps, the layouts, the straight run) is drawn on
its side and never handed to the learner's functions; two checkpoints loaded in the
other order turn down a state kept outside the checkpoint (a side file holds the last
save only), and a drawn step turns down an answer that skips a fixed count.

The wrong answers it names are the ones that lose data in real jobs: one key for every
rank (DCP keeps one rank's copy: the others replay that rank's shard), only rank 0
saving (the others start over), the RNG forgotten (the right samples, other masks).
:data:`CORPUS` holds them beside right answers, one of them unusual.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ezpz_nb.data.groups import make_layout
from ezpz_nb.data.resumable import ShardStream
from ezpz_nb.models import RuleTokenDataset
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    judge,
    not_done,
    run_job,
    wrong,
)

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
    """One drawn run: the layout, the dataset's size and seed, the two save steps."""

    dp: int
    tp: int
    num_samples: int
    seed: int
    stops: tuple[int, int]


def draw_case(rng: random.Random, dp: int, tp: int) -> Case:
    """A dataset size and seed, and two distinct save steps inside the epoch (>= 4 steps)."""
    num_samples = dp * BATCH * rng.randint(4, 7)
    steps = num_samples // (dp * BATCH)
    first, second = sorted(rng.sample(range(1, steps), 2))
    return Case(dp, tp, num_samples, rng.randrange(1, 2**20), (first, second))


def stream(layout: Any, case: Case) -> ShardStream:
    """The exercise's loader on this rank: its DP rank's shard of the case's rule sequences."""
    ds = RuleTokenDataset(num_samples=case.num_samples, seed=case.seed)
    return ShardStream(ds, BATCH, layout.dp_rank, layout.dp_size, seed=case.seed)


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


def _save_part(paths: list[str], case: Case, save: StateFn, load: LoadFn) -> dict[str, Any]:
    """Rank side: the straight epoch, then one save at each of the case's two steps."""
    import torch.distributed.checkpoint as dcp

    layout = make_layout(tp_size=case.tp)
    straight = _seen(stream(layout, case))
    loader = stream(layout, case)
    it, taken = iter(loader), 0
    for path, stop in zip(paths, case.stops, strict=True):
        for _ in range(stop - taken):
            next(it)
        taken = stop
        dcp.save({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
    return {"dp_rank": layout.dp_rank, "straight": straight}


def _load_part(paths: list[str], case: Case, save: StateFn, load: LoadFn) -> list[Seen]:
    """Rank side: each checkpoint loaded into a fresh loader, the rest of the epoch run."""
    import torch.distributed.checkpoint as dcp

    layout = make_layout(tp_size=case.tp)
    resumed = []
    for path in paths:
        loader = stream(layout, case)
        dcp.load({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
        resumed.append(_seen(loader))
    return resumed


def _diagnose(first: list[dict[str, Any]], resumed: list[Seen], stop: int) -> str:
    """Why the resumed batches differ, the worst loss first; "" when every rank matches."""
    straight = {f["dp_rank"]: f["straight"] for f in first}
    found: dict[int, str] = {}  # severity -> the first rank's diagnosis
    for rank, (f, got) in enumerate(zip(first, resumed, strict=True)):
        want = f["straight"][stop:]
        if got == want:
            continue
        ids, own = [i for b, _ in got for i in b], [i for b, _ in want for i in b]
        other = next(
            (
                d
                for d, s in straight.items()
                if d != f["dp_rank"] and [b for b, _ in got] == [b for b, _ in s[stop:]]
            ),
            None,
        )
        if other is not None:
            found.setdefault(
                0,
                (
                    f"rank {rank} (DP rank {f['dp_rank']}) resumed DP rank {other}'s place and "
                    f"replays its samples {ids[:6]}; its own {own[:6]} are never seen. Every rank "
                    "wrote the same keys, and DCP kept one copy of each (not always from one "
                    "rank): key the state by DP rank"
                ),
            )
        elif [b for b, _ in got] == [b for b, _ in f["straight"][: len(got)]]:
            found.setdefault(
                1,
                (
                    f"rank {rank} (DP rank {f['dp_rank']}) started its shard over ({ids[:6]}, "
                    "already trained on): its own state was not in the checkpoint (only rank 0 "
                    "saving?). Every DP rank must save its own place"
                ),
            )
        elif [b for b, _ in got] == [b for b, _ in want]:
            step = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            found.setdefault(
                2,
                (
                    f"rank {rank} got the right samples but other masked tokens from step "
                    f"{stop + step} on: the loader's RNG (its generator's state) was not saved, "
                    "not restored, or restored from another rank"
                ),
            )
        else:
            found.setdefault(
                3,
                f"rank {rank} resumed with samples {ids[:6]}, the straight run's were {own[:6]}: "
                "restore from the state dcp.load hands you, not from anything kept outside the "
                "checkpoint or counted in steps",
            )
    return found[min(found)] if found else ""


def _run_case(case: Case, save: StateFn, load: LoadFn, cluster: Any) -> None:
    """Save, then load into fresh loaders, on ``cluster`` (or fresh ranks); stop at a fault."""
    paths = [tempfile.mkdtemp(prefix="ezpz-nb15-") for _ in case.stops]
    timeout = 4 * CHECK_TIMEOUT
    try:
        first = run_job(
            _save_part, paths, case, save, load, world_size=WORLD, timeout=timeout, cluster=cluster
        )
        # Loaded in the other order: a state kept beside the checkpoint (a file, a global on
        # the rank) holds the last save only, so fresh ranks would add nothing to judge.
        back = run_job(
            _load_part, paths[::-1], case, save, load, world_size=WORLD, timeout=timeout,
            cluster=cluster,
        )  # fmt: skip
    finally:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
    for resumed, stop in zip(zip(*back, strict=True), case.stops[::-1], strict=True):
        why = _diagnose(first, list(resumed), stop)
        if why:
            raise wrong(f"on dp {case.dp} x tp {case.tp}, saved after step {stop}: {why}")


def check_loader_state(
    loader_state: StateFn | None, load_loader_state: LoadFn | None, *, cluster: Any = None
) -> CheckResult:
    """Save and load through DCP on real ranks with the learner's functions; print the verdict.

    Args:
        loader_state, load_loader_state: The learner's functions (None: not done).
        cluster: A warm ``ez.Cluster`` of 4 ranks to run on (default, or closed since:
            fresh ranks for each run).
    """

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
        for case in cases:
            _run_case(case, loader_state, load_loader_state, cluster)
        runs = "; ".join(
            f"dp {c.dp} x tp {c.tp}, saved after steps {c.stops[0]} and {c.stops[1]}" for c in cases
        )
        return (
            f"every rank resumed from each checkpoint with the straight run's samples and "
            f"masked tokens, through dcp.save and dcp.load in fresh loaders ({runs})."
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
