"""Start real torch.distributed gloo ranks from a notebook cell and keep them: ``Cluster``.

``launch`` (one run on fresh ranks) and ``run_on_ranks`` (a cluster's, else fresh
ones) are in :mod:`.on_ranks`.

How it works, and why:

* Ranks are forked from a *forkserver* that imported torch once. Forking the
  kernel itself is faster but breaks after autograd/CUDA use in the kernel and on
  macOS; ``spawn`` pays an ``import torch`` per rank (seconds). ``start_method``
  selects ``fork`` or ``spawn`` instead.
* Functions travel by value with cloudpickle, so lambdas, closures and functions
  defined in a notebook cell work.
* A run is three steps, each in its own module: the processes
  (:mod:`.procs`), gathering what they answer (:func:`.run.collect`), and what
  that means: keep, kill, raise (:func:`.policy.decide`). ``Cluster`` only
  strings them together and keeps the ranks between runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ezpz_nb.events import reissue
from ezpz_nb.launcher import wire
from ezpz_nb.launcher.errors import HangError, RankError, RunInterrupted
from ezpz_nb.launcher.policy import decide
from ezpz_nb.launcher.procs import RankProcesses, RankSpec
from ezpz_nb.launcher.run import RunResult, collect
from ezpz_nb.launcher.session import SESSION, Session
from ezpz_nb.launcher.startup import (
    check_args,
    check_timeout,
    cores,
    default_start_method,
    pack_job,
)
from ezpz_nb.launcher.wire import RankEvent

__all__ = ["Cluster", "live_clusters"]

#: Starting includes the forkserver's one import of torch (seconds on a busy
#: laptop): a short run timeout meant for a hang demo must not cut it.
_START_TIMEOUT_S = 60.0


class Cluster:
    """A persistent group of ranks in a torch.distributed process group.

    State on the ranks (globals, iterators) survives between :meth:`run` calls, so a
    learner can step through a DataLoader one cell at a time.

    Args:
        world_size: Number of ranks (1..``MAX_WORLD_SIZE``).
        timeout: Seconds a run may take before the ranks are reported as hung
            (``HangError``) and stopped; time a busy machine kept the ranks waiting
            for a CPU does not count (:mod:`.runclock`). ``cluster.timeout`` may be
            changed between runs; gloo's own collective timeout is fixed when the ranks
            start (``timeout + 60`` s), so to allow longer runs start a new cluster.
        threads: Intra-op threads per rank; default ``max(1, cores // world_size)``
            so ranks do not fight over cores.
        start_method: ``"forkserver"`` (default on Linux), ``"fork"`` or ``"spawn"``
            (default elsewhere); ``EZPZ_NB_START_METHOD`` changes the default.
        backend: ``"gloo"`` (CPU, default) or ``"nccl"`` (one GPU per rank).
        one_shot: The ranks are for one run only (``launch``): a RankError then
            does not say they are kept.
        session: The notebook's session the cluster registers with and takes
            standby ranks from (default: this process's, ``SESSION``).

    Example:
        >>> with Cluster(world_size=2) as c:
        ...     c.run(lambda: dist.get_rank())
        [0, 1]
    """

    def __init__(
        self,
        world_size: int = 2,
        timeout: float = 60.0,
        *,
        threads: int | None = None,
        start_method: str | None = None,
        backend: str = "gloo",
        one_shot: bool = False,
        session: Session | None = None,
    ):
        check_args(world_size, timeout, threads, start_method, backend)
        self.world_size = world_size
        self.timeout = float(timeout)
        self.threads = threads or max(1, cores() // world_size)
        self.start_method = start_method or default_start_method()
        self.backend = backend
        self.one_shot = one_shot
        self._session = SESSION if session is None else session
        #: Items published by the ranks during the latest run, in arrival order.
        self.events: list[RankEvent] = []
        #: Called with each :class:`RankEvent` as it arrives (e.g. a progress display).
        self.on_event: Callable[[RankEvent], None] | None = None
        self._spec = RankSpec(
            world_size, self.threads, self.start_method, backend, pg_timeout=self.timeout + 60.0
        )
        self._procs: RankProcesses  # made by each _start: one per set of ranks
        self._key: int | None = None  # our entry in the session's registry while running
        self._start()

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        self._procs = RankProcesses(self._spec, self._session.pool)
        self._key = self._session.register(self)
        try:
            self._procs.start()
            start_s = max(self.timeout, _START_TIMEOUT_S)
            result = collect(self._procs, start_s)
        except BaseException:
            self.kill()
            raise
        self._apply(result, start_s, starting=True)
        if not self.one_shot:
            self._procs.release_standby()  # these ranks are up for good

    def close(self) -> None:
        """Stop the ranks and remove everything they used. Calling it twice is harmless."""
        if self.closed:
            return
        self._procs.stop()
        self._forget()

    def kill(self) -> None:
        """Kill every rank's process group (loader workers included) and clean up."""
        self._procs.kill()
        self._forget()

    def _forget(self) -> None:
        if self._key is not None:
            self._session.forget(self._key)
            self._key = None

    @property
    def closed(self) -> bool:
        """True once the ranks are gone (after close(), a hang or a crash)."""
        return not self._procs.alive

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self.closed:
                self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running"
        return f"Cluster(world_size={self.world_size}, {self.start_method}, {state})"

    # ------------------------------------------------------------------ running
    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank and return the results in rank order.

        Every keyword goes to ``fn`` (even one named ``fn`` or ``timeout``); the run
        may take ``cluster.timeout`` seconds, or see :meth:`run_within`.

        Raises:
            RankError: a rank raised or died; the message names it and carries its
                traceback. If other ranks were blocked they were stopped, and the next
                ``run`` starts fresh ranks.
            HangError: not finished within ``timeout``; says where each rank was.
            RunInterrupted: interrupted (a ``KeyboardInterrupt``); says where each
                rank was, and every rank was stopped.
            TypeError: ``fn`` or an argument cannot be pickled (nothing was started).
        """
        return self.run_job(pack_job(fn, args, kwargs))

    def run_within(
        self, timeout: float, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> list[Any]:
        """:meth:`run`, with ``timeout`` seconds for this run only.

        The deadline is positional, so it takes no keyword from ``fn``'s; and
        ``cluster.timeout`` stays as it was, for the runs after this one.

        Example:
            >>> c.run_within(5, train, steps=10, timeout=3)  # train gets timeout=3
        """
        return self.run_job(pack_job(fn, args, kwargs), check_timeout(timeout))

    def run_job(self, job: bytes, timeout: float | None = None) -> list[Any]:
        """:meth:`run` for a job :func:`~.startup.pack_job` made already.

        Args:
            job: The packed ``(fn, args, kwargs)``.
            timeout: Seconds for this run (default ``cluster.timeout``).
        """
        timeout = self.timeout if timeout is None else timeout
        if self.closed:
            print(
                f"[ezpz_nb] starting {self.world_size} fresh ranks (the previous ones "
                "were stopped; state on them is gone)",
                file=sys.stderr,
            )
            self._start()
        self.events = []
        try:
            self._procs.send_all(wire.Run(job))
            result = collect(
                self._procs,
                timeout,
                on_event=self.on_event,
                events=self.events,
            )
        except BaseException:
            self.kill()
            raise
        return self._apply(result, timeout)

    def _apply(self, result: RunResult, timeout: float, starting: bool = False) -> list[Any]:
        """Act on what a run gave: return the replies, or stop ranks and raise."""
        decision = decide(result, starting=starting, one_shot=self.one_shot)
        if decision.outcome == "return":
            reissue(result.warnings)  # may raise, under the notebook's "error" filter
            return [result.replies[r] for r in range(self.world_size)]
        stacks = {}
        try:
            if decision.outcome in ("hang", "interrupt"):
                stacks = self._procs.stacks(result.pending)  # before the kill: ask where
        finally:  # a second interrupt while asking still leaves no rank behind
            if decision.kill:
                self.kill()
        error: BaseException
        if decision.outcome == "rank_error":
            error = RankError(decision.failures, self.events, note=decision.note)
        elif decision.outcome == "interrupt":
            error = RunInterrupted(stacks, self.events)
        else:
            error = HangError(stacks, timeout, self.events)
        try:
            reissue(result.warnings)
        finally:  # a warning turned into an error by a filter does not hide the failure
            raise error


def live_clusters(session: Session = SESSION) -> list[Cluster]:
    """Clusters started in this process (in ``session``) and not yet closed, oldest first."""
    return [c for c in session.live() if isinstance(c, Cluster)]
