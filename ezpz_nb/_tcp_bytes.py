"""Bytes that crossed a set of processes' TCP connections, read by the kernel, from outside them.

A checker that wants to know what some processes sent each other cannot trust anything
kept inside them. The kernel counts, per TCP socket, the bytes the peer acknowledged
(``tcpi_bytes_acked``) and the bytes received (``tcpi_bytes_received``); this module reads
those counters, for the sockets a set of processes holds, from another process: the
sockets are found by inode in ``/proc/<pid>/fd``, the counters through the kernel's
``sock_diag`` netlink interface (what ``ss -ti`` reads), with Python's own ``socket``
module and no external command. Linux only; elsewhere, or where the kernel refuses,
:func:`unavailable` says why and nothing is counted.

What it cannot see: a connection opened and closed between two readings (its socket is
gone from every ``/proc/<pid>/fd`` by the second one), and processes outside the set.
Standard library only: a rank may import it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from dataclasses import dataclass

__all__ = ["Conn", "read_conns", "reread", "socket_inodes", "unavailable"]

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_INFO = 2
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
# inet_diag_msg: family, state, timer, retransmits, the socket id (two ports, big-endian, at
# byte 4; two 16-byte addresses, interface, cookie), expires, rqueue, wqueue, uid, inode (68).
_PORTS_AT, _INODE_AT, _MSG_SIZE = 4, 68, 72
# tcp_info (linux/tcp.h): tcpi_bytes_acked at byte 120, tcpi_bytes_received at 128 (since 4.1).
_ACKED_AT, _INFO_MIN = 120, 136


@dataclass(frozen=True)
class Conn:
    """One TCP socket as the kernel counts it: its ports and its two byte counters."""

    inode: int
    local_port: int
    remote_port: int
    acked: int  # bytes this end sent that the peer acknowledged
    received: int  # bytes this end received
    key: bytes = b""  # its family and socket id as the kernel gave them: what reread asks for


def unavailable() -> str | None:
    """Why the counters cannot be read here (None when they can)."""
    if not sys.platform.startswith("linux"):
        return f"the kernel's per-connection byte counters are read on Linux only (this is {sys.platform})"
    try:
        read_conns(set())
    except OSError as err:
        return f"the kernel refused its per-connection byte counters (sock_diag: {err})"
    return None


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds (empty if it is gone or unreadable)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    found.add(int(link[8:-1]))
    return found


def read_conns(inodes: set[int]) -> dict[int, Conn]:
    """The TCP sockets (IPv4 and IPv6) among ``inodes``, with their counters, by inode.

    Raises:
        OSError: the kernel refused the query (no netlink, or no ``tcp_info`` in its answer).
    """
    out: dict[int, Conn] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        for family in (socket.AF_INET, socket.AF_INET6):
            _dump(nl, family, inodes, out)
    return out


def reread(nl: socket.socket, conn: Conn) -> Conn | None:
    """``conn``'s counters now, asked of the kernel for that one socket (None: it is gone).

    Tens of microseconds, where :func:`read_conns` walks every TCP socket of the machine
    (milliseconds on a busy one). ``nl``: a ``NETLINK_SOCK_DIAG`` socket the caller holds.
    """
    info, states = 1 << (_INET_DIAG_INFO - 1), ~0 & 0xFFFFFFFF
    req = struct.pack("=BBBxI", conn.key[0], socket.IPPROTO_TCP, info, states) + conn.key[1:]
    nl.send(_HEADER.pack(_HEADER.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req)
    data = nl.recv(1 << 16)
    length, kind, _, _, _ = _HEADER.unpack_from(data)
    found: dict[int, Conn] = {}
    if kind not in (_NLMSG_ERROR, _NLMSG_DONE):
        _take(data[_HEADER.size : length], {conn.inode}, found)
    return found.get(conn.inode)


def _dump(nl: socket.socket, family: int, inodes: set[int], out: dict[int, Conn]) -> None:
    # inet_diag_req_v2: family, TCP, ask for tcp_info, every state, an empty socket id.
    req = struct.pack(
        "=BBBxI", family, socket.IPPROTO_TCP, 1 << (_INET_DIAG_INFO - 1), ~0 & 0xFFFFFFFF
    )
    req += bytes(48)
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    nl.send(_HEADER.pack(_HEADER.size + len(req), _SOCK_DIAG_BY_FAMILY, flags, 1, 0) + req)
    while True:
        data = nl.recv(1 << 16)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, at)
            if kind == _NLMSG_DONE:
                return
            if kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
                raise OSError(code, os.strerror(code))
            if length < _HEADER.size:
                raise OSError("a malformed sock_diag answer")
            _take(data[at + _HEADER.size : at + length], inodes, out)
            at += (length + 3) & ~3


def _take(body: bytes, inodes: set[int], out: dict[int, Conn]) -> None:
    sport, dport = struct.unpack_from(">HH", body, _PORTS_AT)
    (inode,) = struct.unpack_from("=I", body, _INODE_AT)
    if inode not in inodes:
        return
    at = _MSG_SIZE
    while at + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, at)
        if length < 4:
            break
        if kind == _INET_DIAG_INFO:
            if length - 4 < _INFO_MIN:
                raise OSError("this kernel's tcp_info has no byte counters (Linux 4.1 or later)")
            acked, received = struct.unpack_from("=QQ", body, at + 4 + _ACKED_AT)
            out[inode] = Conn(inode, sport, dport, acked, received, body[:1] + body[4:52])
            return
        at += (length + 3) & ~3
