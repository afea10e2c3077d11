"""The protocol between the notebook and its ranks: the messages and how they travel.

Both ends import this module and nothing of each other. Every message is one of
the NamedTuples below, sent as one pickle over the rank's command pipe:

=========================  ==========================================================
notebook -> rank           rank -> notebook
=========================  ==========================================================
:class:`Run` (a job)       :class:`Ready` once joined, then per run :class:`Ok`,
:class:`Stop`              :class:`Error` or :class:`Unpicklable`; any number of
                           :class:`Event` (``publish``) while a run goes on
=========================  ==========================================================

Replies are pickled with cloudpickle, so a rank may return objects it defined;
jobs with :func:`dumps_job`, which makes every function sent by value share the
rank's persistent namespace (see :class:`_JobPickler`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import types
from collections import ChainMap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import cloudpickle

from ezpz_nb.launcher import submodules


class Frame(NamedTuple):
    """One frame of a rank's stack, as plain data (the only definition of a frame)."""

    filename: str
    lineno: int
    name: str
    #: The source line as the rank read it, or "" (a cell only the notebook knows).
    line: str = ""


class Link(NamedTuple):
    """One exception of a chain: its frames (outermost first) and its header."""

    frames: tuple[Frame, ...]
    #: ``"Type: message"``, as the last line of a Python traceback.
    header: str
    #: The sentence Python prints before it when it follows another ("" for the first).
    link: str = ""


#: An exception and its causes, oldest first.
Chain = tuple[Link, ...]


class Run(NamedTuple):
    """Run a job: ``dumps_job((fn, args, kwargs))``."""

    job: bytes


class Stop(NamedTuple):
    """Leave: the notebook closes the cluster."""


class Ready(NamedTuple):
    """The rank joined the process group."""

    pid: int


class Ok(NamedTuple):
    """The run returned ``value``."""

    value: Any


class Error(NamedTuple):
    """The run (or the start) raised; ``ours`` is set when ezpz_nb's own code failed.

    Made by :func:`ezpz_nb.launcher.failures.encode` on the rank, read back by
    :func:`ezpz_nb.launcher.failures.decode` in the notebook.
    """

    chain: Chain
    ours: str = ""


class Unpicklable(NamedTuple):
    """The reply could not be pickled: ``what`` it was and ``why`` not."""

    what: str
    why: str


class Event(NamedTuple):
    """An item the running function published (``ez.publish``)."""

    item: Any


ToRank = Run | Stop
ToNotebook = Ready | Ok | Error | Unpicklable | Event


@dataclass(frozen=True)
class RankEvent:
    """An :class:`Event` as the notebook keeps it (see :func:`ezpz_nb.events.publish`).

    Not a message itself: the notebook makes one per :class:`Event` it receives.

    Attributes:
        rank: Global rank that published it.
        item: The published object (already unpickled).
        time: ``time.monotonic()`` in the notebook process when it arrived.
    """

    rank: int
    item: Any
    time: float


def _code_keep_filename(code: types.CodeType) -> tuple:
    # cloudpickle renames every code object's file to "<dynamic-code>"; we keep the
    # real one so tracebacks and hang reports can point at the learner's cell line.
    ctor, args = cloudpickle.cloudpickle._code_reduce(code)
    return ctor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


def _lru_cache(fn: Any, maxsize: int | None, typed: bool) -> Any:
    """Wrap ``fn`` in a new, empty ``functools.lru_cache`` (see :class:`_Pickler`)."""
    return functools.lru_cache(maxsize=maxsize, typed=typed)(fn)


#: Objects pickled once already, by id: ``(object, its pickle)`` (see :func:`sent_once`).
_SENT_ONCE: dict[int, tuple[Any, bytes | Exception]] = {}
#: The namespaces of the jobs :func:`loads_job` is loading now, innermost last.
_LOADING: list[dict[str, Any]] = []


@contextlib.contextmanager
def sent_once(objs: Iterable[Any]) -> Iterator[None]:
    """While inside, every pickle made here sends each of ``objs`` as its pickle made now.

    Pickling runs code of the object's own (a ``__reduce__``, in a default argument or a
    closure): a workshop check pickles the learner's function once, before it draws
    anything, so that code never runs while the check's secrets exist in this process.
    One that cannot be pickled fails the same way each time, without running it again.
    """
    made = {id(o): (o, _pickled(o)) for o in objs}
    before = dict(_SENT_ONCE)
    _SENT_ONCE.update(made)
    try:
        yield
    finally:
        _SENT_ONCE.clear()
        _SENT_ONCE.update(before)


def _pickled(obj: Any) -> bytes | Exception:
    try:
        return dumps_job(obj)
    except Exception as exc:  # noqa: BLE001 - raised again wherever it is sent
        return exc


def _load_sent(data: bytes) -> Any:
    """An object :func:`sent_once` pickled, loaded into the namespace of the job being loaded."""
    return loads_job(data, _LOADING[-1] if _LOADING else None)


