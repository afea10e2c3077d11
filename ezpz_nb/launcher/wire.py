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

import io
import pickle
import types
from collections import ChainMap
from typing import Any, NamedTuple

import cloudpickle

# (filename, lineno, function name, source line or "")
Frame = tuple[str, int, str, str]
#: An exception and its causes, oldest first: (frames, "Type: message", link sentence).
Chain = list[tuple[list[Frame], str, str]]


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
    """The run (or the start) raised; ``ours`` is set when ezpz_nb's own code failed."""

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


def _code_keep_filename(code: types.CodeType) -> tuple:
    # cloudpickle renames every code object's file to "<dynamic-code>"; we keep the
    # real one so tracebacks and hang reports can point at the learner's cell line.
    ctor, args = cloudpickle.cloudpickle._code_reduce(code)
    return ctor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    if hasattr(cloudpickle.cloudpickle, "_code_reduce"):
        dispatch_table = ChainMap(
            {types.CodeType: _code_keep_filename}, cloudpickle.Pickler.dispatch_table
        )


def dumps(obj: Any) -> bytes:
    """cloudpickle, keeping source file names (functions travel by value)."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    """Load a message from the other end."""
    return pickle.loads(data)


#: One namespace per rank shared by every function sent by value (and by %%ranks
#: cells), so globals a run sets are still there in the next run.
NAMESPACE: dict[str, Any] = {"__name__": "__ranks__", "__builtins__": __builtins__}

# Stands in the pickle for the globals dict of every function sent by value.
_GLOBALS_TOKEN = "ezpz_nb:rank-namespace"


class _JobPickler(_Pickler):
    """Pickles a job so that its by-value functions share the rank's NAMESPACE.

    cloudpickle gives the functions of one pickle that shared a globals dict in the
    notebook one fresh dict on the ranks (``globals_ref``), and fills it with the
    names each function uses. Here that dict travels as a persistent id, and the
    rank loads it as NAMESPACE: cloudpickle then writes the notebook's values into
    NAMESPACE itself (the notebook wins for names a function uses), names set only
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
    def persistent_load(self, pid: Any) -> Any:  # pickle's hook
        if pid == _GLOBALS_TOKEN:
            return NAMESPACE
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps_job(obj: Any) -> bytes:
    """Pickle what the notebook sends to run (see :class:`_JobPickler`)."""
    buf = io.BytesIO()
    _JobPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def loads_job(data: bytes) -> Any:
    """Load a job made by :func:`dumps_job` into this rank's NAMESPACE (runs on a rank)."""
    return _JobUnpickler(io.BytesIO(data)).load()


def command(msg: ToRank) -> bytes:
    """Pickle a notebook-to-rank message (plain pickle: it holds bytes and nothing else)."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
