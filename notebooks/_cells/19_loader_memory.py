# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 19 · Why the loader eats the machine: worker, shared and pinned memory
#
# **Time:** about 40 to 50 minutes with the predictions and the exercise (advanced track).
# Running the cells alone takes under a minute.
#
# Two of the problems users report most about data loading are about memory. A dataset held as
# Python objects in a forked DataLoader worker is copied page by page as the worker reads it, so
# every worker's memory grows toward the whole dataset (pytorch #13246); with 8 ranks x 8
# workers the machine runs out. And batches travel from the workers through `/dev/shm`, which
# Docker sizes at 64 MiB: a worker fails with "No space left on device" or a "Bus error", or
# the loader waits forever (pytorch #5040, #16979). Both are measured here, per rank and per
# worker, on 2 real ranks.
#
# **Learning goals**
#
# - Tell RSS, PSS and private memory apart, and say which one a worker really costs.
# - Predict, then measure, each worker's growth for a list of dicts, a numpy array, an Arrow
#   table and a memory map, with `fork` and with `forkserver`.
# - Predict the peak of `/dev/shm` for a loader, watch a small one fail, and measure the fixes.
# - Make a list-of-dicts dataset flat, without changing what it yields.

# %%
# %matplotlib inline
import tempfile

import numpy as np
import torch
import torch.distributed as dist  # noqa: F401  (the README's examples use it)
from torch.utils.data import Dataset

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.ledger import Ledger
from ezpz_nb.ledger.memory import MIB, read_memory
from ezpz_nb.shm import plan_shm, predict_peak, shm_size
from ezpz_nb.workshop.shm_fill import ShmConfig, namespace_refusal, small_shm
from ezpz_nb.workshop.storages import STORAGES, measure_workers
from ezpz_nb.wrapping import wrap_message

N, LENGTH = 4096, 256  # samples x tokens: 8 MiB of int64 tokens
cluster = ez.Cluster(2, timeout=120)  # 2 warm ranks, reused by every measurement below
work = tempfile.TemporaryDirectory(prefix="ezpz-19-")  # each rank's files, removed at the end

# %% [markdown]
# ## 1. Which number is a worker's cost?
#
# A forked worker maps every page of its parent, so its RSS counts the whole dataset from the
# first moment, shared or not. PSS splits each shared page between the processes mapping it
# (the PSS of all processes adds up to what they hold together). A worker's own cost is its
# **private** memory, the dirty kind: pages it wrote, which stay in RAM until it exits. Clean
# private pages (a file read by one process only) count in `USS` too, but the kernel drops them
# whenever it needs the room. `read_memory` reads them from `/proc/<pid>/smaps_rollup`; the
# cheaper `statm` cannot tell a page shared since the fork from one copied since.

# %%
mine = read_memory()
for name in ("rss", "pss", "uss", "private", "shared"):
    print(f"this kernel's {name:>7}: {getattr(mine, name) / MIB:7.1f} MiB")

# %% [markdown]
# ## 2. The same samples held four ways, with fork
#
# Every storage yields the same samples, `{"index", "input_ids", "labels"}`, from the same
# tokens: a list of dicts of Python ints (what `json.load` gives), one numpy array, an Arrow
# table saved by HF `datasets` and memory-mapped back, and a raw memory-mapped file. Each rank
# iterates one epoch with 2 forked workers; `record(loader, memory=1.0)` reads the rank's and
# every worker's memory at every step, however long the readings take on a loaded machine
# (`memory=True` reads less often, within 1% of the wall time). A worker's growth counts from
# the first step, when it has made at most its first few (`prefetch_factor`) of its 32
# batches, to the last.
#
# **Predict first.** Which workers' private memory grows through the epoch, and by about how
# much? (Each worker reads half the samples; a Python int takes 32 bytes plus an 8-byte
# pointer, an int64 in an array 8 bytes.)

# %%
runs = {}
for storage in STORAGES:
    got = cluster.run(measure_workers, storage, n=N, length=LENGTH, folder=work.name)
    runs[storage] = Ledger.from_results([m.ledger for m in got])
    held = got[0].held / MIB
    print(f"{storage:>7}: held by the rank {held:6.1f} MiB, data {got[0].data / MIB:.0f} MiB")
viz.memory_growth(runs)

# %% [markdown]
# The list-of-dicts workers climb step after step; the others stay flat. (The grey dashed line
# is the rank itself: it looks alike in every storage, so it is not where storages differ.)
# Slicing a Python list (`row[:-1]`) writes a new reference into each int it copies: the
# reference count lives in the int itself, so the page holding it is written, and the kernel
# copies that page for the worker. Reading numpy, Arrow or a memory map writes nothing. The
# same table per rank and worker:

