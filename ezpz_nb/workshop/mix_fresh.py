"""Notebook 17's reference stream: the learner's ``mix_batch`` run once more in a new Python
process, one that never saw the check's ranks (the checker is :mod:`.mixture`).

Why a new process: every rank of a check descends from one forkserver (or from standby
processes spawned with the kernel's environment), so all of them share one string-hash
salt (``PYTHONHASHSEED``), and a warm cluster keeps whatever an earlier cell left in its
ranks. A stream seeded by ``hash()`` of a str, or by a value planted in the ranks, is then
the same at every layout, while another job, or the same job restarted, draws another one.
A hash salt is fixed when an interpreter starts, so only a new interpreter shows it: the
check starts one with another ``PYTHONHASHSEED``, drawn (never the kernel's), and holds the
batches it computes to the ranks'.

:func:`start_fresh` starts that process, the check waits for its answer
(:meth:`FreshStream.finish`) before any rank runs the learner's code, and
:func:`same_in_a_new_process` holds its batches (:meth:`FreshStream.batches`) to the
ranks' at the end. The process is confined (:mod:`.mix_confine`): it reads no shared place,
writes nothing, and answers before the ranks write anything, so it cannot wait for the
ranks' batches (issue 45's ninth trial) nor leave them its salt. The process runs this
module (``python -m ezpz_nb.workshop.mix_fresh``): it reads a JSON line (the notebook's
``sys.path``, the folders it may read, the arguments and the steps) and then the pickled
function from stdin, calls the function at ``dp_rank=0, dp_size=1`` for each step, and
writes one JSON line back on its stdout (the learner's prints go to its stderr, which
nobody reads). Only ints come back, so nothing the learner's code returns runs code in the notebook.

Measured (2 cores at load 20 to 26, the new process alone, 68 global batches: a horizon of
64 and the far run near step 9000): 0.9 to 1.5 s for the notebook's solution (Python and
numpy starting, most of it), 6 to 11 s for an answer whose module imports torch and pytest
(a test's). It overlapped the rank runs until the ninth trial; it now runs before them
(timings in :mod:`.mix_confine`). Until issue 47's fifth round the confinement's modules
imported torch, which no answer of plain Python or numpy needs: a check of the library's
answer on a warm 4-rank cluster took 2.6-3.3 s (3.1-3.9 s of CPU), now 2.0-2.4 s (2.5-3.3
s of CPU), quiet; ``tests/test_mix_exercise.py`` holds the process to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ezpz_nb.workshop.mix_confine import confine_self, readable_paths

if TYPE_CHECKING:
    from ezpz_nb.workshop.mix_streams import Draw

__all__ = ["FreshStream", "first_difference", "hash_seed", "same_in_a_new_process", "start_fresh"]


def hash_seed(rng: random.Random, kernel: str | None) -> int:
    """A ``PYTHONHASHSEED`` for the new process: 1 to 2**32 - 1, never ``kernel`` (the
    kernel's own setting, which the ranks inherit)."""
    while True:
        x = rng.randrange(1, 2**32)
        if str(x) != kernel:
            return x


class FreshStream:
    """One dp=1 stream of the learner's function, computed in a new Python process started
    at once.

    Args:
        job: The function as :func:`~ezpz_nb.launcher.startup.pack_job` packs it (with no
            arguments), packed before the check drew anything.
        args: ``(sizes, weights, global_batch, seed)``.
        steps: The global batches to compute, in order.
        hash_seed: The new process's ``PYTHONHASHSEED``.
        timeout: Seconds the process may take, from :meth:`batches`' call.
    """

    def __init__(
        self,
        job: bytes,
        args: tuple[Any, ...],
        steps: Sequence[int],
        hash_seed: int,
        timeout: float,
    ) -> None:
        self.timeout = timeout
        self._got: list[list[tuple[int, int]]] | None = None
        sizes, weights, g, seed = args
        head = {"path": sys.path, "args": [list(sizes), list(weights), g, seed]}
        head["steps"] = list(steps)
        head["readable"] = readable_paths(sys.path)
        env = dict(os.environ, PYTHONHASHSEED=str(hash_seed), OMP_NUM_THREADS="1")
        env["CUDA_VISIBLE_DEVICES"] = ""  # as the ranks: no CUDA start-up cost
        self._proc = subprocess.Popen(  # this Python, this module, no shell
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=os.getcwd(),
            start_new_session=True,  # its own group: whatever it forks is killed with it
        )
        self._out = b""
        self._late = False
        self._done = False
        self._closed = False
        # Talked to from a thread: neither a job nor an answer larger than a pipe's buffer
        # blocks the notebook, and finish() waits for it with a timeout.
        self._talker = threading.Thread(
            target=self._talk, args=(json.dumps(head).encode() + b"\n" + job,), daemon=True
        )
        self._talker.start()

    def _talk(self, data: bytes) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.close()
        except OSError:  # the process died or was stopped: batches() says why
            pass
        # Its first line only: a child it left holding the pipe cannot answer later.
        self._out = self._proc.stdout.readline()

    def finish(self) -> None:
        """Wait for the process's answer (at most ``timeout`` s), then end its whole process
        group: called before any rank runs the learner's code, so that nothing the ranks
        write during the check exists while it runs (:mod:`.mix_confine`)."""
        if self._done:
            return
        self._talker.join(self.timeout)
        self._late = self._talker.is_alive()
        self._done = True
        self.close()

    def batches(self) -> list[list[tuple[int, int]]]:
        """The process's batches, one list of ``(source, index)`` pairs per step (waited
        for once, then kept).

        Raises:
            RuntimeError: The function raised there (its exception and line, in words for
                the learner).
            TimeoutError: No answer: the process did not finish in time (a busy machine,
                or an answer that waits for something only the ranks have) or ended
                without one.
        """
        if self._got is not None:
            return self._got
        self.finish()
        if self._late:
            raise TimeoutError(
                f"mix_batch did not return within {self.timeout:.0f} s in a new Python process "
                "(which runs before the ranks: a batch waited for from them never comes)"
            )
        try:
            got = json.loads(self._out.decode().strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise TimeoutError(
                f"the new Python process ended with exit code {self._proc.returncode} "
                "before mix_batch returned"
            ) from None
        if "error" in got:
            raise RuntimeError(f"mix_batch raised in a new Python process: {got['error']}")
        self._got = [[(int(s), int(i)) for s, i in batch] for batch in got["batches"]]
        return self._got

    def close(self) -> None:
        """End the process and its group (a check that stopped early, or it answered)."""
        if self._closed:  # once: the group's id may be another group's later
            return
        self._closed = True
        with contextlib.suppress(OSError):  # the group is gone already
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        # A child that left the group (setsid) may still hold the pipe: the daemon thread
        # that reads it is then left, and nothing it reads is used.
        self._talker.join(5.0)
        assert self._proc.stdout is not None
        if not self._talker.is_alive():
            self._proc.stdout.close()

    def __enter__(self) -> FreshStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_difference(
    ranks: Sequence[Sequence[tuple[int, int]]],
    fresh: Sequence[Sequence[tuple[int, int]]],
    steps: Sequence[int],
) -> str:
    """The first of ``steps`` whose global batch holds other samples in the new process than
    on the ranks (order within a batch aside, as the layout rule compares), said with what to
    do; '' if none."""
    for step, x, y in zip(steps, ranks, fresh, strict=True):
        if Counter(map(tuple, x)) != Counter(map(tuple, y)):
            return (
                f"global batch {step} (dp=1) holds other samples in a new Python process than "
                f"on the ranks ({list(map(tuple, y))[:3]}... there, {list(map(tuple, x))[:3]}... "
                "on the ranks): a restarted job would draw another stream. Compute the batch "
                "from the arguments alone: seed each generator with numbers (as "
                "np.random.default_rng([seed, 1 + source, pass])), never with hash() of a str "
                "(salted per process: PYTHONHASHSEED) or with anything an earlier cell left in "
                "the ranks."
            )
    return ""


def start_fresh(job: bytes, setup: Draw, steps: Sequence[int], timeout: float) -> FreshStream:
    """The check's new process, started now: the main case's dp=1 batches of ``steps`` with
    the check's seed, its ``PYTHONHASHSEED`` drawn from that seed (never the kernel's)."""
    main = setup.main
    salt = hash_seed(random.Random(setup.seeds[0]), os.environ.get("PYTHONHASHSEED"))
    args = (main.sizes, main.weights, main.global_batch, setup.seeds[0])
    return FreshStream(job, args, steps, salt, timeout)


def same_in_a_new_process(
    fresh: FreshStream, ranks: Sequence[Sequence[tuple[int, int]]], steps: Sequence[int]
) -> None:
    """Stop the check unless the new process's batches of ``steps`` are the ranks': "wrong"
    where they differ or the function raised there, "not done" where it gave no answer."""
    # Here, not at the top: stops imports torch, which the new process must not pay for.
    from ezpz_nb.workshop.stops import not_done, wrong

    try:
        got = fresh.batches()
    except TimeoutError as err:
        # Not judged rather than wrong: a new process pays its imports again (torch's: 10 s
        # measured on 2 cores at load 26), so on a busy machine it may be late.
        raise not_done(
            f"{err}, so the check could not compare its batches with the ranks' (on a busy "
            "machine, run the check again)."
        ) from None
    except RuntimeError as err:
        raise wrong(
            f"{err}, though it ran on the ranks: compute the batch from the arguments alone, "
            "with nothing an earlier cell left in the ranks (that process runs before the "
            "ranks, may read only the interpreter's and the code's folders, and writes "
            "nothing)."
        ) from None
    differs = first_difference(ranks, got[: len(steps)], steps)
    if differs:
        raise wrong(differs)


def _main() -> None:
    """The new process: read the job from stdin, write its batches (or its error) on stdout."""
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the learner's prints go to stderr: stdout carries the answer alone
    head = json.loads(sys.stdin.buffer.readline())
    job = sys.stdin.buffer.read()  # bytes only: no code of the learner's runs before confining
    # What cannot be done once confined (no writes): find the temporary folder (torch's
    # import asks, through dill, and the search writes a file), and import torch where the
    # job names it (the ranks have it preloaded; an answer of Python or numpy never pays).
    tempfile.gettempdir()
    if b"torch" in job:
        import torch  # noqa: F401
    confine_self(head["readable"])  # before the learner's code is unpickled
    sys.path[:] = head["path"]
    sizes, weights, g, seed = head["args"]
    try:
        # Here: the launcher's pickles, which this process needs only now.
        from ezpz_nb.launcher.wire import loads_job

        fn, _, _ = loads_job(job)
        got: dict[str, Any] = {"batches": []}
        for step in head["steps"]:
            out = fn(sizes, weights, g, step, 0, 1, seed)
            got["batches"].append([[int(s), int(i)] for s, i in out])
    except Exception as exc:  # noqa: BLE001 - any failure is the learner's, said in words
        where = traceback.extract_tb(exc.__traceback__)[-1]
        got = {
            "error": f"{type(exc).__name__}: {exc} (at {os.path.basename(where.filename)}, "
            f"line {where.lineno}: {where.line})"
        }
    answer.write(json.dumps(got) + "\n")
    answer.flush()


if __name__ == "__main__":
    _main()
