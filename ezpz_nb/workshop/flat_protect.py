"""Notebook 19: whether a dataset's samples are read from the buffers it references.

A dataset can hold a flat array of the tokens it never reads (a decoy) and read its samples
from storage per row that the walk (:mod:`.flat_held`) does not reach: the twelfth trial kept
rows in anonymous ``mmap``\\ s, in Python's small blocks, in shared memory, in ``malloc``
blocks beside memory allocated before the checker's baseline, each found by an address, so
every rule that counts one allocator's bytes missed one of them. This rule counts no bytes:
in a forked copy of the rank, the whole pages of the large buffers' extent that holds the
rows' tokens (from the first run of them :mod:`.flat_find` found to the end of the last)
are replaced by fresh zero pages (``mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)``), and
:data:`READS` samples are read, chosen among the rows whose runs were found on those pages.
A right answer reads zeros where its tokens were: its samples differ. Every read still right
means the samples come from memory the dataset does not reference, even where the reads
touch the decoy too (which made a copy with the decoy unreadable die as a right answer's
did), and a table of addresses the decoy keeps outside the tokens' extent is left as it is.
Measured on ranks (2 draws each): the twelfth trial's 7 right answers (pyarrow, shared
memory, a column-major view among them) read their rows wrong; its 5 dodges read 8 of 8 right.

Replaced, never written in place: memory the copy shares with the rank (shared memory, a
``MAP_SHARED`` map) keeps the rank's data. A copy that faults, raises or does not end once
the pages are replaced says nothing of where the tokens are: "not judged", with why, as
where they cannot be replaced. The copy reads one sample before anything is replaced (a
dataset that reads wrong in any fork is not judged by this rule), dies by an alarm and is
killed with its process group after :data:`SECONDS`, writes no core, leaves no process.
Linux only (elsewhere: not judged, said in the verdict).
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

#: ``mmap``'s flags for a fresh private zero page in place of the old (``MAP_FIXED`` is
#: 0x10 on Linux's architectures but alpha's and parisc's; Python's mmap does not name it).
_FRESH = 0x10 | mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS

#: Samples read with the tokens' pages replaced: chosen among the rows whose runs are on
#: those pages (a right answer reads each of them wrong), drawn at random where fewer are.
READS = 8
#: How long the forked copy may take (its alarm fires first, at two thirds): 9 reads take
#: milliseconds; a copy that does not end is not judged, never passed on a clock.
SECONDS = 30
_Span = tuple[int, int]
#: A run found: its row, its address and bytes (:func:`.flat_find.located`).
_At = tuple[int, int, int]


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
    (an object's header, a neighbour's block) is left as it is."""
    out = []
    for address, size in spans:
        low, high = -(-address // PAGE) * PAGE, (address + size) // PAGE * PAGE
        if high > low:
            out.append((low, high))
    return out


def _replace(libc: Any, pages: list[_Span]) -> bool:
    """In the copy: each ``(start, end)`` mapped anew to zero pages of its own (never written
    in place: a shared map's pages are the rank's too). False where the kernel refused."""
    fresh = libc.mmap
    fresh.restype = ctypes.c_void_p
    fresh.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    return all(fresh(low, high - low, prot, _FRESH, -1, 0) == low for low, high in pages)


def _child(
    ds: Any, pages: list[_Span], picks: list[int], read: Callable[[int], str], fd: int, alarm: int
) -> None:
    """In the forked copy: one read, the pages replaced, :data:`READS` reads; a byte on
    ``fd`` for each step ("c" the first read right, "p" the pages replaced or "e" refused,
    then "r" right, "w" wrong, "x" raised for each read). Never returns."""
    try:
        faulthandler.disable()  # a fault ends the copy, quietly: the parent says what it means
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # its group, killed after it, and what it starts
            os.setpgid(0, 0)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: a fault writes no core
        signal.alarm(alarm)
        torch.set_num_threads(1)  # as in a loader worker: no thread pool across the fork
        # Seen from the dataset, a loader worker (get_worker_info() set, as the DataLoader
        # sets it): a dataset that reads its decoy only in a bare fork, neither its maker nor
        # a worker, would else single this copy out (the thirteenth trial).
        from torch.utils.data._utils import worker

        worker._worker_info = worker.WorkerInfo(
            id=0, num_workers=1, seed=secrets.randbits(63), dataset=ds
        )
        first, *rest = picks
        os.write(fd, b"c" if read(first) == "r" else b"C")
        if not _replace(libc, pages):
            os.write(fd, b"e")
            return
        os.write(fd, b"p")
        for i in rest:
            os.write(fd, read(i).encode())
    finally:
        os._exit(0)


def _picks(n: int, pages: list[_Span], at: list[_At]) -> list[int]:
    """A first row to read, then :data:`READS` rows: those whose runs lie on the replaced
    ``pages`` first (a right answer reads zeros there), then rows drawn at random."""
    draw = secrets.SystemRandom()
    on = {r for r, a, b in at if 0 <= r < n and any(lo <= a and a + b <= hi for lo, hi in pages)}
    chosen = draw.sample(sorted(on), min(READS, len(on)))
    others = [i for i in draw.sample(range(n), min(n, 2 * READS + 1)) if i not in chosen]
    first, *more = others[: READS + 1 - len(chosen)]
    reads = [*chosen, *more]
    draw.shuffle(reads)
    return [first, *reads]


def protect_and_read(
    ds: Any,
    spans: list[_Span],
    unprotected: list[str],
    ok: Callable[[int, Any], bool],
    *,
    at: list[_At] | None = None,
    seconds: int = SECONDS,
) -> dict[str, Any]:
    """On a rank, after every other read and the walk: :data:`READS` samples read in a forked
    copy with the whole pages of ``spans`` (the extents of the large buffers that hold the
    rows' tokens) replaced by zero pages; ``at``: the runs found there, by row
    (:func:`.flat_find.located`), whose rows are read; ``ok(i, sample)`` says whether a
    sample is right; ``seconds``: how long the copy may take (a test's shorter). Returns
    ``{"reads", "right", "bytes"}``, or ``{"not": why}`` where the rule could not judge."""
    if unprotected:
        return {"not": f"the tokens are in {unprotected[0]}, which cannot be replaced in a copy"}
    if not sys.platform.startswith("linux"):
        return {"not": "the checker replaces memory in a copy of the rank on Linux only"}
    pages = _whole_pages(spans)
    if not pages:
        return {"not": "no buffer your dataset references holds whole pages of the tokens"}

    def read(i: int) -> str:
        try:
            return "r" if ok(i, ds[i]) else "w"
        except Exception:  # noqa: BLE001  (said apart: a read that raises judges nothing)
            return "x"

    picks = _picks(len(ds), pages, at or [])
    out, into = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(out)
        _child(ds, pages, picks, read, into, max(1, seconds * 2 // 3))
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
    return _verdict(said.decode("ascii", "replace"), ended, status, seconds, pages)


def _verdict(
    text: str, ended: bool, status: int, seconds: int, pages: list[_Span]
) -> dict[str, Any]:
    """What the copy said (see :func:`_child`), as :func:`protect_and_read` returns it."""
    alarm = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM
    if not text.startswith("c"):
        why = "did not end" if not ended or alarm else "read a sample wrong or failed"
        return {"not": f"a copy of the rank {why} before any memory was replaced"}
    if "e" in text:
        return {"not": "the kernel refused to replace the tokens' pages (mmap)"}
    done = text.partition("p")[2]
    if "w" in done or done == "r" * READS:  # a read the zero pages changed, or none of them
        return {"reads": READS, "right": done.count("r"), "bytes": sum(h - lo for lo, h in pages)}
    # A fault or an exception here says nothing of where the tokens are: a dodge's read
    # that touches its decoy may fail on zeros as a right answer's may.
    if "x" in done:
        why = "raised an exception in a read"
    elif not ended or alarm:
        why = f"did not end in {seconds} s"
    elif os.WIFSIGNALED(status):
        why = f"died ({_signal_name(os.WTERMSIG(status))})"
    else:
        why = "ended"
    return {
        "not": f"the copy of the rank {why} with the tokens' pages replaced by zeros, before "
        f"its {READS} reads were done (none of them read wrong)"
    }


def _signal_name(sig: int) -> str:
    return signal.Signals(sig).name if sig in set(signal.Signals) else f"signal {sig}"


def judge_protected(got: dict[str, Any], rank: int) -> str:
    """Wrong when ``rank``'s samples (``got``: :func:`protect_and_read`'s) were all read right
    with its tokens' pages replaced by zeros; else why it was not judged (``""``: it was)."""
    if "not" in got:
        return str(got["not"])
    if got["right"] >= got["reads"]:
        raise wrong(
            f"On rank {rank} a copy of the rank read {got['reads']} samples of your dataset "
            f"right after the checker replaced the {got['bytes'] / (1 << 20):.1f} MiB of the "
            "buffers it references that hold the tokens with zeros: the samples are read "
            "from memory kept where the dataset does not reference them (rows found by an "
            "address, in C memory, maps or shared memory of their own), and the array it "
            "holds is not what it reads. Keep the tokens in one array the dataset holds as "
            "an attribute and read every sample from it (a slice per sample)."
        )
    return ""
