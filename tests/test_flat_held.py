"""Notebook 19's checker asks for the tokens in one array: storage per row fails, however it
is read, and every right layout passes (issue 45, the sixth trial's ``bytes`` per row read
through ``ctypes`` and its array per row).

The walk (:func:`~ezpz_nb.workshop.flat_held.holdings`) is tried in this process on small
rows (a few ms each: ``make unit``), then the whole check on real ranks (``make system``;
``EZPZ_NB_DRAWS=20`` in ``make stress``).
"""

from __future__ import annotations

import array
import ctypes
import gc
import mmap
import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import shared_memory

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from ezpz_nb.workshop import flat_held
from ezpz_nb.workshop.flat_find import needles
from ezpz_nb.workshop.flat_held import holdings
from ezpz_nb.workshop.flat_judge import judge_held
from ezpz_nb.workshop.flat_pages import PAGE, written
from ezpz_nb.workshop.flat_protect import READS, memory, protect_and_read
from ezpz_nb.workshop.flat_storage import check_flat
from ezpz_nb.workshop.stops import CheckStopped
from ezpz_nb.workshop.storages import tokens

#: Checks per case (each draws fresh tokens); EZPZ_NB_DRAWS=20 for the issue's 20 draws.
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))
_BYTES_AT = bytes.__basicsize__ - 1  # where a bytes object's payload starts


def _sample(i, row):
    row = torch.as_tensor(np.asarray(row, dtype=np.int64))
    return {"index": i, "input_ids": row[:-1], "labels": row[1:]}


def _freeze():
    """``gc.freeze()`` in a rank, as the dodges do there; not in this test process."""
    if dist.is_initialized():
        gc.freeze()


class _Rows(Dataset):
    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return _sample(i, self.row(i))


class BytesPerRowPeeked(_Rows):
    """Dodge (issue 45's sixth trial): a ``bytes`` per row (over 512 bytes: ``malloc``'d, not
    a small-object block), read through ``ctypes`` at its address: no count written."""

    def __init__(self, rows):
        blobs = [np.array(r["tokens"], dtype=np.int64).tobytes() for r in rows]
        self.at = np.array([id(b) + _BYTES_AT for b in blobs], dtype=np.uint64)
        self.n, self.size, self._keep = len(rows), len(blobs[0]), tuple(blobs)
        _freeze()

    def row(self, i):
        return np.frombuffer(ctypes.string_at(int(self.at[i]), self.size), np.int64).copy()


class ArrayPerRow(_Rows):
    """Honest-wrong by the exercise's words (one array): a numpy array per row."""

    def __init__(self, rows):
        self.rows = [np.array(r["tokens"], dtype=np.int64) for r in rows]
        self.n = len(rows)

    def row(self, i):
        return self.rows[i]


class _Row:
    __slots__ = ("blob",)

    def __init__(self, blob):
        self.blob = blob


class RowObjects(_Rows):
    """Dodge: each row an object of its own, holding a ``bytearray`` in a slot."""

    def __init__(self, rows):
        self.rows = [_Row(bytearray(np.array(r["tokens"], np.int64))) for r in rows]
        self.n = len(rows)

    def row(self, i):
        return np.frombuffer(self.rows[i].blob, np.int64)


class StrKeysPerRow(_Rows):
    """Dodge: each row a ``str`` (latin-1 of its bytes), kept as a dict's key (a dict of
    ``str`` keys shows gc its values alone)."""

    def __init__(self, rows):
        blobs = [np.array(r["tokens"], np.int64).tobytes().decode("latin-1") for r in rows]
        self.rows = {blob: i for i, blob in enumerate(blobs)}
        self.order, self.n = list(self.rows), len(rows)

    def row(self, i):
        return np.frombuffer(self.order[i].encode("latin-1"), np.int64)


class ObjectArrayPerRow(_Rows):
    """Dodge: a ``bytes`` per row in a numpy object array (whose items gc does not see)."""

    def __init__(self, rows):
        self.rows = np.empty(len(rows), dtype=object)
        for i, r in enumerate(rows):
            self.rows[i] = np.array(r["tokens"], np.int64).tobytes()
        self.n = len(rows)

    def row(self, i):
        return np.frombuffer(self.rows[i], np.int64)