# %%
print(runs["dicts"].memory_report())
grew = {
    s: max(g.growth for g in led.memory_report().growth if g.worker >= 0) for s, led in runs.items()
}
# The flat storages' workers still grow a little (their own allocations: 0.5-1.5 MiB here, over
# 2 MiB once on a busy machine), the dicts' by about twice the data (15-18 MiB): ten times more.
flat = max(grew["numpy"], grew["memmap"])
assert grew["dicts"] > 0.5 * N * LENGTH * 8 and grew["dicts"] > 4 * flat

# %% [markdown]
# ## 3. With forkserver (or spawn): private from the start
#
# **Predict:** with `multiprocessing_context="forkserver"` the dataset is pickled into each
# worker. What does a worker hold at its first step, and does it grow?

# %%
got = cluster.run(
    measure_workers,
    "dicts",
    n=N,
    length=LENGTH,
    folder=work.name,
    worker_start="forkserver",
    workers=1,
)
for g in got[0].ledger.memory_report().growth[1:]:  # the workers (the rank's line first)
    print(
        f"forkserver, {g.name:<16}: starts at {g.start / MIB:6.1f} MiB, grows {g.growth / MIB:+.1f}"
    )

# %% [markdown]
# Every forkserver worker pays for its own `import torch` (about 150 MiB here) and for its
# pickled copy of the dataset; the list of dicts arrives whole and private (compare the fork
# workers' start above). A memory map should travel as a path: `MemmapDataset` drops its map
# when pickled and reopens it in the worker (pickling an `np.memmap` itself copies its data),
# so its forkserver workers start at the bare `import torch` (the benchmark's table:
# `benchmarks/memory.py`). With fork the worker starts small and
# Python objects make it grow; with forkserver it starts big and stays. `gc.freeze()` before
# the workers start keeps the garbage collector off the rank's objects, but reading an object
# still writes its reference count: it does not stop this growth (the exercise's checker
# measures it).
#
# ## 4. Persistent workers, prefetch, pinned memory
#
# - `persistent_workers=True` keeps the workers between epochs: what a forked worker copied
#   stays copied (a new worker each epoch starts small again and grows again).
# - `prefetch_factor` batches per worker wait in shared memory (next section).
# - `pin_memory=True` adds a thread to each rank that copies every batch into page-locked
#   memory: about `workers x prefetch_factor + 1` batches of it per rank, which the kernel
#   can never swap. On a machine without a GPU there is nothing to pin for, and the
#   DataLoader warns and skips it.

# %%
got = cluster.run(
    measure_workers,
    "dicts",
    n=N // 2,
    length=LENGTH,
    folder=work.name,
    persistent_workers=True,
    epochs=2,
)
for epoch in (0, 1):
    for worker in (0, 1):
        seen = [s for s in got[0].ledger.memory if s.epoch == epoch and s.worker == worker]
        print(
            f"epoch {epoch}, worker {worker} (pid {seen[0].pid}): "
            f"{seen[0].memory.private / MIB:5.1f} -> {seen[-1].memory.private / MIB:5.1f} MiB"
        )

# %% [markdown]
# The same pids in both epochs: the second epoch starts where the first ended, and reading
# the same samples again copies nothing more.
#
# ## 5. Shared memory: predict the peak, then fill a small `/dev/shm`
#
# A worker builds each batch straight into shared memory and hands the rank a file descriptor.
# At any moment a rank holds `prefetch_factor` batches per worker made ahead, plus the one its
# loop holds: peak = ranks x (workers x prefetch_factor + 1) x bytes per batch.
#
# **Predict:** 2 ranks, 2 workers, prefetch 2, batches of 8 MiB. Does it fit in Docker's
# 64 MiB? With `prefetch_factor=1`? With one worker? With the `file_system` sharing strategy?

# %%
for name, workers, prefetch in (("default", 2, 2), ("prefetch 1", 2, 1), ("1 worker", 1, 2)):
    peak = predict_peak(8 * MIB, workers=workers, prefetch_factor=prefetch, ranks=2)
    fits = "fits" if peak <= 64 * MIB else "does NOT fit"
    print(f"{name:>10}: peak {peak / MIB:.0f} MiB, {fits} in 64 MiB")
print(f"this machine's /dev/shm: {(shm_size() or 0) / MIB:.0f} MiB")
print(wrap_message(str(plan_shm(8 * MIB, workers=2, prefetch_factor=2, ranks=2))))

# %% [markdown]
# Now measured. Where this kernel may make a private mount namespace (root, here), the runs
# below get their own 64 MiB `/dev/shm`: a fresh tmpfs seen by their process tree only (2 warm
# ranks started inside it), nothing mounted outside it. A thread polls its use during each
# run: the peak is measured, not computed. For the last run it grows to 256 MiB, what
# `docker run --shm-size=256m` gives (or, in Kubernetes, an `emptyDir` with `medium: Memory`
# mounted at `/dev/shm`).

