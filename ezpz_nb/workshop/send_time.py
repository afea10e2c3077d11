"""What a check guards in the notebook's own process while the learner's code is sent.

A checker pickles the learner's function for the ranks, in the notebook. Pickling runs
code the function carries (an object's ``__reduce__``, in a default argument, a closure
cell or a class attribute), in the notebook, where the verdict is made: issue 45's sixth
trial rewrote a checker's rule that way, and walked up the frames to rewrite a check's
drawn answers in place. :func:`sending` guards a check against that:

1. the learner's functions are pickled once, when the check starts, before it draws
   anything (``wire.sent_once``): every later pickle sends those bytes, so no code of the
   learner's runs in the notebook while the check's secrets exist;
2. the checker's code is fingerprinted (:func:`fingerprint`: every loaded ``ezpz_nb``
   module's globals by identity, and for functions their code, defaults and closure
   cells, methods of classes alike), once when :mod:`.exercises` finished importing
   (:func:`mark_baseline`) and again when the check starts and ends: a change refuses
   the verdict, whether the learner's cell made it before the call or the sending did;
3. a thread started while the functions were pickled refuses the verdict (it could wait
   for the draw and rewrite it later), and so does code defined in the notebook's cells that
   the interpreter runs on its own while the check runs (a profile or trace
   function, a gc callback, a signal handler, an audit hook, a live thread; found by
   :mod:`.notebook_hooks`): the sixth
   trial's second part rewrote counts and verdicts from each.
The standard library's modules the checkers compute with (:data:`_LIBRARY`) are
fingerprinted with the checkers' own.

Not covered (docs/architecture.md, "What a check guards in the notebook"): code in the
notebook can patch torch or numpy, which a checker uses but does not fingerprint; a hook
given another module's name is not told from a library's. A checker detects changes to its
own code only.
"""

from __future__ import annotations

import builtins
import contextlib
import dis
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ezpz_nb.workshop import notebook_hooks

__all__ = ["Refused", "fingerprint", "mark_baseline", "patched_on_purpose", "sending"]

#: One module's print: global name -> what identifies its value.
ModulePrint = dict[str, Any]

#: Globals no module's code defines: set by the interpreter as it goes.
_INTERPRETER = frozenset({"__warningregistry__", "__builtins__", "__cached__", "__loader__"})

#: Names a module's code may read from the builtins: a global of one of them hides it.
_BUILTINS = frozenset(vars(builtins))
#: The opcodes that rebind a global.
_REBINDS = frozenset({dis.opmap["STORE_GLOBAL"], dis.opmap["DELETE_GLOBAL"]})

#: Class attributes the interpreter caches as it goes (copyreg, when an instance is pickled).
_CLASS_CACHES = frozenset({"__slotnames__"})

#: The print of each ``ezpz_nb`` module as first seen (most when ``exercises`` was imported).
_BASELINE: dict[str, ModulePrint] = {}
#: Per module, the globals its own functions rebind (``global x``): state, not code.
_STATE: dict[str, frozenset[str]] = {}
#: ``(module, global)`` pairs a test changed on purpose (:func:`patched_on_purpose`).
_ON_PURPOSE: set[tuple[str, str]] = set()

_ADVICE = (
    "Define the answer with plain code (a function, and the values and helpers it uses): "
    "the checker runs it on the ranks, where it is judged. Restart the kernel to undo the "
    "change, then run the notebook's cells again."
)


