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
rank to clear or rewrite; :func:`judge_sent` (run in the notebook's process) checks it
against the checker's own read log: a rank's sent values must hold the partial sum of what
that rank read, which the checker knows from outside the rank, and not the losses themselves.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.workshop.stops import wrong

__all__ = ["Sent", "judge_channel", "judge_sent", "recording"]

#: A sent value equal to a loss the rank read (float32 keeps 7 digits): two such, raw losses.
LOSS_MATCH = 1e-6
#: A sent value that is the rank's part: float32 sums of up to 40 losses stay within 2e-6.
PART_MATCH = 1e-5
#: Numbers one rank may send: a pair (2), a reduce then a broadcast (4), a one-hot
#: (dp, 2) table all-reduced (8 at dp 4), and a margin; the losses of a shard (up to 20) not.
MAX_SENT = 12
# Measured over 1000 draws of exact_eval.draw_case x 3 layouts (strided, blocks, padded with
# weight 0) x float32/float64 pairs: 0 right answers refused, every raw-loss send refused;
# the worst float32 partial sum is 2.1e-7 off (PART_MATCH 1e-5: 47x margin), and the closest
# a pair's sum or count came to a single loss is 1.9e-5 relative (LOSS_MATCH 1e-6: 19x; one
# such match is never enough, it takes two).


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
#: Numbers kept per call (the count is kept whole): a pair is 2, every loss at most 40.
_KEEP = 256


@dataclass
class Sent:
    """One rank's record, kept by the checker (the rank streams it, line by line, as its
    calls happen: nothing of it stays in the rank to rewrite): each collective (its name,
    how many numbers it sent, the first of them) and each use of the key-value store, in
    order; ``intact``: the rank said, after the learner's function returned, that every
    wrapper was still in place (never said: the function broke the stream)."""

    calls: list[tuple[str, int, list[float]]] = field(default_factory=list)
    store: list[str] = field(default_factory=list)
    intact: bool = False
    intact_said: bool = False  # a second "intact" line is forged: it counts as not intact

    def take(self, line: str) -> bool:
        """Add one streamed line (``sent``, ``store`` or ``intact``); False if not one."""
        word = line.split()
        try:
            if len(word) >= 3 and word[0] == "sent":
                self.calls.append((word[1], int(word[2]), [float(v) for v in word[3:]]))
            elif len(word) == 2 and word[0] == "store":
                self.store.append(word[1])
            elif len(word) == 2 and word[0] == "intact":
                self.intact = word[1] == "1" and not self.intact_said
                self.intact_said = True
            else:
                return False
        except ValueError:
            return False
        return True


class _Depth(threading.local):
    depth = 0  # >0 inside a recorded call: its inner calls are part of it


def _numbers(obj: Any, out: list[float]) -> int:
    """Append the numbers ``obj`` holds (tensors, arrays, nested containers, a pickled
    object's bytes) to ``out``, up to :data:`_KEEP`; return how many it holds."""
    if isinstance(obj, bool) or obj is None:
        return 0
    if isinstance(obj, (int, float)):
        out.append(float(obj))
        return 1
    if hasattr(obj, "detach") and hasattr(obj, "numel"):  # a tensor
        if str(obj.dtype) == "torch.uint8":  # an ``*_object`` call's pickle, sent as bytes
            try:
                return _numbers(pickle.loads(obj.detach().numpy().tobytes()), out)
            except Exception:  # noqa: BLE001 - not a pickle: bytes, no numbers kept
                return int(obj.numel())
        flat = obj.detach().reshape(-1)[: max(0, _KEEP - len(out))]
        out.extend(float(v) for v in flat.tolist())
        return int(obj.numel())
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return _numbers(obj.tolist(), out)
    if isinstance(obj, dict):
        return sum(_numbers(v, out) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return sum(_numbers(v, out) for v in obj)
    if isinstance(obj, (bytes, bytearray)):  # packed doubles (struct, array, numpy bytes)
        if len(obj) % 8:
            return len(obj)
        return _numbers(list(struct.unpack(f"<{len(obj) // 8}d", obj)), out)
    if isinstance(obj, str):  # a number or JSON written out
        try:
            return _numbers(json.loads(obj), out)
        except ValueError:
            return 0
    return 0


def _get(owner: Any, name: str) -> Any:
    return owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)


def _targets() -> list[tuple[Any, str, Callable[[tuple[Any, ...]], Any] | None]]:
    """(owner, name, what a call sends) for every function :func:`recording` wraps."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch._C import _distributed_c10d as cpp

    def arg(i: int | None, shift: int) -> Callable[[tuple[Any, ...]], Any]:
        # A method's args start with the process group itself: shift past it.
        return lambda a: [] if i is None else (a[i + shift] if len(a) > i + shift else None)

    out: list[tuple[Any, str, Callable[[tuple[Any, ...]], Any] | None]] = []
    out += [(cpp.ProcessGroup, n, arg(i, 1)) for n, i in _PG_SENDS.items()]
    for n, i in _OBJECT_SENDS.items():  # one function under two names
        out += [(c10d, n, arg(i, 0))] + ([(dist, n, arg(i, 0))] if hasattr(dist, n) else [])
    # Wrapped when loaded (importing it costs a second a rank): a learner's function that
    # uses it brings it in when the notebook sends the function, before any recording.
    if (funcol := sys.modules.get("torch.distributed._functional_collectives")) is not None:
        out += [(funcol, n, arg(0, 0)) for n in _FUNCTIONAL]
    stores = (cpp.Store, *cpp.Store.__subclasses__())
    out += [(c, n, None) for c in stores for n in _STORE_METHODS if n in c.__dict__]
    return [(o, n, pick) for o, n, pick in out if _get(o, n) is not None]


@contextmanager
def recording(note: Callable[[str], None]) -> Iterator[None]:
    """Send ``note`` a line for every collective and store use of this rank inside the
    block (:meth:`Sent.take` reads them); restore torch's functions after.

    A call inside a recorded one (``all_gather_object``'s own ``all_gather``) is part of
    it, not another line. The last line says whether every wrapper was still in place.
    """
    local = _Depth()

    def wrapper(original: Any, name: str, pick: Callable[[tuple[Any, ...]], Any] | None) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if local.depth == 0:
                if pick is None:
                    note(f"store {name}")
                else:
                    kept: list[float] = []
                    got = pick(args) if args else None
                    count = _numbers(got if got is not None else list(kwargs.values()), kept)
                    note(" ".join(["sent", name, str(count), *map(repr, kept[:_KEEP])]))
            local.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth -= 1

        return recorded

    saved = [(o, n, _get(o, n), pick) for o, n, pick in _targets()]
    wrappers: dict[int, Any] = {}  # id(original) -> its one wrapper, shared by its names
    for owner, name, original, pick in saved:
        w = wrappers.setdefault(id(original), wrapper(original, name, pick))
        setattr(owner, name, w)
    try:
        yield
    finally:
        intact = all(_get(o, n) is wrappers[id(orig)] for o, n, orig, _ in saved)
        for owner, name, original, _ in saved:
            setattr(owner, name, original)
        note(f"intact {int(intact)}")


def _partials(mine: set[int], others: set[int], losses: list[float]) -> list[float]:
    """What a rank's collectives may carry as its part: the sum of the losses only it read,
    plus any of those another rank read too (padding it weighed 0 or counted), as a sum, a
    mean over its samples, or divided by N (each rank's share of the mean)."""
    own, shared = sorted(mine - others), sorted(mine & others)
    n, out = len(losses), []
    # At most dp - 1 indices are read twice (each rank reads at most its share, and every
    # index is read): a handful of subsets.
    for pick in itertools.product((False, True), repeat=len(shared)):
        idx = own + [i for i, p in zip(shared, pick, strict=True) if p]
        if idx:
            total = math.fsum(losses[i] for i in idx)
            out += [total, total / len(idx), total / n]
    return out


def _near(a: float, b: float, rel: float) -> bool:
    return abs(a - b) <= rel * max(abs(b), 1e-12)


_FIX = "each rank sums what it read, then one all_reduce of the (sum, count) pair."


def judge_channel(rank: int, sent: Sent, case: str) -> None:
    """Stop if ``rank`` went around the collectives: the store used, or the record broken.

    Judged before the value: whatever a rank returned, this is what is wrong with it.
    ``case`` names the drawn case in the verdict.
    """
    fix = _FIX
    if not sent.intact:
        raise wrong(
            f"rank {rank} put back or replaced torch.distributed's functions (its collectives, "
            f"the store) the checker watches, so it cannot see how the ranks combined {case}: "
            f"leave them as they are; {fix}"
        )
    if sent.store:
        raise wrong(
            f"your ranks never combined with a collective {case}: rank {rank} went through the "
            f"process group's key-value store ({', '.join(sorted(set(sent.store)))}), which "
            f"is rendezvous plumbing, not a collective: {fix}"
        )


def judge_sent(rank: int, got: list[Any], losses: list[float], case: str) -> None:
    """Stop unless ``rank`` combined through collectives that carried its part, not every loss.

    ``got`` holds each rank's (answer, indices it read, :class:`Sent`), the indices from the
    checker's read log: the rank's partial sum is known from outside the rank, and checked
    against what its record says it sent. ``case`` names the drawn case in the verdict.
    """
    _, reads, sent = got[rank]
    fix = _FIX
    values = [v for _, _, kept in sent.calls for v in kept]
    numbers = sum(count for _, count, _ in sent.calls)
    if not numbers:
        raise wrong(
            f"your ranks never combined with a collective {case}: rank {rank} sent nothing "
            f"through torch.distributed (a file, a socket or the store does not count): {fix}"
        )
    mine = [losses[i] for i in reads]
    raw = sum(any(_near(v, loss, LOSS_MATCH) for v in values) for loss in mine)
    if raw >= 2 or numbers > MAX_SENT:
        raise wrong(
            f"you sent every loss {case}: rank {rank} sent {numbers} values over the wire, "
            f"where a (sum, count) pair per rank gives the same exact mean: {fix}"
        )
    if not _carries(rank, got, losses):
        # The root of a combine by hand (the others send it their parts point to point, it
        # sends back what it added up) never sends its own part: it sends the total.
        total = math.fsum(losses)
        root = any(_near(v, t, PART_MATCH) for v in values for t in (total, total / len(losses)))
        if not (root and all(_carries(r, got, losses) for r in range(len(got)) if r != rank)):
            raise wrong(
                f"rank {rank}'s collectives did not carry the sum of the losses it read {case} "
                f"(it sent {values[:4]}): the mean must come from what the ranks sent: {fix}"
            )


def _carries(rank: int, got: list[Any], losses: list[float]) -> bool:
    """Whether ``rank`` sent, in some collective, its part of what the ranks read."""
    _, reads, sent = got[rank]
    others = {i for r, (_, rd, _) in enumerate(got) if r != rank for i in rd}
    values = [v for _, _, kept in sent.calls for v in kept]
    return any(
        _near(v, p, PART_MATCH) for p in _partials(set(reads), others, losses) for v in values
    )
