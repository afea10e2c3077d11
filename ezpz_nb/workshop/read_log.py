"""Notebook 12's read log, kept in the notebook's process: every document read, in order.

The checker of :mod:`.throughput` judges where a rank loaded its documents: inside the
steps, beside them, or hidden before them. What it trusts must not live in the rank,
where the learner's code runs and can reach the checker's files, frames and module
globals (a fourth outside trial rewrote a log file, patched ``os`` and ``time`` there,
and formatted a count as 0). So the documents' text lives here: a :class:`ReadLog` in
the notebook's process serves ``document(i)`` over a Unix socket, and numbers every
request it gets with its own counter, under one lock: the order of events, not a
clock, is the evidence. It counts the words of each read itself (from its own dataset).

Each rank's job opens two connections before the learner's code runs (``rank <r>``, its
reads; ``mark <r>``, the checker's training loop's marks, :class:`Marked`), and the
kernel's peer credentials tie the rank to its pid. Reads from another process (a
DataLoader worker) come on a connection of their own (``worker <r>``), accepted only from
a process below the rank. So who read is known here, not from what the rank says: the
rank's own process (any of its threads), or a worker. A load (``dataset[i]`` finished:
the text tokenized) sends ``done i b`` on the same connection, logged with the read it
ended and ``b``, the batch a DataLoader worker was fetching then (:func:`fetching`). The
marks must arrive in the loop's order (``a e s`` asked for step s, ``g e s`` got it,
``z e`` the epoch ended): a mark out of turn is noted in :attr:`ReadLog.faults`,
as is any refused connection. The marks are sent by code in the rank, so each event also
carries the rank's finished steps as the kernel counts them (:mod:`.step_bytes`, measured
at ``sync`` lines of the mark connection); a batch that came before the kernel counted
every earlier step is a fault.

The rank side (:class:`ServedDocuments`, :class:`Marked`, :func:`claim`) needs only the
standard library and torch: a rank imports this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import FrameType
from typing import Any

from ezpz_nb.data.distributed import forward_set_epoch
from ezpz_nb.models.tokenizing import TokenizingDataset
from ezpz_nb.workshop.read_counts import RankLog, Read
from ezpz_nb.workshop.step_bytes import StepBytes
from ezpz_nb.workshop.witness import descendants, peer_pid

__all__ = ["Marked", "Read", "ReadLog", "ServedDocuments", "claim"]


class ReadLog:
    """In the notebook's process: serve the documents to the ranks, log every read in order.

    Use as a context manager around the run; :attr:`address` goes to the rank job.
    Attributes: ``ranks`` (``{rank: RankLog}``), ``faults`` (what was refused, in words).
    """

    def __init__(self, reference: TokenizingDataset) -> None:
        self.reference = reference
        self.bytes = StepBytes(reference.world)
        self.ranks: dict[int, RankLog] = {}
        self.faults: list[str] = []
        self._seq, self._lock = 0, threading.Lock()
        self._texts: dict[int, str] = {}
        self._folder = tempfile.mkdtemp(prefix="ezpz-nb12-")
        self.address = os.path.join(self._folder, "socket")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(16)
        self._threads = [threading.Thread(target=self._serve, daemon=True)]
        self._conns: list[socket.socket] = []
        self._threads[0].start()

    def __enter__(self) -> ReadLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving, close every connection, join the threads, remove the socket's folder."""
        for s in [self._sock, *self._conns]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self.bytes.close()
        for t in list(self._threads):
            t.join(5.0)
        shutil.rmtree(self._folder, ignore_errors=True)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # accept() fails once close() shut the listener
            while True:
                self._start(self._sock.accept()[0])

    def _start(self, conn: socket.socket) -> None:
        """Answer ``conn`` in a thread of its own, kept for :meth:`close` to end and join."""
        t = threading.Thread(target=self._answer, args=(conn,), daemon=True)
        with self._lock:
            self._conns.append(conn)
            self._threads.append(t)
        t.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rw", encoding="ascii", newline="\n") as f:
            with contextlib.suppress(OSError, ValueError, UnicodeError):
                kind, rank = self._claim(f.readline(), peer := peer_pid(conn))
                f.write("ok\n" if kind else "no\n")
                f.flush()
                began: dict[int, tuple[int, int]] = {}  # this reader's reads not yet loaded
                while kind and (line := f.readline()):
                    word = line.split()
                    if kind == "mark" and word[:1] == ["sync"] and len(word) == 2:
                        answer = self.bytes.sync(word[1], rank, peer)
                    else:
                        answer = self._take(kind, rank, word, began)
                    f.write(answer + "\n")
                    f.flush()

    def _claim(self, line: str, peer: int) -> tuple[str, int]:
        """``(kind, rank)`` of a new connection, or ``("", -1)`` refused (and noted)."""
        word = line.split()
        ok = len(word) == 2 and word[0] in ("rank", "mark", "worker") and word[1].isdigit()
        kind, rank = (word[0], int(word[1])) if ok else ("", -1)
        with self._lock:
            log = self.ranks.get(rank)
            if kind == "rank" and log is None:
                self.ranks[rank] = RankLog(pid=peer)
                return kind, rank
            if log is not None and kind == "mark" and peer == log.pid and not log.marking:
                log.marking = True  # a second mark connection is refused
                return kind, rank
            if log is not None and kind == "worker" and peer != log.pid:
                if peer in descendants(log.pid) or not os.path.isdir("/proc"):
                    return kind, rank
            self.faults.append(f"a connection of process {peer} asking as {line.strip()!r}")
            return "", -1

    def _take(
        self, kind: str, rank: int, word: list[str], began: dict[int, tuple[int, int]]
    ) -> str:
        """Log one request under the next number; answer a read with the document's text.

        ``began``: the reads of this connection not yet loaded (``done``), by sample.
        """
        steps = self.bytes.steps(rank)  # read before the number: never later than the event
        with self._lock:
            log, self._seq = self.ranks[rank], self._seq + 1
            if kind == "mark":
                self._mark(rank, log, word, steps)
                return "ok"
            done = word[:1] == ["done"]
            word = word[1:] if done else word
            # A load by the thread that runs the checker's loop ends "loop" (see read_counts).
            loop = done and word[-1:] == ["loop"]
            word = word[:-1] if loop else word
            # A load may name the batch a DataLoader worker was fetching: "done i b".
            named = done and len(word) == 2 and word[1].removeprefix("-").isdigit()
            batch = int(word.pop()) if named else -1
            if len(word) != 1 or not word[0].isdigit() or int(word[0]) >= len(self.reference):
                return "bad"
            i, worker = int(word[0]), kind == "worker"
            read = Read(self._seq, i, self.reference.words_of(i), worker, steps)
            if done:
                start, start_steps = began.pop(i, (self._seq, steps))
                log.loads.append(
                    replace(read, began=start, began_steps=start_steps, batch=batch, loop=loop)
                )
                return "ok"
            began[i] = (self._seq, steps)
            log.reads.append(read)
        # Made outside the lock: one read's text does not hold up the others' numbers.
        if i not in self._texts:
            self._texts[i] = self.reference.document(i)
        return self._texts[i]

    def _mark(self, rank: int, log: RankLog, word: list[str], steps: int) -> None:
        """Note a mark of the training loop, or a fault when it is not one the loop makes next.

        A batch that came (``g``) before the kernel counted every earlier step's all-reduce
        is a fault too: the loop's all-reduce was held back or skipped.
        """
        kind, e, s = log.last
        allowed = {
            "a": [("g", e, s), ("z", e, 0)],  # the batch came, or the epoch ended
            "g": [("a", e, s + 1)],
            "z": [("a", e + 1, 0)],
        }.get(kind, [])
        got = " ".join(word)
        for mark in allowed:
            if got == " ".join(map(str, mark[:2] if mark[0] == "z" else mark)):
                log.marks[mark] = self._seq
                log.last = mark
                if mark[0] == "g":
                    if 0 <= steps < log.gets:
                        self.faults.append(
                            f"rank {rank}'s batch of epoch {mark[1]} step {mark[2]} came when "
                            f"the kernel had counted the all-reduces of {steps} of the "
                            f"{log.gets} steps before it"
                        )
                    log.gets += 1
                return
        self.faults.append(f"rank {rank}'s loop marked {got!r} out of turn")
        log.last = ("", -1, -1)  # nothing after a fault is trusted


