"""Notebook 17's answers, right and wrong, for tests/test_mix_exercise.py.

Kept apart from the tests: a check runs the answer once more in a new Python process
(``workshop/mix_fresh.py``), which imports the module that defines it. Here that is numpy
and the standard library only (torch only for the answers that call the library's
``Mixture`` or ``torch.randperm``), not pytest, torch and the test module's imports:
about a second less of CPU per check on this 2-core machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=256)  # the few-streams rule's 128 seeds each have one
def _plan(sizes, weights, global_batch, seed, steps):
    from ezpz_nb.data.mixture import Mixture  # torch: only the answers that use the library

    return Mixture(sizes, weights, global_batch, "stratified", seed).plan(steps)


def library_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Right: the stratified Mixture's plan, this rank's slots of batch ``step`` (the plan
    kept for the next call, grown by doubling: the far steps reach 10**4)."""
    steps = 1 << max(6, step.bit_length())  # more than step
    plan = _plan(tuple(sizes), tuple(weights), global_batch, seed, steps)
    m = global_batch // dp_size
    lo = step * global_batch + dp_rank * m
    return [(int(s), int(i)) for s, i in plan[lo : lo + m]]


def _notebook_solution():
    """Notebook 17's own solution, read from the stored solutions notebook (plain JSON, which
    ``_build.py --check`` keeps equal to its source) and defined as the notebook defines it."""
    path = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"
    cells = json.loads((path / "17_mixing_solutions.ipynb").read_text(encoding="utf-8"))["cells"]
    (src,) = (
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and "def mix_batch(" in "".join(c["source"])
    )
    # From the function on: the cell also imports the checker (torch), which it does not use.
    src = src[src.index("def mix_batch(") :]
    ns: dict = {"__name__": "mixing_solutions", "np": np}
    exec(compile(src, "<17 solutions cell>", "exec"), ns)
    return ns["mix_batch"]


notebook_solution = _notebook_solution()


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
    """Dodge (the outside trial's "no randomness"): each batch takes floor(weight * batch) of
    each source, the rest to the sources furthest behind over all batches so far; the
    sources' blocks side by side, the samples of a source in plain order 0, 1, 2... (a numpy
    array). Every rule of a stream holds, but the seed changes nothing: every epoch and
    every run gets the same order. Judged right before issue 45's seed rule; since its
    third trial, every pass in the same order shows first."""
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


