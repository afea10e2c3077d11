"""Notebook 14's worker file, checked from outside: its ledgers, its attempts, its startup.

The learner writes a complete torchrun worker (``torchrun_worker.py``). This module
reads what such a worker leaves and runs it the way a checker must, under real
torchrun agents (:mod:`ezpz_nb.agents.agents`):

* :func:`load_attempts`: the ledgers of every attempt of one elastic job
  (``OUT/attempt{n}/rank{r}.jsonl``), with the steps that a restart redid marked
  ``source="replayed"`` and kept apart from the steps that count.
* :func:`startup_lines`: each rank's startup line (``rank R local_rank L ...``).
* :func:`check_worker`: run the learner's file as two simulated nodes of 2 ranks and of
  1 rank, and raise :class:`WorkerCheckError` saying what to look at when a rank's
  identity, the GPU it would take, its DP x TP place, its data, or the spans-nodes
  warning is wrong.

The worker's side of the contract (what the notebook's solution does): each rank
prints ``rank R local_rank L world_size W local_world_size LW node N attempt A
device D gpu G dp P tp T`` once (``G``: the GPU it takes under nccl, worked out under gloo
too), records its steps with :func:`ezpz_nb.ledger.record` into
``OUT/attempt{A}/rank{R}.jsonl``, rank 0 writes ``OUT/attempt{A}/resumed.json``
(``{"epoch": e, "steps": k}``, where the attempt started), and a TP leader whose
group spans nodes warns with the words "spans nodes". The attempt ``A`` is one that
every rank agrees on (rank 0 decides and broadcasts it), not
``TORCHELASTIC_RESTART_COUNT``, which each node's agent counts for itself.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from ezpz_nb.agents.agents import AgentRun, check_worker_file, torchrun
from ezpz_nb.errors import EzpzError
from ezpz_nb.ledger import Ledger, StepRecord

__all__ = [
    "WORKER_NAME",
    "Attempts",
    "WorkerCheckError",
    "check_worker",
    "load_attempts",
    "startup_lines",
    "worker_from_notebook",
    "worker_runs",
]

#: The file notebook 14's ``%%writefile`` cells write.
WORKER_NAME = "torchrun_worker.py"

_STARTUP = re.compile(
    r"rank (\d+) local_rank (\d+) world_size (\d+) local_world_size (\d+) node (\d+) "
    r"attempt (\d+) device (\S+) gpu (\d+) dp (\d+) tp (\d+)"
)


class WorkerCheckError(EzpzError, AssertionError):
    """The learner's worker file does not do what the notebook asks; says what to look at."""


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


def _attempt_number(folder: Path) -> int:
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
        key=_attempt_number,
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
        resumed.append((_attempt_number(folder), epoch, steps))
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
    for m in _STARTUP.finditer(text):
        found[int(m.group(1))] = dict(zip(names, m.groups(), strict=True))
    return found


def _fail(case: str, what: str, run: AgentRun | None = None) -> WorkerCheckError:
    tail = ""
    if run is not None:
        lines = [ln for out in run.output for ln in out.splitlines()][-15:]
        tail = "\nLast lines of its output:\n" + "\n".join(lines)
    return WorkerCheckError(f"{case}: {what}{tail}")


