"""Launches in a real Jupyter kernel under each start method, with and without the pool.

Used by ``benchmarks/launch.py`` (its second table). Each measurement is one fresh
kernel started with ``EZPZ_NB_START_METHOD`` set (and ``EZPZ_NB_STANDBY=0`` for
"spawn, no pool"), one cell that imports ezpz_nb and then launches 4 ranks:

* first: the first launch, 4 s after the import (the learner reads the next cell),
  or, in the "once ready" kernel, as soon as the pool reports ready
* back-to-back: three launches in a row right after it (median)
* after refill: one more launch once the pool is full again (2 s later without a pool)
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

WORLD = 4

_CELL = """
import json, time
t0 = time.perf_counter()
import torch, torch.distributed as dist, psutil
import ezpz_nb as ez
from ezpz_nb.launcher.session import SESSION
POOL = SESSION.pool
imported = time.perf_counter()

def job():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()

def launch():
    t = time.perf_counter()
    ez.launch(job, world_size={world})
    return time.perf_counter() - t

ready = None
until = imported + 4.0
while {once_ready} and POOL.size and not POOL.ready():
    time.sleep(0.01)
while not {once_ready} and time.perf_counter() < until:
    if ready is None and POOL.size and POOL.ready():
        ready = time.perf_counter() - imported
    time.sleep(0.01)
if ready is None and POOL.size and POOL.ready():
    ready = time.perf_counter() - imported
pss = [psutil.Process(p).memory_full_info().pss / 2**20 for p in POOL.pids()]
at = time.perf_counter() - imported
first = launch()
back = [launch() for _ in range(3)]
if POOL.size:
    POOL.wait_ready(120)
else:
    time.sleep(2.0)
later = launch()
print("RESULT", json.dumps(dict(import_s=imported - t0, ready=ready, at=at, first=first,
      back=back, later=later, pss=pss, size=POOL.size)))
"""


def one_kernel(method: str, pool: bool, once_ready: bool, timeout: float = 240.0) -> dict | str:
    """One fresh kernel's figures (see the module docstring), or "failed"."""
    from jupyter_client import KernelManager

    env = dict(os.environ, EZPZ_NB_START_METHOD=method, EZPZ_NB_STANDBY="" if pool else "0")
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    out: list[str] = []
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive(
            _CELL.format(world=WORLD, once_ready=once_ready),
            timeout=timeout,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
        if reply["content"]["status"] != "ok":
            return "failed"
    except Exception:  # noqa: BLE001 - a cell that failed reads "failed"
        return "failed"
    finally:
        km.shutdown_kernel(now=False)
        kc.stop_channels()
    line = next((x for x in "".join(out).splitlines() if x.startswith("RESULT ")), None)
    return "failed" if line is None else json.loads(line.split(" ", 1)[1])


ROWS = (
    ("forkserver", False),
    ("fork", False),
    ("spawn", False),
    ("spawn", True),
)


def table(reps: int) -> list[str]:
    """The side-by-side table's lines: each row the median of ``reps`` fresh kernels."""

    def ms(x: Any) -> str:
        if x is None:
            return "-"
        if isinstance(x, str):
            return x
        return f"{x * 1000:.0f} ms" if x < 10 else f"{x:.1f} s"

    def med(runs: list[Any], key: str) -> float | str | None:
        got = [r[key] for r in runs if isinstance(r, dict)]
        if not got:
            return "failed"
        if key == "back":
            got = [statistics.median(g) for g in got]
        got = [g for g in got if g is not None]
        return statistics.median(got) if got else None

    lines = [
        "| start method | pool | ready after import | first launch at 4 s | first once ready "
        "| back-to-back | after refill | PSS per standby |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base: dict[str, Any] = {}
    for method, pool in ROWS:
        at4 = [one_kernel(method, pool, once_ready=False) for _ in range(reps)]
        ready_runs = (
            [one_kernel(method, pool, once_ready=True) for _ in range(reps)] if pool else []
        )
        row = {k: med(at4, k) for k in ("ready", "first", "back", "later")}
        once = med(ready_runs, "first") if pool else None
        sizes = [r["pss"] for r in at4 if isinstance(r, dict) and r["pss"]]
        pss = statistics.median(p for s in sizes for p in s) if sizes else None
        size = next((r["size"] for r in at4 if isinstance(r, dict)), 0)
        if method == "forkserver":
            base = row
        lines.append(
            f"| {method} | {f'{size} ranks' if pool else 'off'} | {ms(row['ready'])} | "
            f"{ms(row['first'])}{_vs(row['first'], base.get('first'))} | "
            f"{ms(once)}{_vs(once, base.get('first'))} | "
            f"{ms(row['back'])}{_vs(row['back'], base.get('back'))} | "
            f"{ms(row['later'])}{_vs(row['later'], base.get('later'))} | "
            f"{'-' if pss is None else f'{pss:.0f} MiB'} |"
        )
    return lines


def _vs(x: Any, base: Any) -> str:
    """`` (1.2x)``: against the forkserver's figure in the same run."""
    if isinstance(x, float) and isinstance(base, float) and base > 0 and x is not base:
        return f" ({x / base:.1f}x)"
    return ""
