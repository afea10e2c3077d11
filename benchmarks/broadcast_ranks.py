"""What each rank runs for ``broadcast.py``: the timed steps, the step profile, the memory.

Every method's step is timed in interleaved blocks after a barrier (see
``broadcast.py`` for what the methods are and how the table reads them).
"""

from __future__ import annotations

import os
import time

__all__ = ["METHODS", "bench_rank", "memory_rank"]

#: The methods timed, in the table's order.
METHODS = ("loader", "ours", "pickle", "bound", "raw")


def _pin(rank: int, world: int) -> None:
    """Keep every thread of this rank (gloo's included) on a core of its own.

    Only when there is a core per rank: otherwise the scheduler moving threads
    between cores made two runs' ratios differ by up to 40% here.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if world > len(cpus):
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {cpus[rank]})
        except OSError:  # a thread that ended meanwhile
            pass


def _broadcaster_class() -> type:
    try:
        from ezpz_nb.data.broadcast import BatchBroadcaster
    except ModuleNotFoundError:  # a tree from before data/ (benchmarks/compare.py times those)
        from ezpz_nb.broadcast import BatchBroadcaster  # type: ignore[no-redef]
    return BatchBroadcaster


class _Ready:
    """A loader of ready-made batches, taken in turn: the leader's loading costs nothing.

    Two batches alternate so that the leader sends a new dict every step, as a
    DataLoader does; ``len`` is only a hint to the wrapper.
    """

    def __init__(self, batches: list) -> None:
        self.batches = batches

    def __iter__(self):
        import itertools

        return itertools.cycle(self.batches)

    def __len__(self) -> int:
        return 2**31


def _loader_step(batch: dict):
    """One step of ``for batch in TPBroadcastDataLoader(...)``, holding the last batch."""
    import torch.distributed as dist

    from ezpz_nb.data.distributed import TPBroadcastDataLoader

    loader = TPBroadcastDataLoader(
        _Ready([batch, {k: v.clone() for k, v in batch.items()}]), dist.group.WORLD
    )
    it, held = iter(loader), [None]

    def step() -> None:
        held[0] = next(it)  # the loop variable: the previous batch goes as the next comes

    return loader, step


def _make_steps(batch: dict, rank: int, methods: tuple[str, ...]) -> tuple[dict, list]:
    """One step function per method (only those asked: older trees lack some), and the
    broadcasters whose last send must be drained at the end."""
    import torch
    import torch.distributed as dist

    BatchBroadcaster = _broadcaster_class()
    nbytes = sum(t.numel() * t.element_size() for t in batch.values())
    flat = torch.zeros(nbytes, dtype=torch.uint8)
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    steps, senders = {}, []
    for name in methods:
        if name in ("ours", "pickle"):
            bc = BatchBroadcaster(None, mode="tensor" if name == "ours" else "pickle")
            steps[name] = lambda bc=bc: bc.send(batch) if rank == 0 else bc.recv()
            senders.append(bc)
            if name == "ours":
                steps["_ours"] = bc  # for the profile
        elif name == "loader":
            loader, steps[name] = _loader_step(batch)
            senders.append(loader._broadcaster)
        elif name == "bound":
            steps[name] = lambda: dist.broadcast(flat, src=0)
        else:
            steps[name] = lambda pg=dist.group.WORLD: pg.broadcast([flat], opts).wait()
    return steps, senders


def _time_blocks(steps: dict, blocks: int, per_block: int) -> dict[str, list[float]]:
    """Each step's per-batch times, the methods interleaved block by block."""
    import torch.distributed as dist

    for step in steps.values():
        for _ in range(5):  # warm up: the first tensor step also sends the spec
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    # Interleave the methods block by block (rotating their order) so
    # that load from other processes falls on all of them alike.
    for i in range(blocks):
        names = list(steps)[i % len(steps) :] + list(steps)[: i % len(steps)]
        for name in names:
            step, ts = steps[name], times[name]
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(per_block):
                step()
                t1 = time.perf_counter()
                ts.append(t1 - t0)  # one batch; a median ignores the preempted ones
                t0 = t1
    return times


def bench_rank(
    shapes: list[tuple[int, int]],
    blocks: int,
    per_block: int,
    methods: tuple[str, ...] = METHODS,
    profile: bool = True,
) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = dist.get_rank()
    _pin(rank, dist.get_world_size())
    out: dict = {}
    for b, s in shapes:
        batch = {
            "input_ids": torch.randint(0, 32000, (b, s)),
            "labels": torch.randint(0, 32000, (b, s)),
            "index": torch.arange(b),
        }
        steps, senders = _make_steps(batch, rank, methods)
        ours = steps.pop("_ours", None)
        for name, ts in _time_blocks(steps, blocks, per_block).items():
            out[(b, s, name)] = ts
        out[(b, s, "bytes")] = sum(t.numel() * t.element_size() for t in batch.values())
        if profile and ours is not None and dist.get_world_size() == 2:  # the targeted size
            out[(b, s, "profile")] = _profile(ours, batch, rank, per_block * blocks)
        for bc in senders:
            if rank == 0 and hasattr(bc, "_drain"):  # older trees sent synchronously
                bc._drain()
    return out


def _profile(bc, batch: dict, rank: int, steps: int) -> dict[str, float]:
    """Median microseconds of each piece of the steady step, as send/recv run them."""
    import statistics
    import time

    import torch.distributed as dist

    from ezpz_nb.data.broadcast import DATA

    pc = time.perf_counter
    times: dict[str, list[float]] = {}
    keep = None  # a loop holds the previous batch while the next arrives
    dist.barrier()
    for _ in range(steps):
        if rank == 0:
            t0 = pc()
            tensors = bc._same_dict(batch)
            t1 = pc()
            slot = bc._pack_steady(tensors)
            t2 = pc()
            bc._issue(slot)
            t3 = pc()
            pieces = {"check": t1 - t0, "pack": t2 - t1, "wait last, start": t3 - t2}
            total = t3 - t0
        else:
            t0 = pc()
            rb = bc._recv_buffer()
            t1 = pc()
            bc._bcast(rb.buf)
            t2 = pc()
            kind, _, _ = bc._read_header(rb)
            t3 = pc()
            keep = bc._batch(rb)
            bc._recv_turn ^= 1
            t4 = pc()
            assert kind == DATA and keep is not None
            pieces = {
                "pick buffer": t1 - t0,
                "broadcast (wait)": t2 - t1,
                "read header": t3 - t2,
                "build batch": t4 - t3,
            }
            total = t4 - t0
        pieces["whole step"] = total
        for name, t in pieces.items():
            times.setdefault(name, []).append(t)
    return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}


def memory_rank(num_samples: int, seq_length: int, batch: int) -> dict:
    import gc

    import torch

    from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp

    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key)) * 1024

    torch.set_num_threads(1)
    gc.collect()
    base = status("VmRSS:")
    try:  # reset the high-water mark so VmHWM is this measurement's peak
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    ds = RandomTokenDataset(32000, seq_length, num_samples=num_samples)
    built = status("VmHWM:") - base
    dl = get_random_dataset_fsdp_tp(batch, 32000, seq_length, dataset=ds)["dataloader"]
    for i, b in enumerate(dl):
        assert b["input_ids"].shape == (batch, seq_length)
        if i == 9:
            break
    return {"built": built, "read": status("VmHWM:") - base, "sampler_len": len(dl.sampler)}
