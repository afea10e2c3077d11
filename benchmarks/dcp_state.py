"""How big and how slow is the loader's state in a DCP checkpoint, beside the model's? One table.

On ``dp 2 x tp 2`` gloo ranks (one warm ``ez.Cluster``), the capstone's CapstoneLM
(FSDP2 x TP) and its AdamW state, and a loader's
:class:`~ezpz_nb.data.checkpoint.LoaderCheckpoint` (place, generator, torch and
Python RNG), each saved alone with ``dcp.save`` and loaded back with
``dcp.load``, ``--repeats`` times. Per rank: the bytes DCP wrote for it (the
rank's ``.distcp`` file) and the median save and load times (rank 0's clock;
every save and load is collective).

Run: ``.venv/bin/python benchmarks/dcp_state.py [--repeats 5]``. Times on a
shared 2-core machine are noisy: trust the ratio, not the milliseconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch.distributed as dist

import ezpz_nb as ez


def _measure(root: str, repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    from ezpz_nb.data import LoaderCheckpoint, ShardStream
    from ezpz_nb.data.groups import Layout
    from ezpz_nb.examples.capstone import parallelize
    from ezpz_nb.examples.dcp_resume import ModelAndOptim
    from ezpz_nb.models import CapstoneLM, RuleTokenDataset

    warnings.filterwarnings("ignore")  # FSDP2's renamed collective; DCP's overwrite notice
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    layout = Layout(dist.get_rank(), 4, dp, 2, tp, 2, mesh.get_group("dp"), mesh.get_group("tp"))
    torch.manual_seed(0)
    model = parallelize(CapstoneLM(), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    batch = RuleTokenDataset(num_samples=4)[0]
    model(batch["input_ids"][None]).sum().backward()
    opt.step()  # AdamW's moments exist only after a step
    loader = ShardStream(RuleTokenDataset(num_samples=32), 2, dp, 2)
    next(iter(loader))
    parts = {
        "model + optimizer": {"app": ModelAndOptim(model, opt)},
        "loader (LoaderCheckpoint)": {"data": LoaderCheckpoint(loader, layout)},
    }
    out = {}
    for name, state in parts.items():
        path = os.path.join(root, name.split()[0])
        saves, loads = [], []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(state, checkpoint_id=path)
            saves.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            dcp.load(state, checkpoint_id=path)
            loads.append(time.perf_counter() - t0)
        mine = os.path.getsize(os.path.join(path, f"__{dist.get_rank()}_0.distcp"))
        out[name] = (mine, statistics.median(saves), statistics.median(loads))
    return out


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="ezpz-dcp-bench-")
    try:
        with ez.Cluster(world_size=4, timeout=300) as cluster:
            got = cluster.run(_measure, root, args.repeats)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("| state | bytes written per rank (ranks 0-3) | save, median | load, median |")
    print("|---|---|---|---|")
    for name in got[0]:
        sizes = ", ".join(str(g[name][0]) for g in got)
        _, save, load = got[0][name]
        print(f"| {name} | {sizes} | {save * 1e3:.1f} ms | {load * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
