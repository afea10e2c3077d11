"""Notebook 08's exercise: run a TP plan on the capstone model and judge what it did.

``check_tp_plan(make_plan)`` trains the capstone's :class:`~ezpz_nb.models.CapstoneLM`
on 4 real ranks (FSDP2 over dp 2 x TP over tp 2) with the plan ``make_plan()``
returns, for a few steps, and compares every step's loss with one process
trained on the same global batches. A plan is right when the run matches that
reference and the plan really shards something over tp. A wrong plan either
stops the run (the rank's error and the layer it was in are reported) or runs
and moves the loss away from the reference (where, and whether the TP peers
still agree, are reported). The messages say what to look at, not which plan
to write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, wrong

if TYPE_CHECKING:
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["PLAN_RUN", "check_tp_plan"]

#: The run each plan is tried on: 2 steps per epoch over 2 DP replicas, 2 epochs.
PLAN_RUN = {"num_samples": 32, "batch_size": 8, "epochs": 2}
#: Relative tolerance against the fp32 reference on CPU (notebook 08 says why).
RTOL, ATOL = 1e-4, 1e-5


def job_tp_plan(make_plan: Callable[[], dict], size: dict[str, int]) -> Any:
    """One rank: train with ``make_plan()``; report its losses and what it holds, or where it broke.

    Returns ``("raised", module, error)`` when the run stopped (``module``: the
    innermost submodule of a block whose forward had begun), else ``("ran",
    losses, sharded)`` with the names of block 0's parameters split over tp.
    """
    import logging

    from ezpz_nb.examples import capstone

    # A plan that does not fit fails in DTensor's shape propagation, which logs the
    # whole traceback at ERROR level before raising: the verdict says it in one line.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    entered: list[str] = []
    sharded: list[str] = []

    def shard(model: Any, mesh: Any) -> Any:
        plan = make_plan()
        if not isinstance(plan, dict):
            raise TypeError(f"make_plan() returned {type(plan).__name__}, not a dict")
        block = model.blocks[0]
        named = [(n, m) for n, m in block.named_modules() if n]
        for name, mod in named:  # before TP's own input hooks, so a failing one is named
            mod.register_forward_pre_hook(
                lambda *_, n=name: entered.append(n) if n not in entered else None, prepend=True
            )
        capstone.parallelize(model, mesh, plan)
        for name, mod in named:  # after TP's output hooks: those may fail too
            mod.register_forward_hook(lambda *_, n=name: entered.remove(n))
        for name, p in block.named_parameters():
            placements: tuple[Any, ...] = getattr(p, "placements", ())
            # After fully_shard a TP-split parameter lives on the 2-D (dp, tp) mesh.
            if len(placements) == 2 and placements[1].is_shard():
                sharded.append(name)
        return model

    try:
        ledger = capstone.run(
            tp_size=2,
            reduce="avg",
            shard_model=shard,
            num_samples=size["num_samples"],
            batch_size=size["batch_size"],
            epochs=size["epochs"],
        )
    except NotImplementedError:
        raise  # the blank as shipped: "not done", not a plan that broke the run
    except Exception as exc:  # noqa: BLE001 - reported as the verdict; every rank fails alike
        where = entered[-1] if entered else None
        first = (str(exc).splitlines() or [""])[0][:300]
        return "raised", where, f"{type(exc).__name__}: {first}"
    return "ran", [loss for _, _, loss in ledger.losses()], sharded


def check_tp_plan(
    make_plan: Callable[[], dict[str, Any]],
    *,
    cluster: Any = None,
    timeout: float = 2 * CHECK_TIMEOUT,
) -> CheckResult:
    """Notebook 08: does the plan ``make_plan()`` returns train like one process?

    Runs the capstone on 4 ranks (dp 2 x tp 2) with the plan applied to every
    block, FSDP2 on top, and compares each step's loss with
    :func:`~ezpz_nb.examples.capstone.reference_losses` (``rtol=1e-4``, fp32 on
    CPU). Correct: every step matches and at least one layer is split over tp.

    Args:
        make_plan: Called on every rank; returns ``{submodule name: ParallelStyle}``
            for one block (as ``capstone.tp_plan()`` does).
        cluster: A warm 4-rank :class:`~ezpz_nb.Cluster` to run on (faster than
            fresh ranks; fresh ones when it was closed since).
        timeout: Seconds before the ranks are reported as hung.
    """
    from ezpz_nb.errors import EzpzError
    from ezpz_nb.examples import capstone

    # Here, not at the top: a rank imports this module for job_tp_plan (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    if cluster is not None and getattr(cluster, "world_size", None) != 4:
        raise EzpzError(
            f"check_tp_plan runs dp 2 x tp 2 and needs a 4-rank cluster, got {cluster!r}: "
            "pass ez.Cluster(world_size=4), or no cluster (fresh ranks)."
        )

    def body() -> str:
        got = run_learner(job_tp_plan, make_plan, PLAN_RUN, timeout=timeout, cluster=cluster)
        for r, out in enumerate(got):
            if out[0] == "raised":
                _, where, error = out
                place = f"in {where!r} of a block" if where else "before any block ran"
                raise wrong(
                    f"the run stopped: rank {r} raised, {place}, {error} "
                    "Look at what the layer before it hands over: a Colwise layer passes "
                    "on its output split on the last dimension, and the next layer must "
                    "expect that split."
                )
        reference = torch.tensor(capstone.reference_losses(dp_size=2, **PLAN_RUN))
        curves = [torch.tensor(out[1]) for out in got]
        if not torch.equal(curves[0], curves[1]):
            k = int((curves[0] != curves[1]).nonzero()[0])
            raise wrong(
                f"the run did not stop, but from step {k} TP peers 0 and 1 logged "
                f"different losses ({curves[0][k]:.4f} and {curves[1][k]:.4f}; one "
                f"process: {reference[k]:.4f}): each holds its own part of a result "
                "that was never combined. Look at where the partial sums of a "
                "row-split layer are added up (the output layouts)."
            )
        gap = (curves[0] - reference).abs()
        bad = gap > ATOL + RTOL * reference.abs()
        if bool(bad.any()):
            step = int(bad.nonzero()[0])
            raise wrong(
                f"the run did not stop, but its loss left the one-process reference at "
                f"step {step} ({curves[0][step]:.4f} vs {reference[step]:.4f}): the "
                "plan computes something other than the model. Look at each layer's "
                "input and output layouts."
            )
        sharded = got[0][2]
        if not sharded:
            raise wrong(
                "the loss matches the reference, but the plan splits nothing over tp: "
                "every rank holds every weight (that is data parallelism only). Shard "
                "at least one pair of layers."
            )
        return (
            f"every step's loss matched one process (largest gap {float(gap.max()):.1e}); "
            f"each TP rank holds half of {', '.join(sharded)}."
        )

    return judge("tp_plan", body)
