"""Notebook 12's balance rules (the checker is :mod:`.throughput`): how the work of loading
is spread over the ranks, read from the ledger's sample ids and the dataset's words (counts,
no clock), where the rank that waits for its loads is judged on whether it also makes the
others wait.

* :func:`words_per_rank`: each rank's words over an epoch (the work moved, or not);
* :func:`step_words`: each step's slowest rank's words against the ranks' mean, summed
  over an epoch. Equal words over the epoch are not enough: a rank that reads its heavy
  documents in the first half of the epoch and another that reads them in the second half
  hold the same words, yet at every step one of them loads five times the other's words
  while the other waits for it in the all-reduce (issue 45's twelfth trial);
* :func:`unequal_batches`: the same number of samples on every rank at every step.
"""

from __future__ import annotations

from typing import NamedTuple

from ezpz_nb.ledger import Ledger
from ezpz_nb.models import TokenizingDataset

__all__ = ["STEP_BALANCED", "StepWords", "step_words", "unequal_batches", "words_per_rank"]

#: Rebalanced at every step: summed over an epoch's steps, the slowest rank's batch holds at
#: most this many times the ranks' mean words. Here every epoch's mean is 23,040 words; the
#: slow loader's heavy rank (every step's slowest) holds 38,400, 1.67x, as does the twelfth
#: trial's heavy halves read in turn. A shuffled sampler (the notebook's solution: 1.10x and
#: 1.17x) sums 1 + D / 96, D the heavy documents by which the two ranks' batches differ over
#: 8 steps: 1.13x on average, and over 1.4x (D >= 39) with a chance of 1.2e-10 an epoch for
#: a shuffled DistributedSampler, 4.6e-11 for each rank's half shuffled alone (worked out
#: exactly, step by step, from the heavy documents left: tests/test_throughput_exercise.py).
STEP_BALANCED = 1.4


def words_per_rank(data: TokenizingDataset, ledger: Ledger, epoch: int) -> dict[int, int]:
    """``{rank: words of the documents it trained on in epoch}``, from the ledger's sample ids."""
    return {
        rank: sum(
            data.words_of(i)
            for r in ledger.records
            if r.rank == rank and r.epoch == epoch
            for i in r.sample_ids
        )
        for rank in ledger.ranks()
    }


class StepWords(NamedTuple):
    """An epoch's steps, in words of the samples each rank's batch holds.

    Attributes:
        steps: The epoch's steps (any rank's).
        slowest: Summed over them, the words of the step's largest batch.
        mean: Summed over them, the ranks' mean words (a rank with no batch at a step: 0).
    """

    steps: int
    slowest: int
    mean: float

    def ratio(self) -> float:
        """How many times the ranks' mean the slowest rank's batches hold (1.0: balanced)."""
        return self.slowest / self.mean if self.mean else 1.0


def step_words(data: TokenizingDataset, ledger: Ledger, epoch: int) -> StepWords:
    """The words of every step of ``epoch``: the slowest rank's, and the ranks' mean."""
    ranks = ledger.ranks()
    at: dict[int, dict[int, int]] = {}
    for r in ledger.records:
        if r.epoch == epoch:
            mine = at.setdefault(r.step, {})
            mine[r.rank] = mine.get(r.rank, 0) + sum(data.words_of(i) for i in r.sample_ids)
    slowest = sum(max(by_rank.values()) for by_rank in at.values())
    mean = sum(sum(by_rank.values()) / len(ranks) for by_rank in at.values())
    return StepWords(len(at), slowest, mean)


def unequal_batches(ledger: Ledger) -> str:
    """The first step (no rank's last of its epoch) whose batches differ in size across the
    ranks, in words; "" if none. DDP averages each rank's mean gradient, so a sample of a
    batch of 4 weighs 3x one of a batch of 12: balancing the words by batch sizes changes
    what is trained (the eleventh trial's rank of 12-sample and rank of 4-sample batches)."""
    sizes: dict[tuple[int, int], dict[int, int]] = {}
    last: dict[tuple[int, int], int] = {}
    for r in ledger.records:
        sizes.setdefault((r.epoch, r.step), {})[r.rank] = len(r.sample_ids)
        last[(r.epoch, r.rank)] = max(last.get((r.epoch, r.rank), 0), r.step)
    for (epoch, step), by_rank in sorted(sizes.items()):
        if any(step == last[(epoch, rank)] for rank in by_rank) or len(set(by_rank.values())) < 2:
            continue
        said = ", ".join(f"rank {rank} {n}" for rank, n in sorted(by_rank.items()))
        return (
            f"In epoch {epoch}, step {step}, the ranks' batches hold different numbers of "
            f"samples ({said}). DDP averages each rank's mean gradient, so a sample of the "
            "smaller batch weighs more than one of the larger: balance the work with the same "
            "batch size on every rank (spread the long documents, or load them beside the "
            "steps), not with batch sizes."
        )
    return ""
