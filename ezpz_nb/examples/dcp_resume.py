"""Train, save model, optimizer and loader in one DCP checkpoint, get killed, resume elsewhere.

The capstone's :class:`~ezpz_nb.models.CapstoneLM` trains with FSDP2 over
the DP ranks (``--tp-size`` > 1 adds TP) on a
:class:`~ezpz_nb.data.resumable.GlobalOrderLoader`, whose place is one global
``consumed_samples``. At step ``--save-at`` every rank writes one
``torch.distributed.checkpoint`` save: its model and optimizer shards (through
``get_state_dict``) and the loader's state through
:class:`~ezpz_nb.data.checkpoint.LoaderCheckpoint` (``--design reshard``: the
global counter; ``refuse``: one place per DP rank). With ``--kill`` rank 0 then
kills itself (SIGKILL), as a preemption would, and torchrun stops the others.

Resume with another ``--nproc_per_node``: DCP re-shards the model's and the
optimizer's DTensors to the new mesh, and the loader cuts the rest of the same
global order over the new DP ranks (or, under ``refuse``, the job stops with
what differs). The two runs' ledgers join with no sample repeated or skipped::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.dcp_resume --out /tmp/a --checkpoint /tmp/ckpt --save-at 3 --kill
    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        -m ezpz_nb.examples.dcp_resume --out /tmp/b --resume-from /tmp/ckpt

On NCCL the same commands run with ``--backend nccl`` (one GPU per rank); DCP's
files must then be on a filesystem every node sees.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ezpz_nb.data.checkpoint import LoaderCheckpoint
from ezpz_nb.data.resumable import GlobalOrderLoader
from ezpz_nb.examples.capstone import avg_reduces_correctly, parallelize
from ezpz_nb.examples.command import UsageError, cli_main
from ezpz_nb.examples.common import begin, device, record_epochs, to_device
from ezpz_nb.ledger import Ledger
from ezpz_nb.models import CapstoneLM, RuleTokenDataset

__all__ = ["ModelAndOptim", "check_args", "join", "main", "run"]


class ModelAndOptim:
    """A ``Stateful`` for ``dcp``: this rank's DTensor shards of the model and optimizer."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.model, self.opt = model, opt

    def state_dict(self) -> dict[str, Any]:
        """``{"model", "optim"}`` from DCP's ``get_state_dict`` (sharded, re-shardable)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put what ``dcp.load`` read back into the model and optimizer."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )


def check_args(
    tp_size: int = 1,
    num_samples: int = 48,
    batch_size: int = 2,
    epochs: int = 1,
    *,
    save_at: int = 0,
    checkpoint: str | None = None,
    kill: bool = False,
    resume_from: str | None = None,
    **_: Any,
) -> None:
    """Refuse options that cannot work, before any process group starts (see :func:`run`).

    The world size is torchrun's ``WORLD_SIZE`` (1 outside torchrun).

    Raises:
        UsageError: What is wrong and what to pass instead.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sizes = {"--tp-size": tp_size, "--num-samples": num_samples, "--batch-size": batch_size,
             "--epochs": epochs}  # fmt: skip
    bad = [f"{k} {v}" for k, v in sizes.items() if v < 1] + (["--save-at"] if save_at < 0 else [])
    if bad:
        raise UsageError(f"{', '.join(bad)}: must be at least 1 (--save-at at least 0)")
    if world % tp_size:
        raise UsageError(f"--tp-size {tp_size} does not divide the {world} ranks into TP groups")
    if save_at and not checkpoint:
        raise UsageError("--save-at needs --checkpoint DIR (where to write the checkpoint)")
    if checkpoint and not save_at:
        raise UsageError("--checkpoint DIR needs --save-at N (after how many steps to save)")
    if kill and not save_at:
        raise UsageError("--kill needs --save-at N (it kills rank 0 right after that save)")
    steps = num_samples // (batch_size * (world // tp_size)) * epochs
    if save_at > steps:
        raise UsageError(
            f"--save-at {save_at}: this run takes only {steps} steps ({num_samples} samples, "
            f"{batch_size} per DP rank, {world // tp_size} DP ranks, {epochs} epoch(s))"
        )
    if resume_from and not os.path.isfile(os.path.join(resume_from, ".metadata")):
        raise UsageError(
            f"--resume-from {resume_from}: no DCP checkpoint there (no .metadata file); "
            "pass the --checkpoint DIR a run saved to"
        )


