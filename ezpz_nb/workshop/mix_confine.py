"""Notebook 17's new process (:mod:`.mix_fresh`) kept apart from the check's ranks, both ways.

Rule 6 of :mod:`.mixture` trusts what the learner's function returns in a new Python process.
Issue 45's ninth trial (``d17_salted_hash_waits_for_ranks``) passed it 2 of 2 with orders
seeded by ``hash()`` of a str (salted per process): the ranks cached each global batch in
``/tmp``, and the new process, started beside them, waited for their file instead of
computing its own. The reverse works alike: a process that writes its salt first, and ranks
that take it. So the new process now

* answers before any rank runs the learner's code (:meth:`.FreshStream.finish`, called before
  the first rank job): nothing the ranks write during the check exists while it runs; its
  process group is killed once it answered, and only its first line is read, so a child it
  left behind can neither wait for the ranks' files nor answer for it later;
* confines itself before it unpickles the function (:func:`confine_self`), with
  :mod:`.confine`'s Landlock rules: it reads only under the interpreter's and the code's
  folders (``sys.path``, the working folder, the system's libraries and settings, its own
  ``/proc`` entry), never a shared place (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run``,
  another process's ``/proc``); it writes nothing (but ``/dev/null``), starts no program,
  binds or connects no TCP socket, reaches no abstract unix socket nor signals a process
  outside; and :mod:`.no_sockets` refuses it every new socket, System V IPC and the keyring.
  It leaves nothing for the ranks (a file, a socket, a message) and reads nothing they left
  in a shared place.

Where Landlock is missing or older than a rule needs (:func:`~.confine.confinement`), the
process runs unconfined and :func:`not_confined` says what is missing: a stream that differs
there is still wrong, but one that matches is "not judged here", never passed.

Not closed: what the learner wrote *before* the check where the process may read (a file in
the notebook's folder or the interpreter's, which are user-writable), and the environment
the notebook's process hands it. Both are the notebook's own state before the check draws
anything; a stream drawn from such a file is the same in a restarted job on this machine.

Measured (2 cores at load 19 to 30, one warm cluster, the process beside the ranks and before
them interleaved, median of 3 checks each): the notebook's solution as a cell (numpy alone
in the new process) 6.1 s before, 11.3 s after; the tests' copy of it (its module imports
torch there) 5.2 s and 8.5 s. The order costs the new process's whole run; the walls cost
a few system calls.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence

__all__ = ["confine_self", "not_confined", "readable_paths"]

#: Folders any process of the user may write and others read: never readable by the process.
SHARED = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/proc")
#: The system's programs, libraries and settings: what an interpreter and its extensions read.
SYSTEM = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/sys")
#: Read in the process itself: its own /proc entry (resolved there) and the kernel's devices.
OWN = ("/proc/self", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def _holds(folder: str, place: str) -> bool:
    """``place`` is ``folder`` or lies under it."""
    return place == folder or place.startswith(folder.rstrip("/") + "/")


def readable_paths(path: Sequence[str]) -> list[str]:
    """Notebook side: the folders the new process may read, from the notebook's ``sys.path``
    (``''`` is the working folder), the interpreter's prefixes, the folder ``ezpz_nb`` is
    in and :data:`SYSTEM`; less any that holds a shared place (``/``, ``/tmp`` itself): a
    module directly in ``/tmp`` is then not found there, and the error says where to put it."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    wanted = [os.path.abspath(p or os.getcwd()) for p in path]
    wanted += [os.getcwd(), here, *prefixes, *SYSTEM]
    shared = {os.path.realpath(p) for p in (*SHARED, tempfile.gettempdir())}
    out: list[str] = []
    for p in map(os.path.realpath, wanted):
        if os.path.exists(p) and p not in out and not any(_holds(p, s) for s in shared):
            out.append(p)
    return out


def confine_self(readable: Sequence[str]) -> None:
    """Process side, before the learner's code is unpickled and before any other thread
    starts (they inherit it): reads only under ``readable`` and :data:`OWN`, no writes, no
    programs, no sockets. Does nothing where Landlock is missing (:func:`not_confined`)."""
    from ezpz_nb.workshop.confine import landlock_abi, restrict_this_thread
    from ezpz_nb.workshop.no_sockets import available, refuse_sockets

    abi = landlock_abi()
    if abi < 1:
        return
    paths = [p for p in (*readable, *OWN) if os.path.exists(p)]
    restrict_this_thread([], abi, readable=paths)
    if available() is None:
        refuse_sockets(all_threads=True)


def not_confined() -> list[str]:
    """Notebook side: what keeps the new process from being confined here, each with why;
    [] when every rule holds."""
    from ezpz_nb.workshop.confine import confinement, landlock_abi

    abi = landlock_abi()
    missing = [m for m in confinement(abi) if not m.startswith("processes left")]
    if abi < 1:  # confinement's first item speaks of a checkpoint: said for this rule
        missing[0] = "files it reads and writes " + missing[0][missing[0].index("(") :]
    return missing
