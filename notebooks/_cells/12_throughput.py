# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12 · Is data loading the bottleneck?
#
# Most people open a data loader's code because training is slow, not because it is wrong. This
# notebook measures, per rank and per step, where the time goes: waiting for the next batch,
# the step's own work, and waiting in the collective for the slowest rank. The ledger records
# it (`record(...)`, as in every notebook), the loop marks its collective with
# `with rec.collective():`, and `ledger.diagnose()` says in words who waited for whom.
#
# **Learning goals**
#
# - Read each rank's data-wait share, and what `num_workers`, `prefetch_factor` and
#   `persistent_workers` change.
# - Find a straggler on a timeline, and fix it by giving its loader more hands or by
#   rebalancing the work.
# - Count processes and threads against cores; decide whether a TP leader should load and
#   broadcast, or every TP rank load.
#
# **Time:** 35 to 40 minutes with the predictions and the exercise (advanced track). Running
# the cells alone takes about 15 s on an idle 2-core machine.
#
# The numbers are this machine's and this run's; the relations are the lesson. Timings move
# with the machine's load: rerun a cell and the figures change, the relations do not.

# %%
# %matplotlib inline
import inspect
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset, TPBroadcastDataLoader
from ezpz_nb.examples import throughput
from ezpz_nb.examples.throughput import make_loader, train
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.models import TokenizingDataset

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"{CORES} core(s) for this notebook")

# %% [markdown]
# ## Samples that cost real work
#
# Each sample is a document generated from its index and **tokenized** in `__getitem__`: pure
# Python, as a tokenizer's pre-processing is. No sleep: the time is CPU time, so it competes for
# cores exactly as real loading does.

# %%
print(inspect.getsource(TokenizingDataset.__getitem__))
ds = TokenizingDataset(8, words=120)
t0 = time.perf_counter()
sample = ds[0]
print(f"one sample: {1e3 * (time.perf_counter() - t0):.2f} ms, {sample['length']} tokens")

# %% [markdown]
# ## 1. The baseline: how much of each step waits for data?
#
# `throughput.run` trains a tiny model on 2 ranks, data parallel. Its loop is the one you would
# write, plus one line that marks the collective:
#
# ```python
# with record(loader) as rec:
#     for batch in rec:
#         loss = model(batch).loss; loss.backward()   # the step's own work
#         with rec.collective():                      # where the ranks meet
#             for p in model.parameters(): dist.all_reduce(p.grad)
#         opt.step()
# ```
#
# Each rank's clock stamps its entry into the collective; a rank's **wait** is the time from its
# entry to the last rank's entry (the transfer after that is not waiting).

# %%
base = Ledger.from_results(ez.launch(throughput.run, world_size=2, num_samples=128))
verdict = base.diagnose()
print(verdict)
assert all(r.times is not None for r in base.records)
assert set(verdict.data_share) == {0, 1}
viz.step_timeline(base)

# %% [markdown]
# Orange is waiting for data, blue the step's work, vermillion waiting for the other rank,
# green the all-reduce itself. With `num_workers=0` the rank tokenizes inside `next(loader)`:
# every millisecond of loading is a millisecond the model does not train.
#
# ## 2. Workers, prefetching, and the start of each epoch
#
# `num_workers=k` starts k processes that load batches while the rank computes (by fork on
# Linux up to Python 3.13; Python 3.14's Linux default is forkserver, macOS and Windows spawn,
# and then each worker imports and unpickles the dataset afresh);
# `prefetch_factor` is how many batches each worker keeps ready. The sweep runs on **one rank**
# so that the workers have cores of their own: a worker only helps when a core is free for it
# (here: the notebook's cores minus the ranks). On a GPU node the same holds per rank: 8 ranks
# with 4 workers each need 40 cores.


# %%
def sweep(configs, epochs=1):
    """Train once per loader setting on this rank; each setting's ledger."""
    out = []
    for num_workers, prefetch, persistent in configs:
        ds = TokenizingDataset(64, words=240)
        loader = make_loader(
            ds,
            num_workers=num_workers,
            prefetch_factor=prefetch,
            persistent_workers=persistent,
        )
        with record(loader) as rec:
            train(rec, epochs=epochs, hidden=64)
        out.append(rec.ledger())
    return out


