"""How close is the TP broadcast to the wire's limit? Prints one table.

For TP sizes 2 and 4 (world = tp, gloo on loopback, one intra-op thread per
rank) and batches of 8x512 and 32x2048 tokens (int64 input_ids and labels, plus
the int64 index), the time per batch of:

* ours:   ``BatchBroadcaster(mode="tensor")``: pack, one broadcast, unpack
          into fresh tensors on the peers (the steady state of TPBroadcastDataLoader);
* pickle: ezpz's ``broadcast_object_list`` of the whole batch;
* bound:  one ``dist.broadcast`` of a preallocated tensor of the same bytes
          (the issue's lower bound);
* raw:    the same through the process group's own ``broadcast`` method, the
          call ours makes (it skips the ``dist.broadcast`` wrapper's ~50 us of
          Python per call), shown so the comparison hides nothing.

Each batch is timed on every rank; a figure is the median over all batches on
the slowest rank. The methods run in interleaved blocks (after a barrier)
so that load from other processes falls on all of them alike. Then the peak memory of a 10^6 x 2048
RandomTokenDataset and 10 batches read from it.

Run: ``.venv/bin/python benchmarks/broadcast.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ezpz_nb as ez

SHAPES = [(8, 512), (32, 2048)]


def _bench_rank(shapes: list[tuple[int, int]], blocks: int, per_block: int) -> dict:
    import torch
    import torch.distributed as dist

    from ezpz_nb.data.broadcast import BatchBroadcaster

    torch.set_num_threads(1)
    rank = dist.get_rank()
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

        steps = {"ours": step_ours, "pickle": step_pickle, "bound": step_bound, "raw": step_raw}
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
    return out


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=30, help="timed blocks per figure")
    parser.add_argument("--per-block", type=int, default=10, help="iterations per block")
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()

    rows = []
    for tp in args.tp:
        results = ez.launch(
            _bench_rank, SHAPES, args.blocks, args.per_block, world_size=tp, timeout=600, threads=1
        )
        for b, s in SHAPES:
            med = {}
            for name in ("ours", "pickle", "bound", "raw"):
                # Each rank's median time per batch; the slowest rank sets the pace.
                med[name] = max(statistics.median(r[(b, s, name)]) for r in results) * 1e3
            rows.append((tp, f"{b}x{s}", results[0][(b, s, "bytes")], med))

    head = (
        f"{'tp':>3} {'batch':>8} {'bytes':>9} {'ours ms':>8} {'pickle ms':>10} {'bound ms':>9} "
        f"{'raw ms':>7} {'ours/bound':>11} {'ours/raw':>9} {'pickle/ours':>12}"
    )
    print(head)
    print("-" * len(head))
    for tp, shape, nbytes, m in rows:
        print(
            f"{tp:>3} {shape:>8} {nbytes:>9} {m['ours']:>8.3f} {m['pickle']:>10.3f} {m['bound']:>9.3f} "
            f"{m['raw']:>7.3f} {m['ours'] / m['bound']:>10.2f}x {m['ours'] / m['raw']:>8.2f}x "
            f"{m['pickle'] / m['ours']:>11.2f}x"
        )
    print(
        f"(per-batch median over {args.blocks * args.per_block} batches per rank, slowest rank; "
        "gloo, loopback, 1 intra-op thread per rank)"
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
