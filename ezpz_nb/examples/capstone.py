"""Capstone: a tiny language model trained with FSDP2 x TP, fed by the TP broadcast.

A small decoder (token and position embeddings, two pre-norm blocks of causal
attention and an MLP, a few tens of thousands of parameters) learns a
deterministic next-token rule on ``dp x tp`` ranks:

* ``parallelize_module`` splits each block over the **tp** mesh dimension
  (``ColwiseParallel`` for the query/key/value and the MLP's first layer,
  ``RowwiseParallel`` for the attention output and the MLP's second layer);
* ``fully_shard`` (FSDP2) shards every parameter over the **dp** dimension;
* ``get_random_dataset_fsdp_tp(..., broadcast_within_tp=True)`` shards the data
  over the DP replicas only, and only each TP group's leader loads.

Every step's loss goes to the ledger beside the samples that produced it, and
:func:`reference_losses` trains the same model on one process with the same
global batches: a sound run gives the same losses, step by step.

Break the data on purpose and watch the loss leave the reference:

* ``--shard-over world``: the sampler shards over all ranks (no ``dp_group``):
  half the samples are never seen;
* ``--rank-seeded --no-broadcast``: each rank's dataset is seeded by its rank,
  so TP peers compute on different tokens;
* ``--no-set-epoch``: every epoch repeats the first epoch's order.

``--reduce`` picks how FSDP2 reduces gradients over DP: ``avg`` (FSDP2's own
``ReduceOp.AVG`` for fp32), ``sum`` (``set_force_sum_reduction_for_comms``:
a SUM collective, then an explicit divide by the DP size) or ``auto`` (AVG
unless a one-off probe finds the backend's AVG does not average).

Run it::

    python -m torch.distributed.run --standalone --nproc_per_node=4 \\
        -m ezpz_nb.examples.capstone --out /tmp/capstone_ledger

or from a notebook: ``ez.launch(capstone.run, world_size=4, tp_size=2)``.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from ezpz_nb.data import get_random_dataset_fsdp_tp
from ezpz_nb.examples.command import cli_main
from ezpz_nb.examples.common import (
    SHARD_OVER,
    ShardOver,
    begin,
    device,
    record_epochs,
    to_device,
)
from ezpz_nb.ledger import Ledger

# The model and its data live in ezpz_nb.models; named here too, as notebook 08 reads them.
from ezpz_nb.models.rule_lm import SEQ, VOCAB, Attention, Block, CapstoneLM, RuleTokenDataset

__all__ = [
    "REDUCE",
    "SEQ",
    "VOCAB",
    "Attention",
    "Block",
    "RuleTokenDataset",
    "CapstoneLM",
    "avg_reduces_correctly",
    "main",
    "parallelize",
    "reference_losses",
    "run",
    "tp_plan",
]

Reduce = Literal["auto", "avg", "sum"]
REDUCE: tuple[str, ...] = get_args(Reduce)


def _new_model(model_seed: int) -> CapstoneLM:
    # Every rank and the reference build the same weights from the same seed.
    torch.manual_seed(model_seed)
    return CapstoneLM()


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # foreach=False: one code path for plain tensors and DTensors, so the
    # reference and the sharded run do the same arithmetic per parameter.
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=False)


def avg_reduces_correctly(group: Any = None) -> bool:
    """Probe the backend: does ``reduce_scatter`` with ``ReduceOp.AVG`` average?

    FSDP2 reduces fp32 gradients with ``ReduceOp.AVG``; gloo has been reported
    to sum instead (pytorch/pytorch#162338). One tiny collective tells.
    """
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    x = torch.full((n,), float(me + 1), device=device())
    out = torch.empty(1, device=device())
    # reduce_scatter_single is the newer name (torch 2.13 warns about the old one).
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    scatter(out, x, op=dist.ReduceOp.AVG, group=group)
    return math.isclose(out.item(), (n + 1) / 2, rel_tol=1e-6)


def tp_plan() -> dict[str, Any]:
    """The TP plan of one :class:`Block`: submodule name -> how it is split over ``tp``.

    ``ColwiseParallel`` shards a linear layer's output features (the query, key
    and value: whole heads; the MLP's first layer: hidden units) and hands on a
    local tensor sharded on its last dimension. ``RowwiseParallel`` shards the
    matching input features, so each rank's product is a partial sum; its output
    hook all-reduces the partial sums into the replicated result, one all-reduce
    after the attention and one after the MLP. Notebook 08 writes this plan out
    in its own cells and checks it equals this one.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(),
        "w1": ColwiseParallel(),
        "w2": RowwiseParallel(),
    }


