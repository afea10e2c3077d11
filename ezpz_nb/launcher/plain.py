"""Replies read as plain data only, for runs whose replies a checker trusts.

A rank's reply is a pickle, and unpickling runs whatever the pickle names: an
``int`` subclass whose ``__reduce__`` is ``(eval, "...")``, returned by a learner's
function (or slipped into a checker job's reply by code that patched the rank),
runs in the notebook and can rewrite the checker that judges it. Inside
:func:`plain_replies` (the workshop's ``run_job`` opens it around every check) a
reply may name only plain data: Python's containers and numbers, numpy arrays and
scalars, torch tensors, and ezpz_nb's own records (named tuples, dataclasses and
enums: the protocol's messages, ledgers, failures). Anything else, a class the
learner defined or a function to call, is refused before it is called, and the
rank's reply becomes an ``Unpicklable`` failure that names it. Notebook side only.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ezpz_nb.launcher import wire

__all__ = ["loads_reply", "plain_replies"]

_PLAIN: ContextVar[bool] = ContextVar("ezpz_nb_plain_replies", default=False)

_BUILTINS = frozenset(
    {"int", "float", "complex", "bool", "str", "bytes", "bytearray", "list", "tuple", "dict"}
    | {"set", "frozenset", "slice", "range"}
)
# The functions numpy's and torch's own pickles call to rebuild an array, a scalar or a
# tensor (their classes are allowed by the rule in _allowed); nothing else of theirs.
_REBUILDERS = frozenset(
    {
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("collections", "OrderedDict"),
        ("collections", "Counter"),
        ("collections", "deque"),
    }
)


@contextmanager
def plain_replies() -> Iterator[None]:
    """Within this block, rank replies are read by :func:`loads_reply`'s plain rules."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


class _Refused(pickle.UnpicklingError):
    def __init__(self, module: str, name: str) -> None:
        super().__init__(f"{module}.{name}")
        # cloudpickle's helpers rebuild a class or function defined in the notebook
        by_value = module.split(".")[0] == "cloudpickle"
        self.what = (
            "a class or function defined in your notebook" if by_value else f"{module}.{name}"
        )


def _storage_from_bytes(data: bytes) -> Any:
    # torch pickles a tensor's storage as torch.save bytes, read back by a function that
    # calls torch.load(weights_only=False): a pickle inside the pickle. Read them with
    # torch's own weights-only unpickler instead, which builds storages and nothing else.
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _allowed(module: str, name: str) -> bool:
    if module == "builtins":
        return name in _BUILTINS
    if (module, name) in _REBUILDERS:
        return True
    top = module.split(".")[0]
    if top not in ("ezpz_nb", "numpy", "torch"):
        return False
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    if top == "torch":
        import torch

        # a dtype is pickled by name (torch.float32); a shape or device is called with data
        return isinstance(obj, torch.dtype) or obj in (torch.Size, torch.device)
    if not isinstance(obj, type):
        return False
    if top == "numpy":  # ndarray, dtype, the scalar and dtype classes: built from bytes
        import numpy

        return obj is not numpy.memmap and issubclass(
            obj, (numpy.ndarray, numpy.dtype, numpy.generic)
        )
    # ezpz_nb's records: data, whose construction runs no code of a learner's
    return issubclass(obj, (tuple, enum.Enum, Exception)) or dataclasses.is_dataclass(obj)


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch.storage", "_load_from_bytes"):
            return _storage_from_bytes
        if _allowed(module, name):
            return super().find_class(module, name)
        raise _Refused(module, name)


def loads_reply(data: bytes) -> Any:
    """A rank's message: :func:`wire.loads`, or inside :func:`plain_replies` plain data only.

    A refused reply comes back as :class:`wire.Unpicklable`, which the run reports as
    that rank's failure (what it named, and to return plain data).
    """
    if not _PLAIN.get():
        return wire.loads(data)
    try:
        return _PlainUnpickler(io.BytesIO(data)).load()
    except _Refused as err:
        return wire.Unpicklable(
            "reply",
            f"it names {err.what}, and a check reads only plain data: a class or function "
            "of yours would run in the notebook",
        )