def _read_from_closure(held):
    """A dataset whose rows are ``held[i]``, ``held`` a variable of its reader's closure."""

    class Closed(_Rows):
        n = len(held)

        def row(self, i):
            return held[i]

    return Closed()


def closure_per_row(rows):
    """Dodge: an array per row held by a closure the dataset's reader is."""
    return _read_from_closure([np.array(r["tokens"], np.int64) for r in rows])


class _SaysInt:
    """An object whose ``__class__`` says ``int``: ``isinstance(x, int)`` believes it."""

    def __init__(self, held):
        self.held = held

    @property
    def __class__(self):
        return int


class BehindAFalseClass(_Rows):
    """Dodge: a ``bytes`` per row, held by an object that says it is an int."""

    def __init__(self, rows):
        self.box = _SaysInt([np.array(r["tokens"], np.int64).tobytes() for r in rows])
        self.n = len(rows)

    def row(self, i):
        return np.frombuffer(self.box.held[i], np.int64)


class LeakedBytesPeeked(_Rows):
    """Dodge: a ``bytes`` per row kept alive by a reference leaked with ``ctypes`` and read at
    its address: nothing the dataset references holds the tokens (``release`` gives the
    references back, for this test process)."""

    def __init__(self, rows):
        blobs = [np.array(r["tokens"], dtype=np.int64).tobytes() for r in rows]
        for blob in blobs:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(blob))
        self.at = np.array([id(b) for b in blobs], dtype=np.uint64)
        self.n, self.size = len(rows), len(blobs[0])
        del blobs
        _freeze()

    def row(self, i):
        raw = ctypes.string_at(int(self.at[i]) + _BYTES_AT, self.size)
        return np.frombuffer(raw, np.int64).copy()

    def release(self):
        for at in self.at.tolist():
            ctypes.pythonapi.Py_DecRef(ctypes.cast(at, ctypes.py_object))


class LeakedWithADecoy(LeakedBytesPeeked):
    """Dodge: as above, and an array of as many other tokens (same range) beside: the sizes
    are right, the tokens are not in it."""

    def __init__(self, rows):
        super().__init__(rows)
        self.decoy = tokens(len(rows), len(rows[0]["tokens"]), 12345)


class TorchRagged(_Rows):
    """Right: one tensor of every token and a tensor of offsets."""

    def __init__(self, rows):
        self.flat = torch.tensor([t for r in rows for t in r["tokens"]], dtype=torch.int64)
        lens = torch.tensor([len(r["tokens"]) for r in rows])
        self.starts = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
        self.n = len(rows)

    def row(self, i):
        return self.flat[self.starts[i] : self.starts[i + 1]].numpy()


class WithMetadata(_Rows):
    """Right: one array, and a small dict of metadata beside it."""

    def __init__(self, rows):
        self.tokens = np.array([r["tokens"] for r in rows], dtype=np.int64)
        self.meta = {"source": "rows", "dtype": "int64", "shape": self.tokens.shape}
        self.n = len(rows)

    def row(self, i):
        return self.tokens[i]


class ViewsOfOne(_Rows):
    """Right: one array, and a list of its rows as views (an object per row, the tokens in
    the one array's memory)."""

    def __init__(self, rows):
        self.rows = list(np.array([r["tokens"] for r in rows], dtype=np.int64))
        self.n = len(rows)

    def row(self, i):
        return self.rows[i]


class BytesOne(_Rows):
    """Right: one ``bytes`` of every token."""

    def __init__(self, rows):
        self.width, self.n = len(rows[0]["tokens"]), len(rows)
        self.blob = np.array([r["tokens"] for r in rows], dtype=np.int64).tobytes()

    def row(self, i):
        return np.frombuffer(self.blob, np.int64, self.width, 8 * self.width * i)


