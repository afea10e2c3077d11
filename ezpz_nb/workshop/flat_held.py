"""Notebook 19: where a dataset keeps its tokens, found by walking what it references.

The exercise asks for the tokens in one array (or a few, with an offsets array). Storage per
row (a ``bytes``, a numpy array, a ``str`` per row) passes the other rules when its reads
write nothing: an object over 512 bytes is ``malloc``'d, outside the small-object count of
:mod:`.flat_rows`, and read through ``ctypes`` at its address no count is written. So the
rank walks what the dataset references (its attributes, containers, slots, closures, class,
an object array's items; a library's classes, functions and modules are not entered) and
collects the buffers it reaches, each by the memory that owns it: numpy views of one array
are one buffer, a tensor's views one storage. Judged by :func:`judge_held`: many small
buffers holding the tokens' bytes is storage per row; buffers too small for the tokens, or
large ones without them (:mod:`.flat_find` looks for runs of the rows' tokens), mean they
are kept where the dataset does not reference them (a leaked reference, a global).
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

from ezpz_nb.workshop.flat_find import found as runs_found
from ezpz_nb.workshop.flat_pages import PAGE
from ezpz_nb.workshop.flat_rows import named_mappings, off_heap
from ezpz_nb.workshop.stops import wrong

__all__ = ["FEW_ROWS", "holdings", "judge_held"]

#: Buffers below a 64th of the data's int64 size are small; as many small buffers as this
#: share of the rows, holding a byte a token or more, is storage per row. Measured (4096
#: rows of 256 tokens): 21 right answers' walks (numpy, a tensor and offsets, ``bytes``,
#: ``bytearray``, ``array('q')``, ``mmap``, memory maps, a file, two arrays, a metadata dict
#: beside them, a class attribute, a closure) reach 1-2 large buffers and of one type at
#: most 14 small ones, 33 KiB (names, metadata, offsets); a buffer per row (an array, a
#: ``bytes``, ``bytearray`` or ``str``; in a list, a tuple, a dict's keys, an object array, a
#: closure) 4096, 3.2-8.5 MB. The walks took 50-150 ms, most of it :mod:`.flat_find`'s.
FEW_ROWS = 1 / 8
#: Where the tokens are not found in runs (:func:`judge_held`'s second rule), this many small
#: objects holding them says why: storage cut in chunks of a few rows, not a leak.
_MANY = 64
#: Buffers a walk visits at most (its objects, not ints): a walk cut short judges no hiding.
_LIMIT = 300_000
_ATOMIC = (int, float, complex, bool, type(None))
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
        return id(obj), sys.getsizeof(obj) - sys.getsizeof("")
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


def holdings(ds: Any, tokens_n: int, runs: np.ndarray | None = None) -> dict[str, Any]:
    """On a rank: the buffers ``ds`` references, as few numbers for :func:`judge_held`.

    Buffers under a 64th of ``tokens_n`` int64 tokens are small: ``kind`` is the type whose
    small buffers hold the most bytes, ``small`` how many of them, ``small_bytes`` their
    bytes, ``where`` the container most are in; ``all_bytes``: every buffer's (a file kept
    by path or open counts its size); ``complete``: whether the walk reached everything;
    ``found``: how many of the ``runs`` of tokens (:func:`.flat_find.needles`) the large
    buffers hold (``None`` without runs); ``pages``: the page numbers of every object and
    buffer reached (ints and floats included), where its workers' writes are looked for
    (:mod:`.flat_pages`).
    """
    large = tokens_n * 8 // 64
    owners: dict[Any, int] = {}
    large_ones: list[Any] = []  # each large buffer's first object seen, for its bytes
    count: Counter[str] = Counter()
    size_of: Counter[str] = Counter()
    parents: dict[str, Counter[int]] = {}
    containers: dict[int, Any] = {}  # the small buffers' containers, by id
    holders: dict[int, Any] = {}  # each object's first container, to name the commonest
    pages: set[int] = set()
    in_memory = 0  # the buffers' bytes on malloc's heap: not files', maps', shared memory's
    named = named_mappings()  # where malloc's memory is not (read once: after make_flat)
    seen, queue = {id(ds)}, deque([(ds, None)])
    while queue and len(seen) < _LIMIT:
        obj, parent = queue.popleft()
        if not _code(obj):
            _add_pages(pages, obj)
        on_file = _file(obj)
        found = on_file or _buffer(obj)
        if found is not None:
            owner, size = found
            if owner not in owners:
                owners[owner] = size
                # A memory map's pages are the file's, not malloc's: not in the heap; nor is
                # a tensor's shared memory (a decoy there covered rows kept in the heap).
                span = None if on_file else _span(obj)
                elsewhere = span is not None and off_heap(span[0], named)
                mapped = on_file or elsewhere or isinstance(obj, (np.memmap, mmap.mmap))
                in_memory += 0 if mapped else size
                if size >= large:
                    large_ones.append(obj)
                else:
                    kind = type(obj).__name__
                    count[kind] += 1
                    size_of[kind] += size
                    parents.setdefault(kind, Counter())[id(parent)] += 1
                    containers[id(parent)] = parent
            if not issubclass(type(obj), np.ndarray) or not obj.dtype.hasobject:
                continue
        if _code(obj):
            # Of a library's class, function or module, only what was set on it as data.
            kids = _set_on(obj)
        else:
            kids = _children(obj)
        for child in kids:
            if issubclass(type(child), _ATOMIC):  # a token as a Python int: its count's page
                pages.add(id(child) // PAGE)
                continue
            if id(child) in seen:
                continue
            seen.add(id(child))
            holders[id(child)] = obj
            queue.append((child, obj))
    kind = size_of.most_common(1)[0][0] if size_of else ""
    where = ""
    if kind:
        where = _named(containers[parents[kind].most_common(1)[0][0]], holders)
    return {
        "small": count[kind],
        "small_bytes": size_of[kind],
        "all_bytes": sum(owners.values()),
        "memory_bytes": in_memory,
        "kind": kind,
        "where": where,
        "complete": not queue,
        "found": None if runs is None else runs_found(large_ones, runs),
        "runs": 0 if runs is None else len(runs),
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


#: The share of the data's bytes make_flat may leave allocated where the dataset's
#: buffers do not reach (a right answer's temporaries are freed; what stays is its array).
#: Measured (malloc's bytes in use less the reached buffers on the heap): one numpy array
#: 0.01x the data; a ``datasets`` table 0.28x quiet, 0.50x once in a fresh clone's run
#: (pyarrow keeps some of what it allocated), which 0.5 rejected; rows kept in malloc blocks
#: beside a decoy (the eleventh trial) 1.03x. Halfway between.
UNREACHED = 0.75
_MIB = 1 << 20


def judge_held(outs: list[dict[str, Any]], n: int, tokens_n: int) -> str:
    """Wrong when a rank's dataset keeps its tokens per row, or nowhere it references.

    Judged after the workers' growth and the rows (:func:`.flat_rows.judge_kept`): an array
    or a ``bytes`` per row, read so that nothing is written, grows no worker, yet it is not
    the one array the exercise asks for. Returns what could not be judged, in words for the
    verdict (``""``: everything was): where ``malloc``'s bytes in use cannot be read (not
    glibc), tokens kept where the dataset references nothing are not looked for.
    """
    unmeasured = []
    for rank, out in enumerate(outs):
        held = out.get("held")
        if not isinstance(held, dict):
            continue
        count, kind = int(held["small"]), held["kind"]
        if count >= FEW_ROWS * n and held["small_bytes"] >= tokens_n:
            per = "one per row" if abs(count - n) <= n / 10 else f"{count / n:.1f} a row"
            where = f" (in {held['where']})" if held["where"] else ""
            raise wrong(
                f"On rank {rank} your dataset keeps the tokens in {count:,} {kind} objects, "
                f"{per}{where}: keep the tokens in one array. Each row is then a Python object "
                "of its own, allocated apart, with a header and a reference count; the exercise "
                "asks for one flat array (np.array([r['tokens'] for r in rows], "
                "dtype=np.int64)), a sample a slice of it; rows of other lengths: one "
                "np.concatenate of them and an array of offsets."
            )
        got, hits = held["all_bytes"], held.get("found")
        missing = hits is not None and hits < held["runs"] / 2
        if held["complete"] and (got < tokens_n or missing):
            if count >= _MANY and held["small_bytes"] >= tokens_n:
                # The tokens are there, cut into many small arrays (rows in chunks): runs that
                # cross a cut are not found, which is not a leak; say what the storage is.
                where = f" (in {held['where']})" if held["where"] else ""
                raise wrong(
                    f"On rank {rank} your dataset keeps the tokens in {count:,} {kind} "
                    f"objects, about {n / count:.0f} rows each{where}: keep them in one array "
                    "(np.concatenate of the rows, a sample a slice of it, and an array of "
                    "offsets); each small array is an object of its own, with a header and a "
                    "reference count a read writes."
                )
            said = (
                f"{got:,} bytes in all"
                if got < tokens_n
                else (
                    f"{hits} of {held['runs']} runs of tokens drawn from the rows found in its "
                    f"{got:,} bytes"
                )
            )
            raise wrong(
                f"On rank {rank} the checker found no array holding the tokens in what your "
                f"dataset references ({said}, for {tokens_n:,} tokens): they are kept where "
                "it does not reference them (a global, a reference leaked with ctypes). Keep "
                "the tokens in one array the dataset holds as an attribute (self.tokens = "
                "np.array(..., dtype=np.int64))."
            )
        # What make_flat left allocated (malloc's bytes in use, the rows let go of) beyond
        # the buffers the walk reached: tokens kept where the dataset references nothing
        # (an address, a finalizer's arguments, C memory), beside a decoy array it holds
        # (the eleventh trial). Right answers leave little (see UNREACHED for the figures).
        heap, data = out.get("heap"), tokens_n * 8
        if heap is None:  # not glibc: not measured
            unmeasured.append(rank)
            continue
        unreached = heap - held.get("memory_bytes", 0)
        if held["complete"] and unreached >= UNREACHED * data:
            raise wrong(
                f"On rank {rank} make_flat left {heap / _MIB:.1f} MiB allocated, of which the "
                f"buffers your dataset references hold {held.get('memory_bytes', 0) / _MIB:.1f} "
                f"MiB (the tokens are {data / _MIB:.1f} MiB): {unreached / _MIB:.1f} MiB are "
                "kept where the dataset does not reference them (an address, a finalizer, C "
                "memory). Keep the tokens in one array the dataset holds as an attribute and "
                "read every sample from it."
            )
    if not unmeasured:
        return ""
    return (
        "Not judged here: whether make_flat kept the tokens where your dataset references "
        f"nothing (rank(s) {', '.join(map(str, unmeasured))} cannot count malloc's bytes in "
        "use without glibc's mallinfo2, e.g. on macOS)."
    )
