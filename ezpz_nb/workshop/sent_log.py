"""What a rank sends to its peers while a learner's function runs: every collective and store use.

Notebook 16's checker judges how the ranks combined, not only the value they returned:
one collective of each rank's (sum, count) is the skill; a swap through the process
group's key-value store (no collective), or every loss sent, is not. :func:`recording`
wraps, in the rank and before the learner's code runs, every collective the rank can
make from Python (the ``ProcessGroup`` methods every ``torch.distributed`` function calls,
so both ``torch.distributed`` and ``distributed_c10d`` names, and a process group called
directly, are seen; the ``*_object`` functions, so the objects are seen before pickling;
the functional collectives) and the key-value store's methods. Torch only: a rank imports it.

Each call is streamed to the checker's process as it happens, so no record stays in the
rank to clear or rewrite; :mod:`.sent_rules` (run in the notebook's process) judges it
against the checker's own read log, and :mod:`.wire_bytes` the bytes it explains.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ezpz_nb.workshop.sent_count import payload
from ezpz_nb.workshop.wire_bytes import nbytes, spec

__all__ = ["Sent", "recording"]

#: ProcessGroup method -> index of the argument it sends (None: it sends nothing).
_PG_SENDS: dict[str, int | None] = {
    "allreduce": 0,
    "allreduce_coalesced": 0,
    "reduce": 0,
    "broadcast": 0,
    "send": 0,
    "allgather": 1,
    "all_gather_single": 1,
    "allgather_coalesced": 1,
    "allgather_into_tensor_coalesced": 1,
    "gather": 1,
    "scatter": 1,
    "reduce_scatter": 1,
    "reduce_scatter_single": 1,
    "reduce_scatter_tensor_coalesced": 1,
    "all_to_all_single": 1,
    "alltoall_base": 1,
    "alltoall": 1,
    "barrier": None,
    "monitored_barrier": None,
    "recv": None,
    "recv_anysource": None,
}
#: distributed_c10d functions that pickle objects -> index of the argument they send.
_OBJECT_SENDS = {
    "all_gather_object": 1,
    "gather_object": 0,
    "broadcast_object_list": 0,
    "scatter_object_list": 1,
    "send_object_list": 0,
}
#: Functional collectives (``torch.distributed._functional_collectives``): the input first.
_FUNCTIONAL = (
    "all_reduce",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all_single",
    "all_reduce_coalesced",
)
_STORE_METHODS = (
    "set",
    "get",
    "add",
    "compare_set",
    "multi_set",
    "multi_get",
    "append",
    "delete_key",
)


@dataclass
class Sent:
    """One rank's record, kept by the checker (the rank streams it, line by line, as its
    calls happen: nothing of it stays in the rank to rewrite): each collective (its name,
    how many numbers it sent, the first of them) and each use of the key-value store, in
    order; ``intact``: the rank said, after the learner's function returned, that every
    wrapper was still in place (never said: the function broke the stream)."""

    calls: list[tuple[str, int, list[float | int | Fraction]]] = field(default_factory=list)
    # What the calls sent that holds no number (text's letters, raw bytes, a packed int), as
    # (bits, digest): :mod:`.sent_bits` counts those only one rank sent.
    opaque: list[tuple[int, str]] = field(default_factory=list)
    store: list[str] = field(default_factory=list)
    # Every call that puts bytes on the wire (a process group's, at any depth; a functional
    # collective), as recorded and as replayed (:mod:`.wire_bytes`): "name nbytes" each.
    wire: list[str] = field(default_factory=list)
    replayed: list[str] = field(default_factory=list)
    intact: bool = False
    intact_said: bool = False  # a second "intact" line is forged: it counts as not intact

    def take(self, line: str) -> bool:
        """Add one streamed line (``sent``, ``store``, ``wire``, ``replay`` or ``intact``);
        False if not one."""
        word = line.split()
        try:
            if len(word) >= 3 and word[0] == "sent":
                cut = word.index("|") if "|" in word else len(word)
                hidden = [w.split(":") for w in word[cut + 1 :]]
                self.opaque += [(int(bits), digest) for bits, digest in hidden]
                self.calls.append((word[1], int(word[2]), [_exact(v) for v in word[3:cut]]))
            elif len(word) == 2 and word[0] == "store":
                self.store.append(word[1])
            elif len(word) == 3 and word[0] in ("wire", "replay") and word[2].isdigit():
                (self.wire if word[0] == "wire" else self.replayed).append(" ".join(word[1:]))
            elif len(word) == 2 and word[0] == "intact":
                self.intact = word[1] == "1" and not self.intact_said
                self.intact_said = True
            else:
                return False
        except (ValueError, ZeroDivisionError):
            return False
        return True


def _exact(token: str) -> float | int | Fraction:
    """A kept number as :mod:`.sent_count` wrote it: ``n/d`` a fraction, digits an int."""
    if "/" in token:
        return Fraction(token)
    return int(token) if token.lstrip("-").isdigit() else float(token)


class _Depth(threading.local):
    depth = 0  # >0 inside a recorded call: its inner calls are part of it


def _get(owner: Any, name: str) -> Any:
    return owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)


_Target = tuple[Any, str, "Callable[[tuple[Any, ...]], Any] | None", str]


def _targets() -> list[_Target]:
    """(owner, name, what a call sends, how it is replayed) for every function
    :func:`recording` wraps: ``"any"`` (a process group's method: at any depth, so the
    calls inside an ``*_object`` one too), ``"outer"`` (a functional collective, whose
    inner calls are torch's C++, never seen), ``""`` (not replayed: it calls those)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch._C import _distributed_c10d as cpp

    def arg(i: int | None, shift: int) -> Callable[[tuple[Any, ...]], Any]:
        # A method's args start with the process group itself: shift past it.
        return lambda a: [] if i is None else (a[i + shift] if len(a) > i + shift else None)

    out: list[_Target] = []
    out += [(cpp.ProcessGroup, n, arg(i, 1), "any") for n, i in _PG_SENDS.items()]
    for n, i in _OBJECT_SENDS.items():  # one function under two names
        out += [(c10d, n, arg(i, 0), "")]
        out += [(dist, n, arg(i, 0), "")] if hasattr(dist, n) else []
    # Imported here (10 ms quiet): a learner's function that imports it in its own body
    # would otherwise call functions no wrapper replaced, and a right answer sends "nothing".
    import torch.distributed._functional_collectives as funcol

    out += [(funcol, n, arg(0, 0), "outer") for n in _FUNCTIONAL]
    stores = (cpp.Store, *cpp.Store.__subclasses__())
    out += [(c, n, None, "") for c in stores for n in _STORE_METHODS if n in c.__dict__]
    return [t for t in out if _get(t[0], t[1]) is not None]


@contextmanager
def recording(note: Callable[[str], Any], calls: list[Any] | None = None) -> Iterator[None]:
    """Send ``note`` a line for every collective and store use of this rank inside the
    block (:meth:`Sent.take` reads them); restore torch's functions after.

    A call inside a recorded one (``all_gather_object``'s own ``all_gather``) is part of
    it, not another line. The last line says whether every wrapper was still in place.
    With ``calls``, each call that puts bytes on the wire is also kept there for
    :func:`~.wire_bytes.replay` (its arguments by shape) and noted as a ``wire`` line.
    """
    local = _Depth()

    def wrapper(
        original: Any, name: str, pick: Callable[[tuple[Any, ...]], Any] | None, again: str
    ) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if calls is not None and (again == "any" or (again == "outer" and not local.depth)):
                kept_args, kept_kwargs = spec(args), {k: spec(v) for k, v in kwargs.items()}
                size = nbytes(kept_args) + nbytes(list(kept_kwargs.values()))
                note(f"wire {name} {size}")
                calls.append((name, original, kept_args, kept_kwargs))
            if local.depth == 0:
                if pick is None:
                    note(f"store {name}")
                else:
                    got = pick(args) if args else None
                    held = payload(got if got is not None else list(kwargs.values()))
                    note(
                        " ".join(
                            ["sent", name, str(held.count), *map(str, held.kept), "|"]
                            + [f"{bits}:{digest}" for bits, digest in held.opaque]
                        )
                    )
            local.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth -= 1

        return recorded

    saved = [(o, n, _get(o, n), pick, again) for o, n, pick, again in _targets()]
    wrappers: dict[int, Any] = {}  # id(original) -> its one wrapper, shared by its names
    for owner, name, original, pick, again in saved:
        w = wrappers.setdefault(id(original), wrapper(original, name, pick, again))
        setattr(owner, name, w)
    try:
        yield
    finally:
        intact = all(_get(o, n) is wrappers[id(orig)] for o, n, orig, _, _ in saved)
        for owner, name, original, _, _ in saved:
            setattr(owner, name, original)
        note(f"intact {int(intact)}")
