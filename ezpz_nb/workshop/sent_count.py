"""How much a collective's payload carries, whatever Python type carries it (notebook 16).

:mod:`.sent_log` records each collective a rank makes, with how many numbers it sent and the
numbers themselves; :func:`payload` says both. A "number" is what a float64 holds, 8 bytes: a
tensor counts its elements (a byte tensor its bytes, 8 a number, or the object it pickles),
text and bytes their size, an int one number per 64 bits, and an object of any other type
what pickle would write of it (``__reduce_ex__``: its arguments, state and items). Issue 45's
seventh trial sent every loss in a ``collections.deque``, as complex numbers and packed into
one int, each counted as 0 or 1 number before.

The numbers are kept exact (a float, an int, a ``Fraction``; a number written in text as the
value its digits say), and what holds no number (the letters of text, bytes that are not
float64s, an int past 64 bits) is kept as its size in bits and a digest: :mod:`.sent_bits`
counts from both the bits a payload carries beyond what the checker can explain, which a
packing of every loss at a few bits each exceeds where its float64s do not (stop 56).
Standard library only: a rank imports it.
"""

from __future__ import annotations

import hashlib
import numbers
import pickle
import re
import struct
import types
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

__all__ = ["Payload", "carried", "payload"]

#: Numbers kept per call (the count is kept whole): a pair is 2, a shard's losses at most 80.
_KEEP = 256
#: A number written in text: digits, a point, an exponent.
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
#: A "number" is what a float64 holds: 8 bytes, 64 bits, about 16 significant digits. What a
#: send carries is counted in those, whatever Python type carries it (issue 45's seventh
#: trial: every loss in a deque, as complex numbers, packed into one int, each counted 0 or 1).
_WORD = 8
#: How deep the objects inside a send are walked; deeper is counted by its pickled size.
_DEPTH = 32
#: Past these, an int, a fraction or a number in text is kept as its bits and a digest, not
#: as its value: none of the values the checker explains (sums, counts, means) comes near.
_INT_BITS, _FRACTION_BITS, _LITERAL = 64, 256, 80


@dataclass
class Payload:
    """What a send carries: ``count`` float64s' worth; ``kept``, its numbers, exact (the first
    :data:`_KEEP`); ``opaque``, what holds no number, as (bits, digest) pairs."""

    count: int = 0
    kept: list[float | int | Fraction] = field(default_factory=list)
    opaque: list[tuple[int, str]] = field(default_factory=list)

    def keep(self, value: float | int | Fraction) -> None:
        if len(self.kept) < _KEEP:
            self.kept.append(value)

    def hide(self, bits: int, data: bytes) -> None:
        """Keep ``data`` as its size in bits (which the checker counts) and a digest (so that
        what every rank sends alike, a dict's keys, is told from what only one sends)."""
        if bits <= 0:
            return
        if len(self.opaque) < _KEEP:
            self.opaque.append((bits, hashlib.blake2b(data, digest_size=8).hexdigest()))
        else:  # past the first _KEEP, one item holds the rest: the record line stays short
            last_bits, last = self.opaque[-1]
            digest = hashlib.blake2b(last.encode() + data, digest_size=8).hexdigest()
            self.opaque[-1] = (last_bits + bits, digest)


