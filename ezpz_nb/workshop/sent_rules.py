"""How notebook 16's ranks combined, judged from their record (:mod:`.sent_log`) and the read log.

A rank's sent values must hold the partial sum of what that rank read, which the checker
knows from outside the rank (its server's read log), and not the losses themselves; and no
rank may go through the process group's key-value store or put back the recorder's
wrappers. Run in the notebook's process.
"""

from __future__ import annotations

import math
from typing import Any

from ezpz_nb.workshop.sent_bits import BUDGET, carried_bits, index_sets
from ezpz_nb.workshop.sent_log import Sent
from ezpz_nb.workshop.stops import wrong

__all__ = ["FIX", "judge_channel", "judge_sent", "judge_size"]

#: A sent value equal to a loss the rank read (float32 keeps 7 digits): two such, raw losses.
LOSS_MATCH = 1e-6
#: A sent value that is the rank's part: float32 sums of up to 80 losses stay within 2e-6
#: (a drawn share holds 60 to 80).
PART_MATCH = 1e-5
#: Numbers one rank may send, each a float64's worth (8 bytes, :mod:`.sent_log` counts any
#: Python type so): a pair (2), a reduce then a broadcast (4), a one-hot (dp, 2) table
#: all-reduced (8 at dp 4), and a margin; the losses of a shard (60 to 80, as exact_eval
#: draws them: more than this packed whole, or at 12 bits a loss or more, see its
#: MIN_SHARE) not. Fewer bits a loss fit these float64s: :mod:`.sent_bits` counts bits.
MAX_SENT = 12
# Measured over 1000 draws of exact_eval.draw_case x 3 layouts (strided, blocks, padded with
# weight 0) x float32/float64 pairs: 0 right answers refused, every raw-loss send refused;
# the worst float32 partial sum is 2.1e-7 off (3.8e-7 over 1000 draws with the shares of 44
# to 65 drawn since issue 45's seventh trial: PART_MATCH 1e-5, 26x margin), and the closest
# a pair's sum or count came to a single loss is 1.9e-5 relative (LOSS_MATCH 1e-6: 19x; one
# such match is never enough, it takes two).


def _partials(mine: set[int], others: set[int], losses: list[float]) -> list[float]:
    """What a rank's collectives may carry as its part: the sum of the losses only it read,
    plus any of those another rank read too (padding it weighed 0 or counted), as a sum, a
    mean over its samples, or divided by N (each rank's share of the mean)."""
    n, out = len(losses), []
    # At most dp - 1 indices are read twice (each rank reads at most its share, and every
    # index is read): a handful of subsets.
    for idx in index_sets(mine, others):
        if idx:
            total = math.fsum(losses[i] for i in idx)
            out += [total, total / len(idx), total / n]
    return out


def _near(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


#: What to do instead, the end of every verdict on how the ranks combined.
FIX = "each rank sums what it read, then one all_reduce of the (sum, count) pair."


def judge_channel(rank: int, sent: Sent, case: str) -> None:
    """Stop if ``rank`` went around the collectives: the store used, or the record broken.

    Judged before the value: whatever a rank returned, this is what is wrong with it.
    ``case`` names the drawn case in the verdict.
    """
    fix = FIX
    if not sent.intact:
        raise wrong(
            f"rank {rank} put back or replaced torch.distributed's functions (its collectives, "
            f"the store) the checker watches, so it cannot see how the ranks combined {case}: "
            f"leave them as they are; {fix}"
        )
    if sent.store:
        raise wrong(
            f"your ranks never combined with a collective {case}: rank {rank} went through the "
            f"process group's key-value store ({', '.join(sorted(set(sent.store)))}), which "
            f"is rendezvous plumbing, not a collective: {fix}"
        )


def judge_sent(rank: int, got: list[Any], losses: list[float], case: str) -> None:
    """Stop unless ``rank`` combined through collectives that carried its part, not every loss.

    ``got`` holds each rank's (answer, indices it read, :class:`Sent`), the indices from the
    checker's read log: the rank's partial sum is known from outside the rank, and checked
    against what its record says it sent. ``case`` names the drawn case in the verdict.
    """
    _, _, sent = got[rank]
    fix = FIX
    values = [v for _, _, kept in sent.calls for v in kept]
    if not sum(count for _, count, _ in sent.calls):
        raise wrong(
            f"your ranks never combined with a collective {case}: rank {rank} sent nothing "
            f"through torch.distributed (a file, a socket or the store does not count): {fix}"
        )
    judge_size(rank, got, losses, case)
    if not _carries(rank, got, losses):
        # The root of a combine by hand (the others send it their parts point to point, it
        # sends back what it added up) never sends its own part: it sends the total.
        total = math.fsum(losses)
        root = any(_near(v, t, PART_MATCH) for v in values for t in (total, total / len(losses)))
        if not (root and all(_carries(r, got, losses) for r in range(len(got)) if r != rank)):
            shown = [float(v) for v in values[:4]]
            raise wrong(
                f"rank {rank}'s collectives did not carry the sum of the losses it read {case} "
                f"(it sent {shown}): the mean must come from what the ranks sent: {fix}"
            )


def judge_size(rank: int, got: list[Any], losses: list[float], case: str) -> None:
    """Stop if ``rank`` sent its losses: two of them as they are, more than
    :data:`MAX_SENT` numbers however packed, or more than :data:`~.sent_bits.BUDGET` bits
    its sum, its count and the totals do not explain (a few bits a loss, packed).

    Judged before a wrong mean is worded too: losses sent rounded (issue 45's seventh
    brief: 12 or 16 bits a loss, packed) give a mean close to the truth, which the value's
    verdict would take for a sum kept in float16; what is wrong is that they were sent.
    """
    _, reads, sent = got[rank]
    values = [v for _, _, kept in sent.calls for v in kept]
    numbers = sum(count for _, count, _ in sent.calls)
    mine = [losses[i] for i in reads]
    raw = sum(any(_near(v, loss, LOSS_MATCH) for v in values) for loss in mine)
    if raw >= 2 or numbers > MAX_SENT:
        raise wrong(
            f"you sent every loss {case}: rank {rank} sent {numbers} numbers over the wire "
            "(counted as float64s, whatever type carried them), where a (sum, count) pair "
            f"per rank gives the same exact mean: {FIX}"
        )
    bits, said = carried_bits(rank, got, losses)
    if bits > BUDGET:
        raise wrong(
            f"you sent more than a (sum, count) {case}: rank {rank}'s collectives carried "
            f"{bits} bits that its sum, its count and the ranks' totals do not explain "
            f"({said}). At most {BUDGET} may, fewer than its {len(mine)} losses at one bit "
            f"each: losses packed however few bits each do not fit. Instead, {FIX}"
        )


def _carries(rank: int, got: list[Any], losses: list[float]) -> bool:
    """Whether ``rank`` sent, in some collective, its part of what the ranks read."""
    _, reads, sent = got[rank]
    others = {i for r, (_, rd, _) in enumerate(got) if r != rank for i in rd}
    values = [v for _, _, kept in sent.calls for v in kept]
    return any(
        _near(v, p, PART_MATCH) for p in _partials(set(reads), others, losses) for v in values
    )