def run(
    tp_size: int = 1,
    num_samples: int = 48,
    batch_size: int = 2,
    epochs: int = 1,
    seed: int = 3,
    design: Literal["reshard", "refuse"] = "reshard",
    save_at: int = 0,
    checkpoint: str | None = None,
    kill: bool = False,
    resume_from: str | None = None,
    out: str | None = None,
) -> Ledger:
    """Train, save at ``save_at`` (and maybe die there), or resume from ``resume_from``.

    Args:
        tp_size: Ranks per TP group (1: FSDP2 over every rank).
        num_samples: Dataset length.
        batch_size: Samples per step per DP rank.
        epochs: Passes over the data.
        seed: Seed of the global order.
        design: ``"reshard"`` (a global counter) or ``"refuse"`` (per-DP-rank places).
        save_at: Save after this many steps of the first epoch run (0: never).
        checkpoint: Folder to write the DCP checkpoint to.
        kill: After saving, rank 0 kills itself with SIGKILL (a preemption).
        resume_from: A checkpoint folder to load before training.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    check_args(tp_size, num_samples, batch_size, epochs, save_at=save_at,
               checkpoint=checkpoint, kill=kill, resume_from=resume_from)  # fmt: skip
    layout = begin(tp_size, out)
    dev = device()
    mesh = init_device_mesh(dev.type, (layout.dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize(CapstoneLM().to(dev), mesh)
    if not avg_reduces_correctly(mesh.get_group("dp")):
        model.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    loader = GlobalOrderLoader(
        RuleTokenDataset(num_samples=num_samples), batch_size, layout.dp_rank, layout.dp_size,
        seed=seed, mask_rate=0.25, rng="per-sample" if design == "reshard" else "per-rank",
    )  # fmt: skip
    state = {
        "app": ModelAndOptim(model, opt),
        "data": LoaderCheckpoint(loader, layout, on_new_layout=design),
    }
    first = 0
    if resume_from:
        state["data"].prepare_load(resume_from)  # type: ignore[attr-defined]
        dcp.load(state, checkpoint_id=resume_from)
        first = loader.epoch
    taken = 0

    def step(batch: Any, epoch: int, index: int) -> float:
        nonlocal taken
        batch = to_device(batch, dev)
        logits = model(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        taken += 1
        if taken == save_at:
            dcp.save(state, checkpoint_id=checkpoint)
            if kill:
                dist.barrier()  # the checkpoint is complete on every rank
                if dist.get_rank() == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=mesh.get_group("dp"))
        return mean.item() / layout.dp_size

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # FSDP2's renamed collective
        # set_epoch(first) keeps a loaded place: it is the epoch the state was saved in.
        loader.set_epoch(first)
        return record_epochs(loader, layout, epochs - first, out=out, set_epoch=False, step=step)


def join(*folders: str, num_samples: int = 48) -> tuple[int, int]:
    """``(repeated, never seen)`` over the ledgers of a killed run and its resumes.

    One TP leader per DP rank counts (TP peers hold the same samples).
    """
    import collections

    counts = collections.Counter(
        i
        for folder in folders
        for r in Ledger.load(folder).records
        if r.tp_rank == 0
        for i in r.sample_ids
    )
    return sum(n - 1 for n in counts.values()), num_samples - len(counts)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv, check_args=check_args)


if __name__ == "__main__":
    sys.exit(main())