SETTINGS = [(0, None, False), (1, 2, False), (2, 2, False), (2, 4, False)]
# threads=1: one intra-op thread, so the step's compute does not fight the workers for cores
# (section 4 shows what two threads per rank cost on a busy 2-core machine).
(runs,) = ez.launch(sweep, SETTINGS, world_size=1, threads=1)
print("| num_workers | prefetch_factor | data wait per step | step | epoch start | epoch end |")
print("|---|---|---|---|---|---|")
waits = {}
for (workers, prefetch, _), led in zip(SETTINGS, runs, strict=True):
    timed = led.timings()
    steady = [t for t in timed if t.step > 0]
    waits[(workers, prefetch)] = wait = statistics.median(t.data_s for t in steady)
    step = statistics.median(t.total_s for t in steady)
    start, end = timed[0].data_s, timed[-1].end_s
    print(
        f"| {workers} | {prefetch or '-'} | {1e3 * wait:.2f} ms | {1e3 * step:.2f} ms "
        f"| {1e3 * start:.0f} ms | {1e3 * end:.0f} ms |"
    )
best = min(waits, key=waits.get)
print(f"\nthis run's shortest wait: num_workers={best[0]}, prefetch_factor={best[1]}")

# %% [markdown]
# Medians over the steps after the first; "epoch start" is the first step's wait (workers
# forked), "epoch end" the last `next()` (workers shut down). With one worker, the next batch is
# tokenized while the step runs: the wait shrinks by about the step's own time. With two, two batches are made at once, if there are two free cores.
# `prefetch_factor` helps only when the loading time per batch varies (it evens out bursts);
# it cannot make loading faster on average. On this notebook's machine the table says which
# won; on a machine with more cores than ranks, more workers keep winning until loading is
# faster than the step.
#
# **Predict**: the workers are started in `iter(loader)`, at every epoch. What does the first
# step of the second epoch wait for, with and without `persistent_workers=True`?
#
# <details><summary>Answer</summary>
#
# Without: the workers are forked again (and shut down at the epoch's end), so the first step
# waits for a fork and a batch. With: the workers stay; the first step waits for one batch.
# </details>

# %%
(starts,) = ez.launch(sweep, [(2, 2, False), (2, 2, True)], epochs=2, world_size=1, threads=1)
for name, led in zip(("persistent_workers=False", "persistent_workers=True"), starts, strict=True):
    first = led.epoch_start()
    end = [r.times.end_s for r in led.records if r.times and r.times.end_s]
    print(
        f"{name}: first step waits {1e3 * first[0][0]:.0f} ms (epoch 0), "
        f"{1e3 * first[1][0]:.0f} ms (epoch 1);\n    epoch ends take "
        f"{', '.join(f'{1e3 * e:.0f} ms' for e in end)}"
    )

# %% [markdown]
# The recorder counts the epoch's start (`iter()`, where workers start) in the first step's data
# wait, and the epoch's end (the last `next()`, where workers are shut down) as `end_s` of the
# last step, so nothing the loader does escapes the timings.
#
# ## 3. A straggler
#
# Now rank 1's shard holds documents five times longer (`heavy_rank=1`: the sampler is not
# shuffled, so rank 1 holds every odd index). **Predict** before running: which rank waits for
# data, which rank waits in the collective, and how long is each step?

# %%
slow = Ledger.from_results(
    ez.launch(throughput.run, world_size=2, num_samples=128, words=240, heavy_rank=1)
)
verdict = slow.diagnose()
print(verdict)
assert verdict.straggler == 1, verdict.text
viz.step_timeline(slow)

# %% [markdown]
# Rank 1 waits for data; rank 0 finishes its own loading and work early, then waits in the
# all-reduce for rank 1 (vermillion). Every step takes as long as rank 1's: one slow shard
# slows every rank. Two fixes:
#
# - **More hands where the work is**: `heavy_rank_workers=2` gives rank 1 two loader workers
#   (they need free cores: on 2 cores they compete with both ranks).
# - **Rebalance**: `shuffle=True` spreads the long documents over both ranks, so no rank carries
#   all of them. This needs no extra core.
#
# Read the two verdicts: on a machine with free cores both fixes remove the straggler; on a
# loaded 2-core laptop the workers compete with the ranks and the verdict may still name rank 1.
# The timeline below is the shuffled run's.

# %%
fixes = {
    "2 workers on rank 1": dict(heavy_rank_workers=2, persistent_workers=True, epochs=2),
    "shuffled": dict(shuffle=True),
}
for name, kwargs in fixes.items():
    led = Ledger.from_results(
        ez.launch(throughput.run, world_size=2, num_samples=128, words=240, heavy_rank=1, **kwargs)
    )
    print(f"--- {name}\n{led.diagnose()}")
viz.step_timeline(led)

# %% [markdown]
# ## 4. Oversubscription: processes x threads against cores
#
# Every rank is a process; every DataLoader worker is another; each may run several intra-op
# threads (`torch.get_num_threads()`, set by `OMP_NUM_THREADS` or `torch.set_num_threads`). When
# ranks x (threads + workers) exceeds the cores, they take turns, and a step's time grows with
# every extra thread. `ez.launch` gives each rank `cores // ranks` threads; DataLoader workers
# run with 1 thread each (torch sets it in every worker). On a cluster, ask the scheduler for
# the cores you will use: with one torchrun per node (`docs/scale-out.md`), Slurm's
# `--cpus-per-task` is the whole node's share for all its ranks and their workers; then set
# `OMP_NUM_THREADS` per rank to match.


