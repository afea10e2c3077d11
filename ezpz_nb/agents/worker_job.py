"""What notebook 14's worker leaves, and the layouts its checker runs it in.

* :func:`load_attempts`: the ledgers of every attempt of one elastic job
  (``OUT/attempt{n}/rank{r}.jsonl``), with the steps that a restart redid marked
  ``source="replayed"`` and kept apart from the steps that count.
* :func:`startup_lines`: each rank's startup line (``rank R local_rank L ...``).
* :func:`worker_from_notebook`: the worker file a notebook's ``%%writefile`` cells write.
* :class:`WorkerRun` and :func:`worker_runs`: the runs of
  :func:`ezpz_nb.agents.by_hand.check_worker` (layout, and where a rank is made to die).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ezpz_nb.agents.result import AgentRun
from ezpz_nb.ledger import Ledger, StepRecord

__all__ = [
    "CHECKPOINT_EVERY",
    "STARTUP",
    "WORKER_NAME",
    "Attempts",
    "WorkerRun",
    "attempt_number",
    "load_attempts",
    "startup_lines",
    "worker_from_notebook",
    "worker_runs",
]

#: The file notebook 14's ``%%writefile`` cells write.
WORKER_NAME = "torchrun_worker.py"

#: A rank's startup line; its groups: rank, local_rank, world_size, local_world_size, node,
#: attempt, device, gpu, dp, tp.
STARTUP = re.compile(
    r"rank (\d+) local_rank (\d+) world_size (\d+) local_world_size (\d+) node (\d+) "
    r"attempt (\d+) device (\S+) gpu (\d+) dp (\d+) tp (\d+)"
)


@dataclass
class Attempts:
    """An elastic job's ledgers, attempt by attempt, merged into one timeline.

    Attributes:
        counted: The steps that count: every step of the last attempt, and each
            earlier attempt's steps before the point the next attempt resumed from.
            Steps are numbered within the epoch across attempts.
        replayed: Steps an attempt took after the checkpoint that the next attempt
            resumed from: the restart redid them, so they do not count. Their
            ``source`` is ``"replayed"``.
        resumed: ``(attempt, epoch, steps)``: where each attempt started.
    """

    counted: Ledger
    replayed: Ledger
    resumed: list[tuple[int, int, int]]

    def exactly_once(self) -> bool:
        """True when, in every epoch, each DP replica's loader took each sample exactly once.

        Counted over the steps that count, on TP leaders only (their TP peers hold
        copies): all samples, none twice, none missing (``drop_last`` aside).
        """
        if not self.counted.ok:
            return False
        for epoch in self.counted.epochs():
            seen = [
                i
                for r in self.counted.records
                if r.epoch == epoch and r.tp_rank == 0
                for i in r.sample_ids
            ]
            if len(seen) != len(set(seen)):
                return False
        return True


def worker_from_notebook(notebook: str | Path) -> str:
    """The worker file a notebook's ``%%writefile`` cells write, as text.

    The cell ``%%writefile NAME`` starts the file and each ``%%writefile -a NAME``
    appends to it, as IPython does when the cells run in order. Used to run the
    notebook's own solution where no kernel runs (``make gpu-check``, the tests).

    Raises:
        ValueError: The notebook writes no such file.
    """
    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    text: str | None = None
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        first, _, rest = source.partition("\n")
        words = first.split()
        if cell["cell_type"] != "code" or not words or words[0] != "%%writefile":
            continue
        # IPython writes the cell's body as is, with a final newline.
        body = rest if rest.endswith("\n") else rest + "\n"
        text = (text or "") + body if "-a" in words[1:-1] else body
    if text is None:
        raise ValueError(f"{notebook} has no %%writefile cell")
    return text


def attempt_number(folder: Path) -> int:
    """``n`` of an ``attempt{n}`` folder."""
    return int(folder.name.removeprefix("attempt"))


def load_attempts(out: str | Path) -> Attempts:
    """Merge ``OUT/attempt{n}/`` ledgers of one job, marking the steps a restart redid.

    An attempt that resumed from ``(epoch e, k steps done)`` redid every step that
    earlier attempts took from step ``k`` of epoch ``e`` on: those move to
    :attr:`Attempts.replayed`. Its own steps of epoch ``e`` are renumbered from ``k``.

    Raises:
        FileNotFoundError: No ``attempt*`` folder with ledger files in ``out``.
    """
    folders = sorted(
        (f for f in Path(out).glob("attempt*") if f.is_dir() and any(f.glob("*.jsonl"))),
        key=attempt_number,
    )
    if not folders:
        raise FileNotFoundError(f"no attempt*/ folder with ledger files in {out}")
    counted: list[StepRecord] = []
    replayed: list[StepRecord] = []
    resumed: list[tuple[int, int, int]] = []
    complete: dict[int, bool] = {}
    sizes: list[int] = []
    for folder in folders:
        where = folder / "resumed.json"
        start = json.loads(where.read_text()) if where.exists() else {"epoch": 0, "steps": 0}
        epoch, steps = int(start["epoch"]), int(start["steps"])
        resumed.append((attempt_number(folder), epoch, steps))
        keep = []
        for r in counted:
            if (r.epoch, r.step) >= (epoch, steps):
                replayed.append(replace(r, source="replayed"))
            else:
                keep.append(r)
        part = Ledger.load(folder)
        counted = keep + [
            replace(r, step=r.step + steps) if r.epoch == epoch else r for r in part.records
        ]
        complete = dict(part.complete)
        if part.num_samples is not None:
            sizes.append(part.num_samples)
    size = max(sizes, default=None)
    return Attempts(Ledger(counted, size, complete), Ledger(replayed, size), resumed)


def startup_lines(source: AgentRun | str) -> dict[int, dict[str, str]]:
    """``{rank: {"local_rank": ..., "node": ..., ...}}`` from the ranks' startup lines.

    Args:
        source: A run (its output), or text such as a rank's ``--log-dir`` file.
            Lines torchrun prefixes (``[default0]:`` with ``--tee``) are read too.
    """
    names = ("rank", "local_rank", "world_size", "local_world_size", "node", "attempt",
             "device", "gpu", "dp", "tp")  # fmt: skip
    text = source if isinstance(source, str) else "\n".join(source.output)
    found: dict[int, dict[str, str]] = {}
    for m in STARTUP.finditer(text):
        found[int(m.group(1))] = dict(zip(names, m.groups(), strict=True))
    return found


#: Steps between the saved positions in the checker's runs (``--checkpoint-every``).
CHECKPOINT_EVERY = 2


@dataclass(frozen=True)
class WorkerRun:
    """One run of :func:`check_worker`: its layout, and the rank that dies in it.

    Attributes:
        nnodes: Simulated nodes.
        nproc: Ranks per node.
        tp: Ranks per TP group (consecutive ranks: TP innermost).
        crash: ``(rank, epoch, step)``: that rank is killed there once (SIGKILL, by the
            checker: :mod:`ezpz_nb.agents.crash_plan`), and torchrun restarts the job once.
        keep: ``(epoch, steps done)``: a position saved before the crash. The checker copies
            the output folder while every rank waits just after it, and puts the copy back
            before the crash: the restart must resume from there, the position its
            checkpoint holds, not from the last one saved before the crash.
        num_samples: The dataset's size (``--num-samples``).
    """

    nnodes: int
    nproc: int
    tp: int = 2
    crash: tuple[int, int, int] | None = None
    keep: tuple[int, int] | None = None
    num_samples: int = 48

    @property
    def world(self) -> int:
        """Ranks in the job."""
        return self.nnodes * self.nproc

    @property
    def attempts(self) -> int:
        """Attempts the job must have: 2 with a crash (one restart), else 1."""
        return 2 if self.crash else 1

    def group(self, rank: int) -> list[int]:
        """The TP group of ``rank``."""
        first = rank - rank % self.tp
        return list(range(first, first + self.tp))

    def spanning_leaders(self) -> set[int]:
        """The TP leaders whose group has ranks on two nodes or more."""
        return {
            g
            for g in range(0, self.world, self.tp)
            if g // self.nproc != (g + self.tp - 1) // self.nproc
        }

    def crash_text(self) -> str:
        """The crash, in words."""
        assert self.crash is not None
        rank, epoch, step = self.crash
        return f"rank {rank} died (SIGKILL) at epoch {epoch} step {step}"

    def name(self) -> str:
        """The run, in words: the start of each of its error messages."""
        text = f"{self.nnodes} node(s) x {self.nproc} rank(s), tp {self.tp}"
        return text + (f", {self.crash_text()}" if self.crash else "")


#: The second run's layouts (nodes, ranks per node, tp), one drawn per check: each has a tp
#: other than the first run's 2 (a worker that ignores --tp-size fails), and a TP leader that
#: is its node's last local rank in a group on one node, or a spanning group whose leader is
#: not (a warning keyed on the local rank fails). (2, 2, 4): [0..3] spans from local rank 0.
SECOND_LAYOUTS = ((1, 3, 1), (2, 2, 1), (2, 2, 4))


def worker_runs(backend: str, rng: random.Random | None = None) -> tuple[WorkerRun, ...]:
    """:func:`check_worker`'s runs, with the crash, the kept position and a layout drawn.

    Under gloo, first two nodes of 3 ranks at TP 2. The TP groups [0, 1] and [4, 5] stay on
    their node and [2, 3] spans both, though tp 2 is smaller than the 3 ranks per node (a
    warning keyed on tp > LOCAL_WORLD_SIZE misses it); DP 3, so a sampler not sharded over the
    replicas shows; rank 3 has LOCAL_RANK 0. A drawn rank dies at a drawn step between two
    saved positions, and torchrun restarts the job once; before it, the checker puts the
    output folder back as it was at a drawn earlier saved position: the restart must resume
    from there, with the attempt every rank agrees on, every sample once, on both nodes.
    Then one layout of :data:`SECOND_LAYOUTS`, no crash.

    Under nccl every simulated node takes GPUs of its own: with fewer than 6 GPUs, one node
    of 2 ranks (with the crash) and two nodes of 1 rank (the TP group across them).
    """
    rng = rng or random.Random()
    nnodes, nproc = 2, 3
    if backend == "nccl":
        import torch  # here: the gloo check on a laptop needs none of CUDA

        if torch.cuda.device_count() < 6:
            nnodes, nproc = 1, 2
    dp = nnodes * nproc // 2
    per_epoch = rng.choice((6, 8))  # steps of 4 samples per replica
    crash, keep = _crash_and_keep(rng, nnodes * nproc, per_epoch)
    first = WorkerRun(nnodes, nproc, crash=crash, keep=keep, num_samples=dp * 4 * per_epoch)
    if nnodes == 1:
        return first, WorkerRun(2, 1)
    return first, WorkerRun(*rng.choice(SECOND_LAYOUTS))


def _crash_and_keep(
    rng: random.Random, world: int, per_epoch: int
) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """A crash at an odd step (every rank is held there: crash_plan, so the last position
    saved is the even step before it, whatever the timing) and a kept position saved earlier
    than that one (in the crash's epoch, or in epoch 0 before a crash in epoch 1)."""
    pairs = [
        ((epoch, step), (e, kept))
        for epoch in (0, 1)
        for step in range(CHECKPOINT_EVERY + 1, per_epoch, CHECKPOINT_EVERY)
        for e in range(epoch + 1)
        for kept in range(CHECKPOINT_EVERY, per_epoch - 1, CHECKPOINT_EVERY)
        if (e, kept) < (epoch, step - 1)
    ]
    (epoch, step), keep = rng.choice(pairs)
    return (rng.randrange(world), epoch, step), keep
