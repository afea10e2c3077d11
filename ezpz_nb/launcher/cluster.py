"""Start real torch.distributed gloo ranks from a notebook cell: ``launch`` and ``Cluster``.

How it works, and why:

* Ranks are forked from a *forkserver* that imported torch once. Forking the
  kernel itself is faster but breaks after autograd/CUDA use in the kernel and on
  macOS; ``spawn`` pays an ``import torch`` per rank (seconds). ``start_method``
  selects ``fork`` or ``spawn`` instead.
* Functions travel by value with cloudpickle, so lambdas, closures and functions
  defined in a notebook cell work.
* Ranks meet through a FileStore in a fresh temporary folder: no fixed port, so two
  notebooks never collide, and nothing is left behind once the folder is removed.
* Each rank's fd 1 and 2 go to pipes that the waiting notebook thread reads, so
  output (torch's C++ messages too) shows up live, whole lines, ``[rank r]``-prefixed,
  in the cell that asked.
* Each rank is its own process group leader; stopping a rank kills the group, so
  its DataLoader workers go with it. A lifeline pipe makes ranks exit if the
  kernel dies.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import multiprocessing.forkserver
import multiprocessing.util  # before our atexit hook is registered, see _close_all
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import Any

from ezpz_nb.launcher import rank as _rank
from ezpz_nb.launcher import wire
from ezpz_nb.launcher.errors import (
    HangError,
    RankError,
    RankEvent,
    RankFailure,
    RankStack,
    format_chain,
    parse_faulthandler,
    signal_name,
    stack_from_frames,
)
from ezpz_nb.launcher.output import OutputRelay
from ezpz_nb.launcher.shutdown import on_kernel_shutdown
from ezpz_nb.launcher.startup import (
    check_args,
    cores,
    default_start_method,
    dumps_job,
    loopback,
    main_hidden,
    should_warm_up,
)
from ezpz_nb.launcher.torchrun import in_torchrun_env, run_in_place

__all__ = ["Cluster", "launch", "live_clusters"]

#: How long the other ranks get to finish after one rank raised.
_GRACE_S = 1.0
# What Cluster._receive returns when a message settles nothing.
_NOTHING, _CLOSED = object(), object()

# Live clusters by start order, so "the running cluster" means the latest one.
_LIVE: weakref.WeakValueDictionary[int, Cluster] = weakref.WeakValueDictionary()
_SERIAL = itertools.count()


class Cluster:
    """A persistent group of ranks in a torch.distributed process group.

    State on the ranks (globals, iterators) survives between :meth:`run` calls, so a
    learner can step through a DataLoader one cell at a time.

    Args:
        world_size: Number of ranks (1..``MAX_WORLD_SIZE``).
        timeout: Seconds a run may take before the ranks are reported as hung
            (``HangError``) and stopped. ``cluster.timeout`` may be changed between
            runs; gloo's own collective timeout is fixed when the ranks start
            (``timeout + 60`` s), so to allow longer runs start a new cluster.
        threads: Intra-op threads per rank; default ``max(1, cores // world_size)``
            so ranks do not fight over cores.
        start_method: ``"forkserver"`` (default on Linux), ``"fork"`` or ``"spawn"``
            (default elsewhere).
        backend: ``"gloo"`` (CPU, default) or ``"nccl"`` (one GPU per rank).

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
    ):
        check_args(world_size, timeout, threads, start_method, backend)
        self.world_size = world_size
        self.timeout = float(timeout)
        self.threads = threads or max(1, cores() // world_size)
        self.start_method = start_method or default_start_method()
        self.backend = backend
        #: Items published by the ranks during the latest run, in arrival order.
        self.events: list[RankEvent] = []
        #: Called with each :class:`RankEvent` as it arrives (e.g. a progress display).
        self.on_event: Callable[[RankEvent], None] | None = None
        self._procs: list[Any] = []
        # The kernel-shutdown hook may tear down from another thread while a run
        # in the main thread is being interrupted: one teardown at a time.
        self._kill_lock = threading.Lock()
        self._one_shot = False  # set by launch(): the ranks go away after one run
        self._tmp: str | None = None
        self._closed = True
        self._start()

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        ctx = (
            _forkserver()
            if self.start_method == "forkserver"
            else mp.get_context(self.start_method)
        )
        self._tmp = tempfile.mkdtemp(prefix="ezpz_nb-")
        self._cleanup_dirs: tuple[str, ...] = (self._tmp,)
        if self.start_method == "forkserver":
            # The forkserver's folder (made when it started) would outlive a killed kernel.
            self._cleanup_dirs += (multiprocessing.util.get_temp_dir(),)
        self._conns: list[Any] = []
        self._lifelines: list[Any] = []
        self._output = OutputRelay()
        self._procs = []
        self._closed = False
        self._serial = next(_SERIAL)
        _LIVE[self._serial] = self
        on_kernel_shutdown(_close_all)
        env = dict(os.environ)
        env.update(
            GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", loopback()),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.world_size),
            OMP_NUM_THREADS=str(self.threads),
        )
        if self.backend == "gloo":
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU-only unless asked: no CUDA init cost
        env.pop("MASTER_ADDR", None)  # ranks use our FileStore, not an outer launcher's
        try:
            for r in range(self.world_size):
                self._start_rank(ctx, r, dict(env, RANK=str(r), LOCAL_RANK=str(r)))
            # Starting includes the forkserver's one import of torch (seconds on a
            # busy laptop): a short run timeout meant for a hang demo must not cut it.
            self._await(time.monotonic() + max(self.timeout, 60.0), what="start")
        except BaseException:
            self._kill()
            raise

    def _start_rank(self, ctx: Any, r: int, env: dict[str, str]) -> None:
        assert self._tmp is not None
        cfg = _rank.RankConfig(
            rank=r,
            world_size=self.world_size,
            store_path=os.path.join(self._tmp, "store"),
            dump_path=os.path.join(self._tmp, f"stack{r}.txt"),
            threads=self.threads,
            backend=self.backend,
            pg_timeout=self.timeout + 60.0,
            env=env,
            cwd=os.getcwd(),
            sys_path=list(sys.path),
            parent_pid=os.getpid(),
            cleanup_dirs=self._cleanup_dirs,
        )
        # Pipes are made just before each rank starts so a forked rank never
        # inherits another rank's write ends (that would hide EOF on death).
        conn, child_conn = ctx.Pipe()
        out_r, out_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        life_r, life_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank.main,
            args=(cfg, child_conn, out_w, err_w, life_r),
            name=f"ezpz_nb-rank{r}",
            daemon=False,
        )
        with main_hidden(self.start_method):
            proc.start()
        for c in (child_conn, out_w, err_w, life_r):
            c.close()
        self._output.add(out_r, r, 1)
        self._output.add(err_r, r, 2)
        self._procs.append(proc)
        self._conns.append(conn)
        self._lifelines.append(life_w)

    def close(self) -> None:
        """Stop the ranks and remove everything they used. Calling it twice is harmless."""
        if self._closed:
            return
        for conn in self._conns:
            try:
                conn.send_bytes(wire.command(wire.Stop()))
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._output.drain()
        self._kill()

    def _kill(self) -> None:
        """Kill every rank's process group (loader workers included) and clean up."""
        with self._kill_lock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        for p in self._procs:
            if p.pid is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
        for p in self._procs:
            p.join(2.0)
        self._output.drain(final=True)
        self._output.close()
        for c in self._conns + self._lifelines:
            c.close()
        for p in self._procs:
            try:
                p.close()
            except ValueError:
                pass
        self._conns, self._lifelines, self._procs = [], [], []
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        self._closed = True
        _LIVE.pop(getattr(self, "_serial", -1), None)

    @property
    def closed(self) -> bool:
        """True once the ranks are gone (after close(), a hang or a crash)."""
        return self._closed

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._kill() if not self._closed else None
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"Cluster(world_size={self.world_size}, {self.start_method}, {state})"

    # ------------------------------------------------------------------ running
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank and return the results in rank order.

        Raises:
            RankError: a rank raised or died; the message names it and carries its
                traceback. If other ranks were blocked they were stopped, and the next
                ``run`` starts fresh ranks.
            HangError: not finished within ``timeout``; says where each rank was.
            TypeError: ``fn`` or an argument cannot be pickled (nothing was started).
        """
        job = dumps_job(fn, args, kwargs)
        if self._closed:
            print(
                f"[ezpz_nb] starting {self.world_size} fresh ranks (the previous ones "
                "were stopped; state on them is gone)",
                file=sys.stderr,
            )
            self._start()
        self.events = []
        msg = wire.command(wire.Run(job))
        try:
            for conn in self._conns:
                conn.send_bytes(msg)
            replies = self._await(time.monotonic() + self.timeout, what="run")
        except RankError:
            raise  # _await already stopped the ranks if they could not be kept
        except BaseException:
            if not self._closed:
                self._kill()
            raise
        return [replies[r] for r in range(self.world_size)]

    def _await(self, deadline: float, what: str) -> dict[int, Any]:
        """Wait for one reply per rank while showing their output live.

        Returns the replies by rank; raises RankError or HangError otherwise.
        """
        pending = set(range(self.world_size))
        replies: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        grace_end: float | None = None
        sentinels = {p.sentinel: r for r, p in enumerate(self._procs)}
        by_conn = {id(c): r for r, c in enumerate(self._conns)}

        def settle(r: int, outcome: Any) -> None:
            pending.discard(r)
            if isinstance(outcome, RankFailure):
                failures[r] = outcome
            else:
                replies[r] = outcome

        while pending:
            now = time.monotonic()
            limit = grace_end if grace_end is not None else deadline
            if now >= limit:
                break
            watch = (
                [self._conns[r] for r in pending]
                + [s for s, r in sentinels.items() if r in pending]
                + self._output.fds
            )
            ready = wait(watch, timeout=min(0.1, limit - now))
            for obj in ready:
                if isinstance(obj, int) and self._output.owns(obj):
                    self._output.read(obj)
            for obj in ready:
                if not isinstance(obj, int) and id(obj) in by_conn:
                    r = by_conn[id(obj)]
                    outcome = self._receive(r)
                    if outcome is not _NOTHING and outcome is not _CLOSED:
                        settle(r, outcome)
            for obj in ready:
                dead = sentinels.get(obj) if isinstance(obj, int) else None
                if dead is not None and dead in pending:
                    conn = self._conns[dead]
                    # It may have replied, then died: read what it sent before EOF.
                    while dead in pending and conn.poll():
                        outcome = self._receive(dead)
                        if outcome is _CLOSED:
                            break
                        if outcome is not _NOTHING:
                            settle(dead, outcome)
                    if dead in pending:
                        settle(dead, self._death(dead))
            if failures and grace_end is None:
                grace_end = time.monotonic() + _GRACE_S
        self._output.drain()
        if failures:
            died = any(f.kind in ("signal", "exit") for f in failures.values())
            for r in pending:
                failures[r] = RankFailure(r, "stopped", "", "stopped while still running")
            if pending or died or what == "start":
                self._kill()
            keep = not self._closed and not self._one_shot
            raise RankError(
                failures,
                self.events,
                note="The ranks are still up; their state is kept." if keep else "",
            )
        if pending:
            stacks = self._stacks(pending)
            self._kill()
            raise HangError(stacks, self.timeout, self.events)
        return replies

    def _receive(self, r: int) -> Any:
        """Take one message from rank ``r``.

        Returns its reply value (a :class:`RankFailure` for a failure), ``_NOTHING``
        after an event (the run goes on), or ``_CLOSED`` when its end is closed
        (the process sentinel then says how it died).
        """
        try:
            msg = wire.loads(self._conns[r].recv_bytes())
        except (EOFError, OSError):
            return _CLOSED
        if isinstance(msg, wire.Event):
            ev = RankEvent(r, msg.item, time.monotonic())
            self.events.append(ev)
            if self.on_event is not None:
                self.on_event(ev)
            return _NOTHING
        if isinstance(msg, wire.Ok):
            return msg.value
        if isinstance(msg, wire.Ready):
            return msg.pid
        if isinstance(msg, wire.Error):
            tb = format_chain(msg.chain) + (f"\n{msg.ours}\n" if msg.ours else "")
            where = " (inside ezpz_nb, before your function ran)" if msg.ours else ""
            header = msg.chain[-1][1]
            return RankFailure(r, "exception", header.split(":")[0], header + where, tb)
        if isinstance(msg, wire.Unpicklable):
            return RankFailure(
                r,
                "unpicklable",
                "PicklingError",
                f"its {msg.what} could not be sent back to the notebook ({msg.why}); return "
                "plain data (numbers, lists, dicts, tensors) instead",
            )
        raise TypeError(f"unexpected message from rank {r}: {msg!r}")

    def _death(self, r: int) -> RankFailure:
        proc = self._procs[r]
        proc.join(1.0)
        code = proc.exitcode
        if code is not None and code < 0:
            return RankFailure(r, "signal", "", f"killed by {signal_name(-code)}", signal=-code)
        return RankFailure(
            r,
            "exit",
            "",
            f"exited with code {code} without replying (os._exit or sys.exit in a worker thread?)",
        )

    def _stacks(self, pending: set[int]) -> dict[int, RankStack]:
        """Ask each blocked rank for its Python stack (faulthandler on SIGUSR1)."""
        assert self._tmp is not None
        for r in pending:
            try:
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        stacks: dict[int, RankStack] = {}
        deadline = time.monotonic() + 2.0
        for r in range(self.world_size):
            if r not in pending:
                stacks[r] = RankStack(r, "finished")
                continue
            path = os.path.join(self._tmp, f"stack{r}.txt")
            frames: list = []
            while not frames and time.monotonic() < deadline:
                time.sleep(0.02)
                try:
                    with open(path) as fh:
                        frames = parse_faulthandler(fh.read(), "_serve_forever")
                except OSError:
                    pass
            stacks[r] = stack_from_frames(r, frames) if frames else RankStack(r, "unknown")
        return stacks


def launch(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = 60.0,
    threads: int | None = None,
    start_method: str | None = None,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks and return their results.

    torch.distributed is initialised in every rank (``dist.get_rank()``,
    ``dist.all_reduce`` just work); the group is torn down afterwards, whatever happens.

    Under torchrun (RANK, WORLD_SIZE and MASTER_ADDR set) no ranks are started:
    ``fn`` runs in this process and the results are gathered from torchrun's ranks.

    Returns:
        The return values, in rank order.

    Raises:
        RankError, HangError: see :meth:`Cluster.run`.
        ValueError, TypeError: bad arguments, raised before any process starts.
    """
    check_args(world_size, timeout, threads, start_method, backend)
    if in_torchrun_env():
        # Under torchrun (or srun/mpiexec around it) the ranks already exist: run
        # here and gather, so notebook code gives the same list on a cluster.
        if int(os.environ["WORLD_SIZE"]) != world_size:
            warnings.warn(
                f"launch(world_size={world_size}) under torchrun uses torchrun's "
                f"WORLD_SIZE={os.environ['WORLD_SIZE']}",
                stacklevel=2,
            )
        return run_in_place(fn, *args, backend=backend, timeout_s=timeout, **kwargs)
    dumps_job(fn, args, kwargs)  # fail on unpicklable input before starting anything
    cluster = Cluster(
        world_size, timeout, threads=threads, start_method=start_method, backend=backend
    )
    cluster._one_shot = True
    try:
        return cluster.run(fn, *args, **kwargs)
    finally:
        cluster.close()


