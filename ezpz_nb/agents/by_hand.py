"""Notebook 14's worker file, checked from outside: :func:`check_worker`.

The learner writes a complete torchrun worker (``torchrun_worker.py``). The checker runs
it the way a cluster does, under real torchrun agents (:mod:`ezpz_nb.agents.agents`), in
the layouts of :func:`~ezpz_nb.agents.worker_job.worker_runs`, makes one rank die mid-job
(:mod:`ezpz_nb.agents.crash_plan`: a SIGKILL from outside, which the worker cannot tell from
a real crash), and raises :class:`WorkerCheckError` saying what to look at when a rank's
identity, the GPU it would take, its DP x TP place, its data, the spans-nodes warning, or
the restart is wrong.
What the worker leaves is read by :mod:`ezpz_nb.agents.worker_job` (its names are
re-exported here: notebook 14 imports them from this module).

The worker's side of the contract (what the notebook's solution does): each rank
prints ``rank R local_rank L world_size W local_world_size LW node N attempt A
device D gpu G dp P tp T`` once per attempt (``G``: the GPU it takes under nccl, worked out
under gloo too), records its steps with :func:`ezpz_nb.ledger.record` into
``OUT/attempt{A}/rank{R}.jsonl``, saves its data position every ``--checkpoint-every``
steps and resumes from it after a restart, rank 0 writes ``OUT/attempt{A}/resumed.json``
(``{"epoch": e, "steps": k}``, where the attempt started), and a TP leader whose
group spans nodes warns with the words "spans nodes". The attempt ``A`` is one that
every rank agrees on (rank 0 decides and broadcasts it), not
``TORCHELASTIC_RESTART_COUNT``, which each node's agent counts for itself.
"""

from __future__ import annotations

import random
import re
import tempfile
from collections import defaultdict
from pathlib import Path

from ezpz_nb.agents.agents import AgentError, AgentRun, check_worker_file, torchrun
from ezpz_nb.agents.crash_plan import CrashPlan
from ezpz_nb.agents.worker_job import (
    CHECKPOINT_EVERY,
    STARTUP,
    WORKER_NAME,
    Attempts,
    WorkerRun,
    attempt_number,
    load_attempts,
    startup_lines,
    worker_from_notebook,
    worker_runs,
)
from ezpz_nb.errors import EzpzError
from ezpz_nb.ledger import Ledger

__all__ = [
    "CHECKPOINT_EVERY",
    "WORKER_NAME",
    "Attempts",
    "WorkerCheckError",
    "WorkerRun",
    "check_worker",
    "load_attempts",
    "startup_lines",
    "worker_from_notebook",
    "worker_runs",
]

# The startup and warning lines carry their rank: torchrun's --tee prefix, set to the
# global rank (its default is the local rank, the same on every node).
_PREFIX_TEMPLATE = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${rank}]:"}
_PREFIX = re.compile(r"\[(\d+)\]:")


class WorkerCheckError(EzpzError, AssertionError):
    """The learner's worker file does not do what the notebook asks; says what to look at."""


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


def _expect_attempts(case: str, out: Path, spec: WorkerRun, run: AgentRun) -> Attempts:
    """Every rank's ledger in each attempt's folder, and the job's steps merged across them."""
    world, want = spec.world, list(range(spec.attempts))
    found = sorted(attempt_number(f) for f in out.glob("attempt*") if any(f.glob("*.jsonl")))
    if not found:
        raise _fail(
            case,
            f"no ledger files in {out}/attempt0/: record the loader with "
            "record(loader, layout, path=OUT/attempt{attempt}/rank{RANK}.jsonl)",
            run,
        )
    if found != want:
        raise _fail(
            case,
            f"ledgers of attempts {found}, expected {want}"
            + (
                f" ({spec.crash_text()}, and torchrun restarted the job once): number the "
                "attempt by what rank 0 decides and broadcasts, not by "
                "TORCHELASTIC_RESTART_COUNT (each node's agent counts for itself)"
                if spec.crash
                else ""
            ),
            run,
        )
    for attempt in want:
        part = Ledger.load(out / f"attempt{attempt}")
        if part.ranks() != list(range(world)):
            raise _fail(
                case,
                f"attempt {attempt}'s ledger files are of ranks {part.ranks()}, expected "
                f"0..{world - 1}: every rank, on every node, writes to the attempt every rank "
                "agreed on",
                run,
            )
    last = Ledger.load(out / f"attempt{want[-1]}")
    if not all(last.complete.get(r) for r in range(world)):
        raise _fail(
            case,
            "a ledger file has no end record: close the recording loader "
            "(use it as a context manager) when the epochs are done",
            run,
        )
    return load_attempts(out)


