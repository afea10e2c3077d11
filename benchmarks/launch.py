"""How fast does a cell get N gloo ranks? ezpz_nb against the bare minimum and the peers.

Prints one table, medians of REPS repetitions, at 2, 4 and 8 ranks, then a
scaling table of ezpz alone at 16, 32 and 64 ranks (``--scale``):

* ezpz launch, first call in a fresh process (imports excluded, forkserver start included)
* ezpz launch, later calls in the same process (cold ranks, warm forkserver)
* ezpz Cluster.run round trip (warm ranks), and the memory (PSS) of one rank
* ezpz first call in a real Jupyter kernel: the import cell, a 4 s pause (the
  learner reading), then the launch; with the forkserver warm-up at import (the
  default) and without it (``EZPZ_NB_WARMUP=0``)
* bare fork: os-level fork of N processes from this script, FileStore rendezvous,
  one all_reduce, results through a queue: the lower bound for fresh processes
* accelerate.notebook_launcher and torch.multiprocessing spawn, same job
* a second table: 4 ranks in a kernel under each start method (forkserver, fork,
  spawn, spawn with the standby pool): the first launch 4 s after the import and
  once the pool is ready, back-to-back launches, a launch after the pool's refill,
  and the memory (PSS) of one standby rank (see ``_methods.py``)

accelerate is installed for this benchmark only when missing (it is not a dependency).

Each cell is measured in a child process with a time limit (``--limit``): a
launcher that stalls (accelerate 1.16 did, at 4 and 8 ranks on 2 cores) reads "hung" in
its cell, one that fails reads "failed", and the table is still printed. What a
child leaves running is killed. To see that work, ``EZPZ_NB_BENCH_FAULT=spawn=hang,bare=fail``
makes those cells' children stall or fail on purpose (the tests do).

    python benchmarks/launch.py [--reps 5] [--sizes 2 4 8] [--scale 16 32 64]
                                [--no-peers] [--peers bare accelerate spawn] [--limit 120]
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

import _methods
import torch
import torch.distributed as dist
from _methods import table as start_methods_table
from _procs import kill_tagged, new_tag, run_limited


def job() -> float:
    """The benchmarked work: one all_reduce, return the result."""
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


# ------------------------------------------------------------------ bare fork


def _bare_rank(rank: int, world: int, store: str, q) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    q.put((rank, job()))
    dist.destroy_process_group()


def bare_fork(world: int) -> float:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        q = ctx.SimpleQueue()
        procs = [
            ctx.Process(target=_bare_rank, args=(r, world, os.path.join(tmp, "s"), q))
            for r in range(world)
        ]
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
        ctx = tmp_mp.start_processes(
            _spawn_rank,
            args=(world, os.path.join(tmp, "s"), q),
            nprocs=world,
            start_method="spawn",
            join=False,
        )
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
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "accelerate", pin],
        capture_output=True,
        text=True,
    )
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
        pids = c.run(os.getpid)
        c.run(job)
        for _ in range(max(20, reps)):
            t0 = time.perf_counter()
            c.run(job)
            warm.append(time.perf_counter() - t0)
        pss = statistics.mean(_pss_mib(pid) for pid in pids)
    return dict(first=[first], later=later, warm=warm, pss=[pss])


def _pss_mib(pid: int) -> float:
    """Proportional set size of one process (its share of pages shared with the others)."""
    import psutil

    return psutil.Process(pid).memory_full_info().pss / 2**20


_KERNEL_CODE = """import time
t0 = time.perf_counter()
ez.launch(job, world_size={world})
print("FIRST", time.perf_counter() - t0)"""


def kernel_first_call(world: int, warm_up: bool) -> float:
    """The first launch in a fresh Jupyter kernel, 4 s after ``import ezpz_nb``."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ, EZPZ_NB_WARMUP="1" if warm_up else "0"))
    kc = km.client()
    kc.start_channels()
    out: list[str] = []
    try:
        kc.wait_for_ready(timeout=60)
        prelude = (
            "import torch, torch.distributed as dist\nimport ezpz_nb as ez\n"
            "def job():\n    t = torch.ones(1)\n    dist.all_reduce(t)\n    return t.item()"
        )
        kc.execute_interactive(prelude, timeout=60)
        time.sleep(4.0)  # the learner reads the next cell
        kc.execute_interactive(
            _KERNEL_CODE.format(world=world),
            timeout=120,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
    finally:
        km.shutdown_kernel(now=False)
        kc.stop_channels()
    line = next(x for x in "".join(out).splitlines() if x.startswith("FIRST "))
    return float(line.split()[1])


# ------------------------------------------------------------------ cells in children

PEERS: dict[str, Callable[[int], float]] = {
    "bare": bare_fork,
    "accelerate": accelerate_launcher,
    "spawn": torch_spawn,
}


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
    elif name in ("kernel", "kernel-cold"):
        print(
            json.dumps({"times": [kernel_first_call(world, name == "kernel") for _ in range(reps)]})
        )
    else:
        torch.set_num_threads(1)
        print(json.dumps({"times": [PEERS[name](world) for _ in range(reps)]}))


def cell(name: str, world: int, reps: int, limit_s: float) -> dict[str, Any] | str:
    """One measurement in a fresh child: its times, or "hung" / "failed"."""
    tag = new_tag()
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        name,
        "--world",
        str(world),
        "--reps",
        str(reps),
    ]
    status, out, _ = run_limited(cmd, tag=tag, limit_s=limit_s)
    kill_tagged(tag)  # ranks a launcher left behind must not slow the next cell
    if status != 0:
        print(
            f"{name} at {world} ranks: {status if status == 'hung' else f'exit {status}'}"
            f"\n{out[-2000:]}",
            file=sys.stderr,
        )
        return "hung" if status == "hung" else "failed"
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--no-peers", action="store_true", help="skip accelerate and spawn")
    ap.add_argument(
        "--peers",
        nargs="+",
        choices=sorted(PEERS),
        default=sorted(PEERS),
        help="peer launchers to measure (bare fork is the ratio's base)",
    )
    ap.add_argument(
        "--limit",
        type=float,
        default=120.0,
        help="seconds one cell (all its repetitions) may take before it is 'hung'",
    )
    ap.add_argument(
        "--scale",
        type=int,
        nargs="*",
        default=[16, 32, 64],
        help="world sizes of the ezpz-only scaling table (none: skip it)",
    )
    ap.add_argument(
        "--kernel-reps",
        type=int,
        default=2,
        help="fresh kernels per first-call-in-a-kernel cell (0: skip)",
    )
    ap.add_argument(
        "--child", choices=["ezpz", "kernel", "kernel-cold", *sorted(PEERS)], help=argparse.SUPPRESS
    )
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

    def kernel_cell(name: str, world: int) -> float | str | None:
        if args.kernel_reps <= 0:
            return None
        got = cell(name, world, args.kernel_reps, args.limit)
        return got if isinstance(got, str) else med(got["times"])

    rows = []
    for world in args.sizes:
        ours = ezpz_cells(world)
        bare = measured("bare", world, args.reps)
        acc = measured("accelerate", world, args.reps)
        spawn = measured("spawn", world, max(1, min(args.reps, 3)))
        kernel = (kernel_cell("kernel", world), kernel_cell("kernel-cold", world))
        rows.append((world, ours, bare, acc, spawn, kernel))

    def ms(x: float | str | None) -> str:
        if x is None or isinstance(x, str):
            return x or "n/a"
        return f"{x * 1000:.0f} ms" if x >= 0.1 else f"{x * 1000:.1f} ms"

    def ratio(a: float | str | None, b: float | str | None, fmt: str) -> str:
        ok = isinstance(a, float) and isinstance(b, float)
        return fmt.format(a / b) if ok else "n/a"

    def of(ours: dict[str, float] | str, key: str) -> float | str:
        return ours if isinstance(ours, str) else ours[key]

    head = (
        "ranks",
        "ezpz first call",
        "kernel first call (warm-up / none)",
        "ezpz launch",
        "bare fork",
        "launch/bare",
        "notebook_launcher",
        "launch vs nl",
        "torch spawn",
        "Cluster.run warm",
    )
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for world, ours, bare, acc, spawn, (kwarm, kcold) in rows:
        print(
            f"| {world} | {ms(of(ours, 'first'))} | {ms(kwarm)} / {ms(kcold)} | "
            f"{ms(of(ours, 'later'))} | {ms(bare)} | "
            f"{ratio(of(ours, 'later'), bare, '{:.2f}x')} | {ms(acc)} | "
            f"{ratio(acc, of(ours, 'later'), '{:.1f}x faster')} | {ms(spawn)} | "
            f"{ms(of(ours, 'warm'))} |"
        )
    print(
        f"\nmedians of {args.reps} repetitions, each cell in a fresh process limited to "
        f"{args.limit:g} s; kernel first call: {args.kernel_reps} fresh kernel(s), the launch "
        f"4 s after `import ezpz_nb`; machine: {os.cpu_count()} cores, torch "
        f"{torch.__version__}. Targets: launch within 1.3x of bare fork and 1.5x faster than "
        "notebook_launcher; first call in a kernel <= 0.3 s; warm round trip <= 20 ms."
    )
    if args.kernel_reps > 0:
        print("\n" + "\n".join(start_methods_table(args.kernel_reps)))
        print(
            f"\n{_methods.WORLD} ranks in a fresh Jupyter kernel per cell (medians of "
            f"{args.kernel_reps}), EZPZ_NB_START_METHOD set, pool off with EZPZ_NB_STANDBY=0; "
            "(Nx): against the forkserver in this run. Target: spawn with the pool within "
            "1.5x of the forkserver once the pool is ready and after its refill."
        )
    if args.scale:
        print("\n| ranks | ezpz launch | Cluster.run warm | memory per rank (PSS) |")
        print("|---|---|---|---|")
        for world in args.scale:
            got = cell("ezpz", world, max(1, min(args.reps, 3)), args.limit)
            if isinstance(got, str):
                print(f"| {world} | {got} | {got} | {got} |")
                continue
            print(
                f"| {world} | {ms(med(got['later']))} | {ms(med(got['warm']))} | "
                f"{med(got['pss']):.1f} MiB |"
            )
        print("\nhow the cost grows with the ranks: ezpz alone, one fresh process per row")


if __name__ == "__main__":
    main()
