"""Notebook 19: whether a dataset's samples are read from the buffers it references.

A dataset can hold a flat array of the tokens it never reads (a decoy) and read its samples
from storage per row that the walk (:mod:`.flat_held`) does not reach: the twelfth trial kept
rows in anonymous ``mmap``\\ s, in Python's small blocks, in shared memory, in ``malloc``
blocks beside memory allocated before the checker's baseline, each found by an address, so
every rule that counts one allocator's bytes missed one of them. This rule counts no bytes:
a forked copy of the rank makes the whole pages of the large buffers that hold the rows'
tokens unreadable (``mprotect(PROT_NONE)``) and reads :data:`READS` samples drawn at random.
A right answer reads its tokens there: its first read faults (the copy dies on SIGSEGV) or
raises. Every read still right means the samples come from memory the dataset does not
reference. Measured offline (``_protect_probe.py``, the twelfth trial): 7 right answers
(a vocabulary beside the array, pyarrow, ``array('q')``, a ``bytes`` blob, shared memory, a
column-major view) died at their first read; the 5 dodges read 8 of 8 right.

The copy reads one sample before anything is made unreadable (a dataset that reads wrong in
any fork is not judged by this rule), dies by an alarm and is killed with its process group
after :data:`SECONDS`, writes no core, and leaves no process. Linux only (elsewhere: not
judged, said in the verdict).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import faulthandler
import mmap
import os
import secrets
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ezpz_nb.workshop.flat_pages import PAGE
from ezpz_nb.workshop.stops import wrong

__all__ = ["READS", "SECONDS", "judge_protected", "memory", "protect_and_read"]

#: Samples read with the buffers unreadable: all of them right by chance, for a right answer
#: whose buffers are protected, would need every one outside the protected whole pages.
READS = 8
#: How long the forked copy may take (its alarm fires first, at two thirds): 9 reads take
#: milliseconds; a copy that does not end is not judged, never passed on a clock.
SECONDS = 30
_Span = tuple[int, int]


def _array(obj: np.ndarray) -> list[_Span] | None:
    if obj.dtype.hasobject:
        return None
    root = obj
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is not None:  # memory of another object's (bytes, a map, an Arrow buffer)
        under = memory(root.base)
        if under:
            return under
    if root.size == 0:
        return []
    start = int(root.__array_interface__["data"][0])
    reach = [(d - 1) * s for d, s in zip(root.shape, root.strides, strict=True)]
    low = start + sum(r for r in reach if r < 0)
    return [(low, start + sum(r for r in reach if r > 0) + root.itemsize - low)]


def _arrow(obj: Any) -> list[_Span] | None:
    """Every buffer of an Arrow table, batch, chunked or plain array (children's too)."""
    out: list[_Span] = []
    for part in getattr(obj, "columns", None) or getattr(obj, "chunks", None) or []:
        got = _arrow(part)
        if got is None:
            return None
        out += got
    buffers = getattr(obj, "buffers", None)
    held = buffers() if callable(buffers) else [obj] if hasattr(obj, "address") else []
    for buffer in held:
        if buffer is None:
            continue
        if not buffer.is_cpu:
            return None
        out.append((int(buffer.address), int(buffer.size)))
    return out


def memory(obj: Any) -> list[_Span] | None:
    """``(address, bytes)`` of the memory that holds ``obj``'s values (a view's whole base, a
    tensor's storage, an Arrow object's buffers); ``None`` where it is not memory of this
    process (a file kept by path or open, a tensor on a GPU) or cannot be told."""
    kind = type(obj)
    module = getattr(kind, "__module__", None)
    try:
        if issubclass(kind, np.ndarray):
            return _array(obj)
        if issubclass(kind, torch.Tensor | torch.UntypedStorage):
            storage = obj.untyped_storage() if isinstance(obj, torch.Tensor) else obj
            return (
                [(storage.data_ptr(), storage.nbytes())] if storage.device.type == "cpu" else None
            )
        if isinstance(module, str) and module.startswith("pyarrow"):
            return _arrow(obj)
        if issubclass(kind, memoryview) and not obj.c_contiguous:
            return None if obj.obj is None else memory(obj.obj)
        if issubclass(
            kind, bytes | bytearray | array.array | mmap.mmap | memoryview | ctypes.Array
        ):
            raw = np.frombuffer(memoryview(obj).cast("B"), np.uint8)  # its address, any kind
            return [(int(raw.__array_interface__["data"][0]), raw.nbytes)]
    except (RuntimeError, NotImplementedError, TypeError, ValueError, BufferError, AttributeError):
        return None
    return None


def _whole_pages(spans: list[_Span]) -> list[_Span]:
    """The whole pages inside each span, as ``(start, end)``: a page shared with other memory
    (an object's header, a neighbour's block) is left readable."""
    out = []
    for address, size in spans:
        low, high = -(-address // PAGE) * PAGE, (address + size) // PAGE * PAGE
        if high > low:
            out.append((low, high))
    return out


def _child(
    ds: Any, pages: list[_Span], picks: list[int], right: Callable[[int], bool], fd: int, alarm: int
) -> None:
    """In the forked copy: one read, the pages made unreadable, :data:`READS` reads; a byte
    on ``fd`` for each step. Never returns."""
    try:
        faulthandler.disable()  # a fault is the answer here, not a crash to report
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # its group, killed after it, and what it starts
            os.setpgid(0, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: a fault writes no core
        signal.alarm(alarm)
        torch.set_num_threads(1)  # as in a loader worker: no thread pool across the fork
        first, *rest = picks
        os.write(fd, b"c" if right(first) else b"C")
        mprotect = libc.mprotect
        mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for low, high in pages:
            if mprotect(low, high - low, 0) != 0:  # PROT_NONE
                os.write(fd, b"e")
                return
        os.write(fd, b"p")
        for i in rest:
            os.write(fd, b"r" if right(i) else b"w")
    finally:
        os._exit(0)


def protect_and_read(
    ds: Any,
    spans: list[_Span],
    unprotected: list[str],
    ok: Callable[[int, Any], bool],
    *,
    seconds: int = SECONDS,
) -> dict[str, Any]:
    """On a rank, after every other read and the walk: :data:`READS` samples read in a forked
    copy with the whole pages of ``spans`` unreadable (the large buffers that hold the rows'
    tokens); ``ok(i, sample)`` says whether a sample is right; ``seconds``: how long the copy
    may take (a test's shorter). Returns ``{"reads", "right",
    "bytes"}``, or ``{"not": why}`` where the rule could not run."""
    if unprotected:
        return {"not": f"the tokens are in {unprotected[0]}, which cannot be made unreadable"}
    if not sys.platform.startswith("linux"):
        return {"not": "the checker makes memory unreadable in a copy of the rank on Linux only"}
    pages = _whole_pages(spans)
    if not pages:
        return {"not": "no buffer your dataset references holds whole pages of the tokens"}

    def right(i: int) -> bool:
        try:
            return bool(ok(i, ds[i]))
        except Exception:  # noqa: BLE001  (a read that raises is not right)
            return False

    picks = secrets.SystemRandom().sample(range(len(ds)), READS + 1)
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(out)
        _child(ds, pages, picks, right, into, max(1, seconds * 2 // 3))
    os.close(into)
    said, ended, deadline = bytearray(), False, time.monotonic() + seconds
    wait = select.poll()  # not select(): a rank with 4096 shared tensors has fds past 1024
    wait.register(out, select.POLLIN)
    try:
        while (left := deadline - time.monotonic()) > 0:
            if wait.poll(left * 1000):
                chunk = os.read(out, 64)
                if not chunk:  # the copy is gone (and anything it started closed it too)
                    ended = True
                    break
                said += chunk
    finally:
        os.close(out)
        for kill in (os.killpg, os.kill):  # its group, and itself if it had none yet
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _, status = os.waitpid(pid, 0)
    text = said.decode("ascii", "replace")
    alarm = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    if not text.startswith("c"):
        why = "did not end" if not ended or alarm else "read a sample wrong or failed"
        return {"not": f"a copy of the rank {why} before anything was made unreadable"}
    if "e" in text:
        return {"not": "the kernel refused to make the buffers unreadable (mprotect)"}
    done = text.partition("p")[2]
    if (not ended or alarm) and len(done) < READS and "w" not in done:
        return {"not": f"its reads did not end in {seconds} s with the buffers unreadable"}
    return {"reads": READS, "right": done.count("r"), "bytes": sum(h - lo for lo, h in pages)}


def judge_protected(got: dict[str, Any], rank: int) -> str:
    """Wrong when ``rank``'s samples (``got``: :func:`protect_and_read`'s) were all read right
    with its tokens' buffers unreadable; else why it was not judged (``""``: it was)."""
    if "not" in got:
        return str(got["not"])
    if got["right"] >= got["reads"]:
        raise wrong(
            f"On rank {rank} a copy of the rank read {got['reads']} samples of your dataset "
            f"right after the checker made the {got['bytes'] / (1 << 20):.1f} MiB of the "
            "buffers it references that hold the tokens unreadable: the samples are read "
            "from memory kept where the dataset does not reference them (rows found by an "
            "address, in C memory, maps or shared memory of their own), and the array it "
            "holds is not what it reads. Keep the tokens in one array the dataset holds as "
            "an attribute and read every sample from it (a slice per sample)."
        )
    return ""