class _Pickler(cloudpickle.Pickler):
    if hasattr(cloudpickle.cloudpickle, "_code_reduce"):
        dispatch_table = ChainMap(
            {types.CodeType: _code_keep_filename}, cloudpickle.Pickler.dispatch_table
        )

    def reducer_override(self, obj: Any) -> Any:
        sent = _SENT_ONCE.get(id(obj))
        if sent is not None and sent[0] is obj:
            # Its bytes, made before: pickling it again would run its code again, now.
            if isinstance(sent[1], Exception):
                raise pickle.PicklingError(str(sent[1]))
            return _load_sent, (sent[1],)
        # An lru_cache (or functools.cache) wrapper pickles by name, module and qualname:
        # a notebook's __main__ has the name, a rank's __main__ does not (AttributeError
        # on the rank). Send the function it wraps by value and wrap it again there.
        if isinstance(obj, functools._lru_cache_wrapper):
            fn = obj.__wrapped__
            by_name = getattr(cloudpickle.cloudpickle, "_should_pickle_by_reference", None)
            if isinstance(fn, types.FunctionType) and by_name is not None and not by_name(fn):
                params = obj.cache_parameters()
                return _lru_cache, (fn, params["maxsize"], params["typed"])
        return super().reducer_override(obj)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        # cloudpickle lists the submodules a by-value function names, for the rank to
        # import first; keep only those its code can reach (see submodules.py).
        reduced = super()._dynamic_function_reduce(func)
        try:
            slotstate = reduced[2][1]
            listed = slotstate["_cloudpickle_submodules"]
        except (IndexError, KeyError, TypeError):  # another cloudpickle: leave it be
            return reduced
        slotstate["_cloudpickle_submodules"] = submodules.reached(func, listed)
        return reduced


def dumps(obj: Any) -> bytes:
    """cloudpickle, keeping source file names (functions travel by value)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    """Load a message from the other end."""
    return pickle.loads(data)


def new_namespace() -> dict[str, Any]:
    """A rank's namespace: shared by every function sent by value (and %%ranks cells)."""
    return {"__name__": "__ranks__", "__builtins__": __builtins__}


# Stands in the pickle for the globals dict of every function sent by value.
_GLOBALS_TOKEN = "ezpz_nb:rank-namespace"


class _JobPickler(_Pickler):
    """Pickles a job so that its by-value functions share the rank's namespace.

    cloudpickle gives the functions of one pickle that shared a globals dict in the
    notebook one fresh dict on the ranks (``globals_ref``), and fills it with the
    names each function uses. Here that dict travels as a persistent id, and the
    rank loads it as its namespace: cloudpickle then writes the notebook's values into
    that namespace itself (the notebook wins for names a function uses), names set only
    on the ranks persist between runs, and every kind of by-value function
    (helpers calling each other in cycles, methods of cell classes, decorated
    functions, partials, lambdas in globals) reads and writes the same globals.
    Rebinding the functions after loading instead had to walk their references
    by hand, and recursed forever on any cycle (two helpers of one function).
    """

    def persistent_id(self, obj: Any) -> str | None:  # pickle's hook
        if type(obj) is dict:
            for shared in self.globals_ref.values():
                if obj is shared:
                    return _GLOBALS_TOKEN
        return None


class _JobUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, namespace: dict[str, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._namespace = namespace

    def persistent_load(self, pid: Any) -> Any:  # pickle's hook
        if pid == _GLOBALS_TOKEN:
            return self._namespace
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps_job(obj: Any) -> bytes:
    """Pickle what the notebook sends to run (see :class:`_JobPickler`).

    Raises whatever pickling raises; :func:`ezpz_nb.launcher.startup.pack_job` is the
    checked front door that says which part cannot travel.
    """
    buf = io.BytesIO()
    _JobPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads_job(data: bytes, namespace: dict[str, Any] | None = None) -> Any:
    """Load a job made by :func:`dumps_job` (runs on a rank).

    Args:
        data: The pickled job.
        namespace: The rank's namespace, which the job's by-value functions share
            (:attr:`ezpz_nb.launcher.runtime.RankRuntime.namespace`); a fresh one if None.
    """
    namespace = new_namespace() if namespace is None else namespace
    _LOADING.append(namespace)
    try:
        return _JobUnpickler(data, namespace).load()
    finally:
        _LOADING.pop()


def unpicklable_part(named: list[tuple[str, Any]]) -> tuple[str, Any, Exception] | None:
    """The first ``(label, object, error)`` of ``named`` that :func:`dumps_job` refuses.

    Used once a whole job failed to pickle, to say which of its parts is to blame.
    """
    for label, obj in named:
        try:
            dumps_job(obj)
        except Exception as exc:  # noqa: BLE001 - any pickling error names the culprit
            return label, obj, exc
    return None


def command(msg: ToRank) -> bytes:
    """Pickle a notebook-to-rank message (plain pickle: it holds bytes and nothing else)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