# %%
def matmul_step_ms(n=256, steps=20):
    """The median time of one float32 matmul step on this rank."""
    a = torch.randn(n, n)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - t0)
    return torch.get_num_threads(), 1e3 * statistics.median(times)


print("| ranks | threads per rank | threads in all | cores | matmul step (median, ms) |")
print("|---|---|---|---|---|")
for threads in (1, 2):
    got = ez.launch(matmul_step_ms, world_size=2, threads=threads)
    print(f"| 2 | {got[0][0]} | {2 * got[0][0]} | {CORES} | {max(ms for _, ms in got):.2f} |")

# %% [markdown]
# With more threads than cores, a second thread per rank buys nothing and often costs: the
# threads wait for each other at every parallel region. Count before you set the knobs: each
# rank runs its `threads`, each of its workers one, so
# `ranks_per_node x (threads + num_workers) <= cores_per_node`.
#
# ## 5. TP: the leader loads and broadcasts, or every TP rank loads?
#
# TP peers need the same batch. Either the leader loads and broadcasts it
# (`TPBroadcastDataLoader`: one collective per batch), or every TP rank loads the same batch
# itself (no collective, but the loading is done TP times, on the node's cores). Which wins
# depends on loading cost against broadcast cost, and on free cores. Here 4 ranks form one TP
# group on this machine's cores.


# %%
# (documents, sequence length, batch): one batch cheap to make and big to send (random tokens,
# 2 x 32 x 4096 int64 = 2 MiB), one costly to make (tokenizing long documents) and small to send.
TP_CASES = {
    "cheap to load, 2 MiB to send": (None, 4096, 32),
    "costly to load, 4 KiB to send": (600, 32, 8),
}


def tp_step_ms(case, broadcast):
    """Median step time of one TP group loading 6 batches one way or the other."""
    words, seq_length, batch = TP_CASES[case]
    n = 6 * batch
    if words is None:
        ds = RandomTokenDataset(1024, seq_length, num_samples=n)
    else:
        ds = TokenizingDataset(n, seq_length=seq_length, words=words)
    loader = DataLoader(
        ds, batch_size=batch
    )  # one DP replica: every TP rank reads the same batches
    if broadcast:
        loader = TPBroadcastDataLoader(loader, dist.group.WORLD)
    rec = record(loader)
    for _batch in rec:
        with rec.collective():  # TP ranks meet in every layer; one all-reduce stands for them
            dist.all_reduce(torch.zeros(1))
    return 1e3 * statistics.median(t.total_s for t in rec.ledger().timings())


def tp_table():
    return {(case, b): tp_step_ms(case, b) for case in TP_CASES for b in (False, True)}


tp = ez.launch(tp_table, world_size=4)
table = {k: max(rank[k] for rank in tp) for k in tp[0]}
print("| batch | every TP rank loads | leader loads + broadcasts | faster here |")
print("|---|---|---|---|")
for case in TP_CASES:
    each, bcast = table[(case, False)], table[(case, True)]
    won = "every rank loads" if each < bcast else "broadcast"
    ratio = max(each, bcast) / min(each, bcast)
    print(f"| {case} | {each:.2f} ms | {bcast:.2f} ms | {won}, {ratio:.1f}x |")


def tp_verdict(case, each, bcast, noise=1.25):
    """One sentence on this run's numbers: who won, by how much, or too close to call."""
    ratio = max(each, bcast) / min(each, bcast)
    if ratio < noise:
        return f"{case}: a tie on this run ({each:.1f} vs {bcast:.1f} ms, under {noise}x apart)"
    won = "every TP rank loading" if each < bcast else "the leader's broadcast"
    # Two lines: one would pass the output column's 100 characters and break mid-number.
    return f"{case}: {won} wins, {ratio:.1f}x\n  ({each:.1f} ms loading each, {bcast:.1f} ms broadcast)"


for case in TP_CASES:
    print(tp_verdict(case, table[(case, False)], table[(case, True)]))

