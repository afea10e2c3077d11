"""Notebook 19's checker (make a list-of-dicts dataset flat): right answers of every
shape pass, and the dodges a learner may try are caught, on real ranks.

Growth is counted in pages; the bound comes from the data's size, never from a clock.
"""

from __future__ import annotations

import gc
import os
import tempfile

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

import ezpz_nb as ez
from ezpz_nb.workshop.memory_exercises import check_flat
from ezpz_nb.workshop.memory_jobs import DictsDataset


def _row_sample(i, row):
    return {"index": i, "input_ids": torch.as_tensor(row[:-1]), "labels": torch.as_tensor(row[1:])}


class NumpyFlat(Dataset):
    """The expected answer: one 2-D int64 array."""

    def __init__(self, rows):
        self.data = np.array([r["tokens"] for r in rows], dtype=np.int64)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return _row_sample(i, self.data[i])


class TensorFlat(Dataset):
    """Unusual but right: one torch tensor (no numpy)."""

    def __init__(self, rows):
        self.data = torch.tensor([r["tokens"] for r in rows], dtype=torch.int64)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return _row_sample(i, self.data[i])


class BytesFlat(Dataset):
    """Unusual but right: one bytes blob, each row read back with np.frombuffer."""

    def __init__(self, rows):
        self.width = len(rows[0]["tokens"])
        self.blob = np.array([r["tokens"] for r in rows], dtype=np.int64).tobytes()
        self.n = len(rows)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        row = np.frombuffer(self.blob, np.int64, self.width, offset=8 * self.width * i)
        return _row_sample(i, row)


class MemmapFlat(Dataset):
    """Unusual but right: the tokens written to a file, memory-mapped."""

    def __init__(self, rows):
        data = np.array([r["tokens"] for r in rows], dtype=np.int64)
        self.path = tempfile.mkstemp(prefix="ezpz-flat-test-", dir="/tmp")[1]
        data.tofile(self.path)
        self.map = np.memmap(self.path, dtype=np.int64, mode="r", shape=data.shape)
        os.unlink(self.path)  # the map (and forked workers') keeps the pages: nothing left behind

    def __len__(self):
        return len(self.map)

    def __getitem__(self, i):
        return _row_sample(i, np.array(self.map[i]))


def keep_rows(rows):
    """Dodge: the list of dicts, wrapped; yields the same, grows like it."""
    ds = DictsDataset(np.zeros((0, 2), dtype=np.int64))
    ds.rows = rows
    return ds


def frozen_rows(rows):
    """Dodge: gc.freeze() keeps the collector off the rows, not the reference counts."""
    gc.freeze()
    return keep_rows(rows)


class Int32Flat(NumpyFlat):
    """Dodge: flat, but int32: half the memory, other samples."""

    def __init__(self, rows):
        self.data = np.array([r["tokens"] for r in rows], dtype=np.int32)


class RightAtFirst(NumpyFlat):
    """Dodge: right on the first samples only."""

    def __getitem__(self, i):
        return super().__getitem__(i if i < 100 else i - 1)


class Shorter(NumpyFlat):
    """Dodge: drops the last batch's worth of samples."""

    def __len__(self):
        return len(self.data) - 64


class NoLabels(NumpyFlat):
    """Dodge: yields input_ids only."""

    def __getitem__(self, i):
        return {"index": i, "input_ids": torch.as_tensor(self.data[i][:-1])}


class ListsFlattenedAtFirstRead(Dataset):
    """Dodge: keeps the lists, builds an array from them at its first read, wherever that is."""

    def __init__(self, rows):
        self.rows, self.data = [r["tokens"] for r in rows], None

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        if self.data is None:
            self.data = np.array(self.rows, dtype=np.int64)
        return _row_sample(i, self.data[i])


class FlattenedInEachWorker(ListsFlattenedAtFirstRead):
    """Dodge: a private array built in each worker at its first read; lists in the rank."""

    def __getitem__(self, i):
        if get_worker_info() is None:
            return _row_sample(i, np.array(self.rows[i], dtype=np.int64))
        return super().__getitem__(i)


class ListsUntilRankReadAll(ListsFlattenedAtFirstRead):
    """Dodge: serves from the lists until the rank has read every sample, then from an array."""

    reads = 0

    def __getitem__(self, i):
        if self.data is None:
            self.reads += 1
            if self.reads >= len(self.rows):
                self.data = np.array(self.rows, dtype=np.int64)
            return _row_sample(i, np.array(self.rows[i], dtype=np.int64))
        return _row_sample(i, self.data[i])


class WorkersServeOthers(NumpyFlat):
    """Dodge: right in the rank, other tokens in the workers."""

    def __getitem__(self, i):
        if get_worker_info() is None:
            return super().__getitem__(i)
        return _row_sample(i, np.zeros(self.data.shape[1], dtype=np.int64))


def not_started(rows):
    raise NotImplementedError


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(2, timeout=120) as c:
        yield c


SLOW = pytest.mark.system  # each case is a run on ranks (~5 s): the default run keeps two


@pytest.mark.parametrize(
    "answer",
    [
        NumpyFlat,
        pytest.param(TensorFlat, marks=SLOW),
        pytest.param(BytesFlat, marks=SLOW),
        pytest.param(MemmapFlat, marks=SLOW),
    ],
)
def test_right_answers_of_every_shape_pass(answer, cluster):
    """Guards: any storage without a Python object per token passes, not only numpy."""
    got = check_flat(answer, cluster=cluster)
    assert got.status == "correct", got.message


@pytest.mark.parametrize(
    ("dodge", "says"),
    [
        (keep_rows, "grew by"),
        pytest.param(frozen_rows, "grew by", marks=SLOW),
        pytest.param(Int32Flat, "int32", marks=SLOW),
        (RightAtFirst, "sample 100 differs"),
        pytest.param(Shorter, "4032 samples", marks=SLOW),
        pytest.param(NoLabels, "keys", marks=SLOW),
        (FlattenedInEachWorker, "grew by"),
        pytest.param(ListsFlattenedAtFirstRead, "grew by", marks=SLOW),
        pytest.param(ListsUntilRankReadAll, "grew by", marks=SLOW),
        pytest.param(WorkersServeOthers, "workers' batches differ", marks=SLOW),
    ],
)
def test_dodges_are_caught(dodge, says, cluster):
    """Guards: the growth is measured (a wrapper of the rows, gc.freeze), from before a
    worker's first read and on a dataset the rank has not read (an array built at some
    read), every sample is compared (not the first few), in the rank and from the
    workers, and dtype, length and keys must match."""
    got = check_flat(dodge, cluster=cluster)
    assert got.status == "wrong" and says in got.message, got.message


def test_not_started_says_not_done(cluster):
    got = check_flat(not_started, cluster=cluster)
    assert got.status == "not done", got.message