def _words(size: int) -> int:
    """How many float64s ``size`` bytes would fill: the count of a payload judged by size."""
    return -(-size // _WORD)


def _pickled(obj: Any, out: Payload) -> int:
    """``obj`` counted by its pickled size, kept as opaque bytes; 0 if it cannot be pickled
    (then it cannot be sent either)."""
    try:
        data = pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - not picklable
        return 0
    out.hide(8 * len(data), data)
    return _words(len(data))


def _numbers(obj: Any, out: Payload, depth: int = 0) -> int:
    """Keep the numbers ``obj`` holds (tensors, arrays, nested containers, a pickled object's
    bytes) in ``out``; return how many float64s' worth it holds.

    What a payload carries is what pickle would write of it: an object of any other type
    is walked as pickle sees it (``__reduce_ex__``: its arguments, its state, its items);
    an int counts one number per 64 bits, text and bytes one per 8 bytes at least.
    """
    if isinstance(obj, bool) or obj is None:
        return 0
    if depth > _DEPTH:
        return _pickled(obj, out)
    if isinstance(obj, (int, float, complex)):
        # A subclass of one pickles its instance dict too: what it holds there counts.
        extra = _numbers(vars(obj), out, depth + 1) if getattr(obj, "__dict__", None) else 0
        return _scalar(obj, out) + extra
    if hasattr(obj, "detach") and hasattr(obj, "numel"):  # a tensor
        size = int(obj.numel()) * int(obj.element_size())
        if obj.element_size() == 1:  # bytes: an ``*_object`` call's pickle, or packed data
            raw = obj.detach().numpy().tobytes()
            try:
                return _numbers(pickle.loads(raw), out, depth + 1)
            except Exception:  # noqa: BLE001 - not a pickle: bytes, as packed doubles or not
                return _numbers(raw, out, depth + 1)
        flat = obj.detach().reshape(-1)[: max(0, _KEEP - len(out.kept))]
        for v in flat.tolist():
            _scalar(v, out)
        return max(int(obj.numel()), _words(size))
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return _numbers(obj.tolist(), out, depth + 1)
    if isinstance(obj, dict):
        return sum(
            _numbers(k, out, depth + 1) + _numbers(v, out, depth + 1) for k, v in obj.items()
        )
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(_numbers(v, out, depth + 1) for v in obj)
    if isinstance(obj, (bytes, bytearray)):  # packed doubles (struct, array, numpy bytes)
        if len(obj) % _WORD:
            out.hide(8 * len(obj), bytes(obj))
            return _words(len(obj))
        return _numbers(list(struct.unpack(f"<{len(obj) // _WORD}d", obj)), out, depth + 1)
    if isinstance(obj, str):
        return _text(obj, out)
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return 0  # pickled by name: no data of the rank's (a partial or a method is walked)
    if type(obj) is Fraction:  # its exact value: a right answer's exact sum is one
        count = _reduced(obj, Payload(), depth)  # its size as pickled; its value kept below
        if max(obj.numerator.bit_length(), obj.denominator.bit_length()) <= _FRACTION_BITS:
            out.keep(obj)
        else:
            out.hide(obj.numerator.bit_length() + obj.denominator.bit_length(), str(obj).encode())
        return count
    if isinstance(obj, numbers.Real):  # another real type: its value kept, its state walked
        out.keep(float(obj))
    return _reduced(obj, out, depth)


def _scalar(obj: int | float | complex, out: Payload) -> int:
    """An int (one number per 64 bits: past 64 kept as its bits), a float or a complex."""
    if isinstance(obj, int):
        bits = abs(obj).bit_length()
        if bits <= _INT_BITS:
            out.keep(int(obj))
        else:  # a packed int: its bits, not its value (which no float holds exactly)
            out.hide(bits + 1, str(int(obj)).encode())
        return max(1, -(-bits // (8 * _WORD)))
    if isinstance(obj, float):
        out.keep(float(obj))
        return 1
    out.keep(obj.real)
    out.keep(obj.imag)
    return 2


def payload(obj: Any) -> Payload:
    """What ``obj`` carries when sent: what a recorded collective's ``sent`` line says."""
    out = Payload()
    out.count = _numbers(obj, out)
    return out


def carried(obj: Any) -> tuple[int, list[float | int | Fraction]]:
    """How many float64s' worth of numbers ``obj`` carries when sent, and the first of them
    (:data:`_KEEP`), exact."""
    got = payload(obj)
    return got.count, got.kept


def _text(obj: str, out: Payload) -> int:
    """Numbers written out (JSON, or issue 45's fifth trial: every loss joined by ";"), each
    kept as the exact value its digits say; the rest of the text (letters, brackets) kept as
    opaque bits. Either way at least the text's size, a float64 per 8 bytes."""
    size = _words(len(obj.encode("utf-8", "surrogatepass")))
    found = _NUMBER.findall(obj)
    for literal in found:
        value = _literal(literal)
        if value is None:
            out.hide(8 * len(literal), literal.encode())
        else:
            out.keep(value)
    rest = _NUMBER.sub("", obj).encode("utf-8", "surrogatepass")
    out.hide(8 * len(rest), rest)
    return max(size, len(found))


def _literal(text: str) -> int | Fraction | None:
    """The exact value a number in text says; None past :data:`_LITERAL` characters or an
    exponent no sum or count has (kept as opaque bits instead)."""
    exponent = re.search(r"[eE]([-+]?\d+)$", text)
    if len(text) > _LITERAL or (exponent and abs(int(exponent.group(1))) > 400):
        return None
    value = Fraction(text.lstrip("+") or "0")
    return value.numerator if value.denominator == 1 else value


def _reduced(obj: Any, out: Payload, depth: int) -> int:
    """What pickle writes of ``obj``: the arguments, state and items of its reduction."""
    try:
        parts = obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    except Exception:  # noqa: BLE001 - pickled some other way: counted by its size
        parts = None
    if not isinstance(parts, tuple):
        return _pickled(obj, out)
    args, state, items, pairs = (list(parts[1:5]) + [None] * 4)[:4]
    return (
        _numbers(list(args or ()), out, depth + 1)
        + _numbers(state, out, depth + 1)
        + (_numbers(list(items), out, depth + 1) if items is not None else 0)
        + (_numbers(dict(pairs), out, depth + 1) if pairs is not None else 0)
    )
