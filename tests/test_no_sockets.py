"""The seccomp filter of confined checks (workshop/no_sockets.py), in a process of its own.

Issue 45's sixth trial kept a save's state in a System V segment and in the kernel's
keyring from a sealed rank: Landlock has no rule for either. The filter must refuse those
calls as it refuses new sockets, and leave the rest of the process working.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ezpz_nb.workshop.no_sockets import available

pytestmark = pytest.mark.skipif(available() is not None, reason=f"no filter here: {available()}")

_PROBE = r"""
import ctypes, errno, os, platform, socket
from ezpz_nb.workshop.no_sockets import refuse_sockets, _TABLES
libc = ctypes.CDLL(None, use_errno=True)
nr = _TABLES[platform.machine()][2]
refuse_sockets()
def refused(name, *args):
    ctypes.set_errno(0)
    got = libc.syscall(nr[name], *args)
    return got == -1 and ctypes.get_errno() == errno.EPERM
# Arguments that make nothing where the call is let through (a key no object has, no
# create flag, keyring 0): unfiltered they fail otherwise (ENOENT, EINVAL) or only read.
KEY = 0x7E2A1145
print("shmget", refused("shmget", KEY, 4096, 0))
print("msgget", refused("msgget", KEY, 0))
print("semget", refused("semget", KEY, 1, 0))
print("add_key", refused("add_key", b"user", b"ezpz", b"state", 5, 0))
print("keyctl", refused("keyctl", 0, -2, 0))
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    print("udp", False)
except PermissionError:
    print("udp", True)
r, w = os.pipe()  # the rest of the process works: files, pipes
os.write(w, b"x")
print("pipe", os.read(r, 1) == b"x")
"""


def test_the_filter_refuses_sockets_system_v_ipc_and_the_keyring_and_nothing_else():
    """Guards: each refused call fails with EPERM after the filter, the process goes on
    (a pipe still works); without the filter the same calls are not refused."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    said = dict(line.split() for line in done.stdout.splitlines())
    assert said == {k: "True" for k in said} and len(said) == 7, done.stdout
    unfiltered = _PROBE.replace("refuse_sockets()\n", "")
    done = subprocess.run(
        [sys.executable, "-c", unfiltered], capture_output=True, text=True, timeout=120
    )
    said = dict(line.split() for line in done.stdout.splitlines())
    assert set(said.values()) == {"False", "True"} and said["shmget"] == "False", done.stdout
    assert said["msgget"] == said["semget"] == said["add_key"] == said["udp"] == "False"
