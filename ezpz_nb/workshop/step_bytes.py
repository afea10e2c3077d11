"""How many training steps each of notebook 12's ranks has finished, counted by the kernel.

The read log (:mod:`.read_log`) places every read among the marks of the checker's
training loop, but the marks are sent by code in the rank, where the learner's code runs
too: a fifth outside trial found the loop's wrapper one frame up and sent its "asked for
step s" marks late, so every read of the slow loader looked like one made beside the
steps. What the rank cannot hold back is its gradient all-reduce: every step of the
loop sends the same tensors to the other rank through gloo's TCP connections, and the
kernel counts the bytes each socket received (:mod:`ezpz_nb._tcp_bytes`). So the log's
process reads those counters at each event: the bytes received since the loop began,
over one step's bytes, is the number of steps whose all-reduce has finished: a read for
step t's batch made when t steps had finished was waited for by the loop.

One step's bytes are measured, not assumed: before the learner's code runs, every rank
all-reduces zeros of the model's gradient shapes between two :meth:`StepBytes.sync`
points, where every rank waits on the log at once (nothing is in flight between ranks
then, so each reading is exact). A third sync after the loop must find at least as many
steps' bytes as the loop took steps. The learner's code can add bytes (collectives of its
own), which only makes its reads look later; it cannot take any back without skipping the
loop's all-reduce, which that count sees. Where the counters cannot be read (not Linux, a
kernel that refuses), ``unit`` stays 0 and only the marks count.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from ezpz_nb._tcp_bytes import Conn, read_conns, reread, socket_inodes

__all__ = ["StepBytes"]

#: The syncs, in the order each rank's job makes them: before the calibrating all-reduce,
#: after it (the loop's count starts there), after the loop.
SYNCS = ("0", "1", "2")


class StepBytes:
    """The ranks' gloo bytes received, read from the notebook's process; steps finished.

    ``unit[rank]``: one step's bytes (0 until measured, or where nothing can be read);
    ``total[rank]``: bytes received from the second sync to the third; ``faults``: syncs
    asked for again or out of order (a second calibration would reset the count).
    """

    def __init__(self, world: int, timeout: float = 300.0) -> None:
        self.world, self.timeout = world, timeout
        self.pids: dict[int, int] = {}
        self.unit: dict[int, int] = {}
        self.total: dict[int, int] = {}
        self.faults: list[str] = []
        self._synced: dict[int, int] = {}  # rank -> syncs made
        self._conns: dict[int, list[Conn]] = {}
        self._readings: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._nl: socket.socket | None = None
        with contextlib.suppress(OSError):
            self._nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
        self._meet = {k: threading.Barrier(world, self._action(k)) for k in SYNCS}

    def close(self) -> None:
        """Release every rank still waiting at a sync; close the netlink socket."""
        for meet in self._meet.values():
            meet.abort()
        if self._nl is not None:
            self._nl.close()

    def sync(self, label: str, rank: int, pid: int) -> str:
        """Rank ``rank`` (process ``pid``) waits here until every rank came: ``ok``, or ``bad``."""
        with self._lock:
            made = self._synced.get(rank, 0)
            if made >= len(SYNCS) or label != SYNCS[made]:
                self.faults.append(f"rank {rank} asked for the checker's sync {label!r} again")
                return "bad"
            self._synced[rank] = made + 1
        self.pids.setdefault(rank, pid)
        try:
            self._meet[label].wait(self.timeout)
        except threading.BrokenBarrierError:
            return "bad"
        return "ok"

    def steps(self, rank: int) -> int:
        """Steps whose all-reduce rank ``rank`` has finished since the second sync (-1: unknown)."""
        unit, base = self.unit.get(rank, 0), self._readings.get("1", {}).get(rank)
        if unit <= 0 or base is None:
            return -1
        return (self._received(rank) - base) // unit

    def _received(self, rank: int) -> int:
        with self._lock:
            if self._nl is None:
                return 0
            got = [reread(self._nl, c) for c in self._conns.get(rank, [])]
        return sum(c.received for c in got if c is not None)

    def _action(self, label: str) -> Callable[[], None]:
        def read_all() -> None:  # run by one thread while every rank waits: nothing in flight
            if label == "0":
                self._learn()
            now = {rank: self._received(rank) for rank in self.pids}
            self._readings[label] = now
            before = self._readings.get({"1": "0", "2": "1"}.get(label, ""), {})
            for rank, value in now.items():
                if rank in before:
                    (self.unit if label == "1" else self.total)[rank] = value - before[rank]

        return read_all

    def _learn(self) -> None:
        """Each rank's TCP sockets at the first sync, before the learner's code runs."""
        for rank, pid in self.pids.items():
            with contextlib.suppress(OSError):
                self._conns[rank] = list(read_conns(socket_inodes(pid)).values())
