"""The bytes that crossed between notebook 16's ranks, counted by the kernel, against the record.

:mod:`.sent_log` records, inside each rank, every collective the learner's function makes;
but code in a rank can call torch's own functions past any wrapper (taken from the
wrapper's closure, a process group made anew, a socket of its own), and nothing inside
the rank can stop it. The kernel's byte counters can see it: the notebook's process reads
them (:mod:`ezpz_nb._tcp_bytes`) for every TCP connection the ranks (and their children)
hold, at three moments each rank asks for, all ranks waiting at once (and a gloo
message is always waited for by its receiver, so no byte is in flight between ranks then):
before the learner's function, after it, and after the rank has
replayed the recorded collectives (the same process groups, ops, shapes and dtypes, the
tensors zeros: :func:`replay`). Gloo frames the same op sequence the same way, so the
replay crosses as many bytes as the recorded collectives did; bytes beyond it crossed
outside the collectives the checker saw (:func:`judge_wire`). The checker's own
connections (the reads, the record) are left out by port; the control channel is a pipe.
Two more counts, each read at the same moments: the size of the ranks' ``FileStore`` (a
process group made inside the function, even one destroyed before it returns, writes its
rendezvous there) and the sockets of other kinds the ranks hold (a UDP or Unix socket of
the learner's own, whose bytes the kernel does not count per connection).

The replay runs in the rank, so each replayed call is streamed to the checker as it runs
(``replay`` lines) and must match the calls recorded while the learner's function ran
(``wire`` lines): a call added to the replay, or a tensor grown, is seen. Where the
counters cannot be read (not Linux, a kernel that refuses), this rule is not judged and
the verdict says why. Torch and the standard library only in what a rank runs.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ezpz_nb._tcp_bytes import Conn, read_conns, socket_inodes, unavailable

__all__ = [
    "SLACK",
    "Readings",
    "WireCounter",
    "crossed",
    "judge_wire",
    "nbytes",
    "replay",
    "spec",
    "store_file",
]

#: Bytes the learner's window may exceed its replay by: none. Gloo frames the same calls
#: the same way, and every reading is taken with all ranks waiting (nothing in flight), so
#: the two agree to the byte (measured: see :func:`judge_wire`); one float64 is 8 bytes.
SLACK = 0
#: The moments read, in the order each rank asks for them.
LABELS = ("before", "after", "replayed")


@dataclass(frozen=True)
class _Zeros:
    """A tensor argument as the replay needs it: its shape and dtype, no values."""

    shape: tuple[int, ...]
    dtype: Any


def spec(obj: Any) -> Any:
    """``obj`` (a call's arguments) with every tensor, in lists and tuples too, by shape."""
    if hasattr(obj, "detach") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        return _Zeros(tuple(obj.shape), obj.dtype)
    if isinstance(obj, (list, tuple)):
        return type(obj)(spec(v) for v in obj)
    return obj


def _made(obj: Any) -> Any:
    import torch

    if isinstance(obj, _Zeros):
        return torch.zeros(obj.shape, dtype=obj.dtype)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_made(v) for v in obj)
    return obj


def nbytes(obj: Any) -> int:
    """The bytes of every tensor (or :func:`spec` of one) in ``obj``, lists included."""
    if isinstance(obj, _Zeros):
        return _numel(obj.shape) * _itemsize(obj.dtype)
    if hasattr(obj, "element_size") and hasattr(obj, "numel"):
        return int(obj.numel()) * int(obj.element_size())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _itemsize(dtype: Any) -> int:
    return int(dtype.itemsize)


def replay(
    calls: list[tuple[str, Callable[..., Any], Any, Any]], note: Callable[[str], Any]
) -> None:
    """Make ``calls`` again, in order, with zeros: each a (name, torch's own function,
    :func:`spec` of its positional and keyword arguments); each waited for, each noted."""
    for name, fn, args, kwargs in calls:
        made_args, made_kwargs = _made(args), {k: _made(v) for k, v in kwargs.items()}
        note(f"replay {name} {nbytes(made_args) + nbytes(list(made_kwargs.values()))}")
        work = fn(*made_args, **made_kwargs)
        if hasattr(work, "wait"):
            work.wait()


def store_file() -> str:
    """The file of this rank's default store (a ``FileStore``, maybe under prefixes), or
    ``-`` when it is not one (under torchrun a ``TCPStore``: its bytes are counted as TCP)."""
    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    while not hasattr(store, "path") and hasattr(store, "underlying_store"):
        store = store.underlying_store
    path = str(getattr(store, "path", "") or "")
    return path if path and not any(c.isspace() for c in path) else "-"


Readings = dict[int, Conn]