# %% [markdown]
# Read the sentences above: they are this run's numbers, worded by `tp_verdict` (a ratio under
# 1.25x is called a tie, since one run on a shared machine moves that much). What decides it is
# what each side costs **on these cores**. Every TP rank loading does the loading four times at
# once; here four ranks share 2 cores, so even "cheap" random-token batches (32 samples stacked
# into 2 MiB) are made four times on half a core each, and the broadcast, one rank making the
# batch and loopback moving 2 MiB, can win. The tokenizing case costs far more to make than to
# send, so expect it to lean further towards the broadcast; the sentence above says whether it
# did on this run. Rerun the cell: a row that changes its winner was a tie. On a GPU node with cores to spare per rank, duplicated loading costs CPU, not time, and
# the crossover moves towards "every rank loads" (torchtitan and picotron do that); with heavy
# decoding (images, video) or few cores per GPU, the broadcast wins.
#
# ## 6. `pin_memory` and `non_blocking` (GPUs only)
#
# On a GPU, a batch is copied from host memory to the device. From ordinary (pageable) memory
# the copy is staged through a pinned buffer and blocks the host. `DataLoader(pin_memory=True)`
# makes the loader's thread put each batch in page-locked memory, and
# `batch.to("cuda", non_blocking=True)` then queues the copy and returns at once: the **host**
# goes on (fetching the next batch, launching kernels). On the device the copy is queued on the
# same stream as the kernels and runs after the previous step's, not beside them; our H200
# table (`docs/throughput.md`) shows the same step time with and without `non_blocking`. For
# the copy to overlap the kernels, prefetch the next batch on a side stream
# (`torch.cuda.Stream()`), make the step `wait_stream` for it, and `record_stream` the batch.
# Nothing of this can be shown on this CPU-only machine: `make gpu-check` measures the copies,
# and the side-stream prefetch against the same loop on one stream, when a GPU is present.

# %%
print("GPU here:", torch.cuda.is_available())

# %% [markdown]
# ## Exercise: make the straggler's loader keep up
#
# The checker trains on your loader for 2 epochs, with rank 1 holding the long documents as in
# section 3. Write `faster_loader(dataset, rank, world_size)` returning the DataLoader each rank
# trains on. With the slow loader, rank 1's steps wait for every word of its shard, every epoch.
# Yours passes when, in every epoch, no rank's steps wait for more than half those words (a word
# is waited for when the rank's own process finishes loading it, `dataset[i]` read and tokenized,
# while its loop waits for a batch, or a worker starts reading it only after its step asked for
# the batch; loading that runs ahead, beside the steps, is not: workers, prefetching, a cache), or
# when the work is rebalanced: every rank's samples in that epoch hold at most 1.5x the words of
# any other's, and so do its steps: each step waits in its all-reduce for the rank that loads the
# most, so summed over the epoch's steps that rank's words must stay within 1.4x the ranks' mean
# (the slow loader's are 1.67x; long documents read by one rank in the epoch's first half and by
# the other in its second hold equal words, yet make every step wait). Load every sample through the `dataset` your function gets (wrap it, cache what
# `dataset[i]` returns, hand it to workers): its documents come from the notebook's process, which
# numbers every read and every finished load in one order with the loop's steps (counted there
# from the bytes of each step's all-reduce, as the kernel sees them), and checks them against the
# batches each rank trained on. The checker counts words, on every rank and in every epoch,
# instead of comparing clocks: a busy machine moves every clock, and two cores of one laptop can
# run the same code 1.5x apart. Loading before the loop, moving each epoch's loading to its first
# step, or moving the wait to rank 0 or to another epoch hides it instead of removing it: the
# checker counts those too and says so. A cache of the samples is a fix, whether it fills as the
# first epoch reads or takes the whole shard at once in the first step: each document is loaded
# once, inside steps, and later epochs load nothing (a cache of the documents' text alone still
# tokenizes every epoch: the slow loader's work). It costs the shard in memory and, filled at
# once, a first step that waits for the whole shard while the other ranks wait in its all-reduce:
# worth it over several epochs of a shard that fits in memory, not for one epoch.

# %% tags=["workshop"]
import ezpz_nb.workshop.throughput as ex


def faster_loader(dataset, rank, world_size):
    raise NotImplementedError  # your code: return a DataLoader over this rank's shard


# %% tags=["workshop"]
ex.check_faster_loader(faster_loader)

# %% tags=["solutions"]
import ezpz_nb.workshop.throughput as ex


def faster_loader(dataset, rank, world_size):
    # Rebalance: a shuffled sampler spreads the long documents over every rank.
    return make_loader(dataset, batch_size=ex.BATCH_SIZE, shuffle=True)


# %% tags=["solutions"]
assert ex.check_faster_loader(faster_loader).passed

# %% [markdown]
# ## What to take away
#
# - `ledger.diagnose()` and `viz.step_timeline(ledger)` tell data wait from compute from waiting
#   for a straggler, per rank; measure before changing a knob.
# - Workers and prefetching hide loading behind the step only with free cores; count
#   `ranks x (threads + workers)` against the cores, and keep workers with
#   `persistent_workers=True` when epochs are short.
# - One slow shard slows every rank: rebalance the work, or give that rank more hands.