def _expect_resume(case: str, spec: WorkerRun, got: Attempts, run: AgentRun, back: bool) -> None:
    """The restarted attempt began at the position its checkpoint held: the kept one, which
    the checker put back before the crash, or (if not every rank reached it) the last saved."""
    assert spec.crash is not None
    _, epoch, step = spec.crash
    last = (epoch, step - step % CHECKPOINT_EVERY)
    put_back = spec.keep is not None and back
    saved = spec.keep if put_back and spec.keep is not None else last
    where = got.resumed[1][1:]
    if where == saved:
        return
    # The case (the start of the message) names the crash.
    said = (
        f"the last position saved before it was epoch {last[0]}, {last[1]} steps done "
        f"(--checkpoint-every {CHECKPOINT_EVERY})"
    )
    if put_back:
        said += (
            f"; before the restart the checker put --out back as it was at epoch {saved[0]}, "
            f"{saved[1]} steps done (as if the later saves never reached the disk)"
        )
    if where == (0, 0):
        why = (
            "the job started over: read the checkpoint on restart (rank 0 reads it and "
            "broadcasts the position)"
        )
    else:
        why = (
            "resume from the position the checkpoint holds, read after the restart (not "
            "worked out from the crash, the ledgers or the checker's environment): no step "
            "after it counts, none before it is redone"
        )
    raise _fail(
        case,
        f"{said}; the restart says (resumed.json) it began at epoch {where[0]}, {where[1]} "
        f"steps done: {why}",
        run,
    )


