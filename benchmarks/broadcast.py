"""How close is the TP broadcast to the wire's limit? Prints one table.

For TP sizes 2 and 4 (world = tp, gloo on loopback, one intra-op thread per
rank) and batches of 8x512 and 32x2048 tokens (int64 input_ids and labels, plus
the int64 index), the time per batch of:

* loader: ``TPBroadcastDataLoader`` over a loader that yields ready-made batches,
          read as ``for batch in loader`` reads it (the previous batch is still held
          while the next arrives): what a training loop pays;
* ours:   ``BatchBroadcaster(mode="tensor")`` alone: pack, one broadcast, the
          batch as views into a receive buffer on the peers (dropped at once);
* pickle: ezpz's ``broadcast_object_list`` of the whole batch;
* bound:  one ``dist.broadcast`` of a preallocated tensor of the same bytes
          (the issue's lower bound);
* raw:    the same through the process group's own ``broadcast`` method, the
          call ours makes (it skips the ``dist.broadcast`` wrapper's ~50 us of
          Python per call), shown so the comparison hides nothing.

Each batch is timed on every rank; a figure is the median over all batches on
the slowest rank. The methods run in interleaved blocks (after a barrier)
so that load from other processes falls on all of them alike. TP 2, the
targeted size, is measured in two separate launches, and the table says how
far their ratios agree: the machine's speed drifts between launches (raw
itself moved 0.26-0.44 ms here), so the ratios, measured interleaved, are what
two runs can agree on. Larger TP sizes get fewer batches: they are reported,
not targeted.

Then a per-step profile of ours at TP 2: the median time of each piece of the
steady step, on the leader (check the batch against the spec, pack it, start
the broadcast) and on the peer (pick a receive buffer, the broadcast itself,
read the header, build the batch). Then the peak memory of a 10^6 x 2048
RandomTokenDataset and 10 batches read from it.

Run: ``.venv/bin/python benchmarks/broadcast.py`` (about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import ezpz_nb as ez

SHAPES = [(8, 512), (32, 2048)]


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


METHODS = ("loader", "ours", "pickle", "bound", "raw")


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


def _bench_rank(
    shapes: list[tuple[int, int]],
    blocks: int,
    per_block: int,
    methods: tuple[str, ...] = METHODS,
    profile: bool = True,
) -> dict:
    import torch
    import torch.distributed as dist

    BatchBroadcaster = _broadcaster_class()
    torch.set_num_threads(1)
    rank = dist.get_rank()
    _pin(rank, dist.get_world_size())
    out = {}
    for b, s in shapes:
        batch = {
            "input_ids": torch.randint(0, 32000, (b, s)),
            "labels": torch.randint(0, 32000, (b, s)),
            "index": torch.arange(b),
        }
        nbytes = sum(t.numel() * t.element_size() for t in batch.values())
        flat = torch.zeros(nbytes, dtype=torch.uint8)
        ours, pickled = BatchBroadcaster(None, mode="tensor"), BatchBroadcaster(None, mode="pickle")

        def step_ours(bc=ours, batch=batch):
            bc.send(batch) if rank == 0 else bc.recv()

        def step_pickle(bc=pickled, batch=batch):
            bc.send(batch) if rank == 0 else bc.recv()

        def step_bound(flat=flat):
            dist.broadcast(flat, src=0)

        opts = dist.BroadcastOptions()
        opts.rootRank = 0

        def step_raw(flat=flat, pg=dist.group.WORLD, opts=opts):
            pg.broadcast([flat], opts).wait()

        loader, step_loader = _loader_step(batch)
        every = {
            "loader": step_loader,
            "ours": step_ours,
            "pickle": step_pickle,
            "bound": step_bound,
            "raw": step_raw,
        }
        steps = {name: every[name] for name in methods}
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
        for name, ts in times.items():
            out[(b, s, name)] = ts
        out[(b, s, "bytes")] = nbytes
        if profile and dist.get_world_size() == 2:  # the targeted size
            out[(b, s, "profile")] = _profile(ours, batch, rank, per_block * blocks)
        if rank == 0 and hasattr(ours, "_drain"):  # older trees sent synchronously
            ours._drain()
            if loader._broadcaster is not None:
                loader._broadcaster._drain()
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


def _memory_rank(num_samples: int, seq_length: int, batch: int) -> dict:
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


def _block_medians(per_rank: list[list[float]], per_block: int) -> list[float]:
    """The slowest rank's median batch time in each timed block."""
    medians = [
        [statistics.median(ts[i : i + per_block]) for i in range(0, len(ts), per_block)]
        for ts in per_rank
    ]
    return [max(block) for block in zip(*medians, strict=True)]


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over blocks of a/b, each block paired with its neighbour of the other method."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=60, help="timed blocks per figure")
    parser.add_argument("--per-block", type=int, default=20, help="iterations per block")
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()

    rows, profiles = [], {}
    for tp in args.tp:
        # The targeted size twice; the others once, with fewer batches.
        runs, blocks = (2, args.blocks) if tp == 2 else (1, max(5, args.blocks * 2 // tp))
        for run in range(1, runs + 1):
            results = ez.launch(
                _bench_rank, SHAPES, blocks, args.per_block, world_size=tp, timeout=900, threads=1
            )
            for b, s in SHAPES:
                med, per_block = {}, {}
                for name in METHODS:
                    # Each rank's median time per batch; the slowest rank sets the pace.
                    med[name] = max(statistics.median(r[(b, s, name)]) for r in results) * 1e3
                    per_block[name] = _block_medians(
                        [r[(b, s, name)] for r in results], args.per_block
                    )
                # Ratios pair each block with its neighbours of the same rotation,
                # so that the machine's drift during the run cancels out.
                for name in ("bound", "raw"):
                    for mine in ("loader", "ours"):
                        med[f"{mine}/{name}"] = paired_ratio(per_block[mine], per_block[name])
                med["pickle/ours"] = paired_ratio(per_block["pickle"], per_block["ours"])
                label = f"{tp} (run {run})" if runs > 1 else str(tp)
                rows.append((tp, label, f"{b}x{s}", results[0][(b, s, "bytes")], med))
                if tp == 2:
                    profiles[(run, b, s)] = (
                        results[0][(b, s, "profile")],
                        results[1][(b, s, "profile")],
                    )

    head = (
        f"{'tp':>9} {'batch':>8} {'bytes':>9} {'loader ms':>9} {'ours ms':>8} {'pickle ms':>10} "
        f"{'bound ms':>9} {'raw ms':>7} {'loader/bound':>13} {'ours/bound':>11} {'ours/raw':>9} "
        f"{'pickle/ours':>12}"
    )
    print(head)
    print("-" * len(head))
    for _, label, shape, nbytes, m in rows:
        print(
            f"{label:>9} {shape:>8} {nbytes:>9} {m['loader']:>9.3f} {m['ours']:>8.3f} "
            f"{m['pickle']:>10.3f} {m['bound']:>9.3f} {m['raw']:>7.3f} {m['loader/bound']:>12.2f}x "
            f"{m['ours/bound']:>10.2f}x {m['ours/raw']:>8.2f}x "
            f"{m['pickle/ours']:>11.2f}x"
        )
    print(
        f"(per-batch median over {args.blocks * args.per_block} batches per rank at tp 2, fewer above; "
        "slowest rank; ratios: median over blocks of the ratio of neighbouring blocks; "
        "gloo, loopback, 1 intra-op thread per rank, each rank on its own core where there is one)"
    )
    twice = [r for r in rows if r[0] == 2]
    for shape in dict.fromkeys(r[2] for r in twice):
        a, b = (r[4] for r in twice if r[2] == shape)
        for ratio, (x, y) in {
            "loader/bound": (a["loader/bound"], b["loader/bound"]),
            "ours/bound": (a["ours/bound"], b["ours/bound"]),
            "ours/raw": (a["ours/raw"], b["ours/raw"]),
        }.items():
            print(
                f"tp 2 {shape}: {ratio} {x:.2f}x and {y:.2f}x in the two runs, "
                f"{abs(x - y) / min(x, y) * 100:.1f}% apart"
            )
        print(
            f"tp 2 {shape}: raw itself {a['raw']:.3f} and {b['raw']:.3f} ms "
            f"({abs(a['raw'] - b['raw']) / min(a['raw'], b['raw']) * 100:.0f}% apart: the machine's drift)"
        )

    print("\nwhere a steady step of ours goes at tp 2 (median us per piece, second run):")
    print(f"{'batch':>8}  {'rank':<6} {'piece':<18} {'us':>8}")
    for (run, b, s), (leader, peer) in profiles.items():
        if run != 2:
            continue
        for who, prof in (("leader", leader), ("peer", peer)):
            for piece, us in prof.items():
                print(f"{b}x{s:<6}  {who:<6} {piece:<18} {us:>8.1f}")
    print(
        "(the leader packs the next batch while the last one's broadcast runs on, then "
        "waits for it and starts the next: at most one in flight; the peer's step sets the pace)"
    )

    n, seq, batch = 10**6, 2048, 32
    mem = ez.launch(_memory_rank, n, seq, batch, world_size=1, timeout=300, threads=1)[0]
    eager = n * (seq + 1) * 8
    print(
        f"\nRandomTokenDataset({n:.0e} samples x {seq} tokens): peak RSS +{mem['built'] / 2**20:.1f} MiB "
        f"to build; +{mem['read'] / 2**20:.1f} MiB after DistributedSampler setup and reading "
        f"10 batches of {batch}x{seq} (an eager dataset would hold {eager / 2**30:.1f} GiB)"
    )


if __name__ == "__main__":
    main()
