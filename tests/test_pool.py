"""The standby pool for spawn: sized from the machine, taken by launches, never left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from jupyter_client import KernelManager

import ezpz_nb as ez
from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.pool import STANDBY_BYTES, StandbyPool, standby_size
from ezpz_nb.launcher.session import SESSION
from ezpz_nb.launcher.settings import MAX_WORLD_SIZE, ONE_LAUNCH

pytestmark = pytest.mark.timeout(240)
GIB = 1024**3


@pytest.mark.parametrize(
    ("value", "cores", "available", "want"),
    [
        (None, 8, 16 * GIB, ONE_LAUNCH),  # a laptop: one launch's worth, no more
        ("", 64, 512 * GIB, ONE_LAUNCH),  # a big machine idles with no more either
        (None, 1, 16 * GIB, 2),  # one core: the warm-up imports share it
        (None, 8, 8 * STANDBY_BYTES, 2),  # at most a quarter of the free memory
        (None, 8, 3 * STANDBY_BYTES, 0),  # too little memory: no pool
        (None, 8, None, ONE_LAUNCH),  # memory unknown (no psutil, no /proc)
        ("0", 8, 16 * GIB, 0),
        (" off ", 8, 16 * GIB, 0),
        ("No", 8, 16 * GIB, 0),
        ("8", 2, 1 * GIB, 8),  # asked for: the learner's choice
        ("1000", 8, 16 * GIB, MAX_WORLD_SIZE),
    ],
)
def test_pool_size_from_cores_memory_and_variable(value, cores, available, want):
    """Guards: the pool holds at most one launch's worth when idle, less where cores or
    free memory are short, none with EZPZ_NB_STANDBY=0, and what the learner asks for."""
    assert standby_size(value, cores, available) == want


@pytest.mark.parametrize("value", ["four", "-1", "2.5", "yes please"])
def test_pool_size_rejects_what_is_not_a_number(value):
    """Guards: a typo in EZPZ_NB_STANDBY is an error saying what to set, not a silent pool."""
    with pytest.raises(EzpzError, match="EZPZ_NB_STANDBY=.*set it to a number"):
        standby_size(value, 4, 16 * GIB)


def _pid() -> int:
    return os.getpid()


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and _not_zombie(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_launch_takes_the_standby_ranks_and_the_pool_refills():
    """Guards: under spawn a launch runs on the standby processes (not fresh ones), a
    launch larger than the pool still gets every rank, and the pool refills with new
    processes once the ranks are gone; closing it leaves no process."""
    pool = SESSION.pool  # the one the session's clusters take from
    pool.start(2)
    try:
        assert pool.wait_ready(120)
        standby = sorted(pool.pids())
        ranks = ez.launch(_pid, world_size=2, start_method="spawn", timeout=120)
        assert sorted(ranks) == standby
        refilled = pool.pids()
        assert len(refilled) == 2 and not set(refilled) & set(standby)
        assert _gone(standby, 10)  # the launch's ranks (ex-standby) stopped
        assert pool.wait_ready(120)
        three = ez.launch(_pid, world_size=3, start_method="spawn", timeout=120)
        assert len(set(three)) == 3 and set(refilled) < set(three)
        # Other start methods leave the pool alone.
        left = pool.pids()
        ez.launch(_pid, world_size=2, start_method="forkserver", timeout=120)
        assert pool.pids() == left
    finally:
        pids = pool.pids()
        pool.close()
    assert _gone(pids, 10)
    assert pool.pids() == []


def test_the_pool_replaces_what_it_lent_only_at_release():
    """Guards the pool's one refill policy: a take leaves the pool short while the
    taken ranks start (a refill then would compete with them for the cores), and the
    release starts the replacements; nothing outlives close()."""
    pool = StandbyPool()
    pool.start(1)
    taken: list = []
    try:
        first = pool.pids()
        taken = pool.take(1)
        assert [s.child.proc.pid for s in taken] == first
        assert pool.pids() == []  # not refilled while the taken rank starts
        pool.release(len(taken))
        again = pool.pids()
        assert len(again) == 1 and again != first
    finally:
        for s in taken:
            s.kill()
        pids = pool.pids()
        pool.close()
    assert _gone(first + pids, 10)


_KILLED = """
import os, signal, sys
import ezpz_nb as ez
from ezpz_nb.launcher.session import SESSION
POOL = SESSION.pool
POOL.start(2)
assert POOL.wait_ready(120)
c = ez.Cluster(2, start_method="spawn", timeout=120)  # takes both; two more start
pids = c.run(os.getpid) + POOL.pids()
print(" ".join(map(str, pids)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the kernel dies: no exit handler runs
"""


@pytest.mark.system  # a notebook process of its own, killed: `make system`
def test_killed_notebook_leaves_no_standby_process(short_tmp):
    """Guards: SIGKILL of the notebook (the OOM killer, a crashed kernel) ends the standby
    ranks too, those still importing torch included, and the ranks made from them."""
    done = subprocess.run(
        [sys.executable, "-c", _KILLED],
        capture_output=True,
        text=True,
        timeout=200,
        env=dict(os.environ, TMPDIR=short_tmp),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 4
    # The refilled two may still be importing torch: they leave once that is done.
    assert _gone(pids, 120), [p for p in pids if psutil.pid_exists(p)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.listdir(short_tmp):
        time.sleep(0.1)
    assert os.listdir(short_tmp) == []


# A killed kernel under spawn is the slower case (`make system`); a killed script is
# checked in the quick run above (test_killed_notebook_leaves_no_standby_process).
@pytest.mark.system  # a Jupyter kernel under spawn of its own per case: `make system`
@pytest.mark.parametrize("how", ["shutdown", "SIGKILL"])
def test_kernel_under_spawn_warms_a_pool_and_leaves_nothing(how, short_tmp):
    """Guards: in a real kernel with EZPZ_NB_START_METHOD=spawn, import ezpz_nb starts the
    pool, a launch uses it, and neither Jupyter's shutdown nor a killed kernel leaves a
    standby process (or a folder) behind."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ, TMPDIR=short_tmp, EZPZ_NB_START_METHOD="spawn"))
    kc = km.client()
    kc.start_channels()
    out: list[str] = []
    try:
        kc.wait_for_ready(timeout=60)
        code = (
            "import os, ezpz_nb as ez\nfrom ezpz_nb.launcher.session import SESSION\n"
            "POOL = SESSION.pool\n"
            "assert POOL.wait_ready(150)\nwarm = sorted(POOL.pids())\n"
            "ranks = sorted(ez.launch(os.getpid, world_size=2))\n"
            "print('pids', *warm, *POOL.pids(), 'same', set(ranks) <= set(warm))"
        )
        reply = kc.execute_interactive(
            code, timeout=200, output_hook=lambda m: out.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        if how == "SIGKILL":
            os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
            km.shutdown_kernel(now=True)  # the manager's own bookkeeping; nothing is left
        else:
            km.shutdown_kernel(now=False)
        kc.stop_channels()
    words = "".join(out).split()
    assert words[0] == "pids" and words[-1] == "True", out
    pids = [int(w) for w in words[1:-2]]
    assert len(pids) >= 4  # the pool's first ranks and their replacements
    assert _gone(pids, 120), [p for p in pids if psutil.pid_exists(p)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.listdir(short_tmp):
        time.sleep(0.1)
    assert os.listdir(short_tmp) == []
