"""How long does a contract check take, beside the loader it checks? Prints one table.

The issue's target: ``check_contract`` of 4 ranks (dp=2 x tp=2) x 2 epochs x 100 steps
of a small loader in under 5 s. Beside it, on the same machine in the same run:

* loader alone: the same factory built and iterated for the same epochs in 4 fresh
  ranks by ``ez.launch``, nothing observed (the floor: starting ranks and loading);
* the check, cold: ``check_contract`` starting its own ranks (what a CI run pays);
* the check, warm: on a ``Cluster`` that is already up (``cluster=``), as notebook 13
  runs several checks;

and the per-step cost of observing a batch (ids, digest, structure, the record),
summed over the ranks' steps, against the time spent inside the loader. Each row is
the median of ``--repeat`` runs; the machine's load moves single runs by 2x.

Usage: ``.venv/bin/python benchmarks/verify.py [--repeat 3] [--steps 100]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ezpz_nb as ez
from ezpz_nb.verify import check_contract

BATCH = 8


class Tokens(Dataset):
    """``n`` samples of 64 int64 tokens, computed from the index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.arange(64) + i, "index": i}


def factory(steps: int):
    """A loader with ``steps`` batches of 8 per DP replica (dp=2)."""

    def make_loader(layout):
        ds = Tokens(2 * steps * BATCH)
        s = DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank, seed=0)
        return DataLoader(ds, batch_size=BATCH, sampler=s)

    return make_loader


def loader_alone(make_loader, epochs: int) -> int:
    """Build and iterate the loader in a rank, as the check does, observing nothing."""
    from ezpz_nb.data.distributed import forward_set_epoch
    from ezpz_nb.data.groups import make_layout

    loader = make_loader(make_layout(tp_size=2))
    n = 0
    for epoch in range(epochs):
        forward_set_epoch(loader, epoch)
        for _ in loader:
            n += 1
    return n


def _median(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    """Measure and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    make = factory(args.steps)
    ez.launch(lambda: 0, world_size=4)  # the forkserver's first start is not the check's
    alone, steps = _median(
        lambda: ez.launch(loader_alone, make, args.epochs, world_size=4), args.repeat
    )
    cold, report = _median(
        lambda: check_contract(make, "dp=2,tp=2", epochs=args.epochs), args.repeat
    )
    with ez.Cluster(world_size=4) as c:
        check_contract(make, "dp=2,tp=2", epochs=args.epochs, cluster=c)  # ranks' imports
        warm, _ = _median(
            lambda: check_contract(make, "dp=2,tp=2", epochs=args.epochs, cluster=c), args.repeat
        )
    assert report.ok, report.table()  # type: ignore[union-attr]
    secs = report.seconds  # type: ignore[union-attr]
    n_steps = sum(sum(s) for s in report.steps.values())  # type: ignore[union-attr]
    print(f"4 ranks (dp=2 x tp=2) x {args.epochs} epochs x {steps[0] // args.epochs} steps "
          f"of batches of {BATCH} x 64 int64; median of {args.repeat}\n")  # fmt: skip
    print("| what | seconds | vs loader alone |")
    print("|---|---|---|")
    for name, t in (
        ("loader alone (ez.launch)", alone),
        ("check, cold", cold),
        ("check, warm Cluster", warm),
    ):
        print(f"| {name} | {t:.2f} | {t / alone:.2f}x |")
    print(f"\nper step, summed over the ranks' {n_steps} steps (last cold run):")
    print("| inside the loader | observing | overhead |")
    print("|---|---|---|")
    per_load = secs["loader"] / n_steps * 1e6
    per_obs = secs["observe"] / n_steps * 1e6
    print(f"| {per_load:.0f} us | {per_obs:.0f} us | {per_obs / per_load:.0%} |")
    print(f"\ntarget: check under 5 s -> {'met' if cold < 5 else 'NOT met'} ({cold:.2f} s cold)")


if __name__ == "__main__":
    main()