class Refused(Exception):
    """The check cannot be trusted: ``message`` says what was changed and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _ours(name: str) -> bool:
    return name == "ezpz_nb" or name.startswith("ezpz_nb.")


#: Standard-library modules the checkers compute verdicts with: their public functions and
#: classes are fingerprinted too (the sixth trial's second part patched ``builtins.abs`` and
#: ``random.Random.sample`` in an earlier cell, and the checker's own code read them).
#: Library names a Jupyter kernel itself swaps per cell (ipykernel forwards ``input`` to the
#: browser; IPython adds ``display``, ``get_ipython``, its own ``exit``): not the learner's.
_KERNEL_SWAPS = frozenset(
    ("builtins", k)
    for k in ("input", "exit", "quit", "display", "get_ipython", "help", "copyright", "credits")
)
_LIBRARY = frozenset(
    {"builtins", "random", "math", "operator", "hashlib", "json", "statistics", "fractions"}
    | {"functools", "itertools", "collections", "struct", "zlib", "bisect", "heapq"}
)


def _codes(value: Any) -> Iterator[types.CodeType]:
    """The code objects of a function (nested ones included), or of a class's methods."""
    if isinstance(value, type):
        for attr in list(vars(value).values()):
            yield from _codes(getattr(attr, "__func__", attr))
        return
    code = getattr(value, "__code__", None)
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        c = stack.pop()
        yield c
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))


def _rebound(mod: types.ModuleType) -> frozenset[str]:
    """The globals ``mod``'s own functions and methods rebind (``global`` statements)."""
    names: set[str] = set()
    for value in list(vars(mod).values()):
        if getattr(value, "__module__", None) != mod.__name__:
            continue
        for code in _codes(value):
            if not _REBINDS & set(code.co_code):
                continue  # a quick filter (argument bytes match too): most code rebinds none
            for ins in dis.get_instructions(code):
                if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                    names.add(ins.argval)
    return frozenset(names)


def _function_print(fn: Any) -> tuple[Any, ...]:
    """What a function runs: its code, defaults and closure cells' contents, by identity."""
    cells = tuple(id(c.cell_contents) if _full(c) else None for c in fn.__closure__ or ())
    return (
        id(fn),
        id(fn.__code__),
        tuple(map(id, fn.__defaults__ or ())),
        tuple((k, id(v)) for k, v in (fn.__kwdefaults__ or {}).items()),
        cells,
    )


def _full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _value_print(value: Any, module: str) -> Any:
    """A global's print: functions and the module's own classes in depth, others by identity."""
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.FunctionType):
        return _function_print(value)
    wrapped = getattr(value, "__wrapped__", None)  # an lru_cache, a functools.wraps wrapper
    if isinstance(wrapped, types.FunctionType) and not isinstance(value, type):
        return (id(value), _function_print(wrapped))
    if isinstance(value, type) and value.__module__ == module:
        members = [(k, v) for k, v in list(vars(value).items()) if k not in _CLASS_CACHES]
        return (id(value), tuple(_member_print(k, v) for k, v in members))
    return id(value)


def _member_print(name: str, attr: Any) -> tuple[str, Any]:
    """A class member's print: methods (plain, static, class, properties) by their functions."""
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, property):
        parts = (attr.fget, attr.fset, attr.fdel)
        return name, tuple(_function_print(f) if f else None for f in parts)
    if isinstance(attr, types.FunctionType):
        return name, _function_print(attr)
    return name, id(attr)


def _module_print(name: str, mod: types.ModuleType) -> ModulePrint:
    if name not in _STATE:
        _STATE[name] = _rebound(mod)
    skip = _STATE[name] | _INTERPRETER
    items = list(vars(mod).items())
    if name in _LIBRARY:  # its code, not its data: public functions and classes
        items = [
            (k, v)
            for k, v in items
            if not k.startswith("_") and callable(v) and (name, k) not in _KERNEL_SWAPS
        ]
    return {k: _value_print(v, name) for k, v in items if k not in skip}


def fingerprint() -> dict[str, ModulePrint]:
    """The print of every loaded ``ezpz_nb`` module and of the standard library's modules
    in :data:`_LIBRARY` (see the module's docstring)."""
    return {
        name: _module_print(name, mod)
        for name, mod in list(sys.modules.items())
        if (_ours(name) or name in _LIBRARY) and isinstance(mod, types.ModuleType)
    }


