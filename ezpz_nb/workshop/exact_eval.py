"""Checker for notebook 16's exercise: an evaluation loop exact on any dataset size and DP degree.

The learner writes ``exact_mean(dataset, dp_rank, dp_size) -> float``: every rank
returns the mean of ``dataset[i]["loss"]`` over all ``len(dataset)`` samples, equal to
what one process computes, while reading at least one and at most
``ceil(len / dp_size)`` samples itself, every sample read by some rank. The losses never
enter a rank: the checker serves ``dataset[i]`` from its own process (a server on
127.0.0.1, two connections per rank, one for its reads and one for its record of
collectives, claimed before the learner's code runs), so every loss a rank holds it asked
for, and the record of what each rank read is kept where the learner's code never runs.
Each check draws a fresh size and DP degree (2, 3 or 4 ranks; a size the degree does not
divide) and fresh losses, so a fixed answer cannot fit, and
the three dodges (``DistributedSampler``'s padding, ``drop_last``, the mean of per-rank
means) each land measurably off; the checker names the one an answer matches. Reading
every sample on every rank is exact but not distributed: refused too. How the ranks
combined is judged as well (:mod:`.sent_log`): every collective and store use is recorded
in the rank while the answer runs, and each rank must have sent its own partial sum (known
here from the read log) through a collective: not through the store, a file or a socket,
and not every loss it read.
"""

from __future__ import annotations

import math
import operator
import os
import random
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ezpz_nb.launcher.settings import LOOPBACK
from ezpz_nb.workshop.sent_log import Sent, judge_channel, judge_sent, recording
from ezpz_nb.workshop.stops import CHECK_TIMEOUT, CheckStopped, not_done, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["LossServer", "check_exact_mean", "dodge_means", "draw_case"]

EXERCISE = "exact_mean"
#: Relative error an answer may have: float32 sums pass, every dodge lands far outside.
TOLERANCE = 1e-6
#: A dodge must land at least this far off (relative) for a case to be drawn.
SEPARATION = 1e-3
#: A wrong mean this close (relative), no dodge's, is a sum in too few digits: over 2000
#: drawn cases float16 sums landed up to 1.3e-3 off, bfloat16 up to 7.9e-3. The verdict
#: then names the dtype.
ROUNDED = 2e-2


class LossServer:
    """The evaluation set, served from the checker's process: the losses and the read log.

    Each rank's job opens two connections and claims its rank on each before the learner's
    function runs: ``hello <r>`` for the dataset's reads, ``record <r>`` for
    :func:`~.sent_log.recording`'s stream. A second claim, or any later connection, is
    refused and counted in :attr:`refused`. On the read connection only a request ``<i>`` is
    taken (logged under the rank, answered with the loss): a ``sent`` line written there, as
    the learner holds that connection, is answered ``bad`` and recorded nowhere. Nothing of
    this lives in a rank, so no frame, closure or ``gc`` scan there finds the losses or
    rewrites the log. Use as a context manager: on exit the listener and every connection
    are closed and their threads joined.
    """

    def __init__(self, losses: list[float], dp: int) -> None:
        self.losses, self.dp = losses, dp
        self.reads: dict[int, list[int]] = {}  # rank -> every index it asked for, in order
        self.sent: dict[int, Sent] = {}  # rank -> what it sent its peers (sent_log's stream)
        self.refused = 0
        self._claimed: set[tuple[str, int]] = set()  # (hello or record, rank)
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._conns: list[socket.socket] = []
        self._listener = socket.create_server((LOOPBACK, 0))
        self._listener.settimeout(0.05)  # accept() wakes to see the stop: close() never waits long
        self.port: int = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> LossServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, close every connection, join every thread."""
        self._stop.set()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its rank
        for t in list(self._threads):
            t.join(timeout=5.0)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            t = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    def _claim(self, line: str) -> tuple[str, int | None]:
        word = line.split()
        ok = len(word) == 2 and word[0] in ("hello", "record") and _digits(word[1])
        kind, rank = (word[0], int(word[1])) if ok else ("", -1)
        with self._lock:
            if 0 <= rank < self.dp and (kind, rank) not in self._claimed:
                self._claimed.add((kind, rank))
                self.reads.setdefault(rank, [])
                self.sent.setdefault(rank, Sent())
                return kind, rank
            self.refused += 1
            return kind, None

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rw", encoding="ascii", newline="\n") as f:
            try:
                kind, rank = self._claim(f.readline())
                f.write("no\n" if rank is None else "ok\n")
                f.flush()
                while rank is not None and (line := f.readline()):
                    i = int(line) if kind == "hello" and _digits(line.strip()) else -1
                    if kind == "record":
                        with self._lock:
                            noted = self.sent[rank].take(line)
                        # Answered, so the rank's next call waits until it is logged.
                        f.write("ok\n" if noted else "bad\n")
                    elif 0 <= i < len(self.losses):
                        with self._lock:
                            self.reads[rank].append(i)
                        f.write(f"{self.losses[i]!r}\n")
                    else:
                        f.write("bad\n")
                    f.flush()
            except (OSError, ValueError, UnicodeError):
                return  # the rank went away (or sent what no job sends): its log stays


def _digits(word: str) -> bool:
    return word.isascii() and word.isdigit()


class _Served:
    """``len(dataset)`` samples; ``dataset[i]`` is ``{"index": i, "loss": ...}``, asked of
    the checker over this rank's one connection (each read a logged request)."""

    __slots__ = ("_file", "_lock", "_n", "_pid")

    def __init__(self, n: int, port: int, rank: int) -> None:
        self._n, self._pid, self._lock = n, os.getpid(), threading.Lock()
        self._file = _claimed(port, f"hello {rank}")

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> dict[str, Any]:
        try:
            i = operator.index(i)
        except TypeError:
            raise IndexError(f"index {i!r} is not an integer") from None
        if not 0 <= i < self._n:
            raise IndexError(f"index {i!r} outside 0..{self._n - 1}")
        if os.getpid() != self._pid:
            raise RuntimeError(
                "read dataset[i] in the rank's own process (a DataLoader with num_workers=0): "
                "each rank's reads go over its one connection to the checker"
            )
        return {"index": i, "loss": float(self._ask(f"{i}"))}

    def _ask(self, line: str) -> str:
        return _ask(self._file, self._lock, line)

    def __repr__(self) -> str:
        return f"<evaluation set of {self._n} samples>"