def _expect_ledger(case: str, ledger: Ledger, spec: WorkerRun, run: AgentRun) -> None:
    """The merged steps: DP x TP places, sound data, TP peers with the same batches."""
    tp = spec.tp
    want = {r: (r // tp, r % tp) for r in range(spec.world)}
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


def _expect_warnings(case: str, spec: WorkerRun, run: AgentRun) -> None:
    """The TP leaders whose group spans nodes warned, and no other rank did."""
    warned = {int(m[1]) for ln in run.lines("spans nodes") if (m := _PREFIX.match(ln))}
    want = spec.spanning_leaders()
    nodes = ", ".join(
        f"ranks {n * spec.nproc}-{(n + 1) * spec.nproc - 1} on node {n}" for n in range(spec.nnodes)
    )
    for rank in sorted(want - warned):
        raise _fail(
            case,
            f"the TP group {spec.group(rank)} spans nodes here ({nodes}), but its leader, rank "
            f"{rank}, did not warn: a group spans nodes when its ranks' nodes (RANK // "
            "LOCAL_WORLD_SIZE) differ, which happens with a tp that does not divide "
            "LOCAL_WORLD_SIZE, not only with a tp larger than it",
            run,
        )
    for rank in sorted(warned - want):
        raise _fail(
            case,
            f"rank {rank} warned that its TP group spans nodes, but its group "
            f"{spec.group(rank)} is on one node here ({nodes}) or rank {rank} is not its "
            "leader: warn from a TP leader whose group's ranks are on different nodes "
            "(RANK // LOCAL_WORLD_SIZE), not whenever the job has two nodes",
            run,
        )


def _expect_no_crash(case: str, spec: WorkerRun, out: Path, run: AgentRun) -> None:
    """The job never reached the step where a rank was to die: say why, from its data."""
    if any(out.glob("attempt*/*.jsonl")):
        _expect_ledger(case, load_attempts(out).counted, spec, run)
    steps = spec.num_samples // (spec.world // spec.tp) // 4
    raise _fail(
        case,
        f"no rank reached that step, so nothing died and torchrun restarted nothing: an epoch "
        f"holds {steps} steps here (--num-samples {spec.num_samples} over DP "
        f"{spec.world // spec.tp}, --batch-size 4); run both epochs, every step of each",
        run,
    )


def _expect_attempt_lines(case: str, spec: WorkerRun, run: AgentRun) -> None:
    """Each rank printed one startup line per attempt, with the attempt every rank agreed on."""
    seen = sorted({(int(m[1]), int(m[6])) for m in STARTUP.finditer("\n".join(run.output))})
    want = [(r, a) for r in range(spec.world) for a in range(spec.attempts)]
    if seen != want:
        raise _fail(
            case,
            f"(rank, attempt) in the startup lines: {seen}, expected {want}"
            + (
                f" ({spec.crash_text()}; torchrun restarted every rank once): take the "
                "attempt rank 0 decides and broadcasts; TORCHELASTIC_RESTART_COUNT is "
                "each node's agent's own count, and they differ"
                if spec.crash
                else ""
            ),
            run,
        )


def check_worker(
    path: str | Path = WORKER_NAME,
    *,
    backend: str = "gloo",
    timeout_s: float = 90,
    seed: int | None = None,
) -> list[AgentRun]:
    """Run the learner's worker file under real torchrun agents and check what it did.

    The runs (:func:`worker_runs`): first, under gloo, two simulated nodes of 3 ranks at
    TP 2, one TP group spanning them; a drawn rank is killed at a drawn step, once, and
    torchrun (``--max-restarts=1``) restarts the job; before the restart the checker puts the
    output folder back as it was at a drawn earlier saved position (ledgers aside). Then a
    drawn layout of :data:`~ezpz_nb.agents.worker_job.SECOND_LAYOUTS` (another tp, another
    placement of the TP leaders), no crash. Each job must exit 0; every rank must report
    the identity torchrun gave it and the GPU it would take (its ``LOCAL_RANK``, under gloo
    too), in each attempt the attempt every rank agreed on; the leaders of spanning TP
    groups, and no other rank, must warn; each attempt's folder must hold every rank's
    ledger; the restart must begin at the position its checkpoint holds (the one put back);
    and the steps that count must hold every sample once per epoch and replica, TP peers the
    same batches, each rank the DP x TP place the mesh gives it. The crash plan stays in
    this process (:class:`~ezpz_nb.agents.crash_plan.CrashPlan`): it steps the ranks from
    outside, through the recorder, and nothing a rank can read holds it.

    Args:
        path: The worker file.
        backend: ``"gloo"`` here; ``"nccl"`` on a GPU node with 2 GPUs or more. Each
            simulated node then gets its own GPUs (``CUDA_VISIBLE_DEVICES``): two nodes
            on one machine must not both take GPU 0 as their ``LOCAL_RANK`` 0.
        timeout_s: Deadline of each run.
        seed: Seed of the draws (default: a new draw at each call).

    Returns:
        The runs, in order (their output is there to read; ``label`` names each one's
        layout and crash).

    Raises:
        WorkerCheckError: What is wrong, and the last lines of the run's output.
        AgentError: The file does not compile (before anything starts).
    """
    check_worker_file(path)
    path = Path(path).resolve()
    runs = []
    for spec in worker_runs(backend, random.Random(seed)):
        case = spec.name()
        # The step after the kept position: every form of the save before it is done (end
        # of the step before, start of its own), none of the next one.
        keep = None if spec.keep is None else (spec.keep[0], spec.keep[1] + 1)
        with (
            tempfile.TemporaryDirectory(prefix="ezpz-check-") as tmp,
            CrashPlan(spec.crash, Path(tmp) / "out", keep=keep, world=spec.world) as plan,
        ):
            out = Path(tmp) / "out"
            envs = [{**_PREFIX_TEMPLATE, **plan.env} for _ in range(spec.nnodes)]
            if backend == "nccl":
                for n, node_env in enumerate(envs):
                    gpus = range(n * spec.nproc, (n + 1) * spec.nproc)
                    node_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            # fmt: off
            try:
                run = torchrun(
                path, "--backend", backend, "--tp-size", str(spec.tp), "--out", str(out),
                "--epochs", "2", "--num-samples", str(spec.num_samples), "--batch-size", "4",
                "--checkpoint-every", str(CHECKPOINT_EVERY), "--timeout", "20",
                nnodes=spec.nnodes, nproc_per_node=spec.nproc, timeout_s=timeout_s,
                echo=False, node_envs=envs, tee="3", max_restarts=1 if spec.crash else 0,
            )
            except AgentError as exc:
                if exc.run is None:
                    raise
                raise _fail(case, f"the job did not end: {exc}", exc.run) from None
            # fmt: on
            _expect_run(case, run, spec, backend, out, plan)
            run.label = case
            runs.append(run)
    return runs


def _expect_run(
    case: str, run: AgentRun, spec: WorkerRun, backend: str, out: Path, plan: CrashPlan
) -> None:
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
    _expect_identity(case, run, spec.nnodes, spec.nproc, backend)
    if spec.crash and not plan.crashed:
        _expect_no_crash(case, spec, out, run)
    _expect_attempt_lines(case, spec, run)
    _expect_warnings(case, spec, run)
    got = _expect_attempts(case, out, spec, run)
    if spec.crash:
        _expect_resume(case, spec, got, run, plan.restored)
    _expect_ledger(case, got.counted, spec, run)
    if not got.exactly_once():
        raise _fail(
            case,
            "the steps that count do not hold every sample once per epoch:\n"
            + got.counted.summary(),
            run,
        )