def seed_ignored(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (outside trial): the notebook's solution with the seed replaced by a constant."""
    return notebook_solution(sizes, weights, global_batch, step, dp_rank, dp_size, 0)


def three_sources_assumed(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (outside trial): fitted to a draw that always had three sources."""
    a, b, c = sizes
    return library_answer((a, b, c), weights, global_batch, step, dp_rank, dp_size, seed)


def replays_24_batches(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (outside trial): a table of 24 global batches replayed (the old checker's
    longest run was 24 batches): the stream restarts at step 24."""
    return notebook_solution(sizes, weights, global_batch, step % 24, dp_rank, dp_size, seed)


def numpy_array_answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Right, unusually (outside trial): the solution's pairs as an (m, 2) numpy int array."""
    return np.array(notebook_solution(sizes, weights, global_batch, step, dp_rank, dp_size, seed))


def grouped_by_source(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Right, unusually (outside trial): the sources' blocks side by side (no shuffle inside
    a batch), a seeded permutation per source and pass, a tuple of tuples."""
    w = np.asarray(weights, dtype=float) / sum(weights)
    done = np.zeros(len(w), dtype=int)
    for b in range(step + 1):
        quota = np.floor(w * global_batch).astype(int)
        behind = w * (b + 1) * global_batch - (done + quota)
        quota[np.argsort(-behind, kind="stable")[: global_batch - int(quota.sum())]] += 1
        if b < step:
            done += quota
    out = []
    for s in range(len(w)):
        for n in range(done[s], done[s] + quota[s]):
            perm = np.random.default_rng([seed, 7 + s, n // sizes[s]]).permutation(sizes[s])
            out.append((s, int(perm[n % sizes[s]])))
    m = global_batch // dp_size
    return tuple(out[dp_rank * m : (dp_rank + 1) * m])


def _reordered(order, early=0):
    """An answer with the library's source in every slot, the ``k``-th draw of source ``s``
    taken as ``order(seed, s, pass, size)[k % size]`` (``pass = (k + early) // size``: a
    pass index counted ``early`` draws early is an off-by-one)."""

    def answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
        steps = 1 << max(6, step.bit_length())  # more than step
        src = _plan(tuple(sizes), tuple(weights), global_batch, seed, steps)[:, 0]
        m = global_batch // dp_size
        lo = step * global_batch + dp_rank * m
        done = np.bincount(src[:lo], minlength=len(sizes))  # each source's draws before
        out = []
        for j in range(lo, lo + m):
            s, n = int(src[j]), sizes[int(src[j])]
            k = int(done[s])
            done[s] += 1
            out.append((s, int(order(seed, s, (k + early) // n, n)[k % n])))
        return out

    return answer


def _fresh(seed, s, p, n):
    return np.random.default_rng([seed, 1 + s, p]).permutation(n)


def _torch_randperm(seed, s, p, n):
    import torch

    g = torch.Generator().manual_seed(hash((seed, s, p)) % 2**62)
    return torch.randperm(n, generator=g).tolist()


#: Right, unusually (issue 45's brief): a fresh torch.randperm per (seed, source, pass).
torch_randperm_per_pass = _reordered(_torch_randperm)
#: Dodge (third trial): no shuffle, each source's samples in index order rotated by the seed.
rotated_by_the_seed = _reordered(lambda seed, s, p, n: np.roll(np.arange(n), -(seed % n)))
#: Dodge (third trial): one permutation per source, the same in every pass.
same_order_every_pass = _reordered(lambda seed, s, p, n: _fresh(seed, s, 0, n))
#: Dodge (third trial): two orders per source, alternating pass by pass.
two_orders_alternating = _reordered(lambda seed, s, p, n: _fresh(seed, s, 0, n)[:: 1 - 2 * (p % 2)])
#: Dodge: one permutation per source, shifted by one place each pass (every pass differs).
one_order_shifted = _reordered(lambda seed, s, p, n: np.roll(_fresh(seed, s, 0, n), p))
#: Dodge: small sources shuffled per pass, the others in index order rotated per pass.
big_sources_rotated = _reordered(
    lambda seed, s, p, n: (
        _fresh(seed, s, p, n) if n < 10 else np.roll(np.arange(n), -(seed + 7 * p))
    )
)


#: Dodge (fourth trial): the seed reaches source 0's orders only; every other source goes
#: through the same orders whatever the seed.
seed_for_source_zero_only = _reordered(lambda seed, s, p, n: _fresh(seed if s == 0 else 0, s, p, n))
#: Mistake (fourth trial): the pass index off by one draw, so each pass's last sample comes
#: from the next pass's order.
pass_off_by_one = _reordered(_fresh, early=1)


#: Mistake (fifth trial): each pass's order seeded with ``seed + source + pass``, so seed
#: ``x + 1`` runs seed ``x``'s orders one pass later (the check's seeds include ``x ^ k``).
seed_plus_pass = _reordered(
    lambda seed, s, p, n: np.random.default_rng(seed + s + p).permutation(n)
)


def seed_mod_1000(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (fourth trial): only ``seed % 1000`` used (1000 streams in all)."""
    return notebook_solution(sizes, weights, global_batch, step, dp_rank, dp_size, seed % 1000)


def low_16_bits(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: only the seed's low 16 bits used."""
    return notebook_solution(sizes, weights, global_batch, step, dp_rank, dp_size, seed & 0xFFFF)


def drawn_with_replacement(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Mistake (fourth trial): the right sources, each sample drawn with replacement from
    (seed, step)."""
    rng = np.random.default_rng([seed, step])
    whole = library_answer(sizes, weights, global_batch, step, 0, 1, seed)
    out = [(s, int(rng.integers(sizes[s]))) for s, _ in whole]
    m = global_batch // dp_size
    return out[dp_rank * m : (dp_rank + 1) * m]


def one_bit_of_the_seed(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (third trial): the seed hashed to one bit, which picks one of two streams."""
    bit = hashlib.sha256(str(seed).encode()).digest()[0] & 1
    return notebook_solution(sizes, weights, global_batch, step, dp_rank, dp_size, 1 + bit)


def _hashed(seed, k):
    return int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "little") % k


def seed_hashed_to(k):
    """Dodge (issue 45's fifth brief): the seed hashed to one of ``k`` values, each one of
    the solution's streams: no twin shares a hash, and 5 seeds fall in 5 streams with a
    chance that grows with ``k`` (about 15% at 7)."""

    def answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
        return notebook_solution(
            sizes, weights, global_batch, step, dp_rank, dp_size, 1 + _hashed(seed, k)
        )

    answer.__name__ = f"seed_hashed_to_{k}"
    return answer


def largest_source_hashed_to_50(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (fifth brief): the seed reaches the largest source through one of 50 values
    only (the others get the whole seed)."""
    big = max(range(len(sizes)), key=lambda s: sizes[s])
    return _reordered(lambda x, s, p, n: _fresh(1 + _hashed(x, 50) if s == big else x, s, p, n))(
        sizes, weights, global_batch, step, dp_rank, dp_size, seed
    )


def replays_from(t):
    """Dodge (fifth brief): the stream right up to step ``t - 1``, then again from step 0
    (a table of ``t`` batches), for ``t`` past the old checker's reach (128)."""

    def answer(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
        return notebook_solution(sizes, weights, global_batch, step % t, dp_rank, dp_size, seed)

    answer.__name__ = f"replays_{t}"
    return answer


def stops_at_128(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (fifth brief): the stream right up to step 128, then that batch at every step."""
    return notebook_solution(sizes, weights, global_batch, min(step, 128), dp_rank, dp_size, seed)


def replays_80_batches(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge (third trial's open class): a table of 80 global batches replayed, longer than
    any horizon (32 to 64): the far steps hold the table's batches again."""
    return notebook_solution(sizes, weights, global_batch, step % 80, dp_rank, dp_size, seed)


def _cached_epoch():
    """Right, unusually (third trial, rejected before): the stream of a case built once and
    kept in a ``functools.lru_cache`` helper of the notebook's ``__main__``, lists of lists,
    pure Python (random.Random(str) shuffles), grown by doubling (the far steps reach 10**4:
    each build costs its length, not its square). Defined as a notebook cell defines it, so
    both functions travel by value."""
    ns: dict = {"__name__": "__main__"}
    src = (
        "import random\n"
        "from functools import lru_cache\n"
        "@lru_cache(maxsize=4)\n"
        "def _epoch(sizes, weights, g, seed, steps):\n"
        "    w = [x / sum(weights) for x in weights]\n"
        "    done, out, perms = [0] * len(w), [], {}\n"
        "    for b in range(steps):\n"
        "        quota = [int(x * g) for x in w]\n"
        "        behind = [x * (b + 1) * g - d - q for x, d, q in zip(w, done, quota)]\n"
        "        for s in sorted(range(len(w)), key=lambda s: -behind[s])[: g - sum(quota)]:\n"
        "            quota[s] += 1\n"
        "        slots = [s for s in range(len(w)) for _ in range(quota[s])]\n"
        "        random.Random(f'{seed}:{b}').shuffle(slots)\n"
        "        batch = []\n"
        "        for s in slots:\n"
        "            n, size = done[s], sizes[s]\n"
        "            if (s, n // size) not in perms:\n"
        "                perms[s, n // size] = random.Random(f'{seed}:{s}:{n // size}').sample(\n"
        "                    range(size), size)\n"
        "            batch.append([s, perms[s, n // size][n % size]])\n"
        "            done[s] += 1\n"
        "        out.append(batch)\n"
        "    return out\n"
        "def mix_batch(sizes, weights, global_batch, step, dp_rank, dp_size, seed):\n"
        "    steps = 1 << max(4, step.bit_length())  # the cache doubles when needed\n"
        "    batch = _epoch(tuple(sizes), tuple(weights), global_batch, seed, steps)[step]\n"
        "    m = global_batch // dp_size\n"
        "    return batch[dp_rank * m : (dp_rank + 1) * m]\n"
    )
    exec(compile(src, "<17 cached epoch cell>", "exec"), ns)
    return ns["mix_batch"]


cached_epoch = _cached_epoch()


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
        quota = _plan(tuple(sizes), tuple(weights), global_batch, 0, 1)[:, 0]
        src = self.rng.permutation(quota)
        out = [(int(s), int(self.rng.integers(sizes[s]))) for s in src]
        m = global_batch // dp_size
        return out[dp_rank * m : (dp_rank + 1) * m]


def same_seed_every_step(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    """Dodge: the right shares, the same order at every layout, but the picks come from the
    seed alone: every step hands out the same samples again."""
    rng = np.random.default_rng(seed)
    quota = _plan(tuple(sizes), tuple(weights), global_batch, 0, 1)[:, 0]
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


class HardCodedBatch:
    """Dodge: the global_batch argument ignored, one of the checker's own sizes assumed; the
    rest right. Before each check also ran a second batch, it passed whenever its size was
    drawn (1 check in 4)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __repr__(self) -> str:
        return f"batch_of_{self.size}"

    def __call__(self, sizes, weights, global_batch, step, dp_rank, dp_size, seed):
        whole = library_answer(sizes, weights, self.size, step, 0, 1, seed)
        m = self.size // dp_size
        return whole[dp_rank * m : (dp_rank + 1) * m]


def not_done(sizes, weights, global_batch, step, dp_rank, dp_size, seed):
    raise NotImplementedError
