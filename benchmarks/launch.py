"""How fast does a cell get N gloo ranks? ezpz_nb against the bare minimum and the peers.

Prints one table, medians of REPS repetitions, at 2, 4 and 8 ranks:

* ezpz launch, first call in a fresh process (imports excluded, forkserver start included)
* ezpz launch, later calls in the same process (cold ranks, warm forkserver)
* ezpz Cluster.run round trip (warm ranks)
* bare fork: os-level fork of N processes from this script, FileStore rendezvous,
  one all_reduce, results through a queue: the lower bound for fresh processes
* accelerate.notebook_launcher and torch.multiprocessing spawn, same job

accelerate is installed for this benchmark only when missing (it is not a dependency).

Each cell is measured in a child process with a time limit (``--limit``): a
launcher that stalls (accelerate's did, at 8 ranks on 2 cores) reads "hung" in
its cell, one that fails reads "failed", and the table is still printed. What a
child leaves running is killed. To see that work, ``EZPZ_NB_BENCH_FAULT=spawn=hang,bare=fail``
makes those cells' children stall or fail on purpose (the tests do).

    python benchmarks/launch.py [--reps 5] [--sizes 2 4 8] [--no-peers]
                                [--peers bare accelerate spawn] [--limit 120]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from _procs import kill_tagged, new_tag, run_limited


def job() -> float:
    """The benchmarked work: one all_reduce, return the result."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


# ------------------------------------------------------------------ bare fork

def _bare_rank(rank: int, world: int, store: str, q) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                            world_size=world)
    q.put((rank, job()))
    dist.destroy_process_group()


def bare_fork(world: int) -> float:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        q = ctx.SimpleQueue()
        procs = [ctx.Process(target=_bare_rank, args=(r, world, os.path.join(tmp, "s"), q))
                 for r in range(world)]
        for p in procs:
            p.start()
        results = dict(q.get() for _ in range(world))
        for p in procs:
            p.join()
    assert len(results) == world
    return time.perf_counter() - t0


# ------------------------------------------------------------------ torch spawn

def _spawn_rank(rank: int, world: int, store: str, q) -> None:
    _bare_rank(rank, world, store, q)


def torch_spawn(world: int) -> float:
    import torch.multiprocessing as tmp_mp

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        q = tmp_mp.get_context("spawn").SimpleQueue()
        ctx = tmp_mp.start_processes(_spawn_rank, args=(world, os.path.join(tmp, "s"), q),
                                     nprocs=world, start_method="spawn", join=False)
        results = [q.get() for _ in range(world)]
        ctx.join()
    assert len(results) == world
    return time.perf_counter() - t0


# ------------------------------------------------------------------ accelerate

def _acc_rank(q) -> None:
    dist.init_process_group("gloo")
    q.put((dist.get_rank(), job()))
    dist.destroy_process_group()


def accelerate_launcher(world: int) -> float:
    import multiprocessing as mp

    from accelerate import notebook_launcher

    q = mp.get_context("fork").SimpleQueue()
    t0 = time.perf_counter()
    notebook_launcher(_acc_rank, (q,), num_processes=world, use_port=str(_free_port()))
    results = [q.get() for _ in range(world)]
    assert len(results) == world
    return time.perf_counter() - t0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_accelerate() -> bool:
    if importlib.util.find_spec("accelerate") is not None:
        return True
    print("installing accelerate for this benchmark only...", file=sys.stderr)
    pin = f"torch=={torch.__version__.split('+')[0]}"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "accelerate", pin],
                          capture_output=True, text=True)
    return proc.returncode == 0


# ------------------------------------------------------------------ ezpz_nb

def ezpz(world: int, reps: int) -> dict[str, list[float]]:
    """First launch, later launches and warm Cluster.run round trips, in this process."""
    import ezpz_nb as ez

    t0 = time.perf_counter()
    ez.launch(job, world_size=world)
    first = time.perf_counter() - t0
    later, warm = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        ez.launch(job, world_size=world)
        later.append(time.perf_counter() - t0)
    with ez.Cluster(world) as c:
        c.run(job)
        for _ in range(max(20, reps)):
            t0 = time.perf_counter()
            c.run(job)
            warm.append(time.perf_counter() - t0)
    return dict(first=[first], later=later, warm=warm)


# ------------------------------------------------------------------ cells in children

PEERS: dict[str, Callable[[int], float]] = {
    "bare": bare_fork, "accelerate": accelerate_launcher, "spawn": torch_spawn}