def _expect_identity(case: str, run: AgentRun, nnodes: int, nproc: int, backend: str) -> None:
    world = nnodes * nproc
    seen = startup_lines(run)
    if sorted(seen) != list(range(world)):
        raise _fail(
            case,
            f"expected one startup line per rank 0..{world - 1}, got ranks "
            f"{sorted(seen)}: does every rank print it, once, after init?",
            run,
        )
    for rank, got in seen.items():
        want = {
            "local_rank": str(rank % nproc),
            "world_size": str(world),
            "local_world_size": str(nproc),
            "node": str(rank // nproc),
        }
        for key, value in want.items():
            if got[key] != value:
                raise _fail(
                    case,
                    f"rank {rank} says {key} {got[key]}, but torchrun gave it "
                    f"{value}: read it from the environment variable torchrun sets "
                    f"({key.upper() if key != 'node' else 'GROUP_RANK'})",
                    run,
                )
        if got["gpu"] != got["local_rank"]:
            raise _fail(
                case,
                f"rank {rank} would take GPU {got['gpu']}, but it is local rank "
                f"{got['local_rank']} of node {got['node']}: pick the GPU with LOCAL_RANK (the "
                "GPUs are numbered on each node; RANK counts every node's)",
                run,
            )
        device = "cpu" if backend == "gloo" else f"cuda:{got['local_rank']}"
        if got["device"] != device:
            raise _fail(
                case,
                f"rank {rank} works on {got['device']}, expected {device} "
                "(under nccl: the GPU numbered LOCAL_RANK)",
                run,
            )


def _expect_ledger(case: str, out: Path, world: int, tp: int, run: AgentRun) -> None:
    try:
        ledger = Ledger.load(out / "attempt0")
    except FileNotFoundError:
        raise _fail(
            case,
            f"no ledger files in {out}/attempt0/: record the loader with "
            "record(loader, layout, path=OUT/attempt{attempt}/rank{RANK}.jsonl)",
            run,
        ) from None
    if ledger.ranks() != list(range(world)):
        raise _fail(case, f"ledger files of ranks {ledger.ranks()}, expected 0..{world - 1}", run)
    if not all(ledger.complete.get(r) for r in range(world)):
        raise _fail(
            case,
            "a ledger file has no end record: close the recording loader "
            "(use it as a context manager) when the epochs are done",
            run,
        )
    want = {r: (r // tp, r % tp) for r in range(world)}
    if ledger.layout() != want:
        raise _fail(
            case,
            f"(dp_rank, tp_rank) per rank is {ledger.layout()}, expected "
            f"{want}: take them from the mesh's 'dp' and 'tp' dimensions",
            run,
        )
    problems = ledger.check()
    if problems:
        raise _fail(case, "the ledger shows a data problem:\n" + ledger.summary(), run)
    digests: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for r in ledger.records:
        digests[(r.epoch, r.dp_rank, r.step)].add(r.digest)
    if any(len(d) > 1 for d in digests.values()):
        raise _fail(case, "TP peers held different batches at the same step", run)


def worker_runs(backend: str) -> tuple[tuple[int, int, bool], ...]:
    """:func:`check_worker`'s runs: ``(nodes, ranks per node, a TP group spans nodes)``.

    Two nodes of 2 ranks first: DP 2, so a sampler that does not shard over the replicas
    shows, and each TP group on its own node, so a warning given whenever there is more
    than one node shows. Under nccl every simulated node takes GPUs of its own: with fewer
    than 4 GPUs that run is one node of 2 ranks instead (DP 1).
    """
    if backend == "nccl":
        import torch  # here: the gloo check on a laptop needs none of CUDA

        if torch.cuda.device_count() < 4:
            return ((1, 2, False), (2, 1, True))
    return ((2, 2, False), (2, 1, True))


def check_worker(
    path: str | Path = WORKER_NAME,
    *,
    backend: str = "gloo",
    timeout_s: float = 90,
) -> list[AgentRun]:
    """Run the learner's worker file under real torchrun agents and check what it did.

    Two runs, both with TP 2 (:func:`worker_runs`): two simulated nodes of 2 ranks each
    (DP 2; each TP group stays on its node, so no warning, and the two replicas must read
    disjoint shards), then two nodes of 1 rank each (rank 1 has ``LOCAL_RANK`` 0, and the
    TP group spans both nodes, so its leader must warn). Each run must exit 0; every rank
    must report the identity torchrun gave it and the GPU it would take (its
    ``LOCAL_RANK``, under gloo too), hold the DP x TP place the mesh gives it, and leave
    a complete, sound ledger in which TP peers hold the same batches.

    Args:
        path: The worker file.
        backend: ``"gloo"`` here; ``"nccl"`` on a GPU node with 2 GPUs or more. Each
            simulated node then gets its own GPUs (``CUDA_VISIBLE_DEVICES``): two nodes
            on one machine must not both take GPU 0 as their ``LOCAL_RANK`` 0.
        timeout_s: Deadline of each run.

    Returns:
        The runs, in order (their output is there to read).

    Raises:
        WorkerCheckError: What is wrong, and the last lines of the run's output.
        AgentError: The file does not compile (before anything starts).
    """
    check_worker_file(path)
    path = Path(path).resolve()
    runs = []
    for nnodes, nproc, spans in worker_runs(backend):
        case = f"{nnodes} node(s) x {nproc} rank(s), tp 2"
        with tempfile.TemporaryDirectory(prefix="ezpz-check-") as tmp:
            envs = None
            if backend == "nccl":
                envs = [
                    {"CUDA_VISIBLE_DEVICES": ",".join(str(n * nproc + g) for g in range(nproc))}
                    for n in range(nnodes)
                ]
            run = torchrun(
                path,
                "--backend",
                backend,
                "--tp-size",
                "2",
                "--out",
                tmp,
                "--epochs",
                "1",
                nnodes=nnodes,
                nproc_per_node=nproc,
                timeout_s=timeout_s,
                echo=False,
                node_envs=envs,
            )
            if not run.ok:
                raise _fail(case, "the job failed: " + run.diagnosis(), run)
            if run.lines("terminate called"):
                raise _fail(
                    case,
                    "a rank aborted at exit after its work: destroy the process "
                    "group at the end of main(), and keep no group in a global",
                    run,
                )
            if run.lines("outlive destroy_process_group"):
                raise _fail(
                    case,
                    "gloo threads outlived the teardown: drop every reference to a group "
                    "(layout, loader, the gloo side group) before destroy_distributed()",
                    run,
                )
            _expect_identity(case, run, nnodes, nproc, backend)
            _expect_ledger(case, Path(tmp), nnodes * nproc, 2, run)
            warned = bool(run.lines("spans nodes"))
            if warned != spans:
                raise _fail(
                    case,
                    (
                        "the TP group [0, 1] spans nodes 0 and 1 here, but no rank warned: "
                        "work out each TP rank's node from LOCAL_WORLD_SIZE"
                        if spans
                        else "a rank warned that its TP group spans nodes, but every TP group is "
                        "on one node here: a group spans nodes when its ranks' nodes "
                        "(RANK // LOCAL_WORLD_SIZE) differ, not whenever the job has two nodes"
                    ),
                    run,
                )
            runs.append(run)
    return runs
