"""Notebook 19: where a dataset keeps its tokens, found by walking what it references.

The exercise asks for the tokens in one array (or a few, with an offsets array). Storage per
row (a ``bytes``, a numpy array, a ``str`` per row) passes the other rules when its reads
write nothing: an object over 512 bytes is ``malloc``'d, outside the small-object count of
:mod:`.flat_rows`, and read through ``ctypes`` at its address no count is written. So the
rank walks what the dataset references (its attributes, containers, slots, closures, class,
an object array's items; a library's classes, functions and modules are not entered) and
collects the buffers it reaches, each by the memory that owns it: numpy views of one array
are one buffer, a tensor's views one storage. Judged by :func:`.flat_judge.judge_held`: many
small buffers holding runs of the rows' tokens (:mod:`.flat_find`) is storage per row;
buffers too small for the tokens, or large ones without them, mean they are kept where the
dataset does not reference them (a leaked reference, a global); :mod:`.flat_protect` then
reads samples with the tokens in the large buffers holding them replaced by zeros.
"""

from __future__ import annotations

import array
import ctypes
import gc
import io
import mmap
import os
import sys
import types
from collections import Counter, deque
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from ezpz_nb.workshop.flat_find import holding, located, small_found
from ezpz_nb.workshop.flat_pages import PAGE
from ezpz_nb.workshop.flat_protect import memory
from ezpz_nb.workshop.flat_rows import named_mappings, off_heap

__all__ = ["WALK_MOST", "holdings"]

#: Containers of this many items or more on a library's class or module may hold rows.
_MANY = 64
#: Objects a walk enters at most (not ints, ``str`` or ``bytes``, counted as reached): a walk
#: cut short is "not judged" for the rules that need every buffer (:mod:`.flat_judge`).
WALK_MOST = 300_000
_ATOMIC = (int, float, complex, bool, type(None))
#: Exact types with nothing inside to walk: their memory is the whole object.
_LEAVES = (str, bytes)
_EMPTY_STR = sys.getsizeof("")
# Every test of a kind below is on type(obj): isinstance would believe an object's own
# __class__ (a property of the learner's can say int, and hide what it holds).


@lru_cache(maxsize=512)
def _library(module: str) -> bool:
    """Whether ``module`` is the standard library's, an installed package's or this one's:
    its classes and functions are code, not the learner's storage, and not entered."""
    top = module.partition(".")[0]
    if top == "__main__":  # the notebook's code, sent by value (a rank's own main may not be)
        return False
    if top in sys.stdlib_module_names or top in ("builtins", "ezpz_nb"):
        return True
    where = getattr(sys.modules.get(top), "__file__", None) or ""
    return "site-packages" in where or "dist-packages" in where


def _code(obj: Any) -> bool:
    """A class, function or module of a library (see :func:`_library`): not entered.

    What an object says of itself is not trusted: a learner's function or class may set
    ``__module__ = "json"`` (the ninth trial hid an array per row in such a function's
    defaults), so it counts as the library's only where that module really holds it under
    its name; and a C function bound to an object (``rows.__getitem__``) is entered, as
    what it is bound to may hold the rows.
    """
    if issubclass(type(obj), types.ModuleType):
        # A library's module, as imported: not entered. A module object the learner made
        # (types.ModuleType("store"), never imported; the tenth trial kept a row per array
        # in one) or the learner's own module is entered like any object.
        name = vars(obj).get("__name__")
        return isinstance(name, str) and sys.modules.get(name) is obj and _library(name)
    if issubclass(type(obj), types.BuiltinFunctionType):
        bound = obj.__self__
        return bound is None or issubclass(type(bound), types.ModuleType)
    if issubclass(type(obj), type | types.FunctionType):
        module = str(getattr(obj, "__module__", None) or "builtins")
        return _library(module) and _held_by(module, obj)
    return False


def _held_by(module: str, obj: Any) -> bool:
    """Whether ``module`` holds ``obj`` under its ``__qualname__`` (read from the dicts,
    so no code of the learner's runs). A library's nested function is not found, and is
    entered: its closure and defaults are few objects."""
    target: Any = sys.modules.get(module)
    for part in str(getattr(obj, "__qualname__", "")).split("."):
        try:
            target = vars(target).get(part)
        except TypeError:  # no __dict__
            return False
    return target is obj