def _forkserver() -> Any:
    ctx = mp.get_context("forkserver")
    # One import of torch in the server; every rank after that is a fast fork.
    # forkserver first: it leaves the kernel's process group (see there).
    ctx.set_forkserver_preload(["ezpz_nb.launcher.forkserver", "ezpz_nb.launcher.rank"])
    return ctx


def warm_up() -> bool:
    """In a Jupyter kernel, start the forkserver now, so the first launch is fast.

    The forkserver's one ``import torch`` (about a second) then happens while the
    learner reads, instead of inside the first launch. Starting it only spawns a
    process (milliseconds); a launch that comes before it is ready waits for it
    as the first launch always did. Not in a plain script or under torchrun, nor
    with ``EZPZ_NB_WARMUP=0``.

    Returns:
        True when the forkserver was started (or already running).
    """
    if not should_warm_up():
        return False
    _forkserver()
    # The kernel may exit before any launch: its shutdown must still let the
    # forkserver and the resource tracker go and leave no folder behind.
    on_kernel_shutdown(_close_all)
    with main_hidden("forkserver"):
        multiprocessing.forkserver.ensure_running()
    return True


def live_clusters() -> list[Cluster]:
    """Clusters started in this process and not yet closed."""
    return [c for _, c in sorted(_LIVE.items(), key=lambda kv: kv[0]) if not c.closed]


@atexit.register
def _close_all() -> None:
    # Runs before multiprocessing's own exit hook (atexit is last-in, first-out),
    # which would otherwise wait forever for ranks that are not daemons.
    for c in live_clusters():
        try:
            c._kill()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
