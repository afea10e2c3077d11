"""What a training loop pays per batch: the TP loader as ``for batch in loader`` reads it.

``broadcast.py``'s main table takes medians of single batches; a loop pays the mean,
tail included. Here, on each rank of one TP group, three things run as loops of
``batches`` steps, interleaved loop by loop (the order rotating, a barrier before each)
so that load from other processes falls on all of them alike:

* loader: ``for batch in TPBroadcastDataLoader(...)`` over an epoch of ready-made
  batches (the leader's loading costs nothing), the end of the epoch included;
* ours:   ``BatchBroadcaster`` alone, the previous batch held as a loop holds it;
* raw:    one broadcast of the same bytes into a reused buffer (the process group's
  own ``broadcast``): what the wire costs.

Each rank records every step's time, each loop's wall time and the CPU time its
process spent in the loop (gloo's threads included: what it did, which load from
other processes stretches less than the wall time); it also counts the
garbage collector's runs (by generation) and the receive buffers it had to allocate,
during the loader's loops: the usual suspects of a slow step.
"""

from __future__ import annotations

import gc
import time

from broadcast_ranks import _broadcaster_class, _pin

__all__ = ["LOOP_METHODS", "loop_rank"]

LOOP_METHODS = ("loader", "ours", "raw")


class _Epoch:
    """``batches`` ready-made batches, two dicts taken in turn (a DataLoader makes a new
    dict every step); ``len`` is what the wrapper reads."""

    def __init__(self, batch: dict, batches: int) -> None:
        self.pair = [batch, {k: v.clone() for k, v in batch.items()}]
        self.batches = batches

    def __iter__(self):
        return (self.pair[i % 2] for i in range(self.batches))

    def __len__(self) -> int:
        return self.batches


def _loops(batch: dict, batches: int, rank: int) -> dict:
    """One loop function per method: each runs ``batches`` steps, returns the step times."""
    import torch
    import torch.distributed as dist

    from ezpz_nb.data.distributed import TPBroadcastDataLoader

    pc = time.perf_counter
    loader = TPBroadcastDataLoader(_Epoch(batch, batches), dist.group.WORLD)
    bc = _broadcaster_class()(None, mode="tensor")
    nbytes = sum(t.numel() * t.element_size() for t in batch.values())
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg = dist.group.WORLD

    def run_loader() -> list[float]:
        ts, t0 = [], pc()
        for _ in loader:  # the loop variable holds the batch until the next one arrives
            t1 = pc()
            ts.append(t1 - t0)
            t0 = t1
        return ts

    def run_ours() -> list[float]:
        ts, held, t0 = [], None, pc()
        for _ in range(batches):
            held = bc.send(batch) if rank == 0 else bc.recv()
            t1 = pc()
            ts.append(t1 - t0)
            t0 = t1
        if rank == 0:
            bc._drain()  # the last send's broadcast belongs to this loop
        del held
        return ts

    def run_raw() -> list[float]:
        ts, t0 = [], pc()
        for _ in range(batches):
            pg.broadcast([flat], opts).wait()
            t1 = pc()
            ts.append(t1 - t0)
            t0 = t1
        return ts

    return {"loader": run_loader, "ours": run_ours, "raw": run_raw}


def loop_rank(shape: tuple[int, int], loops: int, batches: int, pin: bool = False) -> dict:
    """Per method: each loop's step times and wall time; the loader's GC runs and buffers.

    Unpinned by default, as a training loop runs: pinning every thread of a rank (the
    main thread and gloo's) to one core makes each hand-off between them wait for the
    core, a tail of whole milliseconds that falls hardest on raw's tight loop (measured
    here, 3 runs of 60 loops: raw's mean 0.92-1.18 ms pinned, 0.48-0.57 ms not; p50 0.35 ms
    both). ``pin=True`` shows it.
    """
    import torch
    import torch.distributed as dist

    from ezpz_nb.data import broadcast as bmod

    torch.set_num_threads(1)
    rank = dist.get_rank()
    if pin:
        _pin(rank, dist.get_world_size())
    b, s = shape
    batch = {
        "input_ids": torch.randint(0, 32000, (b, s)),
        "labels": torch.randint(0, 32000, (b, s)),
        "index": torch.arange(b),
    }
    runs = _loops(batch, batches, rank)
    for run in runs.values():
        run()  # warm up: the first step sends the spec, buffers are made
    out: dict = {name: [] for name in runs}
    out |= {f"{n}_{kind}": [] for n in runs for kind in ("wall", "cpu")}
    collected = [0, 0, 0]
    allocated = [0]
    made = bmod.BatchBroadcaster._recv_buffer

    def counting(self):  # a receive buffer made, not reused: counted
        before = self._recv_ring[self._recv_turn]
        rb = made(self)
        allocated[0] += rb is not before
        return rb

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collected[info["generation"]] += 1

    for i in range(loops):
        names = list(runs)[i % len(runs) :] + list(runs)[: i % len(runs)]
        for name in names:
            counted = name == "loader"
            if counted:
                gc.callbacks.append(on_gc)
                bmod.BatchBroadcaster._recv_buffer = counting
            dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            ts = runs[name]()
            out[f"{name}_wall"].append(time.perf_counter() - t0)
            out[f"{name}_cpu"].append(time.process_time() - c0)
            out[name].append(ts)
            if counted:
                gc.callbacks.remove(on_gc)
                bmod.BatchBroadcaster._recv_buffer = made
    out["gc"] = collected
    out["allocated"] = allocated[0]
    return out