def fetching() -> int:
    """The batch a DataLoader worker is fetching now, or -1 (not a worker, its
    ``worker_init_fn``, between batches): ``idx`` of torch's worker loop, bound while it
    fetches the batch the DataLoader asked of it (a prefetch at any depth asks first)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_worker_loop" and code.co_filename.endswith(_WORKER_FILES):
            idx = frame.f_locals.get("idx")
            return idx if type(idx) is int else -1
        frame = frame.f_back
    return -1


# torch's DataLoader and torchdata's StatefulDataLoader: each keeps its batch in ``idx``.
_WORKER_FILES = tuple(
    os.path.join(*parts, "worker.py")
    for parts in (("torch", "utils", "data", "_utils"), ("torchdata", "stateful_dataloader"))
)


def claim(address: str, hello: str) -> Callable[[str], str]:
    """A connection to the :class:`ReadLog` that claimed ``hello``, as ``ask(line) -> answer``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    f, lock = sock.makefile("rw", encoding="ascii", newline="\n"), threading.Lock()

    def ask(line: str) -> str:
        with lock:  # one line out, its answer back: the rank's threads never interleave
            f.write(f"{line}\n")
            f.flush()
            return f.readline().rstrip("\n")

    if ask(hello) != "ok":
        raise RuntimeError(
            f"the checker refused {hello!r}: only the rank's own connection, made before your "
            "code ran, and its DataLoader workers' may ask for documents. Read them only "
            "through the dataset you are given (dataset[i])."
        )
    return ask


