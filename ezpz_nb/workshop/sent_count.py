"""How much a collective's payload carries, whatever Python type carries it (notebook 16).

:mod:`.sent_log` records each collective a rank makes, with how many numbers it sent and the
first of them; :func:`carried` says both. A "number" is what a float64 holds, 8 bytes: a
tensor counts its elements (a byte tensor its bytes, 8 a number, or the object it pickles),
text and bytes their size, an int one number per 64 bits, and an object of any other type
what pickle would write of it (``__reduce_ex__``: its arguments, state and items). Issue 45's
seventh trial sent every loss in a ``collections.deque``, as complex numbers and packed into
one int, each counted as 0 or 1 number before. Standard library only: a rank imports it.
"""

from __future__ import annotations

import json
import numbers
import pickle
import re
import struct
import types
from typing import Any

__all__ = ["carried"]

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


def _words(size: int) -> int:
    """How many float64s ``size`` bytes would fill: the count of a payload judged by size."""
    return -(-size // _WORD)


def _numbers(obj: Any, out: list[float], depth: int = 0) -> int:
    """Append the numbers ``obj`` holds (tensors, arrays, nested containers, a pickled
    object's bytes) to ``out``, up to :data:`_KEEP`; return how many float64s' worth it holds.

    What a payload carries is what pickle would write of it: an object of any other type
    is walked as pickle sees it (``__reduce_ex__``: its arguments, its state, its items);
    an int counts one number per 64 bits, text and bytes one per 8 bytes at least.
    """
    if isinstance(obj, bool) or obj is None:
        return 0
    if depth > _DEPTH:
        return _words(len(pickle.dumps(obj)))
    if isinstance(obj, int):
        bits = abs(obj).bit_length()
        if bits <= 1023:  # beyond, no float holds it: counted, not kept
            out.append(float(obj))
        return max(1, -(-bits // (8 * _WORD)))
    if isinstance(obj, float):
        out.append(float(obj))
        return 1
    if isinstance(obj, complex):
        out.extend((obj.real, obj.imag))
        return 2
    if hasattr(obj, "detach") and hasattr(obj, "numel"):  # a tensor
        size = int(obj.numel()) * int(obj.element_size())
        if obj.element_size() == 1:  # bytes: an ``*_object`` call's pickle, or packed data
            try:
                return _numbers(pickle.loads(obj.detach().numpy().tobytes()), out, depth + 1)
            except Exception:  # noqa: BLE001 - not a pickle: counted by its size
                return _words(size)
        flat = obj.detach().reshape(-1)[: max(0, _KEEP - len(out))]
        out.extend(float(v) for v in flat.tolist())
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
            return _words(len(obj))
        return _numbers(list(struct.unpack(f"<{len(obj) // _WORD}d", obj)), out, depth + 1)
    if isinstance(obj, str):
        return _text(obj, out, depth)
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        return 0  # pickled by name: no data of the rank's (a partial or a method is walked)
    if isinstance(obj, numbers.Real):  # a Fraction, a Decimal: its value kept, its size counted
        out.append(float(obj))
    return _reduced(obj, out, depth)


def carried(obj: Any) -> tuple[int, list[float]]:
    """How many float64s' worth of numbers ``obj`` carries when sent, and the first of them
    (:data:`_KEEP`): what a recorded collective's ``sent`` line says of its payload."""
    kept: list[float] = []
    return _numbers(obj, kept), kept[:_KEEP]


def _text(obj: str, out: list[float], depth: int) -> int:
    """A number or JSON written out; numbers in other text (issue 45's fifth trial: every
    loss joined by ";"); either way at least the text's size, a float64 per 8 bytes."""
    size = _words(len(obj.encode("utf-8", "surrogatepass")))
    try:
        return max(size, _numbers(json.loads(obj), out, depth + 1))
    except (ValueError, RecursionError):
        pass
    found = _NUMBER.findall(obj)
    out.extend(float(v) for v in found[: max(0, _KEEP - len(out))])
    return max(size, len(found))


def _reduced(obj: Any, out: list[float], depth: int) -> int:
    """What pickle writes of ``obj``: the arguments, state and items of its reduction."""
    try:
        parts = obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    except Exception:  # noqa: BLE001 - pickled some other way: counted by its size
        parts = None
    if not isinstance(parts, tuple):
        try:
            return _words(len(pickle.dumps(obj)))
        except Exception:  # noqa: BLE001 - not picklable: it cannot be sent either
            return 0
    args, state, items, pairs = (list(parts[1:5]) + [None] * 4)[:4]
    return (
        _numbers(list(args or ()), out, depth + 1)
        + _numbers(state, out, depth + 1)
        + (_numbers(list(items), out, depth + 1) if items is not None else 0)
        + (_numbers(dict(pairs), out, depth + 1) if pairs is not None else 0)
    )