# %%
why = namespace_refusal()
if why is None:
    results = small_shm(
        [
            ShmConfig("default"),  # 2 ranks x 2 workers x prefetch 2 of 8 MiB, in 64 MiB
            ShmConfig("prefetch 1", prefetch_factor=1),
            ShmConfig("1 worker", workers=1),
            ShmConfig("file_system", sharing="file_system"),
            ShmConfig("--shm-size=256m", shm_mib=256),
        ]
    )
    for r in results:
        print(
            f"{r.config.name:>15} in {r.size / MIB:3.0f} MiB: predicted {r.predicted / MIB:4.0f}"
            f" MiB, peak {r.peak / MIB:5.1f} MiB, steps {r.steps}"
        )
        for e in sorted({e for e in r.errors if e}):
            print(wrap_message(f"    {e}"))
else:
    print(wrap_message(f"No private /dev/shm here ({why}): the predictions above stand alone."))

# %% [markdown]
# The default loader fails in its workers: torch 2.13 reserves each batch's shared memory up
# front and reports `No space left on device`; where memory is only touched later (older torch,
# other libraries) the same shortage is a `Bus error` that kills the worker. Fewer prefetched
# batches or fewer workers fit, at the peak predicted. `file_system` changes how the memory is
# named (files by name instead of descriptors: the fix for "too many open files"), not how much
# there is: it fails too. A larger `/dev/shm` fits. `ezpz-nb doctor` prints `/dev/shm`'s size
# and this prediction for a loader (`ezpz_nb.shm.plan_shm(..., warn=True)` warns before a run).
#
# On macOS there is no `/dev/shm`: torch shares unnamed memory by file descriptor, the limit is
# the system's memory (and open files), and the namespace above is Linux's.
#
# ## Exercise: make it flat
#
# Write `make_flat(rows)`: given the rows of a list-of-dicts dataset (`{"index": i, "tokens":
# [int, ...]}`), return a dataset that yields exactly what `DictsDataset` yields (every sample,
# same keys, int64, same order), holds the tokens in one array (a sample a slice of it; rows of
# other lengths: one array and offsets), and whose forked workers each write less than a
# quarter of the data's size on the pages that hold it over an epoch (and grow by less than the
# data's size in all: a library's allocator may take some room as it reads). The checker builds
# fresh tokens on 2 real ranks of its own (not the warm ones above: nothing an earlier cell left
# there reaches the measurement) and hands the rows to your dataset alone; before anything reads
# it, it runs an epoch with loader settings of its own and, at the epoch's end, reads each
# worker's private memory, and which pages it wrote, from the notebook's process (where your
# code never runs), against a worker that read one flat array of the checker's (building an
# array at some read is counted). Then it compares every sample:
# the batches the workers yielded, and each one read in the rank. It also looks at what your
# dataset holds once built and the rows let go of: keeping the rows (even for the index alone),
# or their ints in lists of your own, fails even when reading them writes nothing, since each
# token is still an object every worker's garbage collector walks; so does an array or a `bytes`
# per row, however it is read: not one array. The tokens are drawn in the rank and exist there
# only as the rows you are given: build from them.

# %% tags=["workshop"]
import ezpz_nb.workshop.exercises as ex


class FlatTokens(Dataset):
    def __init__(self, rows):
        raise NotImplementedError  # your code: hold the tokens in one array

    def __len__(self):
        raise NotImplementedError

    def __getitem__(self, i):
        raise NotImplementedError


# %% tags=["workshop"]
ex.check_flat(FlatTokens, cluster=cluster)

# %% tags=["solutions"]
import ezpz_nb.workshop.exercises as ex


class FlatTokens(Dataset):
    def __init__(self, rows):
        self.tokens = np.array([r["tokens"] for r in rows], dtype=np.int64)  # one object

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        row = self.tokens[i]  # a view: reading it writes nothing
        return {
            "index": i,
            "input_ids": torch.as_tensor(row[:-1]),
            "labels": torch.as_tensor(row[1:]),
        }


# %% tags=["solutions"]
assert ex.check_flat(FlatTokens, cluster=cluster).passed

# %% [markdown]
# ## Summary
#
# - Judge a worker by its private (dirty) memory, not RSS. With fork, a dataset of Python
#   objects is copied into every worker as it is read: a list of dicts grew by more than the
#   data's own size per worker here, numpy and memory maps by about nothing.
# - With forkserver or spawn every worker starts with its own copy (and its own torch):
#   pass paths, reopen files in the worker.
# - `/dev/shm` must hold ranks x (workers x prefetch_factor + 1) batches. When it cannot,
#   lower `prefetch_factor` or `num_workers`, or give the container more shared memory;
#   the sharing strategy does not change the bytes.
#
# On the learner's next machine: under torchrun every rank on a node shares that node's
# `/dev/shm`, so multiply by the ranks per node, not the world size; with GPUs, pinned memory
# adds a similar count of page-locked batches per rank. `docs/memory.md` has the measurements.

# %%
cluster.close()
work.cleanup()
