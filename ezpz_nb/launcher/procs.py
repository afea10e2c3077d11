"""The rank processes of one cluster: start them, watch them, ask where they are, kill them.

The mechanism only: nothing here decides whether a failure ends the cluster (that
is :mod:`.policy`) or keeps the notebook's list of clusters (that is :mod:`.session`).

* Each rank's fd 1 and 2 go to pipes that the waiting notebook thread reads, so
  output (torch's C++ messages too) shows up live in the cell that asked.
* Each rank is its own process group leader; killing a rank kills the group, so
  its DataLoader workers go with it. A lifeline pipe makes ranks exit if the
  kernel dies.
* Ranks meet through a FileStore in a fresh temporary folder: no fixed port, so two
  notebooks never collide, and nothing is left behind once the folder is removed.

Under spawn, :meth:`RankProcesses.start` first takes ranks from the standby pool
(:mod:`.pool`: spawned ahead, torch already imported) and spawns only the rest;
:meth:`RankProcesses.release_standby` tells the pool when they no longer start
(the pool decides what that means for its refill). Every process, fresh or
standby, is started and killed by :mod:`.children`.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.util
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from ezpz_nb.launcher import rank as _rank
from ezpz_nb.launcher import wire
from ezpz_nb.launcher.children import Child, kill_group, start_child
from ezpz_nb.launcher.failures import RankFailure, from_exit
from ezpz_nb.launcher.output import OutputRelay
from ezpz_nb.launcher.pool import Standby, StandbyPool
from ezpz_nb.launcher.stacks import RankStack, ask_stacks
from ezpz_nb.launcher.startup import forkserver_context

__all__ = ["RankProcesses", "RankSpec"]


@dataclass(frozen=True)
class RankSpec:
    """What every rank of one cluster is started with."""

    world_size: int
    threads: int
    start_method: str
    backend: str
    #: gloo's own collective timeout, fixed when the group is made.
    pg_timeout: float


class RankProcesses:
    """The live processes of one cluster and the pipes to each of them.

    Made empty; :meth:`start` starts the ranks, :meth:`kill` ends them all and
    removes their folder. Rank ``r`` is ``procs[r]``, talks over ``conns[r]``.

    Args:
        spec: How every rank is started.
        pool: Where spawned gloo ranks are taken from first (the session's pool).
    """

    def __init__(self, spec: RankSpec, pool: StandbyPool) -> None:
        self.spec = spec
        self.pool = pool
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.output = OutputRelay()
        self.tmp: str | None = None
        #: Folders the ranks remove themselves if the notebook dies without closing.
        self.cleanup_dirs: tuple[str, ...] = ()
        self._lifelines: list[Any] = []
        #: How many ranks came from the standby pool (refilled once they are gone).
        self.from_standby = 0
        # The kernel-shutdown hook may kill from another thread while a run in the
        # main thread is being interrupted: one teardown at a time.
        self._kill_lock = threading.Lock()

    @property
    def alive(self) -> bool:
        """True from :meth:`start` until :meth:`kill`."""
        return self.tmp is not None

    def start(self) -> None:
        """Start every rank (they report ``Ready`` over their pipe once joined)."""
        spec = self.spec
        ctx = (
            forkserver_context()
            if spec.start_method == "forkserver"
            else mp.get_context(spec.start_method)
        )
        self.tmp = tempfile.mkdtemp(prefix="ezpz_nb-")
        self.cleanup_dirs = (self.tmp,)
        if spec.start_method == "forkserver":
            # The forkserver's folder (made when it started) would outlive a killed kernel.
            self.cleanup_dirs += (multiprocessing.util.get_temp_dir(),)
        env = dict(os.environ)
        # gloo binds to LOOPBACK by address (rankgroup.join) unless the learner named an
        # interface in GLOO_SOCKET_IFNAME, which then stays theirs.
        env.update(
            WORLD_SIZE=str(spec.world_size),
            LOCAL_WORLD_SIZE=str(spec.world_size),
            OMP_NUM_THREADS=str(spec.threads),
        )
        if spec.backend == "gloo":
            env["CUDA_VISIBLE_DEVICES"] = ""  # CPU-only unless asked: no CUDA init cost
        env.pop("MASTER_ADDR", None)  # ranks use our FileStore, not an outer launcher's
        # Standby ranks were started CPU-only: NCCL ranks are always spawned fresh.
        standby = spec.start_method == "spawn" and spec.backend == "gloo"
        ready = self.pool.take(spec.world_size) if standby else []
        self.from_standby = len(ready)
        for r in range(spec.world_size):
            rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r))
            if r < len(ready):
                self._adopt(ready[r], r, rank_env)
            else:
                self._start_rank(ctx, r, rank_env)

    def _config(self, r: int, env: dict[str, str]) -> _rank.RankConfig:
        assert self.tmp is not None
        return _rank.RankConfig(
            rank=r,
            world_size=self.spec.world_size,
            store_path=os.path.join(self.tmp, "store"),
            dump_path=self._dump_path(r),
            threads=self.spec.threads,
            backend=self.spec.backend,
            pg_timeout=self.spec.pg_timeout,
            env=env,
            cwd=os.getcwd(),
            sys_path=list(sys.path),
            parent_pid=os.getpid(),
            cleanup_dirs=self.cleanup_dirs,
        )

    def _adopt(self, standby: Standby, r: int, env: dict[str, str]) -> None:
        """Make a standby process rank ``r``: it joins the group as a fresh rank would."""
        child = standby.handed_over()
        child.conn.send(self._config(r, env))
        self._add(child, r)

    def _start_rank(self, ctx: Any, r: int, env: dict[str, str]) -> None:
        child = start_child(
            ctx,
            _rank.main,
            name=f"ezpz_nb-rank{r}",
            start_method=self.spec.start_method,
            head=(self._config(r, env),),
        )
        self._add(child, r)

    def _add(self, child: Child, r: int) -> None:
        self.output.add(child.out_r, r, 1)
        self.output.add(child.err_r, r, 2)
        self.procs.append(child.proc)
        self.conns.append(child.conn)
        self._lifelines.append(child.life_w)

    def _dump_path(self, r: int) -> str:
        assert self.tmp is not None
        return os.path.join(self.tmp, f"stack{r}.txt")

    def send_all(self, msg: wire.ToRank) -> None:
        """Send one command to every rank."""
        data = wire.command(msg)
        for conn in self.conns:
            conn.send_bytes(data)

    def sentinels(self) -> dict[int, int]:
        """Each rank's process sentinel (readable once it died) to its rank."""
        return {p.sentinel: r for r, p in enumerate(self.procs)}

    def death(self, r: int) -> RankFailure:
        """How rank ``r`` died (call once its sentinel is ready)."""
        proc = self.procs[r]
        proc.join(1.0)
        return from_exit(r, proc.exitcode)

    def stacks(self, blocked: set[int]) -> dict[int, RankStack]:
        """Where each rank is: ask the blocked ones for their stack (:func:`.stacks.ask_stacks`)."""
        ranks = range(self.spec.world_size)
        return ask_stacks(
            {r: self.procs[r].pid for r in ranks}, {r: self._dump_path(r) for r in ranks}, blocked
        )

    def stop(self, grace_s: float = 2.0) -> None:
        """Ask every rank to leave, give them ``grace_s`` to do so, then :meth:`kill`."""
        for conn in self.conns:
            try:
                conn.send_bytes(wire.command(wire.Stop()))
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self.output.drain()
        self.kill()

    def kill(self) -> None:
        """Kill every rank's process group (loader workers included) and clean up."""
        with self._kill_lock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        for p in self.procs:
            kill_group(p)
        for p in self.procs:
            p.join(2.0)
        self.output.drain(final=True)
        self.output.close()
        for c in self.conns + self._lifelines:
            c.close()
        for p in self.procs:
            try:
                p.close()
            except ValueError:
                pass
        self.conns, self._lifelines, self.procs = [], [], []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        self.release_standby()  # the ranks the pool lent are gone

    def release_standby(self) -> None:
        """Tell the pool the ranks it lent no longer start (they are up, or gone); once."""
        lent, self.from_standby = self.from_standby, 0
        self.pool.release(lent)