def _tensor(t: torch.Tensor | torch.UntypedStorage) -> tuple[Any, int]:
    storage = t.untyped_storage() if isinstance(t, torch.Tensor) else t
    return ("storage", storage.data_ptr()), storage.nbytes()


def _buffer(obj: Any) -> tuple[Any, int] | None:
    """``(owner, bytes)`` when ``obj`` holds memory of its own or a view of another's.

    The owner is what the memory belongs to (a view's base, a tensor's storage), so views of
    one array count once. ``None`` for anything else (entered by the walk instead).
    """
    kind = type(obj)
    if issubclass(kind, bytes | bytearray | array.array):
        return id(obj), len(obj) * getattr(obj, "itemsize", 1)
    if issubclass(kind, str):
        return id(obj), sys.getsizeof(obj) - _EMPTY_STR
    if issubclass(kind, ctypes.Array):  # memory of its own (the tenth trial: one per row)
        return id(obj), ctypes.sizeof(obj)
    if issubclass(kind, mmap.mmap):
        return id(obj), (0 if obj.closed else len(obj))
    if issubclass(kind, memoryview):
        held = None if obj.obj is None else _buffer(obj.obj)
        return held if held is not None else (id(obj), obj.nbytes)
    if issubclass(kind, np.ndarray):
        if obj.dtype.hasobject:
            return None
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        held = None if base.base is None else _buffer(base.base)
        return held if held is not None else (id(base), base.nbytes)
    if issubclass(kind, torch.Tensor | torch.UntypedStorage):
        try:
            return _tensor(obj)
        except (RuntimeError, NotImplementedError):  # sparse, meta: no one storage
            return id(obj), 0
    if issubclass(kind, io.IOBase):  # tokens in a file the dataset keeps open
        try:
            return ("fd", obj.fileno()), os.fstat(obj.fileno()).st_size
        except (OSError, ValueError):
            return None
    # A class's __module__ need not be a str (Cython's method class holds a descriptor there:
    # the tenth trial's pyarrow column crashed the walk on it).
    module = getattr(kind, "__module__", None)
    arrow = isinstance(module, str) and module.startswith("pyarrow")
    if arrow and isinstance(getattr(obj, "nbytes", None), int):
        return id(obj), obj.nbytes  # an Arrow table or array: values and offsets buffers
    return None


#: Exact types whose memory is all in the object (a header, then the values): their pages
#: are the object's span; any other object's count is on the page of its address.
_INLINE = (int, float, complex, bytes, str, tuple)


def _span(obj: Any) -> tuple[int, int] | None:
    """``(address, bytes)`` of the memory ``obj``'s values are in, outside the object itself
    (an array's data, a tensor's storage, a ``bytearray``'s or ``array``'s items)."""
    kind = type(obj)
    try:
        if issubclass(kind, np.ndarray) and not obj.dtype.hasobject:
            return int(obj.__array_interface__["data"][0]), obj.nbytes
        if issubclass(kind, torch.Tensor | torch.UntypedStorage):
            storage = obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj
            return storage.data_ptr(), storage.nbytes()
        if issubclass(kind, array.array):
            address, count = obj.buffer_info()
            return address, count * obj.itemsize
        if issubclass(kind, bytearray) and len(obj):
            return ctypes.addressof(ctypes.c_char.from_buffer(obj)), len(obj)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, BufferError):
        return None
    return None