def parallelize(model: CapstoneLM, mesh: Any, plan: dict[str, Any] | None = None) -> CapstoneLM:
    """TP inside each block over ``mesh["tp"]`` (``plan``, default :func:`tp_plan`), then FSDP2.

    ``fully_shard`` makes each block one FSDP2 unit over ``mesh["dp"]`` (its
    parameters gathered just before it runs), then the root takes the rest (the
    embeddings, the final norm, the head).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    if mesh["tp"].size() > 1:
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], tp_plan() if plan is None else plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def _loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))


def run(
    tp_size: int = 2,
    num_samples: int = 256,
    batch_size: int = 8,
    epochs: int = 3,
    lr: float = 1e-2,
    shard_over: ShardOver = "dp",
    rank_seeded: bool = False,
    broadcast: bool = True,
    set_epoch: bool = True,
    reduce: Reduce = "auto",
    model_seed: int = 0,
    seed: int = 1337,
    out: str | None = None,
    shard_model: Callable[[CapstoneLM, Any], nn.Module] | None = None,
) -> Ledger:
    """Train :class:`CapstoneLM` with FSDP2 over DP and TP over TP; log each step's loss.

    Call it on every rank (``ez.launch(run, world_size=4)`` or torchrun).

    Args:
        tp_size: Ranks per TP group; must divide the world size and the 4 heads.
        num_samples: Dataset length.
        batch_size: Samples per batch per DP replica (the global batch is
            ``batch_size * dp_size``).
        epochs: Passes over the data.
        lr: AdamW learning rate.
        shard_over: ``"dp"`` (right) or ``"world"`` (pitfall: no ``dp_group``).
        rank_seeded: Seed each rank's dataset with its rank (pitfall).
        broadcast: Only the TP leader loads and broadcasts.
        set_epoch: Reshuffle each epoch (False: the pitfall).
        reduce: ``"avg"``, ``"sum"`` or ``"auto"`` (see the module docstring).
        model_seed: Seed of the model's initial weights (the same on every rank).
        seed: Shuffle seed of the sampler.
        out: Folder to write this rank's ledger file to (``rank{r}.jsonl``).
        shard_model: ``f(model, mesh)`` that applies TP and FSDP2 and returns the
            model (default :func:`parallelize`); notebook 08 passes its own.

    Returns:
        This rank's :class:`~ezpz_nb.ledger.Ledger`, with the loss of every
        step (averaged over the DP replicas, so the same on every rank).
    """
    from torch.distributed.device_mesh import init_device_mesh

    if shard_over not in SHARD_OVER:
        raise ValueError(f"shard_over must be one of {SHARD_OVER}, got {shard_over!r}")
    if reduce not in REDUCE:
        raise ValueError(f"reduce must be one of {REDUCE}, got {reduce!r}")
    layout = begin(tp_size, out)
    dev = device()
    mesh = init_device_mesh(dev.type, (layout.dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    force_sum = reduce == "sum" or (
        reduce == "auto" and not avg_reduces_correctly(mesh.get_group("dp"))
    )
    model = (shard_model or parallelize)(_new_model(model_seed).to(dev), mesh)
    if force_sum:
        # SUM collectives, then FSDP2 divides by the DP size itself.
        model.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
    opt = _optimizer(model, lr)
    dataset = RuleTokenDataset(num_samples=num_samples, seed=dist.get_rank() if rank_seeded else 0)
    dp_group = mesh.get_group("dp")
    built = get_random_dataset_fsdp_tp(
        batch_size,
        VOCAB,
        SEQ,
        dataset=dataset,
        seed=seed,
        dp_group=dp_group if shard_over == "dp" else None,
        tp_group=mesh.get_group("tp"),
        broadcast_within_tp=broadcast,
    )

    def train(batch: Any, epoch: int, index: int) -> float:
        loss = _loss(model, to_device(batch, dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The run's loss is the mean over DP replicas (TP peers agree).
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=dp_group)
        return mean.item() / layout.dp_size

    with warnings.catch_warnings():
        # FSDP2 itself still calls the collective torch 2.13 renamed: not the learner's concern.
        warnings.filterwarnings(
            "ignore", message=".*reduce_scatter_tensor.* is deprecated", category=FutureWarning
        )
        return record_epochs(
            built["dataloader"], layout, epochs, out=out, set_epoch=set_epoch, step=train
        )


def reference_losses(
    dp_size: int = 2,
    num_samples: int = 256,
    batch_size: int = 8,
    epochs: int = 3,
    lr: float = 1e-2,
    model_seed: int = 0,
    seed: int = 1337,
) -> list[float]:
    """The losses of the same training on one process, with the same global batches.

    Step ``s`` trains on the union of what the ``dp_size`` replicas load at step
    ``s`` (``DistributedSampler`` with the same seed and epochs), so a sound
    ``run`` with ``batch_size`` per replica must give these losses. Needs no
    process group.
    """
    # One intra-op thread: matrices this small gain nothing from more, and on a
    # busy machine two threads made this loop 25x slower (1 s vs 29 s here).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference(dp_size, num_samples, batch_size, epochs, lr, model_seed, seed)
    finally:
        torch.set_num_threads(threads)


def _reference(
    dp_size: int,
    num_samples: int,
    batch_size: int,
    epochs: int,
    lr: float,
    model_seed: int,
    seed: int,
) -> list[float]:
    dataset = RuleTokenDataset(num_samples=num_samples, seed=0)
    model = _new_model(model_seed)
    opt = _optimizer(model, lr)
    losses = []
    samplers: list[DistributedSampler[Any]] = [
        DistributedSampler(
            dataset, num_replicas=dp_size, rank=d, shuffle=True, seed=seed, drop_last=True
        )
        for d in range(dp_size)
    ]
    for epoch in range(epochs):
        loaders = []
        for s in samplers:
            s.set_epoch(epoch)
            loaders.append(DataLoader(dataset, batch_size=batch_size, sampler=s, drop_last=True))
        for parts in zip(*loaders, strict=True):
            batch = {k: torch.cat([p[k] for p in parts]) for k in ("input_ids", "labels")}
            loss = _loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    return cli_main(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
