"""A launch after the notebook imported DTensor: our submodule filter against cloudpickle's list.

Notebooks 07 and 08 import ``torch.distributed.tensor``. cloudpickle then lists it
with every by-value function whose code names ``tensor`` and uses ``dist`` (any
``torch.tensor(...)`` call does), and each rank imports DTensor before the function
runs. ``ezpz_nb.launcher.submodules`` keeps only what the code reaches. Both paths
run here in one process, alternating, on the same 4-rank ``ez.launch``.

    python benchmarks/submodules.py [--repeats 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import cloudpickle
import torch
import torch.distributed as dist
import torch.distributed.tensor  # the state after notebook 07's first cells

import ezpz_nb as ez
from ezpz_nb.launcher import wire


def job() -> bool:
    """What a notebook cell sends: a collective on a tensor; True if DTensor got imported."""
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return any(m.endswith("distributed.tensor") for m in sys.modules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="launches per path")
    args = parser.parse_args()
    ours = wire._Pickler._dynamic_function_reduce
    baseline = cloudpickle.Pickler._dynamic_function_reduce
    times: dict[str, list[float]] = {"ezpz_nb (submodules.reached)": [], "cloudpickle's list": []}
    imported: dict[str, bool] = {}
    ez.launch(job, world_size=4)  # warm-up: the forkserver and its preloads
    for _ in range(args.repeats):
        for label, reduce in zip(times, (ours, baseline), strict=True):
            wire._Pickler._dynamic_function_reduce = reduce  # type: ignore[method-assign]
            start = time.perf_counter()
            imported[label] = all(ez.launch(job, world_size=4))
            times[label].append(time.perf_counter() - start)
    wire._Pickler._dynamic_function_reduce = ours  # type: ignore[method-assign]
    print(f"4-rank ez.launch after `import torch.distributed.tensor`, {args.repeats} each")
    print(f"{'path':<30} {'median s':>9} {'min s':>7} {'max s':>7}  ranks import DTensor")
    for label, ts in times.items():
        print(
            f"{label:<30} {statistics.median(ts):9.3f} {min(ts):7.3f} {max(ts):7.3f}  "
            f"{'yes' if imported[label] else 'no'}"
        )


if __name__ == "__main__":
    main()