def _add_pages(pages: set[int], obj: Any) -> None:
    """The pages ``obj`` is on (its count's, its values'), into ``pages``: where a worker
    that reads it writes (see :mod:`.flat_pages`)."""
    start = id(obj)
    end = start + (sys.getsizeof(obj) if type(obj) in _INLINE else 1)
    pages.update(range(start // PAGE, (end - 1) // PAGE + 1))
    span = _span(obj)
    if span is not None and span[1] > 0:
        pages.update(range(span[0] // PAGE, (span[0] + span[1] - 1) // PAGE + 1))


def _named_globals(code: types.CodeType, names: set[str]) -> set[str]:
    names.update(code.co_names)
    for const in code.co_consts:  # nested functions and comprehensions
        if isinstance(const, types.CodeType):
            _named_globals(const, names)
    return names


def _full(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  (an empty cell raises)
    except ValueError:
        return False
    return True


def _children(obj: Any) -> list[Any]:
    if issubclass(type(obj), np.ndarray):  # an object array does not show its items to gc
        return obj.ravel().tolist()
    if issubclass(type(obj), types.CodeType):  # held as data (the tenth trial: rows as consts)
        return list(obj.co_consts)
    if issubclass(type(obj), types.FrameType):  # a frame kept: its locals (rows, the trial's)
        return list(dict(obj.f_locals).values())
    if issubclass(type(obj), dict):  # gc skips a dict's keys when all are str: a row may be one
        return [*dict.keys(obj), *dict.values(obj)]
    if issubclass(type(obj), types.FunctionType):
        # What it can read: its closure, defaults and the globals its code names, not its
        # module's every global (a test module's docstrings are not storage).
        cells = [c.cell_contents for c in obj.__closure__ or () if _full(c)]
        names = _named_globals(obj.__code__, set())
        found = [obj.__globals__[k] for k in names if k in obj.__globals__]
        kw = (obj.__kwdefaults__ or {}).values()
        return [*cells, *(obj.__defaults__ or ()), *kw, *found, *_set_on(obj, library=False)]
    return gc.get_referents(obj)


#: What a class's own dict holds as code: not entered when the class is a library's.
_CLASS_CODE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.WrapperDescriptorType,
    classmethod,
    staticmethod,
    property,
    type,
    types.ModuleType,
    str,
    *_ATOMIC,
)


#: A module's entries that lead into the import system, not to what was set on it.
_MODULE_PLUMBING = ("__builtins__", "__spec__", "__loader__", "__cached__", "__path__", "__all__")


def _import_system() -> set[int]:
    """The interpreter's registries of every module (``sys.modules`` and the importers'
    caches): reached from ``sys``, they would lead the walk into every library's data."""
    held = (sys.modules, sys.path_importer_cache, sys.meta_path, sys.path_hooks, sys.path)
    # ... and the interpreter's own lists of names (sys.stdlib_module_names: 305 strs that
    # named a `make test` run's right answer "storage per row").
    names = (sys.stdlib_module_names, sys.builtin_module_names, sys.argv, sys.orig_argv)
    return {id(x) for x in (*held, *names)}


def _set_on(obj: Any, library: bool = True) -> list[Any]:
    """The values of a class's, function's or module's own dict that are not code: of a
    library's, what was set on it at run time (the tenth trial kept an array per row on
    ``json.JSONDecoder``, on ``sys`` and on a module object it made).

    Methods, descriptors, anything callable, strings and numbers stay out: a worker touches
    code (its reference counts) on every call. Of a library's, only what could be rows: a
    buffer, a container of :data:`_MANY` items or more, or an object of a class not a
    library's; its own settings, registries and open files are the library's.
    """
    kind = type(obj)
    if issubclass(kind, type):  # not cls.__dict__: a metaclass could answer for it
        own: Any = type.__dict__["__dict__"].__get__(obj)
    elif issubclass(kind, types.ModuleType | types.FunctionType):
        own = object.__getattribute__(obj, "__dict__")
    else:
        return []
    plumbing = _import_system()
    module = issubclass(kind, types.ModuleType)
    return [
        v
        for k, v in dict(own).items()
        if not issubclass(type(v), _CLASS_CODE)
        and not callable(v)  # a library's functions of any kind (Cython's too): code
        and id(v) not in plumbing
        and not (module and k in _MODULE_PLUMBING)
        and (not library or _could_be_rows(v))
    ]


def _could_be_rows(v: Any) -> bool:
    kind = type(v)
    if issubclass(kind, list | tuple | dict | set | frozenset):
        return len(v) >= _MANY
    if issubclass(kind, io.IOBase):
        return False
    module = getattr(kind, "__module__", None)
    return _buffer(v) is not None or not (isinstance(module, str) and _library(module))


def _file(obj: Any) -> tuple[Any, int] | None:
    """A path the dataset keeps (the tokens in a file it reads at each sample)."""
    if issubclass(type(obj), str) and len(obj) < 4096 and os.sep in obj:
        try:
            return ("file", obj), os.stat(obj).st_size
        except (OSError, ValueError):
            return None
    return None


class _Tally:
    """The buffers a walk reaches, each counted once, by the memory that owns it."""

    def __init__(self, large: int) -> None:
        self.large = large
        self.owners: dict[Any, int] = {}
        self.large_ones: list[Any] = []  # each large buffer's first object seen
        self.small: dict[str, list[Any]] = {}  # the small buffers, by type
        self.size_of: Counter[str] = Counter()
        self.parents: dict[str, Counter[int]] = {}
        self.containers: dict[int, Any] = {}  # the small buffers' containers, by id
        self.in_memory = 0  # on malloc's heap: not files', maps', shared memory's
        self.named = named_mappings()  # where malloc's memory is not (read once: after make_flat)

    def add(self, obj: Any, parent: Any) -> bool:
        """Counts ``obj`` if it holds memory (or is a path to a file): True, not entered."""
        on_file = _file(obj)
        found = on_file or _buffer(obj)
        if found is None:
            return False
        owner, size = found
        if owner in self.owners:
            return True
        self.owners[owner] = size
        # A memory map's pages are the file's, not malloc's: not in the heap; nor is a
        # tensor's shared memory (a decoy there covered rows kept in the heap).
        span = None if on_file or type(obj) in _LEAVES else _span(obj)  # inline: no span
        elsewhere = span is not None and off_heap(span[0], self.named)
        mapped = on_file or elsewhere or isinstance(obj, (np.memmap, mmap.mmap))
        self.in_memory += 0 if mapped else size
        if size >= self.large:
            self.large_ones.append(obj)
        else:
            kind = type(obj).__name__
            self.small.setdefault(kind, []).append(obj)
            self.size_of[kind] += size
            self.parents.setdefault(kind, Counter())[id(parent)] += 1
            self.containers[id(parent)] = parent
        return True

    def leaf(self, obj: Any, parent: Any, pages: set[int]) -> None:
        """:meth:`add` for a ``str``, ``bytes`` or numpy scalar, its pages into ``pages``: the
        same counts, quicker (a vocabulary has 100,000s): a small one has no span, no file."""
        start, size = id(obj), sys.getsizeof(obj)
        first, last = start // PAGE, (start + size - 1) // PAGE
        pages.add(first)
        if last > first:
            pages.update(range(first + 1, last + 1))
        kind = type(obj)
        if kind not in _LEAVES:
            return
        payload = len(obj) if kind is bytes else size - _EMPTY_STR
        if payload >= self.large or (kind is str and os.sep in obj):  # a blob, a path
            self.add(obj, parent)
            return
        self.owners[start] = payload
        self.in_memory += payload
        name = kind.__name__
        self.small.setdefault(name, []).append(obj)
        self.size_of[name] += payload
        if name not in self.parents:  # (setdefault would build a Counter for every leaf)
            self.parents[name] = Counter()
        holder = id(parent)
        self.parents[name][holder] += 1
        self.containers[holder] = parent

    def kind(self, tokens_n: int, runs: np.ndarray | None) -> tuple[str, int | None]:
        """The type of small buffer most like storage per row, and how many ``runs`` its
        buffers hold (None without runs): of the types holding a byte a token or more, the
        one holding the most runs; else the one holding the most bytes."""
        ranked = [kind for kind, _ in self.size_of.most_common()]
        if not ranked or runs is None:
            return (ranked[0] if ranked else ""), None
        scored = [
            (small_found(self.small[k], runs) if self.size_of[k] >= tokens_n else -1, k)
            for k in ranked
        ]
        hits, kind = max(scored, key=lambda x: x[0])  # max keeps the first: the most bytes
        return kind, max(hits, 0)


def holdings(ds: Any, tokens_n: int, runs: np.ndarray | None = None) -> dict[str, Any]:
    """On a rank: the buffers ``ds`` references, as few numbers for :func:`.flat_judge.judge_held`.

    Buffers under a 64th of ``tokens_n`` int64 tokens are small: ``kind`` is the type whose
    small buffers look most like rows (:meth:`_Tally.kind`), ``small`` how many of them,
    ``small_bytes`` their bytes, ``small_found`` how many of the ``runs`` they hold,
    ``where`` the container most are in; ``all_bytes``: every buffer's (a file kept by path
    or open counts its size); ``complete``: whether the walk reached everything; ``found``:
    how many of the ``runs`` of tokens (:func:`.flat_find.needles`) the large buffers hold
    (``None`` without runs); ``spans``: the extent of the runs in the memory of the large
    buffers that hold one, ``at``: each run found there (:func:`.flat_find.located`), and
    ``unprotected``: those buffers not in memory (a file), for :mod:`.flat_protect`;
    ``pages``: the page numbers of every object and buffer reached (ints and floats
    included), where its workers' writes are looked for (:mod:`.flat_pages`).
    """
    tally, pages, holders = _Tally(tokens_n * 8 // 64), set[int](), dict[int, Any]()
    seen, queue, walked = {id(ds)}, deque([(ds, None)]), 0
    while queue and walked < WALK_MOST:
        obj, parent = queue.popleft()
        walked += 1
        if not _code(obj):
            _add_pages(pages, obj)
        if tally.add(obj, parent):
            continue
        # Of a library's class, function or module, only what was set on it as data.
        for child in _set_on(obj) if _code(obj) else _children(obj):
            if issubclass(type(child), _ATOMIC):  # a token as a Python int: its count's page
                pages.add(id(child) // PAGE)
                continue
            if id(child) in seen:
                continue
            seen.add(id(child))
            if type(child) in _LEAVES or issubclass(type(child), np.generic):
                # Nothing inside to walk (a vocabulary's 310,000 str, the twelfth trial,
                # spent the walk's budget): counted here, not queued.
                tally.leaf(child, obj, pages)
                continue
            holders[id(child)] = obj
            queue.append((child, obj))
    kind, small_hits = tally.kind(tokens_n, runs)
    where = ""
    if kind:
        top = tally.parents[kind].most_common(1)[0][0]
        where = _named(tally.containers[top], holders)
    hits, holds = (None, []) if runs is None else holding(tally.large_ones, runs)
    spans: list[tuple[int, int]] = []
    unprotected = []
    for obj in (b for b, held in zip(tally.large_ones, holds, strict=False) if held):  # []: no runs
        got = memory(obj)
        if got is None:
            unprotected.append(f"a {type(obj).__name__}" + (" (a path)" if _file(obj) else ""))
        spans += got or []
    spans, at = located(spans, runs) if runs is not None else ([], [])
    return {
        "small": len(tally.small.get(kind, ())),
        "small_bytes": tally.size_of[kind],
        "small_found": small_hits,
        "all_bytes": sum(tally.owners.values()),
        "memory_bytes": tally.in_memory,
        "kind": kind,
        "where": where,
        "complete": not queue,
        "found": hits,
        "runs": 0 if runs is None else len(runs),
        "spans": spans,
        "at": at,
        "unprotected": unprotected,
        "pages": sorted(pages),
    }


def _named(container: Any, holders: dict[int, Any]) -> str:
    """``container``'s attribute or key name in what holds it (``"_keep, a tuple"``)."""
    if container is None:
        return ""
    above = holders.get(id(container))
    try:  # an instance's attributes (its dict, which gc passes over) or a dict's keys
        named = above if isinstance(above, dict) else vars(above)
        name = next((str(k) for k, v in dict.items(named) if v is container), "")
    except TypeError:  # no __dict__: slots, a list
        name = ""
    what = type(container).__name__
    return f"{name}, a {what}" if name else f"a {what}"