class MemmapFile(_Rows):
    """Right: a ``np.memmap`` of a temporary file (unlinked: the map keeps it)."""

    def __init__(self, rows):
        data = np.array([r["tokens"] for r in rows], dtype=np.int64)
        fd, path = tempfile.mkstemp(prefix="ezpz-held-test-")
        os.close(fd)
        data.tofile(path)
        self.map = np.memmap(path, dtype=np.int64, mode="r", shape=data.shape)
        os.unlink(path)
        self.n = len(rows)

    def row(self, i):
        return np.array(self.map[i])


class FileRead(_Rows):
    """Right: the tokens in a file kept by path, each row read from it (no memory held)."""

    def __init__(self, rows):
        self.width, self.n = len(rows[0]["tokens"]), len(rows)
        fd, self.path = tempfile.mkstemp(prefix="ezpz-held-test-")
        os.close(fd)
        np.array([r["tokens"] for r in rows], dtype=np.int64).tofile(self.path)

    def row(self, i):
        return np.fromfile(self.path, np.int64, self.width, offset=8 * self.width * i)

    def release(self):
        os.unlink(self.path)


class ClassHeld(_Rows):
    """Right: one array kept as a class attribute (reached through the dataset's class)."""

    def __init__(self, rows):
        type(self).tokens = np.array([r["tokens"] for r in rows], dtype=np.int64)
        self.n = len(rows)

    def row(self, i):
        return self.tokens[i]


def closure_one(rows):
    """Right: one array held by a closure, not an attribute."""
    return _read_from_closure(np.array([r["tokens"] for r in rows], dtype=np.int64))


class ArrayQ(_Rows):
    """Right: one ``array.array('q')`` of every token."""

    def __init__(self, rows):
        self.width, self.n = len(rows[0]["tokens"]), len(rows)
        self.blob = array.array("q", (t for r in rows for t in r["tokens"]))

    def row(self, i):
        return np.frombuffer(self.blob, np.int64, self.width, 8 * self.width * i)


WRONG = [
    (BytesPerRowPeeked, "bytes objects, one per row (in _keep, a tuple)"),
    (ArrayPerRow, "ndarray objects, one per row (in rows, a list)"),
    (RowObjects, "bytearray objects, one per row"),
    (StrKeysPerRow, "str objects, one per row"),
    (ObjectArrayPerRow, "bytes objects, one per row"),
    (closure_per_row, "ndarray objects, one per row"),
    (BehindAFalseClass, "bytes objects, one per row"),
    (LeakedBytesPeeked, "found no array holding the tokens"),
    (LeakedWithADecoy, "0 of 16 runs of tokens drawn from the rows found"),
]
RIGHT = [
    TorchRagged,
    WithMetadata,
    ViewsOfOne,
    BytesOne,
    MemmapFile,
    FileRead,
    ClassHeld,
    closure_one,
    ArrayQ,
]


def _right(data):
    """Whether a sample of the dataset holds row ``i`` of ``data`` (for :mod:`.flat_protect`)."""
    return lambda i, got: np.array_equal(np.asarray(got["input_ids"]), data[i][:-1])