def _injected_fault(name: str) -> str | None:
    spec = os.environ.get("EZPZ_NB_BENCH_FAULT", "")
    return dict(item.split("=", 1) for item in spec.split(",") if "=" in item).get(name)


def child(name: str, world: int, reps: int) -> None:
    """Measure one cell in this (fresh) process and print its times as JSON."""
    fault = _injected_fault(name)
    if fault == "hang":
        time.sleep(1e6)
    elif fault == "fail":
        raise SystemExit(f"{name}: failing on purpose (EZPZ_NB_BENCH_FAULT)")
    if name == "ezpz":
        print(json.dumps(ezpz(world, reps)))
    else:
        torch.set_num_threads(1)
        print(json.dumps({"times": [PEERS[name](world) for _ in range(reps)]}))


def cell(name: str, world: int, reps: int, limit_s: float) -> dict[str, Any] | str:
    """One measurement in a fresh child: its times, or "hung" / "failed"."""
    tag = new_tag()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--world", str(world),
           "--reps", str(reps)]
    status, out, _ = run_limited(cmd, tag=tag, limit_s=limit_s)
    kill_tagged(tag)  # ranks a launcher left behind must not slow the next cell
    if status != 0:
        print(f"{name} at {world} ranks: {status if status == 'hung' else f'exit {status}'}"
              f"\n{out[-2000:]}", file=sys.stderr)
        return "hung" if status == "hung" else "failed"
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--no-peers", action="store_true", help="skip accelerate and spawn")
    ap.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=sorted(PEERS),
                    help="peer launchers to measure (bare fork is the ratio's base)")
    ap.add_argument("--limit", type=float, default=120.0,
                    help="seconds one cell (all its repetitions) may take before it is 'hung'")
    ap.add_argument("--child", choices=["ezpz", *sorted(PEERS)], help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.world, args.reps)
        return
    peers = set(args.peers) - ({"accelerate", "spawn"} if args.no_peers else set())
    if "accelerate" in peers and not ensure_accelerate():
        peers.discard("accelerate")
    med = statistics.median

    def measured(name: str, world: int, reps: int) -> float | str | None:
        if name not in peers:
            return None
        got = cell(name, world, reps, args.limit)
        return got if isinstance(got, str) else med(got["times"])

    def ezpz_cells(world: int) -> dict[str, float] | str:
        # A first call is only first in a fresh process: one child per repetition.
        merged: dict[str, list[float]] = {}
        for _ in range(args.reps):
            got = cell("ezpz", world, args.reps, args.limit)
            if isinstance(got, str):
                return got
            for k, v in got.items():
                merged.setdefault(k, []).extend(v)
        return {k: med(v) for k, v in merged.items()}

    rows = []
    for world in args.sizes:
        ours = ezpz_cells(world)
        bare = measured("bare", world, args.reps)
        acc = measured("accelerate", world, args.reps)
        spawn = measured("spawn", world, max(1, min(args.reps, 3)))
        rows.append((world, ours, bare, acc, spawn))

    def ms(x: float | str | None) -> str:
        if x is None or isinstance(x, str):
            return x or "n/a"
        return f"{x * 1000:.0f} ms" if x >= 0.1 else f"{x * 1000:.1f} ms"

    def ratio(a: float | str | None, b: float | str | None, fmt: str) -> str:
        ok = isinstance(a, float) and isinstance(b, float)
        return fmt.format(a / b) if ok else "n/a"

    head = ("ranks", "ezpz first call", "ezpz launch", "bare fork", "launch/bare",
            "notebook_launcher", "launch vs nl", "torch spawn", "Cluster.run warm")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for world, ours, bare, acc, spawn in rows:
        def of(key: str, ours: dict[str, float] | str = ours) -> float | str:
            return ours if isinstance(ours, str) else ours[key]

        print(f"| {world} | {ms(of('first'))} | {ms(of('later'))} | {ms(bare)} | "
              f"{ratio(of('later'), bare, '{:.2f}x')} | {ms(acc)} | "
              f"{ratio(acc, of('later'), '{:.1f}x faster')} | {ms(spawn)} | {ms(of('warm'))} |")
    print(f"\nmedians of {args.reps} repetitions, each cell in a fresh process limited to "
          f"{args.limit:g} s; machine: {os.cpu_count()} cores, torch {torch.__version__}. "
          "Targets: launch within 1.3x of bare fork and 1.5x faster than notebook_launcher; "
          "first call <= 3 s; warm round trip <= 20 ms.")


if __name__ == "__main__":
    main()