def _claimed(port: int, hello: str) -> Any:
    """A connection to the checker's server that has claimed ``hello`` (``hello <rank>`` or
    ``record <rank>``), as a text file; raise if another connection claimed it first."""
    f = socket.create_connection((LOOPBACK, port)).makefile("rw", encoding="ascii", newline="\n")
    f.write(f"{hello}\n")
    f.flush()
    if f.readline().strip() != "ok":
        raise RuntimeError(
            f"the checker's evaluation set refused {hello!r}: another connection claimed it "
            "first. Read the evaluation set only through dataset[i]."
        )
    return f


def _ask(f: Any, lock: threading.Lock, line: str) -> str:
    with lock:  # one line out, its answer back: threads never interleave
        f.write(f"{line}\n")
        f.flush()
        return str(f.readline())


def _recorder(port: int, rank: int) -> Callable[[str], None]:
    """The ``note`` of :func:`~.sent_log.recording`: each line over this rank's own record
    connection, claimed before the learner's code runs and not on the dataset (whose
    connection takes reads only), so a line written through the dataset records nothing."""
    f, lock, pid = _claimed(port, f"record {rank}"), threading.Lock(), os.getpid()

    def note(line: str) -> None:
        if os.getpid() == pid:  # a forked DataLoader worker's calls are not this rank's
            _ask(f, lock, line)

    return note