class ServedDocuments(TokenizingDataset):
    """The exercise's dataset in a rank: each document's text asked of the notebook's log.

    Tokenizing stays here (the loading work the exercise is about); the text, and the
    record of who asked for it when, stay in the notebook's process. A DataLoader worker
    (another process) opens its own connection at its first read.
    """

    def __init__(self, reference: TokenizingDataset, address: str, rank: int) -> None:
        super().__init__(
            reference.num_samples,
            words=reference.words,
            heavy_rank=reference.heavy_rank,
            heavy_factor=reference.heavy_factor,
            world=reference.world,
        )
        self._address, self._rank = address, rank
        self._asks = {os.getpid(): claim(address, f"rank {rank}")}
        self._loop = threading.get_ident()  # made in the job's thread, which runs the loop

    def __getstate__(self) -> dict[str, Any]:
        # Sent to a worker started by spawn or a forkserver: it opens its own connection.
        return {**self.__dict__, "_asks": {}}

    def document(self, index: int) -> str:
        """Document ``index``'s text, from the notebook's process (which logs the read)."""
        text = self._ask(f"{int(index)}")
        if text == "bad":
            raise IndexError(f"index {index!r} outside 0..{len(self) - 1}")
        return text

    def __getitem__(self, index: int) -> dict[str, Any]:
        """The sample, tokenized here; its end (``done``) logged: a load is counted where it ends."""
        sample = super().__getitem__(index)
        by_loop = " loop" if threading.get_ident() == self._loop else ""
        self._ask(f"done {int(index)} {fetching()}{by_loop}")
        return sample

    def _ask(self, line: str) -> str:
        pid = os.getpid()
        if pid not in self._asks:  # a worker forked from the rank: its own connection
            self._asks = {pid: claim(self._address, f"worker {self._rank}")}
        return self._asks[pid](line)


class Marked:
    """The loader as the checker's loop sees it: each ask and get marked in the notebook's log.

    ``a e s`` before asking for step s's batch (step 0: before ``iter()``, where workers
    start), ``g e s`` once it came, ``z e`` when the epoch ended. Between a ``g`` and the
    next ``a`` the rank's own thread runs the step, not the loader.
    """

    def __init__(self, loader: Any, mark: Callable[[str], str]) -> None:
        self.loader, self._mark, self._epoch = loader, mark, 0
        self.dataset = getattr(loader, "dataset", None)  # the recorder's sample count

    def set_epoch(self, epoch: int) -> None:
        """Label the next pass and pass the epoch on, as the recorder would."""
        self._epoch = epoch
        forward_set_epoch(self.loader, epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        e, step = self._epoch, 0
        self._mark(f"a {e} 0")
        it = iter(self.loader)
        while True:
            if step:
                self._mark(f"a {e} {step}")
            try:
                batch = next(it)
            except StopIteration:
                self._mark(f"z {e}")
                return
            self._mark(f"g {e} {step}")
            yield batch
            step += 1
