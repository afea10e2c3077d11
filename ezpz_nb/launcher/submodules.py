"""Which of a function's imported submodules its code really reaches.

cloudpickle sends, with every function pickled by value, the submodules of its
global modules that are imported in the notebook and whose names appear anywhere
in the function's code, so that the rank imports them before the function runs.
It matches names, not uses: after a notebook imports ``torch.distributed.tensor``
(notebooks 07 and 08 do), every function that calls ``torch.tensor(...)`` and
uses ``dist`` makes each rank import DTensor on every run, a second or more
under load, because ``tensor`` is a name in its code.

:func:`reached` keeps a listed submodule only where the code's attribute chains
may reach it: ``dist.tensor`` from ``dist`` (torch.distributed) does,
``torch.tensor`` from ``torch`` does not. A chain whose start cannot be
resolved (a local variable, a closure of a nested function) keeps it, as
cloudpickle would.
"""

from __future__ import annotations

import dis
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["reached"]

_STARTS = {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_FAST"}
_ATTRS = {"LOAD_ATTR", "LOAD_METHOD"}
_UNKNOWN = object()  # a chain start we cannot resolve: it may be any module


def _chains(code: types.CodeType) -> Iterator[tuple[str, tuple[str, ...], types.CodeType]]:
    """``(opname of the start, names, code)`` of every ``a.b.c`` load, nested code too."""
    start: tuple[str, list[str]] | None = None
    for ins in dis.get_instructions(code):
        if ins.opname in _ATTRS and start is not None:
            start[1].append(str(ins.argval))
            continue
        if start is not None and len(start[1]) > 1:
            yield start[0], tuple(start[1]), code
        start = None
        if ins.opname in _STARTS and isinstance(ins.argval, str):
            start = (ins.opname, [ins.argval])
    if start is not None and len(start[1]) > 1:
        yield start[0], tuple(start[1]), code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _chains(const)


def _head(func: types.FunctionType, op: str, name: str, code: types.CodeType) -> Any:
    """What a chain's first name holds when ``func`` runs, or ``_UNKNOWN``."""
    if op in ("LOAD_GLOBAL", "LOAD_NAME"):
        return func.__globals__.get(name, _UNKNOWN)
    if op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and code is func.__code__ and func.__closure__:
        names = code.co_freevars
        if name in names:
            try:
                return func.__closure__[names.index(name)].cell_contents
            except ValueError:  # an empty cell
                return _UNKNOWN
    return _UNKNOWN


def reached(func: types.FunctionType, listed: list[Any]) -> list[Any]:
    """The submodules of ``listed`` (cloudpickle's) that ``func``'s code may reach.

    Args:
        func: The function being pickled by value.
        listed: The submodules cloudpickle found for it.

    Returns:
        Those to import on the rank: reached through an attribute chain, or
        possibly reached (a chain whose start is unknown).
    """
    wanted = {m.__name__: m for m in listed if isinstance(m, types.ModuleType)}
    if not wanted:
        return listed
    keep: set[str] = set()
    for op, names, code in _chains(func.__code__):
        obj = _head(func, op, names[0], code)
        for attr in names[1:]:
            if obj is _UNKNOWN:
                # Unknown start: keep every listed submodule of this name.
                keep.update(n for n in wanted if n.rsplit(".", 1)[-1] == attr)
                continue
            if not isinstance(obj, types.ModuleType):
                break  # an attribute of a plain object is no submodule
            full = f"{obj.__name__}.{attr}"
            if full in wanted:
                keep.add(full)
            obj = getattr(obj, attr, _UNKNOWN)
    return [m for m in listed if not isinstance(m, types.ModuleType) or m.__name__ in keep]