def mark_baseline() -> None:
    """Take the print every later check compares with (:mod:`.exercises` calls it last),
    and from then on count the audit hooks the notebook's code adds."""
    notebook_hooks.watch_audit_hooks()
    for name, mod_print in fingerprint().items():
        _BASELINE.setdefault(name, mod_print)


def patched_on_purpose(module: str, name: str) -> None:
    """Let a test's own patch of ``module.name`` (e.g. a fixed seed) stand before a check.

    Changes made while a check runs are refused all the same.
    """
    _ON_PURPOSE.add((module, name))


def _changes(old: dict[str, ModulePrint], new: dict[str, ModulePrint]) -> list[str]:
    """``module.name`` of every global whose print differs, in ``old``'s modules."""
    out = []
    for mod, names in old.items():
        now = new.get(mod, {})
        for name in sorted(set(names) | set(now)):
            was, got = names.get(name), now.get(name)
            if was is None and name not in _BUILTINS:
                # Added since (a submodule imported, a lazy name cached): the module's code
                # reads none of them, except one that hides a builtin.
                continue
            if got is None and mod in _LIBRARY:
                continue  # removed (IPython adds and removes `display` in builtins per cell)
            if was != got and (mod, name) not in _ON_PURPOSE:
                out.append(f"{mod.removeprefix('ezpz_nb.')}.{name}")
    return out


def _named(changed: list[str]) -> str:
    shown = ", ".join(changed[:4])
    return shown + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


def _no_hooks(when: str) -> None:
    """Refuse when the notebook's code set any of :func:`.notebook_hooks.found` (``when``:
    since when)."""
    found = notebook_hooks.found()
    if found:
        raise Refused(
            f"{when}, this notebook set code of its own to run while the check runs: "
            f"{', '.join(found)}. Such code can change the check's counts and its verdict. "
            "Remove it (sys.setprofile(None), stop the thread, ...) or restart the kernel, "
            "then run the notebook's cells again, and check the answer alone."
        )


def _before_call() -> dict[str, ModulePrint]:
    """The print now, having refused a checker changed since the baseline."""
    now = fingerprint()
    for name, mod_print in now.items():
        _BASELINE.setdefault(name, mod_print)  # imported since: first seen now
    changed = _changes(_BASELINE, now)
    if changed:
        raise Refused(
            f"the checker's code was changed in this notebook before the check: "
            f"{_named(changed)} is not what ezpz_nb defines. {_ADVICE}"
        )
    return now


@contextlib.contextmanager
def sending(answers: Iterable[Any]) -> Iterator[Callable[[], None]]:
    """Around a check: the ``answers`` (the learner's functions) pickled once, now.

    Yields a function to call once the verdict is made: it raises :class:`Refused` when
    the checker changed while the check ran.

    Raises:
        Refused: the checker was changed before the call or while the answers were
            pickled, or a thread was started then (on entry, before the check runs).
        Exception: what pickling an answer raised (the check has not started).
    """
    from ezpz_nb.launcher.wire import sent_once

    start = _before_call()
    _no_hooks("before the check")
    threads = notebook_hooks.threads()
    with sent_once([a for a in answers if a is not None]):
        started = notebook_hooks.threads() - threads
        if started:
            raise Refused(
                "your function started a thread in the notebook while it was sent to the "
                f"ranks ({len(started)} new): that thread could change the check as it runs. "
                + _ADVICE
            )
        _no_hooks("as your function was sent to the ranks")
        sent = fingerprint()
        changed = _changes(start, sent)
        if changed:
            raise Refused(
                "sending your function to the ranks ran code in this notebook that changed "
                f"the checker: {_named(changed)}. Code an object runs as it is pickled (a "
                "__reduce__, in a default argument, a closure or a class attribute) runs "
                f"where the verdict is made. {_ADVICE}"
            )

        def unchanged() -> None:
            _no_hooks("while the check ran")
            changed = _changes(sent, fingerprint())
            if changed:
                raise Refused(
                    f"the checker's code changed in this notebook while the check ran: "
                    f"{_named(changed)}. {_ADVICE}"
                )

        yield unchanged