def dodge_means(losses: list[float], dp: int) -> dict[str, float]:
    """What each dodge would return: padding, ``drop_last``, the mean of per-rank means."""
    n = len(losses)
    padded = [losses[i % n] for i in range(math.ceil(n / dp) * dp)]
    kept = losses[: (n // dp) * dp]
    shard_means = [math.fsum(losses[r::dp]) / len(losses[r::dp]) for r in range(dp)]
    return {
        "DistributedSampler's padding (the first samples counted twice)": math.fsum(padded)
        / len(padded),
        "drop_last (the last samples never counted)": math.fsum(kept) / len(kept),
        "the mean of per-rank means (a short shard weighs as much as a long one)": math.fsum(
            shard_means
        )
        / dp,
    }


def draw_case(rng: random.Random) -> tuple[int, list[float]]:
    """A DP degree and losses whose size the degree does not divide, every dodge far off."""
    while True:
        dp = rng.choice((2, 3, 4))
        n = rng.choice([k for k in range(2 * dp + 1, 41) if k % dp])
        losses = [round(rng.uniform(0.0, 10.0), 6) for _ in range(n)]
        truth = math.fsum(losses) / n
        if all(abs(v - truth) > SEPARATION * truth for v in dodge_means(losses, dp).values()):
            return dp, losses


def job_exact_mean(fn: Callable[..., Any], port: int, n: int) -> Any:
    """On each rank: claim this rank's two connections to the checker (the reads, the record),
    then run the learner's answer, every collective and store use it makes streamed to the
    checker over the record connection (:mod:`.sent_log`).

    The barrier holds the learner's code back until every rank holds its connections, so no
    rank's code can claim another's. The reads are judged from the checker's log, not here.
    """
    import torch.distributed as dist

    table, note = _Served(n, port, dist.get_rank()), _recorder(port, dist.get_rank())
    dist.barrier()
    with recording(note):
        return fn(table, dist.get_rank(), dist.get_world_size())


def _judge(got: list[Any], losses: list[float], dp: int) -> str:
    """What every rank's answer says, or a stop at the first rank that is off."""
    n, truth = len(losses), math.fsum(losses) / len(losses)
    case = f"(N={n}, dp={dp}, one process's mean {truth:.6f})"
    if all(out is None for out, _, _ in got):
        raise not_done("exact_mean returned None: return the mean.")
    for rank, (_, _, sent) in enumerate(got):
        judge_channel(rank, sent, case)
    values = []
    for rank, (out, _, _) in enumerate(got):
        if not isinstance(out, (int, float)) and not hasattr(out, "item"):
            raise wrong(f"rank {rank} returned {out!r}: return the mean, a float, on every rank.")
        values.append(float(out))
    # The server's log is the evidence: with every rank at most its share (checked below),
    # every index read by some rank means the work was split, and a right value on every
    # rank that the ranks agreed on it (a rank that read only its share cannot know the
    # others' sums alone).
    # Judged before the value: a loop that stops early is named as such, not as the dodge
    # (drop_last) its mean may equal.
    missed = sorted(set(range(n)) - {i for _, reads, _ in got for i in reads})
    if missed:
        raise wrong(
            f"no rank read sample(s) {missed[:5]} {case}: every sample must be evaluated "
            f"once, on some rank, through dataset[i].{_why(values[0], losses, dp, rounded=False)}"
        )
    for rank, ((_, reads, _), value) in enumerate(zip(got, values, strict=True)):
        if not abs(value - truth) <= TOLERANCE * abs(truth):
            raise wrong(f"rank {rank} returned {value:.6f} {case}.{_why(value, losses, dp)}")
        share = math.ceil(n / dp)
        if len(reads) > share:
            raise wrong(
                f"rank {rank} read {len(reads)} samples {case}: exact, but each rank should "
                f"evaluate only its share (at most {share}) and combine with one collective."
            )
        if not reads:
            raise wrong(
                f"rank {rank} read no sample {case}, yet returned the mean: each rank must "
                "evaluate its share through dataset[i] and combine the sums with one collective."
            )
    for rank in range(len(got)):
        judge_sent(rank, got, losses, case)
    return (
        f"every rank returned {truth:.6f} {case}, each read only its share, and the ranks "
        "combined their sums with a collective."
    )


def _why(value: float, losses: list[float], dp: int, *, rounded: bool = True) -> str:
    """What a wrong mean says: the dodge it equals, or (``rounded``: every sample was read)
    a sum kept in too few digits."""
    truth = math.fsum(losses) / len(losses)
    same = [k for k, v in dodge_means(losses, dp).items() if abs(v - value) <= 1e-9 * truth]
    if same:
        return f" That is what {same[0]} gives."
    if rounded and abs(value - truth) <= ROUNDED * truth:
        return (
            f" That is {abs(value - truth) / truth:.1e} off: close, not exact, as a sum kept "
            "in float16 or bfloat16 (a few digits) ends up. Sum in float64."
        )
    return ""


def check_exact_mean(
    fn: Callable[..., Any],
    *,
    timeout: float = CHECK_TIMEOUT,
    seed: int | None = None,
    cluster: Any = None,
) -> CheckResult:
    """Notebook 16's exercise: ``fn(dataset, dp_rank, dp_size)`` returns the exact mean loss.

    Args:
        fn: The learner's function, run on every rank of a fresh group.
        timeout: Seconds before the ranks count as hung.
        seed: Fix the drawn case (tests, an instructor replaying one); by default fresh.
        cluster: Warm ranks (an ``ez.Cluster`` of the drawn degree: tests) instead of fresh.
    """
    # Here, not at the top: a rank imports this module for job_exact_mean (see stops.py).
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        dp, losses = draw_case(random.Random(seed))
        got = _answers(fn, losses, dp, timeout, cluster)
        return _judge(got, losses, dp)

    return judge(EXERCISE, body)


def _answers(
    fn: Callable[..., Any], losses: list[float], dp: int, timeout: float, cluster: Any
) -> Any:
    """Each rank's answer with the indices it read (from the server's log, in this process).

    A hang is worded for this exercise (a collective per sample).
    """
    # Here, not at the top: a rank imports this module for job_exact_mean (see stops.py).
    from ezpz_nb.workshop.verdicts import run_job

    if not callable(fn):
        raise wrong("pass the function itself: check_exact_mean(exact_mean).")
    # The server stops with the check, whether the ranks returned, raised or hung.
    with LossServer(losses, dp) as server:
        try:
            got = run_job(
                job_exact_mean,
                fn,
                server.port,
                len(losses),
                world_size=dp,
                timeout=timeout,
                cluster=cluster,
            )
        except CheckStopped as stop:
            if stop.status == "wrong" and stop.message.startswith("the ranks hung"):
                raise wrong(
                    f"{stop.message}\nEvery rank must make the same collectives, as often, a rank "
                    "with a shorter shard included: sum in the loop, all-reduce after it."
                ) from None
            raise
    if server.refused:
        raise wrong(
            "a connection other than the ranks' own asked the checker for samples: read the "
            "evaluation set only through the dataset you are given (dataset[i])."
        )
    return [
        (out, sorted(set(server.reads.get(rank, []))), server.sent.get(rank, Sent()))
        for rank, out in enumerate(got)
    ]
