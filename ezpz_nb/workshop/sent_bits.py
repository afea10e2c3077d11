"""How many bits a rank's collectives carried that its sum and its count do not explain (notebook 16).

A right answer sends its (sum, count), maybe the total or the mean back (a root's broadcast),
zeros (a one-hot table), a pickle's size: numbers the checker can name from its own read log.
Every loss packed a few bits each is numbers it cannot name: stop 56 left packings of 11 bits
a loss or fewer inside :data:`~.sent_rules.MAX_SENT` float64s (passing on 1.7% of draws with
each loss rounded to 11 bits, 12% with the rounding error carried forward, every draw with
the error left after the last loss sent beside). So a payload is counted in bits, as the
shortest description of each number the checker could write:

- a number it can name (a *target*: the rank's part as a sum, its mean or a share of the
  mean, its count, a sum over some ranks of their parts or counts, the total, N, the mean)
  costs the bits that pick which target (``log2`` of how many there are) plus the bits of it
  that differ from the target (its significant bits past those it shares): an exact sum
  costs nothing more, a float32 sum a bit or two, a loss hidden in a sum's low bits its bits;
- any other number costs its significant bits and its exponent (an integer, its digits);
- 0 costs one bit;
- what holds no number (text's letters, raw bytes, a packed int) costs 8 bits a byte, unless
  every rank sent the same (a dict's keys: the same on every rank, they say nothing of any
  rank's losses).

A rank may carry :data:`BUDGET` bits so counted, fewer than its share's losses
(:data:`~.exact_eval.MIN_SHARE`, at least) at one bit each: no packing of every loss fits, at
any number of bits a loss, whatever the float64s it fills. Not counted: which collectives a
rank calls, how many and in what order (every rank must call them alike, so they say little
of one rank's losses). Run in the notebook's process.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any

__all__ = ["BUDGET", "carried_bits", "index_sets"]

#: Bits a rank may carry beyond its targets: under MIN_SHARE (60), so that every loss of a
#: share at one bit each does not fit (exact_eval's tests hold the two together). What right
#: answers cost (tests/test_eval_exercise.py's, 20 draws each on ranks): a (sum, count) pair
#: 10-12 bits, a pickle's size beside 19, reduce then broadcast 17-21; in process, a float32
#: sum's mean divided in float64 (its rounding error kept, ~30 bits) 40. Packings of every
#: loss measured 219 (4 bits a loss) to 785 (11 bits).
BUDGET = 56
#: A float's sign and exponent: what a number the checker cannot name costs past its digits.
_EXPONENT = 12
#: Combinations of the ranks' part variants (sampler padding weighed or not) tried per subset.
_COMBOS = 64
#: How close a sent value is to a part for that part to be the one the rank sent (a float32
#: sum is 2e-7 off: sent_rules' PART_MATCH).
_SENT_PART = 1e-5


def _odd_bits(n: int) -> int:
    """Significant bits of ``n``: its length without its trailing zero bits."""
    n = abs(n)
    return (n >> ((n & -n).bit_length() - 1)).bit_length() if n else 0


def _info(value: Fraction) -> int:
    """Significant bits of a number: a float's significand (a float32's at most 24), a
    fraction's numerator and denominator (a power of two costs nothing: the exponent), a
    number written in decimal its digits' (JSON's ``395.5145309999999``: 52 bits, not 83)."""
    n, d = abs(value.numerator), value.denominator
    bits = max(0, _odd_bits(n) + _odd_bits(d) - 1)
    twos = (d & -d).bit_length() - 1
    rest, fives = d >> twos, 0
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest == 1:  # d divides 10**k: the value is m / 10**k, m's digits
        bits = min(bits, (n * 10 ** max(twos, fives) // d).bit_length())
    return bits


def _alone(value: Fraction) -> int:
    """What a number costs written out whole: an integer its bits and sign, any other its
    significant bits, sign and exponent."""
    if value.denominator == 1 and abs(value.numerator) < 1 << 64:
        return abs(value.numerator).bit_length() + 1
    return _info(value) + _EXPONENT


def _past(value: Fraction, target: Fraction) -> int:
    """The bits of ``value`` that differ from ``target``: its significant bits past the
    leading ones they share (at least log2 of how close it is, rounded down)."""
    if value == target:
        return 0
    off = abs(value - target) / abs(target)
    same = max(0, off.denominator.bit_length() - off.numerator.bit_length() - 1)
    return max(0, _info(value) - same)


def index_sets(mine: set[int], others: set[int]) -> list[list[int]]:
    """The samples a rank's part may cover: those only it read, plus any of those another
    rank read too (at most dp - 1 such, a sampler's padding: a handful of subsets)."""
    own, shared = sorted(mine - others), sorted(mine & others)
    return [
        own + [i for i, p in zip(shared, pick, strict=True) if p]
        for pick in itertools.product((False, True), repeat=len(shared))
    ]


def _variants(rank: int, got: list[Any], exact: list[Fraction]) -> list[tuple[Fraction, int]]:
    """Each (sum, count) the rank's part may be: the losses only it read, plus any of those
    another rank read too (sampler padding, weighed 0 or counted); those it sent (its sum, or
    its mean, within :data:`_SENT_PART`) where it sent one, so that a reduce's partial sums
    over ranks are named from the parts the ranks sent, not from every combination."""
    others = {i for r, (_, rd, _) in enumerate(got) if r != rank for i in rd}
    out = [
        (sum((exact[i] for i in idx), Fraction(0)), len(idx))
        for idx in index_sets(set(got[rank][1]), others)
    ]
    values = [float(v) for _, _, kept in got[rank][2].calls for v in kept]
    n = len(exact)
    sent = [
        (part, count)
        for part, count in out
        if count
        and any(
            abs(v - float(t)) <= _SENT_PART * float(t)
            for v in values
            for t in (part, part / count, part / n)
        )
    ]
    return sent or out


def targets(rank: int, got: list[Any], losses: list[float]) -> set[Fraction]:
    """Every nonzero value the checker can name for ``rank``'s collectives, exact."""
    exact = [Fraction(v) for v in losses]
    n, total = len(exact), sum(exact, Fraction(0))
    variants = [_variants(r, got, exact) for r in range(len(got))]
    named = {total, Fraction(n), total / n}
    dp = len(got)
    for part, count in variants[rank]:
        # Its sum, count and mean; its share of the mean; a 1/dp share of each (an average
        # all-reduce written by hand).
        named |= {part, Fraction(count), part / n, part / dp, Fraction(count, dp)}
        named |= {part / count} if count else set()
    # Sums over two or more ranks: a reduce's partial results (gloo leaves one on a non-root
    # rank, which a broadcast from it then sends) and a root's totals.
    for size in range(2, dp + 1):
        for ranks in itertools.combinations(range(dp), size):
            combos = itertools.islice(itertools.product(*(variants[r] for r in ranks)), _COMBOS)
            for combo in combos:
                named |= {
                    sum((p for p, _ in combo), Fraction(0)),
                    Fraction(sum(c for _, c in combo)),
                }
    return {t for t in named if t}


def _charge(value: float | int | Fraction, named: set[Fraction], pick: int) -> int:
    """The fewest bits that write ``value``: a target picked and corrected, or itself."""
    if isinstance(value, float) and not math.isfinite(value):
        return _EXPONENT
    exact = Fraction(value)
    if not exact:
        return 1
    return min([_alone(exact)] + [pick + _past(exact, t) for t in named])


def carried_bits(rank: int, got: list[Any], losses: list[float]) -> tuple[int, str]:
    """Bits ``rank``'s collectives carried beyond what the checker can name, and the costliest
    of them in words (for the verdict).

    ``got`` holds each rank's (answer, indices it read, :class:`~.sent_log.Sent`), the indices
    from the checker's read log.
    """
    sent = got[rank][2]
    named = targets(rank, got, losses)
    pick = math.ceil(math.log2(len(named) + 1))
    costs = [(_charge(v, named, pick), v) for _, _, kept in sent.calls for v in kept]
    # What holds no number is free where every rank sent it alike (a dict's keys, JSON's
    # brackets): it says nothing of one rank's losses.
    everyone = [{d for _, d in s.opaque} for _, _, s in got]
    alone = sum(bits for bits, d in sent.opaque if not all(d in seen for seen in everyone))
    total = sum(c for c, _ in costs) + alone
    said = [f"{float(v):.6g} ({c} bits)" for c, v in sorted(costs, key=lambda cv: -cv[0])[:3]]
    if alone:
        said.append(f"{alone} bits of text or bytes no other rank sent")
    return total, ", ".join(said)