class WireCounter:
    """The notebook's side: reads the ranks' connections when every rank has asked.

    A rank asks ``snap <label>`` (``snap before <pid>`` first, before the learner's code
    runs: that ties the rank to its process) over its record connection and waits; when
    every rank has asked for the same label, one reading of every rank's (and its
    children's) TCP connections is taken, and all are answered. Each label is taken once
    per rank, in order; any other ask is noted in :attr:`faults` and answered ``bad``.
    ``skip_port``: the checker's own server, whose connections are not counted.
    """

    def __init__(self, dp: int, skip_port: int) -> None:
        self.dp, self.skip_port = dp, skip_port
        self.reason = unavailable()
        self.pids: dict[int, int] = {}
        self.store_path = ""  # the ranks' FileStore, said by rank 0 before the learner's code
        self.readings: dict[str, Readings] = {}
        self.held: dict[str, set[int]] = {}  # label -> every socket the ranks held
        self.store_size: dict[str, int | None] = {}
        self.faults: list[str] = []
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()
        self._meet = {
            label: threading.Barrier(dp, action=functools.partial(self._read, label))
            for label in LABELS
        }

    def ask(self, rank: int, line: str) -> str:
        """Answer a rank's ``snap`` line (blocks until every rank asked the same)."""
        word = line.split()
        with self._lock:
            step = self._next.get(rank, 0)
            label = LABELS[step] if step < len(LABELS) else None
            pid = word[2] if len(word) == 4 and label == "before" else None
            if label is None or word[1:2] != [label] or (label == "before") != (pid is not None):
                self.faults.append(f"rank {rank} asked {line.strip()!r} out of turn")
                return "bad"
            if pid is not None:
                self.pids[rank] = int(pid) if pid.isdigit() else -1
                if self.pids[rank] == os.getpid():  # under torchrun: each rank checks itself
                    self.reason = "this rank is the checker's own process (under torchrun)"
                self.store_path = word[3] if rank == 0 and word[3] != "-" else self.store_path
            self._next[rank] = step + 1
        if self.reason is not None:
            return "off"
        try:
            self._meet[label].wait()
        except threading.BrokenBarrierError:
            return "bad"
        return "ok"

    def close(self) -> None:
        """Release every rank still waiting (the check is over)."""
        for meet in self._meet.values():
            meet.abort()

    def _read(self, label: str) -> None:
        from ezpz_nb.workshop.witness import descendants

        pids = set(self.pids.values())
        for pid in list(pids):
            pids |= descendants(pid)
        inodes: set[int] = set()
        for pid in pids:
            inodes |= socket_inodes(pid)
        try:
            conns = read_conns(inodes)
        except OSError as err:
            self.reason = f"the kernel refused its per-connection byte counters ({err})"
            return
        skip = self.skip_port
        self.readings[label] = {
            i: c for i, c in conns.items() if skip not in (c.local_port, c.remote_port)
        }
        self.held[label] = inodes - {
            i for i, c in conns.items() if skip in (c.local_port, c.remote_port)
        }
        self.store_size[label] = _size(self.store_path)


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path) if path else None
    except OSError:
        return None


def crossed(a: Readings, b: Readings) -> tuple[int, int]:
    """Bytes that crossed between readings ``a`` and ``b``, and how many connections are new.

    A connection whose other end the ranks hold too counts what each end received (so
    each byte once, and no acknowledgement, which the kernel may delay, is waited for); one
    to a process outside counts both ways. A connection gone by ``b`` is not seen.
    """
    ends = {(c.local_port, c.remote_port) for c in b.values()}
    total = new = 0
    for inode, c in b.items():
        was = a.get(inode)
        if was is None and c.remote_port:
            new += 1
        inside = (c.remote_port, c.local_port) in ends
        now = c.received + (0 if inside else c.acked)
        then = 0 if was is None else was.received + (0 if inside else was.acked)
        total += now - then
    return total, new


def judge_wire(
    counter: WireCounter, wire: dict[int, list[str]], replayed: dict[int, list[str]]
) -> tuple[str | None, str]:
    """(what is wrong or None, a note for a right verdict): the learner's bytes against the replay's.

    ``wire``/``replayed``: each rank's calls as recorded, and as replayed. Measured on a
    2-core machine at load average 22-27 (gloo over loopback): 315 checks of the tests'
    16 right answers (object collectives, point to point, reduce + broadcast, functional and
    asynchronous ones included) at dp 2, 3 and 4: the learner's window and its replay crossed
    the same bytes, to the byte, every time, hence :data:`SLACK` 0. Over: every loss
    all-gathered past the recorder 656 B (dp 2, N 9) to 3936 B (dp 4, N 19); a few losses
    over a socket of the learner's own 53-186 B. A process group made and destroyed inside
    the function leaves no connection to count: its rendezvous grew the store's file
    (386-836 B), which is read too. What it cannot see: a socket (or process group under
    torchrun's TCP store) opened and closed inside the function; UDP, Unix sockets, files
    and shared memory, unless a socket is still open at the second reading; a learner who
    forges the record's lines and the replay list alike (both reachable in the rank).
    """
    if counter.faults:
        return f"the checker's readings were asked out of turn ({counter.faults[0]})", ""
    if counter.reason is not None:
        return None, f" (The bytes on the wire: not judged: {counter.reason}.)"
    for rank in sorted(wire):
        if wire[rank] != replayed.get(rank, []):
            return (
                f"rank {rank}'s replay of its recorded collectives differs from what it "
                "recorded (the replay list was changed)"
            ), ""
    r, size = counter.readings, counter.store_size
    if any(label not in r for label in LABELS):
        return None, " (The bytes on the wire: not judged: a reading is missing.)"
    if None not in (size["before"], size["after"]) and size["after"] != size["before"]:
        return (
            f"your ranks wrote {size['after'] - size['before']} bytes to the process group's "  # type: ignore[operator]
            "key-value store while your function ran (a process group made inside it, or the "
            "store used directly): that is rendezvous plumbing, not a collective"
        ), ""
    others = counter.held["after"] - counter.held["before"] - set(r["after"])
    if others:
        return (
            f"your ranks opened {len(others)} socket(s) of their own during your function "
            "that are not the process group's (the checker cannot count what crossed them)"
        ), ""
    learner, new = crossed(r["before"], r["after"])
    explained, _ = crossed(r["after"], r["replayed"])
    if learner - explained > SLACK:
        more = f", over {new} connection(s) opened during it" if new else ""
        return (
            f"{learner - explained} bytes crossed between your ranks beyond what the "
            f"collectives the checker saw carry ({learner} in all, {explained} for those "
            f"collectives{more}): data went around torch.distributed's functions (the "
            "original taken from a wrapper, a process group of your own, a socket)"
        ), ""
    return None, ""
