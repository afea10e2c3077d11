"""Refuse new sockets to confined code: a seccomp filter, where Landlock stops at TCP.

Landlock (:mod:`.confine`) refuses TCP binds and connects and abstract unix sockets, but not
UDP, raw or packet sockets, netlink, or a unix socket file another process serves, and the
kernel's per-connection TCP counters (:mod:`.wire_bytes`) do not count them either: issue
45's fifth trial sent every loss of notebook 16 between ranks over UDP. A confined check
needs no new socket (the process group's and the checker's connections are made before),
so :func:`refuse_sockets` installs a seccomp filter on which ``socket()`` and
``socketpair()`` fail with ``EPERM`` ("Operation not permitted"), whatever the family, and
so does ``io_uring_setup()`` (a ring makes sockets past the filter). Calls made for another
architecture's system call table (x32, or 32-bit ``int 0x80`` on x86-64) fail alike, or
they would reach ``socket`` under another number.

The filter holds for the thread that installs it and what it starts (threads, children), or
for every thread of the process at once (``all_threads``, seccomp's thread sync), and is
never lifted. It needs ``no_new_privs``, which :mod:`.confine` sets before Landlock. Linux
on x86-64 and aarch64 only; elsewhere :func:`available` says why not.
"""

from __future__ import annotations

import ctypes
import platform
import sys

__all__ = ["available", "refuse_sockets"]

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SET_MODE_FILTER, _FLAG_TSYNC = 1, 1
_EPERM = 1
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_IO_URING_SETUP = 425  # the same number on every architecture
_X32_BIT = 0x40000000
#: machine: (audit arch, socket, socketpair, seccomp) system call numbers.
_TABLES = {
    "x86_64": (0xC000003E, 41, 53, 317),
    "aarch64": (0xC00000B7, 198, 199, 277),
}


class _Insn(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn))]


def available() -> str | None:
    """None where :func:`refuse_sockets` works here, else why it does not."""
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if platform.machine() not in _TABLES:
        return f"no seccomp filter written for {platform.machine()}"
    return None


def _program(machine: str) -> list[tuple[int, int, int, int]]:
    """The BPF program: wrong table or a refused call, EPERM; anything else, allowed."""
    arch, sock, pair, _ = _TABLES[machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE|K, BPF_RET|K
    # Offsets jump over that many instructions; the last one (index 8) refuses.
    return [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, 6, arch),
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, 4, 0, _X32_BIT),
        (jeq, 3, 0, sock),
        (jeq, 2, 0, pair),
        (jeq, 1, 0, _IO_URING_SETUP),
        (ret, 0, 0, _ALLOW),
        (ret, 0, 0, _ERRNO | _EPERM),
    ]


def refuse_sockets(all_threads: bool = False) -> None:
    """From now on, no new socket in this thread and what it starts (``all_threads``: in
    every thread of the process). Raises ``OSError`` where the kernel refuses the filter,
    ``RuntimeError`` where :func:`available` says it cannot run."""
    why = available()
    if why is not None:
        raise RuntimeError(f"new sockets cannot be refused here: {why}")
    machine = platform.machine()
    code = _program(machine)
    insns = (_Insn * len(code))(*[_Insn(*i) for i in code])
    prog = _Prog(len(code), insns)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if all_threads:
        got = libc.syscall(_TABLES[machine][3], _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog))
    else:
        got = libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0)
    if got != 0:
        # With thread sync, a positive value names a thread that could not take the filter.
        raise OSError(ctypes.get_errno(), f"the seccomp filter was refused ({got})")
