"""Refuse new sockets to confined code: a seccomp filter, where Landlock stops at TCP.

Landlock (:mod:`.confine`) refuses TCP binds and connects and abstract unix sockets, but not
UDP, raw or packet sockets, netlink, or a unix socket file another process serves, and the
kernel's per-connection TCP counters (:mod:`.wire_bytes`) do not count them either: issue
45's fifth trial sent every loss of notebook 16 between ranks over UDP. A confined check
needs no new socket (the process group's and the checker's connections are made before),
so :func:`refuse_sockets` installs a seccomp filter on which ``socket()`` and
``socketpair()`` fail with ``EPERM`` ("Operation not permitted"), whatever the family, and
so does ``io_uring_setup()`` (a ring makes sockets past the filter). System V shared
memory, semaphores and message queues, and the kernel's keyring, are refused alike: Landlock
has no rule for them, and the sixth trial kept a save's state in a segment and in the
keyring (a POSIX queue or shared memory is a file under ``/dev/mqueue`` or ``/dev/shm``,
which Landlock already refuses to write). Calls made for another
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
#: machine: (audit arch, the seccomp system call, the refused calls' numbers by name).
_TABLES: dict[str, tuple[int, int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        317,
        {
            "socket": 41, "socketpair": 53, "io_uring_setup": _IO_URING_SETUP,
            "shmget": 29, "shmat": 30, "semget": 64, "semop": 65,
            "msgget": 68, "msgsnd": 69, "msgrcv": 70,
            "add_key": 248, "request_key": 249, "keyctl": 250,
        },
    ),
    "aarch64": (
        0xC00000B7,
        277,
        {
            "socket": 198, "socketpair": 199, "io_uring_setup": _IO_URING_SETUP,
            "shmget": 194, "shmat": 196, "semget": 190, "semop": 193,
            "msgget": 186, "msgsnd": 189, "msgrcv": 188,
            "add_key": 217, "request_key": 218, "keyctl": 219,
        },
    ),
}  # fmt: skip


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
    arch, _, refused = _TABLES[machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE|K, BPF_RET|K
    last = 4 + len(refused) + 1  # the refusing instruction's index
    code = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, last - 2, arch),  # another table: to the refusal
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jge, last - 4, 0, _X32_BIT),
    ]
    # A jump counts the instructions it skips: from index i to the refusal, last - i - 1.
    code += [(jeq, last - len(code) - 1 - k, 0, nr) for k, nr in enumerate(refused.values())]
    return [*code, (ret, 0, 0, _ALLOW), (ret, 0, 0, _ERRNO | _EPERM)]


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
        got = libc.syscall(_TABLES[machine][1], _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog))
    else:
        got = libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0)
    if got != 0:
        # With thread sync, a positive value names a thread that could not take the filter.
        raise OSError(ctypes.get_errno(), f"the seccomp filter was refused ({got})")
