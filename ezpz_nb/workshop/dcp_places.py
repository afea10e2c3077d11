"""Notebook 15's places: the exercise's loader, the checker's straight runs, and its words.

:func:`stream` is the loader a rank saves and loads; :func:`place` and :func:`straight`
compute, in the checker's own process, where each DP rank's loader is after some steps and
what the whole epoch yields; :func:`diagnose` says why a resumed rank differs from the
straight run (the worst loss first) and :func:`twins_differ` why two loaders at one place
saved different checkpoints.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ezpz_nb.data.groups import layout_table
from ezpz_nb.data.resumable import ShardStream
from ezpz_nb.models import RuleTokenDataset

__all__ = [
    "BATCH",
    "BATCHES",
    "WORLD",
    "Case",
    "Point",
    "Seen",
    "diagnose",
    "draw_batches",
    "draw_case",
    "place",
    "seen",
    "straight",
    "stream",
    "twins_differ",
]

WORLD, BATCH = 4, 2
#: The batch sizes a check draws its two layouts' loaders from, two distinct, one odd at
#: least (issue 45's eighth trial: an offset saved as steps and restored as ``steps * 2``
#: passed while every loader had batches of 2).
BATCHES = (2, 3, 4, 5)
Seen = list[tuple[list[int], int]]


@dataclass(frozen=True)
class Case:
    """One drawn layout: the dataset's size, two loader seeds, the two save steps, twins, and
    the loader's batch size.

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
    #: Samples per batch of every DP rank's loader.
    batch: int = BATCH


def draw_batches(rng: random.Random) -> list[int]:
    """Two distinct batch sizes from :data:`BATCHES`, one odd at least: an answer that writes
    a batch size in fits one layout at most, and one that counts in steps of 2 meets an
    odd offset (see :func:`draw_case`)."""
    while True:
        batches = rng.sample(BATCHES, 2)
        if any(b % 2 for b in batches):
            return batches


def draw_case(rng: random.Random, dp: int, tp: int, batch: int = BATCH) -> Case:
    """A dataset size, two seeds, two distinct save steps inside the epoch (>= 4 steps), and
    two twins per place, each with its own seed and a larger dataset (all seeds distinct),
    for loaders of ``batch`` samples a batch. With an odd batch one step is odd at least, so
    the offset there is odd (halving it loses a sample)."""
    num_samples = dp * batch * rng.randint(4, 7)
    steps = num_samples // (dp * batch)
    first, second = sorted(rng.sample(range(1, steps), 2))
    while batch % 2 and not (first % 2 or second % 2):
        first, second = sorted(rng.sample(range(1, steps), 2))
    seeds = rng.sample(range(1, 2**20), 2 + 2 * 2 * 2)
    twins = tuple((s, num_samples + dp * batch * rng.randint(1, 3)) for s in seeds[2:])
    return Case(dp, tp, num_samples, (seeds[0], seeds[1]), (first, second), twins, batch)


def stream(
    dp_rank: int, dp_size: int, num_samples: int, seed: int, batch: int = BATCH
) -> ShardStream:
    """The exercise's loader for one DP rank: its shard of the seed's rule sequences."""
    ds = RuleTokenDataset(num_samples=num_samples, seed=seed)
    return ShardStream(ds, batch, dp_rank, dp_size, seed=seed)


def seen(batches: Any) -> Seen:
    return [(b["index"].tolist(), int(b["input_ids"].sum())) for b in batches]


def place(case: Case, seed: int, stop: int) -> dict[int, dict[str, Any]]:
    """Each DP rank's loader state after ``stop`` steps of the seed's run, computed here."""
    states = {}
    for d in range(case.dp):
        loader = stream(d, case.dp, case.num_samples, seed, case.batch)
        it = iter(loader)
        for _ in range(stop):
            next(it)
        states[d] = loader.state_dict()
    return states


@dataclass(frozen=True)
class Point:
    """One place as the checker knows it: its run, seed, step and its twins' paths at save."""

    case: Case
    seed: int
    stop: int
    twins: tuple[str, ...]


def straight(case: Case, seed: int) -> dict[int, Seen]:
    """Each DP rank's whole epoch, computed here, where no learner code runs."""
    return {d: seen(stream(d, case.dp, case.num_samples, seed, case.batch)) for d in range(case.dp)}


def _ids(got: Any) -> list[list[int]] | None:
    try:
        return [list(b) for b, _ in got]
    except (TypeError, ValueError):
        return None  # not batches at all: judged as different from every run


def diagnose(point: Point, resumed: list[Any]) -> str:
    """Why the resumed batches differ, the worst loss first; "" when every rank matches."""
    case, stop = point.case, point.stop
    runs = straight(case, point.seed)
    found: dict[int, str] = {}  # severity -> the first rank's diagnosis
    layout = layout_table(WORLD, case.tp)
    for rank, got in enumerate(resumed):
        dp_rank = layout[rank][1]
        want = runs[dp_rank][stop:]
        if got == want:
            continue
        ids, own = _ids(got) or [], [b for b, _ in want]
        flat, own_flat = [i for b in ids for i in b], [i for b in own for i in b]
        other = next(
            (d for d, s in runs.items() if d != dp_rank and ids == [b for b, _ in s[stop:]]),
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
        elif ids and stop >= 2 and ids == [b for b, _ in runs[dp_rank][stop - 1 :]][: len(ids)]:
            found.setdefault(
                1,
                (
                    f"rank {rank} (DP rank {dp_rank}) resumed one batch before the saved place "
                    f"({flat[:6]}, where the straight run went on with {own_flat[:6]}): the "
                    "state after step k already counts batch k; restore the offset as saved"
                ),
            )
        elif ids and ids == [b for b, _ in runs[dp_rank][: len(ids)]]:
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


def twins_differ(digests: list[dict[str, str]]) -> str:
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
