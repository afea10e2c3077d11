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

Then what a loop pays at TP 2 (``broadcast_loop.py``): the loader as ``for batch in
loader`` reads it, ``BatchBroadcaster`` alone and one raw broadcast of the same bytes into
a reused buffer, each as loops of ``--loop-batches`` steps interleaved loop by loop:
per batch the p50, the p90 and the mean (a loop's wall time over its batches, the
median over ``--loops`` loops, slowest rank), the mean's ratio to raw paired loop by
loop, and, during the loader's loops, the garbage collector's runs and the receive
buffers allocated (counts: they hold on a loaded machine, where times do not). These
loops run unpinned, as training does; one more run pinned shows where the tail came
from (see ``broadcast_loop.loop_rank``).

Then a per-step profile of ours at TP 2: the median time of each piece of the
steady step, on the leader (check the batch against the spec, pack it, start
the broadcast) and on the peer (pick a receive buffer, the broadcast itself,
read the header, build the batch). Then the peak memory of a 10^6 x 2048
RandomTokenDataset and 10 batches read from it.

What each rank runs is in ``broadcast_ranks.py``. Run:
``.venv/bin/python benchmarks/broadcast.py`` (about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics

from broadcast_loop import LOOP_METHODS, loop_rank
from broadcast_ranks import METHODS, bench_rank, memory_rank

import ezpz_nb as ez

SHAPES = [(8, 512), (32, 2048)]


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


def _measure(tps: list[int], blocks_asked: int, per_block_n: int) -> tuple[list, dict]:
    """Launch the ranks for each TP size: the table's rows and tp 2's step profiles."""
    rows, profiles = [], {}
    for tp in tps:
        # The targeted size twice; the others once, with fewer batches.
        runs, blocks = (2, blocks_asked) if tp == 2 else (1, max(5, blocks_asked * 2 // tp))
        for run in range(1, runs + 1):
            results = ez.launch(
                bench_rank, SHAPES, blocks, per_block_n, world_size=tp, timeout=900, threads=1
            )
            for b, s in SHAPES:
                med = _figures(results, b, s, per_block_n)
                label = f"{tp} (run {run})" if runs > 1 else str(tp)
                rows.append((tp, label, f"{b}x{s}", results[0][(b, s, "bytes")], med))
                if tp == 2:
                    profiles[(run, b, s)] = (
                        results[0][(b, s, "profile")],
                        results[1][(b, s, "profile")],
                    )
    return rows, profiles


def _figures(results: list[dict], b: int, s: int, per_block_n: int) -> dict[str, float]:
    """One row: each method's ms per batch (slowest rank) and the paired ratios."""
    med, per_block = {}, {}
    for name in METHODS:
        # Each rank's median time per batch; the slowest rank sets the pace.
        med[name] = max(statistics.median(r[(b, s, name)]) for r in results) * 1e3
        per_block[name] = _block_medians([r[(b, s, name)] for r in results], per_block_n)
    # Ratios pair each block with its neighbours of the same rotation,
    # so that the machine's drift during the run cancels out.
    for name in ("bound", "raw"):
        for mine in ("loader", "ours"):
            med[f"{mine}/{name}"] = paired_ratio(per_block[mine], per_block[name])
    med["pickle/ours"] = paired_ratio(per_block["pickle"], per_block["ours"])
    return med


def _print_table(rows: list, batches: int) -> None:
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
        f"(per-batch median over {batches} batches per rank at tp 2, fewer above; "
        "slowest rank; ratios: median over blocks of the ratio of neighbouring blocks; "
        "gloo, loopback, 1 intra-op thread per rank, each rank on its own core where there is one)"
    )


def _print_agreement(rows: list) -> None:
    """How far tp 2's two launches agree, ratio by ratio."""
    twice = [r for r in rows if r[0] == 2]
    for shape in dict.fromkeys(r[2] for r in twice):
        a, b = (r[4] for r in twice if r[2] == shape)
        for ratio in ("loader/bound", "ours/bound", "ours/raw"):
            x, y = a[ratio], b[ratio]
            print(
                f"tp 2 {shape}: {ratio} {x:.2f}x and {y:.2f}x in the two runs, "
                f"{abs(x - y) / min(x, y) * 100:.1f}% apart"
            )
        print(
            f"tp 2 {shape}: raw itself {a['raw']:.3f} and {b['raw']:.3f} ms "
            f"({abs(a['raw'] - b['raw']) / min(a['raw'], b['raw']) * 100:.0f}% apart: the machine's drift)"
        )


def _loop_means(res: list[dict], loops: int, batches: int) -> tuple[dict, dict]:
    """Per method, a loop's wall and CPU time per batch, the slowest rank's, loop by loop."""
    wall, cpu = (
        {
            m: [max(r[f"{m}_{kind}"][i] for r in res) / batches for i in range(loops)]
            for m in LOOP_METHODS
        }
        for kind in ("wall", "cpu")
    )
    return wall, cpu


def _paired(per_loop: dict, m: str) -> float:
    """The median over loops of ``m``'s ratio to the raw loop next to it."""
    return statistics.median(x / y for x, y in zip(per_loop[m], per_loop["raw"], strict=True))


def _loop_table(shapes: list[tuple[int, int]], loops: int, batches: int) -> None:
    """The loop section at tp 2: per-batch p50/p90/mean of each method, ratios to raw."""
    print(
        f"\nwhat a loop pays at tp 2 ({loops} loops of {batches} batches per method, "
        "interleaved; slowest rank; threads not pinned, as a training loop runs):"
    )
    head = (
        f"{'batch':>8} {'method':<7} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'mean/raw':>9} "
        f"{'cpu ms':>7} {'cpu/raw':>8}"
    )
    print(head)
    print("-" * len(head))
    for b, s in shapes:
        res = ez.launch(loop_rank, (b, s), loops, batches, world_size=2, timeout=900, threads=1)
        wall, cpu = _loop_means(res, loops, batches)
        for m in LOOP_METHODS:
            p50 = max(_quantile(r[m], 0.5) for r in res)
            p90 = max(_quantile(r[m], 0.9) for r in res)
            print(
                f"{b}x{s:<6} {m:<7} {p50 * 1e3:>8.3f} {p90 * 1e3:>8.3f} "
                f"{statistics.median(wall[m]) * 1e3:>8.3f} {_paired(wall, m):>8.2f}x "
                f"{statistics.median(cpu[m]) * 1e3:>7.3f} {_paired(cpu, m):>7.2f}x"
            )
        gcs = [r["gc"] for r in res]
        print(
            f"{b}x{s:<6} during the loader's loops: garbage collections by generation "
            f"{gcs} (per rank), receive buffers allocated {[r['allocated'] for r in res]}"
        )
    print(
        "(mean: a loop's wall time over its batches, the end of the epoch included, median "
        "over loops; mean/raw: the median over loops of the ratio of neighbouring loops; "
        "cpu: the CPU time the rank's process spent per batch, gloo's threads included)"
    )
    # What made the tail before: every thread of a rank pinned to one core.
    b, s = shapes[-1]
    res = ez.launch(loop_rank, (b, s), loops, batches, True, world_size=2, timeout=900, threads=1)
    wall, _ = _loop_means(res, loops, batches)
    p50 = max(_quantile(r["raw"], 0.5) for r in res)
    print(
        f"the same at {b}x{s} with every thread of a rank pinned to one core: raw's mean "
        f"{statistics.median(wall['raw']) * 1e3:.3f} ms (p50 {p50 * 1e3:.3f}), loader/raw "
        f"{_paired(wall, 'loader'):.2f}x: a hand-off between a rank's threads waits for the "
        "core, whole milliseconds that fall hardest on raw's tight loop"
    )


def _quantile(loops: list[list[float]], q: float) -> float:
    times = sorted(t for loop in loops for t in loop)
    return times[min(len(times) - 1, int(q * len(times)))]


def _print_profiles(profiles: dict) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=60, help="timed blocks per figure")
    parser.add_argument("--per-block", type=int, default=20, help="iterations per block")
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--loops", type=int, default=60, help="loops per method (0: none)")
    parser.add_argument("--loop-batches", type=int, default=50, help="batches per loop")
    args = parser.parse_args()

    rows, profiles = _measure(args.tp, args.blocks, args.per_block)
    _print_table(rows, args.blocks * args.per_block)
    _print_agreement(rows)
    if args.loops:
        _loop_table(SHAPES, args.loops, args.loop_batches)
    if profiles:
        _print_profiles(profiles)

    n, seq, batch = 10**6, 2048, 32
    mem = ez.launch(memory_rank, n, seq, batch, world_size=1, timeout=300, threads=1)[0]
    eager = n * (seq + 1) * 8
    print(
        f"\nRandomTokenDataset({n:.0e} samples x {seq} tokens): peak RSS +{mem['built'] / 2**20:.1f} MiB "
        f"to build; +{mem['read'] / 2**20:.1f} MiB after DistributedSampler setup and reading "
        f"10 batches of {batch}x{seq} (an eager dataset would hold {eager / 2**30:.1f} GiB)"
    )


if __name__ == "__main__":
    main()
