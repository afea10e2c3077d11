"""Notebook 17's checker (ezpz_nb.workshop.mixture): dodges rejected, right answers accepted.

Every answer runs on 4 real ranks (one warm Cluster), inside real DataLoader workers. The
corpus below is the checker's specification: 0 false passes, 0 false failures.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import ezpz_nb as ez
from ezpz_nb.data.mixture import Mixture
from ezpz_nb.workshop.mixture import check_mix_batch

#: Checks per answer: each draws its own sizes, weights and seed (`make stress`: 20).
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "4"))


def library_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Right: the stratified Mixture's plan, this rank's slots of batch ``step``."""
    plan = Mixture(tuple(sizes), tuple(weights), global_batch, "stratified", seed).plan(step + 1)
    m = global_batch // dp_size
    lo = step * global_batch + dp_rank * m
    return [(int(s), int(i)) for s, i in plan[lo : lo + m]]


def same_rounding_every_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the same greedy composition every batch (each slot to the source furthest behind
    within the batch), samples of a source in plain order: within one sample in every batch,
    but the same rounding each time drifts cumulatively."""
    w = np.asarray(weights) / sum(weights)
    counts = np.zeros(len(w))
    src = []
    for i in range(global_batch):
        s = int(np.argmax(w * (i + 1) - counts))
        src.append(s)
        counts[s] += 1
    before = {s: step * int(counts[s]) for s in range(len(w))}
    out = []
    for s in src:
        out.append((s, before[s] % sizes[s]))
        before[s] += 1
    m = global_batch // dp_size
    return out[dp_rank * m : (dp_rank + 1) * m]


def quotas_in_order(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Right, unusually: no randomness at all. Each batch takes floor(weight * batch) of each
    source, the rest to the sources furthest behind over all batches so far; the sources'
    blocks side by side, the samples of a source in plain order 0, 1, 2... (a numpy array)."""
    w = np.asarray(weights, dtype=float) / sum(weights)
    done = np.zeros(len(w), dtype=int)
    for b in range(step + 1):
        quota = np.floor(w * global_batch).astype(int)
        behind = w * (b + 1) * global_batch - (done + quota)
        extra = global_batch - int(quota.sum())
        quota[np.argsort(-behind, kind="stable")[:extra]] += 1
        if b < step:
            done += quota
    pairs = np.array(
        [(s, (done[s] + k) % sizes[s]) for s in range(len(w)) for k in range(quota[s])]
    )
    m = global_batch // dp_size
    return pairs[dp_rank * m : (dp_rank + 1) * m]


def yields_pairs(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge by mistake: a generator (it cannot leave a DataLoader worker)."""
    yield from library_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed)


def returns_an_iterator(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """The same mistake without ``yield``: ``map`` returns an iterator."""
    return map(tuple, library_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed))


def per_rank_sampling(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: each rank draws its own sources and samples (seeded by its rank)."""
    rng = np.random.default_rng([seed, step, dp_rank])
    m = global_batch // dp_size
    src = rng.choice(len(weights), size=m, p=np.asarray(weights) / sum(weights))
    return [(int(s), int(rng.integers(sizes[s]))) for s in src]


def round_robin(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: deterministic and layout-free, but every source in turn, whatever its weight."""
    m = global_batch // dp_size
    first = step * global_batch + dp_rank * m
    out = []
    for p in range(first, first + m):
        s = p % len(sizes)
        out.append((s, (p // len(sizes)) % sizes[s]))
    return out


class SameSeedInEveryWorker:
    """Dodge (HF datasets #7567): one generator made up front; each DataLoader worker gets a
    copy of it in the same state, so the workers draw the same batches."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __call__(self, sizes, weights, global_batch, step, dp_rank, dp_size, seed):
        quota = Mixture(tuple(sizes), tuple(weights), global_batch).plan(1)[:, 0]
        src = self.rng.permutation(quota)
        out = [(int(s), int(self.rng.integers(sizes[s]))) for s in src]
        m = global_batch // dp_size
        return out[dp_rank * m : (dp_rank + 1) * m]


def same_seed_every_step(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the right shares, the same order at every layout, but the picks come from the
    seed alone: every step hands out the same samples again."""
    rng = np.random.default_rng(seed)
    quota = Mixture(tuple(sizes), tuple(weights), global_batch).plan(1)[:, 0]
    out = [(int(s), int(rng.integers(sizes[s]))) for s in quota]
    m = global_batch // dp_size
    return out[dp_rank * m : (dp_rank + 1) * m]


def right_for_eight_steps(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the right plan for the first 8 global batches, the same rounding after (a
    horizon fitted to a fixed number of batches)."""
    if step < 8:
        return library_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed)
    return same_rounding_every_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed)


def slot_size_for_four(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the right global batch, but this rank's slots sized for dp 4 whatever dp_size is."""
    whole = library_answer(sizes, weights, global_batch, step, 0, 1, seed)
    m = global_batch if dp_size == 1 else global_batch // 4
    return whole[dp_rank * m : (dp_rank + 1) * m]


def global_batch_of_twelve(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the global_batch argument ignored, 12 assumed (the old checker's fixed batch)."""
    whole = library_answer(sizes, weights, 12, step, 0, 1, seed)
    m = 12 // dp_size
    return whole[dp_rank * m : (dp_rank + 1) * m]


def not_done(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    raise NotImplementedError


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(4, timeout=60) as c:
        yield c


@pytest.mark.parametrize("fn", [library_answer, quotas_in_order])
def test_right_answers_pass(cluster, fn):
    """Guards against false failures: the library's stratified plan and quotas with the
    sources side by side and samples in order (no randomness, a numpy array) both pass."""
    for _ in range(DRAWS):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "correct", got.message


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (per_rank_sampling, "must not depend on the layout"),
        (round_robin, "against a target"),
        (SameSeedInEveryWorker(), "must not depend on the layout"),
        (same_seed_every_step, "again"),
        (same_rounding_every_batch, "drifts"),
        (right_for_eight_steps, "drifts"),
        (returns_an_iterator, "cannot leave a DataLoader worker"),
    ],
)
def test_dodges_are_rejected_by_the_rule_they_break(cluster, fn, says):
    """Guards against false passes: per-rank sampling (layout), a weight-blind round-robin
    (shares), one generator copied into every worker (layout) and picks from the seed alone
    (repeats) are each turned down, by the rule each one breaks."""
    for _ in range(DRAWS):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong" and says in got.message, got.message


@pytest.mark.parametrize("fn", [slot_size_for_four, global_batch_of_twelve])
def test_fixed_sizes_are_rejected(cluster, fn):
    """Guards H11's dodges of a fixed layout: a slot size fitted to dp 4 and a global batch
    fitted to 12 are turned down on every draw (the drawn DP size or batch differs)."""
    for _ in range(DRAWS):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong", got.message


def test_a_generator_is_refused_at_once():
    """Guards issue 45's "the ranks hung ... after the cluster's whole timeout": ``yield`` in
    mix_batch is said at once, before any rank runs (no cluster: none would start)."""
    got = check_mix_batch(yields_pairs, timeout=1)
    assert got.status == "wrong" and "generator" in got.message, got.message
    assert "hung" not in got.message


def test_not_done_and_bad_arguments():
    """Guards the learner's first runs: the stub is "not done" (on fresh ranks), something not
    callable is refused before any rank starts."""
    assert check_mix_batch(not_done).status == "not done"
    assert check_mix_batch([(0, 0)]).status == "wrong"  # type: ignore[arg-type]