def _judged(make, n=512, length=64):
    """``make``'s dataset, built from fresh rows here, walked and judged: the message or ''."""
    data = tokens(n, length, int.from_bytes(os.urandom(4), "little"))
    rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]
    runs = needles(rows)
    ds = make(rows)
    del rows
    try:
        assert all(np.array_equal(ds.row(i), data[i]) for i in (0, n // 2, n - 1))
        held = holdings(ds, n * length, runs)
        spans, at = held.pop("spans"), held.pop("at")
        read = protect_and_read(ds, spans, held.pop("unprotected"), _right(data), at=at)
        judge_held([{"held": held, "protect": read, "heap": 0}], n, n * length)
    except CheckStopped as stop:
        return stop.message
    finally:
        getattr(ds, "release", lambda: None)()
    return ""


@pytest.mark.parametrize(("make", "says"), WRONG, ids=[m.__name__ for m, _ in WRONG])
def test_storage_per_row_is_found(make, says):
    """Guards: an object per row holding its tokens (a ``bytes``, an array, a ``str``, a
    ``bytearray`` in objects of its own; in a tuple, a dict's keys, an object array, a
    closure) is found, and tokens kept where the dataset does not reference them too."""
    for _ in range(DRAWS):
        said = _judged(make)
        assert says in said and "keep the tokens in one array" in said.lower(), said


@pytest.mark.parametrize("make", RIGHT, ids=lambda x: x.__name__)
def test_one_array_in_any_shape_is_right(make):
    """Guards the right layouts: a tensor and offsets, an array with metadata beside it,
    views of one array, one ``bytes``, a memory map, a file read at each sample."""
    for _ in range(DRAWS):
        assert _judged(make) == ""


def test_arrow_storage_is_one_array():
    """Guards: an Arrow list array (one values buffer and offsets, as ``datasets`` holds
    rows) is one array, though gc sees nothing inside it."""
    pa = pytest.importorskip("pyarrow")

    class Arrow(_Rows):
        def __init__(self, rows):
            self.rows, self.n = pa.array([r["tokens"] for r in rows]), len(rows)

        def row(self, i):
            return self.rows[i].values.to_numpy()

    assert _judged(Arrow) == ""


def _pages_of(values: np.ndarray, inner: bool = False) -> set[int]:
    """The pages ``values`` is on; ``inner``: only those it fills (a page at either end
    may hold a neighbour, which the child may write)."""
    start = values.__array_interface__["data"][0]
    end = start + values.nbytes
    if inner:
        return set(range(-(-start // PAGE), end // PAGE))
    return set(range(start // PAGE, (end - 1) // PAGE + 1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/pagemap is Linux's")
def test_the_pages_a_forked_child_wrote_are_told_from_those_it_shares():
    """Guards issue 45's seventh brief: a worker is judged on the pages it wrote, not on its
    private memory in all. A forked child writes one of two arrays (a value on each page):
    :func:`written`, read from this process, holds that array's pages and none of the other's,
    which the child only read; the rank's walk finds both arrays' pages."""
    wrote, read = np.ones(64 * PAGE // 8), np.ones(64 * PAGE // 8)
    ready, go = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: writes one array, reads the other, waits to be read
        try:
            wrote[:: PAGE // 8] += 1.0
            os.write(ready[1], str(float(read.sum())).encode())
            os.read(go[0], 1)
        finally:
            os._exit(0)
    try:
        assert float(os.read(ready[0], 64)) == read.size
        got = written(pid)
    finally:
        os.write(go[1], b"1")
        os.waitpid(pid, 0)
        for fd in (*ready, *go):
            os.close(fd)
    if got is None:
        pytest.skip("this kernel does not say which pages a process holds alone")
    pages = set(got)
    assert _pages_of(wrote, inner=True) <= pages, "the pages the child wrote are its own"
    assert not _pages_of(read, inner=True) & pages, "pages the child only read are shared"

    class TwoArrays(_Rows):
        def row(self, i):
            return self.wrote[i]

    ds = TwoArrays.__new__(TwoArrays)
    ds.wrote, ds.read = wrote, read
    walked = set(holdings(ds, wrote.size)["pages"])
    assert _pages_of(wrote) | _pages_of(read) <= walked


def test_the_walk_finds_the_pages_of_each_token_kept_as_a_python_int():
    """Guards: the rows kept as lists of Python ints: the page of each int (where reading
    it writes its count) is among the dataset's pages."""

    class Lists(_Rows):
        def __init__(self, rows):
            self.rows, self.n = [list(r["tokens"]) for r in rows], len(rows)

        def row(self, i):
            return self.rows[i]

    rows = [{"tokens": [1000 + 3 * j + i for j in range(64)]} for i in range(32)]
    ds = Lists(rows)
    walked = set(holdings(ds, 32 * 64)["pages"])
    assert {id(x) // PAGE for row in ds.rows for x in row} <= walked


@pytest.mark.system  # each case is a check on 2 fresh ranks (~5 s)
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (BytesPerRowPeeked, "4,096 bytes objects, one per row"),
        (ArrayPerRow, "4,096 ndarray objects, one per row"),
        (LeakedWithADecoy, "0 of 16 runs of tokens drawn from the rows found"),
    ],
    ids=["bytes_per_row_peeked", "array_per_row", "leaked_with_a_decoy"],
)
@pytest.mark.parametrize("draw", range(DRAWS))
def test_the_checker_rejects_storage_per_row(draw, make, says):
    """Guards issue 45's sixth trial on real ranks: the first two passed every rule before
    (no worker grew, no small-object blocks, no row alive); the third is the next step of
    the first (its rows out of the walk's reach, a decoy of the right size in it)."""
    got = check_flat(make)
    assert got.status == "wrong" and says in got.message, got.message


@pytest.mark.system
@pytest.mark.parametrize("make", [TorchRagged, WithMetadata], ids=lambda x: x.__name__)
@pytest.mark.parametrize("draw", range(DRAWS))
def test_the_checker_takes_one_array_with_offsets_or_metadata(draw, make):
    got = check_flat(make)
    assert got.status == "correct", got.message


def test_where_the_heap_cannot_be_read_that_rule_says_not_judged():
    """Guards issue 45 (trial 11's heap rule): on a libc without ``mallinfo2`` the rule that
    finds tokens kept where the dataset references nothing cannot run; the verdict says so,
    naming the ranks, instead of passing in silence; where it ran, nothing is added."""
    n, length = 64, 16
    data = tokens(n, length, 5)
    ds = ViewsOfOne([{"index": i, "tokens": row} for i, row in enumerate(data.tolist())])
    held = holdings(ds, n * length)
    read = {"reads": 8, "right": 0, "bytes": 1 << 20}  # the reads needed the buffers
    outs = [{"held": held, "heap": h, "protect": read} for h in (None, 0)]
    said = judge_held(outs, n, n * length)
    assert said.startswith("Not judged here") and "rank(s) 0 cannot" in said, said
    assert judge_held(outs[1:], n, n * length) == ""


class _OneArray(_Rows):
    def __init__(self, rows):
        self.data = np.array([r["tokens"] for r in rows], dtype=np.int64)
        self.n = len(rows)

    def row(self, i):
        return self.data[i]


class HangsInACopy(_OneArray):
    """Right, but its reads in another process than its maker (after a first one) start a
    process and never end: as a read waiting on a lock a thread held at the fork."""

    def __init__(self, rows, where):
        super().__init__(rows)
        self.maker, self.where, self.reads = os.getpid(), where, 0

    def row(self, i):
        self.reads += 1
        if os.getpid() != self.maker and self.reads > 1:
            started = subprocess.Popen(["sleep", "60"])
            self.where.write_text(str(started.pid))
            time.sleep(600)
        return super().row(i)


def _gone(pid: int) -> bool:
    """Whether ``pid`` is no live process (gone, or a zombie no one reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap in a fork: Linux's")
def test_a_copy_whose_reads_do_not_end_is_not_judged_and_leaves_no_process(tmp_path):
    """Guards the protect-and-read rule's copy of the rank: a read that never ends is stopped
    (its alarm, then its process group killed), the rule says why it did not judge instead
    of passing, and nothing the copy started is left running."""
    data = tokens(64, 64, 7)
    where = tmp_path / "pid"
    ds = HangsInACopy([{"index": i, "tokens": row} for i, row in enumerate(data.tolist())], where)
    got = protect_and_read(ds, memory(ds.data), [], _right(data), seconds=3)
    assert got["not"].startswith("the copy of the rank did not end in 3 s with the tokens'"), got
    # SIGKILL is sent to the copy's group before protect_and_read returns; a process ends
    # when next scheduled, which a loaded machine may delay (CI's make unit: once, found alive).
    pid, give_up = int(where.read_text()), time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert _gone(pid), "the process the copy started is left running"
    said = judge_held([{"held": holdings(ds, data.size), "protect": got, "heap": 0}], 64, data.size)
    assert "Not judged here: whether your samples are read from the arrays" in said, said


def test_where_memory_cannot_be_replaced_that_rule_says_not_judged(monkeypatch):
    """Guards: off Linux the rule does not run, and the verdict says so (never a pass on
    nothing); the tokens in a file read by path cannot be replaced in a copy either."""
    data = tokens(64, 64, 8)
    ds = _OneArray([{"index": i, "tokens": row} for i, row in enumerate(data.tolist())])
    monkeypatch.setattr(sys, "platform", "darwin")
    got = protect_and_read(ds, memory(ds.data), [], _right(data))
    said = judge_held([{"held": holdings(ds, data.size), "protect": got, "heap": 0}], 64, data.size)
    assert "(rank 0: the checker replaces memory in a copy of the rank on Linux only)" in said
    monkeypatch.undo()
    rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]
    ds = FileRead(rows)
    try:
        held = holdings(ds, data.size, needles(rows))
    finally:
        ds.release()
    assert held["unprotected"] == ["a str (a path)"] and held["spans"] == [], held["unprotected"]


def test_a_walk_cut_short_is_not_judged_without_reads_that_need_what_it_reached(monkeypatch):
    """Guards the twelfth trial's walk limit: where the walk stops before reaching every
    object, the rules that need every buffer do not pass in silence; the verdict says "not
    judged", unless samples read with the reached buffers' tokens replaced failed (they are read
    from what the walk reached). ``str`` are counted, not entered: 310,000 of them no longer
    cut the walk (the test above); here 200 empty lists do, with the limit at 50."""
    monkeypatch.setattr(flat_held, "WALK_MOST", 50)
    data = tokens(64, 64, 9)
    rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]
    ds = _OneArray(rows)
    ds.lists = [[] for _ in range(200)]
    held = holdings(ds, data.size, needles(rows))
    assert not held["complete"], "the walk was not cut short: the test tests nothing"
    spans, at = held.pop("spans"), held.pop("at")
    read = protect_and_read(ds, spans, held.pop("unprotected"), _right(data), at=at)
    assert read["right"] < read["reads"], read  # the reads of rows on the zero pages
    assert judge_held([{"held": held, "protect": read, "heap": 0}], 64, data.size) == ""
    unread = {"not": "the checker replaces memory in a copy of the rank on Linux only"}
    said = judge_held([{"held": held, "protect": unread, "heap": 0}], 64, data.size)
    assert "Not judged here: where your dataset keeps the tokens (rank(s) 0: the walk" in said, said


class _Shared(_OneArray):
    """Right: the one array in memory shared with other processes (``kind``: an anonymous
    ``mmap``, which Python maps ``MAP_SHARED``; a tensor's shared memory; a
    ``multiprocessing.shared_memory`` block)."""

    def __init__(self, rows, kind):
        flat = np.array([r["tokens"] for r in rows], dtype=np.int64)
        self.n, self.kind = len(rows), kind
        if kind == "tensor":
            self.keep = torch.from_numpy(flat).share_memory_()
            self.data = self.keep.numpy()
            return
        self.keep = mmap.mmap(-1, flat.nbytes) if kind == "mmap" else None
        if kind == "shared_memory":
            self.keep = shared_memory.SharedMemory(create=True, size=flat.nbytes)
        self.data = np.frombuffer(self.keep if kind == "mmap" else self.keep.buf, np.int64)
        self.data = self.data.reshape(flat.shape)
        self.data[:] = flat

    def release(self):
        if self.kind == "shared_memory":
            del self.data  # a live view keeps the block from closing
            self.keep.close()
            self.keep.unlink()


def _protected(ds, data, rows):
    """``ds`` walked (runs drawn from ``rows``) and read in a forked copy: the read's result."""
    held = holdings(ds, data.size, needles(rows))
    spans, at = held.pop("spans"), held.pop("at")
    return protect_and_read(ds, spans, held.pop("unprotected"), _right(data), at=at)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap in a fork: Linux's")
@pytest.mark.parametrize("kind", ["mmap", "tensor", "shared_memory"])
def test_shared_memory_is_replaced_in_the_copy_never_written(kind):
    """Guards the protect-and-read rule's copy of the rank: it maps zero pages of its own over
    the tokens, so a right answer kept in memory shared with the rank (``MAP_SHARED``, shared
    memory) reads its rows wrong there, and the rank's data is whole after (zeroing the pages
    in place would have zeroed the rank's too)."""
    data = tokens(512, 64, int.from_bytes(os.urandom(4), "little"))
    rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]
    ds = _Shared(rows, kind)
    try:
        read = _protected(ds, data, rows)
        assert read.get("right") == 0, read  # each read was of a row on the zero pages
        assert np.array_equal(ds.data, data), "the check wrote the rank's shared memory"
        assert all(np.array_equal(ds[i]["input_ids"], data[i][:-1]) for i in range(512))
    finally:
        ds.release()


class ChecksItsTokens(_OneArray):
    """Right, but a read meeting zeros where its tokens were (none is below 1000) raises, or
    with ``fault`` reads memory on page 0 (the copy dies on SIGSEGV)."""

    def __init__(self, rows, fault):
        super().__init__(rows)
        self.fault = fault

    def row(self, i):
        got = super().row(i)
        if (got == 0).sum() >= 4:  # a run of tokens found by the walk replaced
            if self.fault:
                ctypes.c_int64.from_address(64).value  # noqa: B018  (page 0: unmapped)
            raise ValueError("a row of the tokens holds zeros")
        return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap in a fork: Linux's")
@pytest.mark.parametrize("fault", [False, True], ids=["raises", "faults"])
def test_a_copy_that_fails_once_the_tokens_are_replaced_is_not_judged(fault):
    """Guards: a read that raises or faults with the tokens replaced by zeros is no evidence
    that the samples come from the buffers reached (a dodge's reads can fail there too, by
    touching its decoy): the rule says it did not judge, never a pass."""
    data = tokens(512, 64, int.from_bytes(os.urandom(4), "little"))
    rows = [{"index": i, "tokens": row} for i, row in enumerate(data.tolist())]
    ds = ChecksItsTokens(rows, fault)
    read = _protected(ds, data, rows)
    how = "died (SIGSEGV)" if fault else "raised an exception in a read"
    assert read == {
        "not": f"the copy of the rank {how} with the tokens' pages replaced by zeros, before "
        f"its {READS} reads were done (none of them read wrong)"
    }, read
    said = judge_held(
        [{"held": holdings(ds, data.size), "protect": read, "heap": 0}], 512, data.size
    )
    assert (
        "Not judged here: whether your samples are read from the arrays your dataset holds "
        f"(rank 0: the copy of the rank {how}" in said
    ), said


class DecoyInABareFork(_OneArray):
    """Dodge (the thirteenth trial's d19_mmap_rows_fork_aware): rows kept apart (a list the
    dataset does not walk to: a closure), a flat decoy read only in a process that is neither
    its maker nor a loader worker: the checker's copy, if it looked like neither."""

    def __init__(self, rows):
        super().__init__(rows)
        hidden = [np.array(r["tokens"], dtype=np.int64) for r in rows]
        self.maker, self.hidden = os.getpid(), lambda i: hidden[i]

    def row(self, i):
        from torch.utils.data import get_worker_info

        if os.getpid() != self.maker and get_worker_info() is None:
            return self.data[i]
        return self.hidden(i)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap in a fork: Linux's")
def test_the_copy_looks_like_a_loader_worker_to_the_dataset():
    """Guards the replace-and-read copy being told apart from a worker: it is one, seen from
    the dataset (get_worker_info() set), so reads that differ only in a bare fork read as in
    a worker: all right with the decoy zeroed, the rows live elsewhere."""
    data = tokens(256, 64, 9)
    ds = DecoyInABareFork([{"index": i, "tokens": row} for i, row in enumerate(data.tolist())])
    got = protect_and_read(ds, memory(ds.data), [], _right(data))
    assert got.get("reads") and got["right"] == got["reads"], got
