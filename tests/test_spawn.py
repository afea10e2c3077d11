"""The start method as every platform gets it: the switch, spawned ranks, loopback only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.settings import PRELOAD_ENV, START_METHOD_ENV
from ezpz_nb.launcher.startup import (
    PreloadError,
    StartMethodError,
    preload_modules,
    resolve_start_method,
)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    ("value", "platform", "want"),
    [
        (None, "linux", "forkserver"),
        ("", "linux", "forkserver"),
        ("  ", "darwin", "spawn"),
        (None, "win32", "spawn"),
        ("spawn", "linux", "spawn"),
        (" Spawn\n", "linux", "spawn"),  # copied from a shell or a .env file
        ("FORK", "darwin", "fork"),  # unsafe on macOS, but asked for: allowed
        ("forkserver", "darwin", "forkserver"),
        ("spawn", "win32", "spawn"),
    ],
)
def test_start_method_variable_accepts_what_the_platform_runs(value, platform, want):
    """Guards: EZPZ_NB_START_METHOD picks the default; blank means the platform's own."""
    assert resolve_start_method(value, platform) == want


@pytest.mark.parametrize(
    ("value", "platform", "says"),
    [
        ("threads", "linux", "set it to one of forkserver, fork, spawn"),
        ("spawn,fork", "linux", "is not a start method"),
        ("1", "darwin", "this platform's default ('spawn')"),
        ("fork", "win32", "Windows does not have; set it to 'spawn'"),
        ("forkserver", "win32", "needs os.fork"),
        ("fork", "cygwin", "set it to 'spawn'"),
    ],
)
def test_start_method_variable_rejects_what_cannot_run(value, platform, says):
    """Guards: a bad value, or fork on Windows, is one clear error naming the variable."""
    with pytest.raises(StartMethodError) as info:
        resolve_start_method(value, platform)
    assert isinstance(info.value, EzpzError) and isinstance(info.value, ValueError)
    assert START_METHOD_ENV in str(info.value) and says in str(info.value)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, **env},
    )


def test_bad_start_method_fails_before_any_rank_starts():
    """Guards: the mistake shows as one clear error before any rank starts, not as a crash
    inside the ranks: in a script at the first launch (``import ezpz_nb`` loads nothing
    there, issue 47), in a kernel already at import, where warm-up reads it."""
    done = _python("import ezpz_nb\nprint('imported')", **{START_METHOD_ENV: "spwan"})
    assert done.returncode == 0 and done.stdout == "imported\n", done.stderr
    code = "import ezpz_nb as ez\nez.launch(print, world_size=1)"
    done = _python(code, **{START_METHOD_ENV: "spwan"})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ezpz_nb.launcher.startup.StartMethodError: EZPZ_NB_START_METHOD=")
    assert "'spwan' is not a start method" in last


_PRELOADED = """
import sys, ezpz_nb as ez
def loaded():
    # What the forkserver imported before forking: in this rank without an import of its own.
    return sorted(m for m in ("wave", "torch.distributed.checkpoint") if m in sys.modules)
print(ez.launch(loaded, world_size=2))
"""


def test_preloaded_modules_reach_every_rank_and_a_misspelt_one_stops_the_launch():
    """Guards issue 47's fifth round: EZPZ_NB_PRELOAD's modules are imported once, in the
    forkserver, and every rank has them without paying for them (the test run sets it: DCP's
    modules are 0.6 s of CPU a rank); a name no module has stops the first
    launch, saying so, before any rank starts (the forkserver would skip it in silence)."""
    both = "wave, torch.distributed.checkpoint"  # not torch._dynamo: it leaves a folder
    done = _python(_PRELOADED, **{PRELOAD_ENV: both})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str([sorted(both.split(", "))] * 2)
    done = _python(_PRELOADED, **{PRELOAD_ENV: ""})
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[[], []]"
    done = _python(_PRELOADED, **{PRELOAD_ENV: "torch._dynamoo"})
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ezpz_nb.launcher.startup.PreloadError: EZPZ_NB_PRELOAD="), last
    assert "no module 'torch._dynamoo'" in last
    with pytest.raises(PreloadError, match="'nopkg.sub'"):
        preload_modules("json nopkg.sub")
    assert preload_modules(" json,, os ") == ["json", "os"]


_HOW_STARTED = """
import psutil, ezpz_nb as ez
def how():
    # A forked rank keeps this script's command line; the others start their own.
    cmd = psutil.Process().cmdline()
    if cmd[-1] == "--multiprocessing-fork":
        return "spawn"
    return "forkserver" if any(a.startswith("from multiprocessing.fork") for a in cmd) else "fork"
c = ez.Cluster(2, start_method=None if len(__import__('sys').argv) < 2 else 'fork')
print(c.start_method, c.run(how))
c.close()
"""


@pytest.mark.system  # a script with spawned ranks, as macOS and Windows start them: `make system`
def test_start_method_variable_starts_spawned_ranks():
    """Guards: the switch really changes how ranks start (spawn, as on macOS/Windows),
    and an explicit start_method still wins over it."""
    done = _python(_HOW_STARTED, **{START_METHOD_ENV: "spawn"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawn ['spawn', 'spawn']"
    done = subprocess.run(
        [sys.executable, "-c", _HOW_STARTED, "fork"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, START_METHOD_ENV: "spawn"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fork ['fork', 'fork']"


_LISTENING = """
import socket, sys, psutil, torch, torch.distributed as dist, ezpz_nb as ez
from torch.distributed.device_mesh import init_device_mesh

def listening():
    init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))  # new groups too
    dist.barrier()
    return sorted({c.laddr.ip for c in psutil.Process().net_connections("inet")
                   if c.status == psutil.CONN_LISTEN})

print("hostname is", socket.gethostbyname(socket.gethostname()))
print("listening", ez.launch(listening, world_size=4, start_method=sys.argv[1]))
"""


def _non_loopback_address() -> str | None:
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


@pytest.mark.system  # scripts on a machine whose hostname resolves elsewhere: `make system`
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_gloo_listens_on_loopback_even_when_the_hostname_does_not(method, tmp_path):
    """Guards: no rank listens beyond 127.0.0.1, without naming an interface (lo, lo0 and
    Windows' names differ). The hostname is made to resolve to this machine's network
    address (a laptop on Wi-Fi), where gloo binds by default; every group (the default
    one and a DeviceMesh's) must still listen on loopback only."""
    address = _non_loopback_address()
    if address is None or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs a network address and root to run in a UTS namespace")
    script = tmp_path / "listen.py"
    script.write_text(_LISTENING)
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    done = subprocess.run(
        ["unshare", "--uts", "sh", "-c", f'hostname {address} && exec "$0" "$@"']
        + [sys.executable, str(script), method],
        capture_output=True,
        text=True,
        timeout=150,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert f"hostname is {address}" in done.stdout  # the trap is set
    assert "listening [['127.0.0.1'], ['127.0.0.1'], ['127.0.0.1'], ['127.0.0.1']]" in done.stdout
