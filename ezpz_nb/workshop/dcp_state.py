"""Exercise of notebook 15: the loader's ``state_dict``/``load_state_dict`` for DCP.

The learner writes two functions, called on every rank:

* ``loader_state(loader, layout) -> dict``: what this rank puts under ``"data"``
  in ``dcp.save`` (the loader is a :class:`~ezpz_nb.data.resumable.ShardStream`);
* ``load_loader_state(loader, layout, state)``: restore from what ``dcp.load``
  filled in (its template is ``loader_state`` of a fresh loader).

:func:`check_loader_state` runs them on ``dp 2 x tp 2`` real gloo ranks: a
straight epoch, then 3 steps, ``dcp.save``, and in a second run (fresh loaders)
``dcp.load`` and the rest of the epoch. Each rank's resumed batches must equal
the straight run's, samples and masked tokens. The wrong answers it names are
the ones that lose data in real jobs: one key for every rank (DCP keeps one
rank's copy: the others replay that rank's shard), only rank 0 saving (the
others start over), and the RNG forgotten (the right samples, other masks).
:data:`CORPUS` holds them beside right answers, one of them unusual.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from ezpz_nb.data.groups import make_layout
from ezpz_nb.data.resumable import ShardStream
from ezpz_nb.workshop.verdicts import CHECK_TIMEOUT, CheckResult

__all__ = ["CORPUS", "EXERCISE", "STOP", "check_loader_state", "stream"]

EXERCISE = "loader_state"
DP, TP, BATCH, NUM_SAMPLES, SEED = 2, 2, 2, 24, 5
#: Steps taken before the save.
STOP = 3

StateFn = Callable[[Any, Any], dict[str, Any]]
LoadFn = Callable[[Any, Any, dict[str, Any]], None]


def stream(layout: Any) -> ShardStream:
    """The exercise's loader on this rank: its DP rank's shard of 24 rule sequences."""
    from ezpz_nb.examples.capstone import RuleTokenDataset

    ds = RuleTokenDataset(num_samples=NUM_SAMPLES)
    return ShardStream(ds, BATCH, layout.dp_rank, layout.dp_size, seed=SEED)


class _Learners:
    """A ``Stateful`` that asks the learner's two functions."""

    def __init__(self, loader: Any, layout: Any, save: StateFn, load: LoadFn) -> None:
        self.loader, self.layout, self.save, self.load = loader, layout, save, load

    def state_dict(self) -> dict[str, Any]:
        return self.save(self.loader, self.layout)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load(self.loader, self.layout, state)


def _seen(batches: Any) -> list[tuple[list[int], int]]:
    return [(b["index"].tolist(), int(b["input_ids"].sum())) for b in batches]


def _first_part(path: str, save: StateFn, load: LoadFn) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    layout = make_layout(tp_size=TP)
    straight = _seen(stream(layout))
    loader = stream(layout)
    it = iter(loader)
    _seen(next(it) for _ in range(STOP))
    dcp.save({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
    return {"dp_rank": layout.dp_rank, "straight": straight}


def _second_part(path: str, save: StateFn, load: LoadFn) -> list[tuple[list[int], int]]:
    import torch.distributed.checkpoint as dcp

    layout = make_layout(tp_size=TP)
    loader = stream(layout)
    dcp.load({"data": _Learners(loader, layout, save, load)}, checkpoint_id=path)
    return _seen(loader)


def _judge(first: list[dict[str, Any]], resumed: list[Any]) -> str:
    """Why the resumed batches differ, the worst loss first; "" when every rank matches."""
    straight = {f["dp_rank"]: f["straight"] for f in first}
    found: dict[int, str] = {}  # severity -> the first rank's diagnosis
    for rank, (f, got) in enumerate(zip(first, resumed, strict=True)):
        want = f["straight"][STOP:]
        if got == want:
            continue
        ids, own = [i for b, _ in got for i in b], [i for b, _ in want for i in b]
        other = next(
            (
                d
                for d, s in straight.items()
                if d != f["dp_rank"] and [b for b, _ in got] == [b for b, _ in s[STOP:]]
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
                    f"{STOP + step} on: the loader's RNG (its generator's state) was not saved, "
                    "not restored, or restored from another rank"
                ),
            )
        else:
            found.setdefault(
                3, f"rank {rank} resumed with samples {ids[:6]}, the straight run's were {own[:6]}"
            )
    return found[min(found)] if found else ""


def check_loader_state(
    loader_state: StateFn | None, load_loader_state: LoadFn | None, *, cluster: Any = None
) -> CheckResult:
    """Save and load through DCP on real ranks with the learner's functions; print the verdict.

    Args:
        loader_state, load_loader_state: The learner's functions (None: not done).
        cluster: A warm ``ez.Cluster`` of 4 ranks to run on (default: fresh ranks
            for each of the two runs, as a restarted job has).
    """
    if loader_state is None or load_loader_state is None:
        return _say("not done", "write loader_state and load_loader_state, then run this cell")
    if not (callable(loader_state) and callable(load_loader_state)):
        return _say(
            "wrong",
            "loader_state and load_loader_state must be functions: "
            "def loader_state(loader, layout): return {...}",
        )
    if cluster is not None and cluster.world_size != DP * TP:
        return _say("not done", f"pass a Cluster(world_size={DP * TP}) or none")
    from ezpz_nb.launcher import launch
    from ezpz_nb.launcher.errors import HangError, RankError

    path = tempfile.mkdtemp(prefix="ezpz-nb15-")

    def run(fn: Callable[..., Any]) -> list[Any]:
        if cluster is not None:
            return cluster.run(fn, path, loader_state, load_loader_state)
        return launch(
            fn, path, loader_state, load_loader_state, world_size=DP * TP, timeout=4 * CHECK_TIMEOUT
        )

    try:
        first = run(_first_part)
        resumed = run(_second_part)
    except RankError as exc:
        failure = exc.failures[0] if getattr(exc, "failures", None) else None
        text = failure.user_frames() if failure is not None else str(exc)
        if "NotImplementedError" in str(exc):
            return _say("not done", "the functions still raise NotImplementedError")
        return _say("wrong", f"a rank raised while saving or loading:\n{text}")
    except HangError as exc:
        return _say("wrong", f"the ranks hung (did every rank call the same collectives?):\n{exc}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    why = _judge(first, resumed)
    if why:
        return _say("wrong", why)
    return _say(
        "correct",
        f"on dp {DP} x tp {TP}, every rank resumed after step {STOP} with the straight run's "
        "samples and masked tokens, through dcp.save and dcp.load",
    )


def _say(status: str, message: str) -> CheckResult:
    prefix = {"correct": "correct", "wrong": "not right yet", "not done": "not done yet"}[status]
    result = CheckResult(EXERCISE, status, f"{EXERCISE}: {prefix}. {message}")
    print(result.message)
    return result


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
