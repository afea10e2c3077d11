"""How fast does a cell get N gloo ranks? ezpz_nb against the bare minimum and the peers.

Prints one table, medians of REPS repetitions, at 2, 4 and 8 ranks:

* ezpz launch, first call in a fresh process (imports excluded, forkserver start included)
* ezpz launch, later calls in the same process (cold ranks, warm forkserver)
* ezpz Cluster.run round trip (warm ranks)
* bare fork: os-level fork of N processes from this script, FileStore rendezvous,
  one all_reduce, results through a queue: the lower bound for fresh processes
* accelerate.notebook_launcher and torch.multiprocessing spawn, same job

accelerate is installed for this benchmark only when missing (it is not a dependency).

    python benchmarks/launch.py [--reps 5] [--sizes 2 4 8] [--no-peers]
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

import torch
import torch.distributed as dist


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

FRESH = """
import json, sys, time
import torch, torch.distributed as dist
import ezpz_nb as ez
def job():
    t = torch.ones(1); dist.all_reduce(t); return t.item()
world = int(sys.argv[1])
t0 = time.perf_counter(); ez.launch(job, world_size=world); first = time.perf_counter() - t0
later = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter(); ez.launch(job, world_size=world); later.append(time.perf_counter() - t0)
warm = []
with ez.Cluster(world) as c:
    c.run(job)
    for _ in range(max(20, int(sys.argv[2]))):
        t0 = time.perf_counter(); c.run(job); warm.append(time.perf_counter() - t0)
print(json.dumps(dict(first=first, later=later, warm=warm)))
"""


def ezpz(world: int, reps: int) -> dict[str, float]:
    firsts, later, warm = [], [], []
    for _ in range(reps):
        out = subprocess.run([sys.executable, "-c", FRESH, str(world), str(reps)],
                             capture_output=True, text=True, check=True)
        data = json.loads(out.stdout.strip().splitlines()[-1])
        firsts.append(data["first"])
        later += data["later"]
        warm += data["warm"]
    med = statistics.median
    return dict(first=med(firsts), later=med(later), warm=med(warm))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--no-peers", action="store_true", help="skip accelerate and spawn")
    args = ap.parse_args()
    torch.set_num_threads(1)
    have_acc = not args.no_peers and ensure_accelerate()
    med = statistics.median
    rows = []
    for world in args.sizes:
        ours = ezpz(world, args.reps)
        bare = med([bare_fork(world) for _ in range(args.reps)])
        acc = med([accelerate_launcher(world) for _ in range(args.reps)]) if have_acc else None
        spawn = (med([torch_spawn(world) for _ in range(max(1, min(args.reps, 3)))])
                 if not args.no_peers else None)
        rows.append((world, ours, bare, acc, spawn))

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x * 1000:.0f} ms" if x >= 0.1 else f"{x * 1000:.1f} ms"

    head = ("ranks", "ezpz first call", "ezpz launch", "bare fork", "launch/bare",
            "notebook_launcher", "launch vs nl", "torch spawn", "Cluster.run warm")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for world, ours, bare, acc, spawn in rows:
        ratio = ours["later"] / bare
        vs_acc = f"{acc / ours['later']:.1f}x faster" if acc else "n/a"
        print(f"| {world} | {ms(ours['first'])} | {ms(ours['later'])} | {ms(bare)} | "
              f"{ratio:.2f}x | {ms(acc)} | {vs_acc} | {ms(spawn)} | {ms(ours['warm'])} |")
    print(f"\nmedians of {args.reps} repetitions; machine: {os.cpu_count()} cores, "
          f"torch {torch.__version__}. Targets: launch within 1.3x of bare fork and 1.5x "
          "faster than notebook_launcher; first call <= 3 s; warm round trip <= 20 ms.")


if __name__ == "__main__":
    main()
