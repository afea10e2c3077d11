"""What EZPZ_NB_PRELOAD buys: the CPU a fresh rank spends on its first optimizer and its first
DCP import, and what a script's first launch pays for it, side by side.

Each setting runs in a fresh Python (a forkserver is one per process): ``none`` (the
default), ``dcp`` (``EZPZ_NB_PRELOAD=torch.distributed.checkpoint``, what the test suite
sets) and ``dynamo+dcp`` (``torch._dynamo`` too). In each, ``--ranks`` ranks are
launched ``--launches`` times (fresh ranks each time, as a checker starts them); every rank
builds an SGD optimizer over a small model and imports ``torch.distributed.checkpoint``,
timing that with its own CPU clock (``time.process_time``). The table gives the median of
the ranks' CPU for that work, the first launch's wall time (the forkserver's start
included) and a later launch's.

    python benchmarks/preload.py [--ranks 4] [--launches 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SETTINGS = {
    "none": "",
    "dcp": "torch.distributed.checkpoint",
    "dynamo+dcp": "torch._dynamo torch.distributed.checkpoint",
}

_CHILD = """
import json, sys, time
import ezpz_nb as ez

def work():
    t = time.process_time()
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    model = torch.nn.Linear(8, 8)
    torch.optim.SGD(model.parameters(), lr=0.1)
    return time.process_time() - t

walls, cpus = [], []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    cpus += ez.launch(work, world_size=int(sys.argv[1]))
    walls.append(time.perf_counter() - t)
print(json.dumps({"walls": walls, "cpus": cpus}))
"""


def measure(preload: str, ranks: int, launches: int) -> dict[str, list[float]]:
    """One setting's launches in a fresh Python: their walls and the ranks' CPU seconds.
    Its temporary folder is its own, removed after (torch._dynamo's import makes a
    ``torchinductor_<user>`` folder there)."""
    with tempfile.TemporaryDirectory(prefix="ezpz-preload-") as tmp:
        env = {**os.environ, "EZPZ_NB_PRELOAD": preload, "TMPDIR": tmp}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(ranks), str(launches)],
            capture_output=True, text=True, env=env, timeout=600, check=True,
        )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--launches", type=int, default=3)
    args = parser.parse_args()
    if args.launches < 2:
        parser.error("--launches must be 2 or more (the first launch and a later one)")
    print(f"{args.ranks} ranks, {args.launches} launches of fresh ranks per setting")
    print(f"{'EZPZ_NB_PRELOAD':<16} {'rank CPU, optimizer + DCP import':>34} "
          f"{'first launch':>13} {'later launch':>13}")  # fmt: skip
    for name, preload in SETTINGS.items():
        got = measure(preload, args.ranks, args.launches)
        cpu = statistics.median(got["cpus"])
        later = statistics.median(got["walls"][1:])
        print(f"{name:<16} {cpu:>32.2f} s {got['walls'][0]:>11.2f} s {later:>11.2f} s")


if __name__ == "__main__":
    main()
