# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 14 · From the notebook to a cluster, by hand: torchrun, two nodes, an elastic restart
#
# **Time:** 50 to 60 minutes reading the worker's cells as given (advanced track); writing them
# yourself from the text takes 60 to 90. Running it top to bottom takes about a minute on an
# idle 2-core machine: five real torchrun jobs, and every rank of each pays a fresh
# `import torch`. On a machine busy with other work allow up to 3 minutes.
#
# `ez.launch` hid the startup code, which was right for learning the data. The job you run next
# has none of that: torchrun starts your file once per rank and you write everything the ranks
# do, from reading who they are to tearing the group down. Here you write that file, cell by
# cell, and run it the way a cluster does: real torchrun agents, one per node, started from
# this notebook.
#
# **Learning goals**
#
# - Write a complete torchrun worker: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`;
#   `init_process_group` with a timeout; under NCCL, one GPU per rank and a gloo side group;
#   the DP x TP mesh; the ledger; teardown. One file for gloo here and NCCL on GPUs.
# - Run it as one node, and as **two nodes on this machine** (two agents meeting in a c10d
#   rendezvous): see `LOCAL_RANK` differ from `RANK`, and where TP groups land.
# - Read torchrun's logs: `--log-dir`, `--tee`, `--local-ranks-filter`.
# - Kill a rank mid-epoch and watch `--max-restarts` bring the job back from its last
#   checkpoint, every sample counted exactly once; on two nodes, see the agents' restart
#   counts disagree, and key the attempt on what every rank agrees on instead.
# - See a rendezvous give up on a node that never comes, in bounded time.

# %%
import socket
import tempfile
from pathlib import Path

from ezpz_nb.agents.agents import AgentError, free_port, run_agents, torchrun, torchrun_argv
from ezpz_nb.agents.by_hand import check_worker, load_attempts, startup_lines
from ezpz_nb.ledger import Ledger
from ezpz_nb.wrapping import wrap_message

WORKER = Path("torchrun_worker.py")  # written beside this notebook by the cells below
work = tempfile.TemporaryDirectory(prefix="ezpz-nb14-")  # ledgers, logs; removed at the end
WORK = Path(work.name)

# %% [markdown]
# ## 1. Who am I? The variables torchrun sets
#
# torchrun (`python -m torch.distributed.run`) is an **agent**: one runs on each node, it meets
# the other nodes' agents in a *rendezvous*, then starts `--nproc-per-node` copies of your file
# and tells each one where it stands through environment variables:
#
# | variable | meaning | 2 nodes x 2 ranks, the second rank of node 1 |
# |---|---|---|
# | `RANK` | unique in the whole job, `0 .. WORLD_SIZE-1` | 3 |
# | `LOCAL_RANK` | unique on this node; **the GPU index** | 1 |
# | `WORLD_SIZE` | ranks in the job | 4 |
# | `LOCAL_WORLD_SIZE` | ranks on this node (`--nproc-per-node`) | 2 |
# | `GROUP_RANK` | this node's number, decided by the rendezvous | 1 |
# | `TORCHELASTIC_RESTART_COUNT` | its agent's count of restarts; nodes differ (section 6) | 0 |
#
# In the notebooks `LOCAL_RANK` and `RANK` were always equal: one machine. On two nodes they are
# not, and code that picks a GPU with `RANK` asks for GPU 3 on a node that has two.
#
# The first cell writes the top of the file: imports, these variables, the options. The next
# ones append to it (`%%writefile -a`). **Edit freely**, then run the `%%writefile` cells again
# from this first one, in order (running an appending cell twice appends it twice; the
# runner refuses such a file). The checker in section 4 runs whatever the file holds.

# %%
# %%writefile torchrun_worker.py
"""Notebook 14's torchrun worker: one file for CPUs (gloo) and GPUs (nccl).

Run it on one machine with 2 ranks:
    torchrun --standalone --nproc-per-node=2 torchrun_worker.py --out ledger
"""

import argparse
import json
import os
import signal
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.elastic.multiprocessing.errors import record as report_errors
from torch.utils.data import DataLoader, DistributedSampler

from ezpz_nb.data import RandomTokenDataset, TPBroadcastDataLoader
from ezpz_nb.data.groups import Layout
from ezpz_nb.examples.common import destroy_distributed
from ezpz_nb.ledger import record

# torchrun sets these for every rank it starts (srun or mpiexec start torchrun, one per node).
RANK = int(os.environ["RANK"])  # 0 .. WORLD_SIZE-1: unique in the whole job
LOCAL_RANK = int(os.environ["LOCAL_RANK"])  # 0 .. LOCAL_WORLD_SIZE-1: unique on this node
WORLD_SIZE = int(os.environ["WORLD_SIZE"])  # ranks in the job: nodes x --nproc-per-node
LOCAL_WORLD_SIZE = int(os.environ["LOCAL_WORLD_SIZE"])  # ranks on this node (--nproc-per-node)
NODE = int(os.environ["GROUP_RANK"])  # this node's number, given by the rendezvous
RUN_ID = os.environ["TORCHELASTIC_RUN_ID"]  # the same in every attempt of one job
# This node's agent's own count of restarts: agents on other nodes may count otherwise
# (section 6), so nothing that every rank must agree on is keyed on it.
RESTART_COUNT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
MAX_RESTARTS = int(os.environ["TORCHELASTIC_MAX_RESTARTS"])


def say(line):
    """Print ``line`` in one write: torchrun runs ranks unbuffered (``python -u``), and
    print() writes the newline in a call of its own, so two ranks' lines could run together."""
    sys.stdout.write(line + "\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--timeout", type=float, default=30.0, help="collective timeout (s)")
    p.add_argument("--tp-size", type=int, default=1, help="ranks per TP group")
    p.add_argument("--num-samples", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=4, help="per DP replica")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", type=Path, default=Path("ledger"), help="ledgers and checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps (0: never)")
    p.add_argument("--kill", default="", help="RANK:EPOCH:STEP dies there, in attempt 0 only")
    p.add_argument(
        "--others-block",
        action="store_true",
        help="with --kill: the other ranks wait there, as NCCL ranks in a collective do",
    )
    return p.parse_args(argv)


# %% [markdown]
# ## 2. Joining the group, and what changes on GPUs
#
# `init_process_group` gets an explicit **timeout**: torch's defaults are 30 minutes on gloo
# and 10 on NCCL, far too long to wait for a job that hangs. It joins through `env://` (the
# default): `RANK`, `WORLD_SIZE`, and the store at `MASTER_ADDR:MASTER_PORT`.
#
# Which store that is matters after a restart. By default torchrun's agents keep **one store
# for the whole job**: every round of ranks gets the same `MASTER_PORT`, and after a restart it
# still holds what the last round's ranks wrote there, such as their addresses. Measured here
# with an earlier version of this file that joined it as it is (torch 2.13): 3 of 5 restarts
# failed in `init_process_group` (two hung, one connected to a dead rank's address). A key
# prefix per `TORCHELASTIC_RESTART_COUNT` looks like the fix, but that count is **kept by each
# node's agent**: an agent that restarts its ranks because another node left and came back
# does not count it (section 6 shows two agents disagree), so the ranks of two nodes look for
# different prefixes and wait for each other until the timeout (pytorch issues 108158,
# 135712). The file keys nothing on that count. It asks torchrun for **a store per
# rendezvous round** (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, set by this notebook's
# `torchrun()`): the round's rendezvous hands every node the same new `MASTER_PORT`, where the
# round's rank 0 serves a fresh store. Started with `--max-restarts` but without it, the file
# refuses to run. The attempt number (for the ledger folders and `--kill`) is decided by rank 0
# and broadcast.
#
# **What changes on GPUs** (`--backend nccl`; the same file, nothing else to edit):
#
# - **One process per GPU.** `torch.cuda.set_device(LOCAL_RANK)` first, before anything touches
#   CUDA. `device_id=` in `init_process_group` is an extra: it binds the communicator to that
#   GPU at once, but in torch 2.13 it does **not** set the current device, and the object
#   collectives (`broadcast_object_list`, `all_gather_object`) put their tensors on the current
#   device. Without `set_device` every rank of a node puts them on `cuda:0`, and NCCL fails.
#   `barrier` picks its device by its own rules (its docstring): `device_ids=` if given, else
#   the bound `device_id`, else the GPU the group first used, else global rank % GPUs per node.
# - **Collective tensors live on the rank's GPU.** Under NCCL a CPU tensor has no backend; the
#   all-reduce in section 3 runs on `device`. CPU-side agreements (where to resume, how many
#   steps were taken) go on a **gloo side group**, `dist.new_group(backend="gloo")`.
# - **The watchdog.** NCCL collectives run asynchronously; a watchdog thread in each rank
#   notices one that runs past the timeout and **aborts the process** (on gloo the timeout
#   raises in your own thread, at your line). That node's torchrun then stops its other ranks;
#   agents on other nodes only notice when their own ranks fail or when a restarting node comes
#   back to the rendezvous. With `--max-restarts=0` nobody comes back: their NCCL ranks wait in
#   the collective until their own timeout, unless NCCL notices the lost connection first and
#   reports a remote error.
# - **Flight Recorder**, the cluster's counterpart of `HangError`: on NCCL each rank already
#   records its last 2000 collectives (`TORCH_FR_BUFFER_SIZE`, formerly
#   `TORCH_NCCL_TRACE_BUFFER_SIZE`; 2000 is torch 2.13's default, so setting it to 2000 changes
#   nothing; only the opt-in torchcomms path, `TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`, starts at 0).
#   `TORCH_NCCL_DUMP_ON_TIMEOUT=1` has the watchdog write the records to files when it fires (its
#   default has changed between releases; setting it makes sure), one per rank at
#   `TORCH_FR_DUMP_TEMP_FILE` (the path prefix). Each rank writes **where it runs**: unless that
#   path is on storage every node shares, gather the files from every node, then compare the
#   ranks' records to see which rank is missing from which collective.
# - **`NCCL_DEBUG=INFO`** prints NCCL's setup: which network interface and transport each
#   communicator uses. It is the first thing to read when ranks on two nodes cannot connect
#   (then name the interface with `NCCL_SOCKET_IFNAME`, or `GLOO_SOCKET_IFNAME` for gloo).


# %%
# %%writefile -a torchrun_worker.py
def init(backend, timeout_s):
    """Join this round's process group; return this rank's GPU index, device, gloo group."""
    if MAX_RESTARTS > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # The agents' shared store outlives a restart and keeps the last round's keys
        # (the dead ranks' addresses); only the agents' own counts could tell the
        # rounds apart, and they disagree (section 6). A store per round does not.
        raise RuntimeError(
            "--max-restarts > 0 with torchrun's shared store: start torchrun with "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 so that every rendezvous round gives "
            "its ranks a new store (pytorch issue 135712)"
        )
    timeout = timedelta(seconds=timeout_s)
    # One process per GPU, numbered on its node: LOCAL_RANK (RANK counts the GPUs of every
    # node, so on node 1 it names a GPU the node does not have). Worked out under gloo too:
    # the startup line shows it, so a check on CPUs sees which GPU each rank would take.
    gpu = LOCAL_RANK
    if backend == "nccl":
        # Set before anything touches CUDA: barrier and broadcast_object_list use the
        # current device, and device_id= does not set it.
        torch.cuda.set_device(gpu)
        device = torch.device("cuda", gpu)
        # device_id= also binds the communicator to that GPU now (eager init).
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        # env:// (the default): RANK, WORLD_SIZE and this round's MASTER_ADDR:PORT.
        dist.init_process_group("gloo", timeout=timeout)
    # NCCL has no CPU tensors: agreements the CPU makes (where to resume, how many
    # steps were taken) go on a gloo group of the same ranks.
    cpu_group = dist.new_group(backend="gloo")
    return gpu, device, cpu_group


# %% [markdown]
# ## 3. The DP x TP pipeline, from a mesh; the checkpoint; the ledger
#
# `init_device_mesh` builds the grid of notebook 07 from the variables: TP innermost, so a TP
# group holds consecutive ranks. torchrun numbers ranks node by node, so the group stays on
# one node **when tp divides the ranks per node** (`--nproc-per-node`). Smaller is not enough:
# 6 ranks per node with tp 4 puts ranks 4-7 on two nodes. The file warns when that happens;
# TP moves the most data, and a group that spans nodes sends it over the network.
#
# The data is notebook 03's: the sampler shards over DP only, the TP leader loads, its peers
# receive. Each rank records every step in its own ledger file, one folder per attempt.


# %%
# %%writefile -a torchrun_worker.py
def build_pipeline(args, device):
    """The DP x TP layout from a DeviceMesh, and the loader of notebooks 02-04."""
    tp = args.tp_size
    mesh = init_device_mesh(device.type, (WORLD_SIZE // tp, tp), mesh_dim_names=("dp", "tp"))
    dp_group, tp_group = mesh["dp"].get_group(), mesh["tp"].get_group()
    layout = Layout(
        RANK,
        WORLD_SIZE,
        mesh["dp"].get_local_rank(),
        WORLD_SIZE // tp,
        mesh["tp"].get_local_rank(),
        tp,
        dp_group,
        tp_group,
    )
    # torchrun numbers ranks node by node: rank r runs on node r // LOCAL_WORLD_SIZE.
    tp_ranks = dist.get_process_group_ranks(tp_group)
    nodes = sorted({r // LOCAL_WORLD_SIZE for r in tp_ranks})
    if len(nodes) > 1 and layout.tp_rank == 0:
        warnings.warn(
            # On lines of its own, after the file and line: a notebook breaks longer ones.
            f"\nTP group {tp_ranks} spans nodes {nodes}: every batch and every TP collective\n"
            f"crosses the network. Use a --tp-size that divides --nproc-per-node "
            f"({LOCAL_WORLD_SIZE}).",
            stacklevel=1,
        )
    dataset = RandomTokenDataset(1024, 16, num_samples=args.num_samples, seed=args.seed)
    # Shard over the DP replicas only: TP peers share their leader's shard.
    sampler = DistributedSampler(
        dataset,
        num_replicas=layout.dp_size,
        rank=layout.dp_rank,
        shuffle=True,
        seed=args.seed,
        drop_last=True,
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    # The TP leader loads; its peers receive each batch (on their GPU under nccl).
    return layout, TPBroadcastDataLoader(loader, tp_group)


# %% [markdown]
# The training loop saves **the data position** every few steps: epoch and steps done. That is
# all a restart needs to resume the data, because the sampler's order depends only on the seed
# and the epoch (the model and optimizer would be saved at the same moment in a real job). On
# resume, `TPBroadcastDataLoader.load_state_dict({"steps": k})` skips the first `k` batches of
# that one epoch and no other (notebook 09 shows the state of a loader that skips without
# loading). Rank 0 reads the checkpoint and broadcasts it on the gloo group, so nodes need not
# share a filesystem for it. `--kill` makes one rank die mid-step in the first attempt, as the
# out-of-memory killer would.


# %%
# %%writefile -a torchrun_worker.py
def agree_on_attempt(out, cpu_group):
    """(attempt, epoch, steps done in it) of this job, decided by rank 0, agreed by all."""
    # Did any agent restart its ranks? Each count is local; their maximum is not.
    restarted = torch.tensor([RESTART_COUNT])
    dist.all_reduce(restarted, op=dist.ReduceOp.MAX, group=cpu_group)
    agreed = [0, 0, 0]  # attempt, epoch, steps; attempt -1: refuse to run
    if RANK == 0:
        agreed = read_job_state(out, restarted.item() > 0)
    # Rank 0 reads, everyone follows: only rank 0's node needs to see OUT.
    dist.broadcast_object_list(agreed, src=0, group=cpu_group)
    if agreed[0] < 0:
        raise RuntimeError(
            f"rank 0 (node {agreed[1]}) finds no trace of this job in {out}, but an agent "
            "restarted its ranks: after a node replacement rank 0 can be on another node. "
            "Put --out on storage every node shares."
        )
    return agreed[0], agreed[1], agreed[2]


def read_job_state(out, restarted):
    """Rank 0: this attempt's number (attempts started before it), and the checkpoint."""
    started, ckpt = out / "started.json", out / "checkpoint.json"
    attempt, position = 0, [0, 0]
    if started.exists() and json.loads(started.read_text())["run_id"] == RUN_ID:
        attempt = json.loads(started.read_text())["attempts"]
    if ckpt.exists() and json.loads(ckpt.read_text())["run_id"] == RUN_ID:
        saved = json.loads(ckpt.read_text())  # another job's checkpoint is not ours
        position = [saved["epoch"], saved["steps"]]
    if restarted and attempt == 0:
        return [-1, NODE, 0]
    out.mkdir(parents=True, exist_ok=True)
    started.write_text(json.dumps({"run_id": RUN_ID, "attempts": attempt + 1}))
    folder = out / f"attempt{attempt}"
    folder.mkdir(exist_ok=True)
    (folder / "resumed.json").write_text(json.dumps(dict(epoch=position[0], steps=position[1])))
    return [attempt, *position]


def save_position(ckpt, epoch, steps):
    tmp = ckpt.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": RUN_ID, "epoch": epoch, "steps": steps}))
    os.replace(tmp, ckpt)  # atomic: a kill never leaves half a checkpoint


def train(args, device, cpu_group, layout, loader, attempt, start):
    """Every epoch from the last checkpoint on; one ledger file per rank and attempt."""
    ckpt = args.out / "checkpoint.json"
    start_epoch, start_steps = start
    kill = tuple(int(x) for x in args.kill.split(":")) if args.kill and attempt == 0 else None
    taken = 0
    with record(loader, layout, path=args.out / f"attempt{attempt}" / f"rank{RANK}.jsonl") as rec:
        for epoch in range(start_epoch, args.epochs):
            rec.set_epoch(epoch)
            skip = start_steps if epoch == start_epoch else 0
            loader.load_state_dict({"steps": skip})  # applies to this epoch only
            for step, batch in enumerate(rec, start=skip):
                if kill == (RANK, epoch, step):
                    os.kill(os.getpid(), signal.SIGKILL)  # mid-step, as the OOM killer would
                if kill and args.others_block and kill[1:] == (epoch, step):
                    time.sleep(args.timeout)  # gloo would notice the dead peer; NCCL waits
                    raise TimeoutError(f"rank {RANK}: the collective timed out")
                x = batch["input_ids"].to(device)
                total = x.float().sum()  # a stand-in for the loss of this step
                # The gradient all-reduce's stand-in: on this rank's device (NCCL needs it).
                dist.all_reduce(total, group=layout.dp_group)
                taken += 1
                if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and RANK == 0:
                    save_position(ckpt, epoch, step + 1)
    # A CPU-side agreement: every rank must have taken the same number of steps.
    counts = torch.tensor([taken, -taken])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=cpu_group)
    assert counts[0] == -counts[1] == taken, f"rank {RANK}: step counts differ: {counts}"
    return taken


# %% [markdown]
# `@record` (torch's, imported as `report_errors`) writes a failing rank's traceback where
# torchrun finds it, so the job's failure report names the rank and shows its traceback.
# The ranks of a node share one output and torchrun runs them unbuffered, so each line is
# written with `say()`, in one call: two ranks' `print()`s can run together on one line.


# %%
# %%writefile -a torchrun_worker.py
@report_errors  # a rank that raises: torchrun's failure report shows its traceback
def main(argv=None):
    args = parse_args(argv)
    gpu, device, cpu_group = init(args.backend, args.timeout)
    attempt, *start = agree_on_attempt(args.out, cpu_group)
    layout, loader = build_pipeline(args, device)
    say(
        f"rank {RANK} local_rank {LOCAL_RANK} world_size {WORLD_SIZE} "
        f"local_world_size {LOCAL_WORLD_SIZE} node {NODE} attempt {attempt} "
        f"device {device} gpu {gpu} dp {layout.dp_rank} tp {layout.tp_rank} "
        f"restart_count {RESTART_COUNT}"
    )
    steps = train(args, device, cpu_group, layout, loader, attempt, start)
    say(f"rank {RANK} done: {steps} steps")
    # Only after a run that went well (a rank whose collective failed would wait here).
    # destroy_distributed() is dist.destroy_process_group() that also frees the groups
    # DeviceMesh keeps: a gloo thread still alive at exit can abort the process.
    del layout, loader, cpu_group  # our references to the groups
    destroy_distributed()


if __name__ == "__main__":
    main()

# %% [markdown]
# ## 4. Check the file: two nodes, a TP group across them, a rank that dies
#
# The checker runs your file under real torchrun agents as a cluster would, twice. First at
# TP 2: two simulated nodes of 3 ranks each. The TP groups `[0, 1]` and `[4, 5]` stay on their
# node, but `[2, 3]` spans both, though tp 2 is smaller than the 3 ranks per node: its leader,
# rank 2, and no other rank, must warn. DP is 3, so the replicas must read different samples,
# and rank 3 has `LOCAL_RANK` 0 (it must take GPU 0 of its node, not GPU 3: the startup line
# shows `gpu`, worked out under gloo too). Mid-job, a rank drawn at random dies at a drawn
# step, once, by SIGKILL (the checker's, not your `--kill`), and torchrun restarts the job
# (`--max-restarts=1`): every rank, on both nodes, must agree on the new attempt and count
# every sample once. Before the restart the checker puts `--out` back as it was at an earlier
# saved position, drawn (your ledger files aside: as if the later saves never reached the
# disk), so the restart must resume from the position **its checkpoint holds**, read after
# the restart; one worked out from where the rank died or from the ledgers is wrong. The
# checker's plan never enters your ranks: it steps them from outside (at each step the
# recorder says where the rank is and waits for the checker's go, the same at every step),
# so nothing your file can read, its environment included, tells the crash or the kept
# position. Then a second layout, drawn: one node of 3 ranks at TP 1, or two nodes of 2 ranks
# at TP 1 or TP 4 (where `[0, 1, 2, 3]` spans both nodes from rank 0), so the TP size must
# come from `--tp-size` and the warning from the nodes of the group's ranks. The verdict
# names the layouts it ran. It
# starts the file with the options of section 1 (`--num-samples`, `--batch-size`,
# `--epochs 2`, `--checkpoint-every 2`, `--tp-size`, `--timeout 20`), so keep them. It reads
# each rank's startup lines and ledgers and says what to look at when something is off. A
# file that does not compile is refused before anything starts. What it cannot see here:
# under gloo no rank takes a GPU, so the GPU in each startup line is the one your code says
# it would take, not one it took (`torch.cuda.set_device` never runs). On a node with 2 GPUs
# or more, `check_worker(WORKER, backend="nccl")` runs the file under NCCL, where picking the
# GPU by `RANK` instead of `LOCAL_RANK` fails on the second node.

# %%
checked = check_worker(WORKER)
print("check_worker: all good in")
print("\n".join(f"  {run.label}" for run in checked))
print(wrap_message("".join(checked[0].output[0].splitlines(keepends=True)[-4:])))

# %% [markdown]
# Each output line starts with its rank (`[2]:`: torchrun's `--tee` prefix, set to the global
# rank). Rank 2 warned in both attempts, and nobody else did:

# %%
warned = checked[0].lines("spans nodes")
print("\n".join(warned))
assert warned and all(line.startswith("[2]:") for line in warned)

# %% [markdown]
# ## 5. Two nodes on this machine, and torchrun's logs
#
# A real two-node job runs the same command on both nodes; here both agents run on this
# machine and meet at `127.0.0.1` on a free port (`--rdzv-backend=c10d`). This is one of the
# two commands; the other differs only in `--node-rank` and `--log-dir`:

# %%
logs = [WORK / "logs-node0", WORK / "logs-node1"]
argv = torchrun_argv(
    WORKER, "--tp-size", "2", "--out", "OUT", nnodes=2, nproc_per_node=2,
    endpoint="127.0.0.1:PORT", node_rank=0, log_dir="LOGS", tee="3", local_ranks_filter="0",
)  # fmt: skip
# argv starts with this Python's "-m torch.distributed.run": the same program as `torchrun`
script_at = argv.index(str(WORKER))
print(" \\\n    ".join(["torchrun", *argv[3:script_at], " ".join(argv[script_at:])]))

# %% [markdown]
# - `--log-dir` gives each agent a folder for its ranks' output files
#   (`RUN_ID/attempt_0/LOCAL_RANK/stdout.log`);
# - `--tee 3` writes stdout and stderr to those files *and* to the console, each line prefixed
#   with the **local** rank (`[default0]:`): both nodes print `[default0]`. For the global rank,
#   set `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[${rank}]:'` in the agents' environment;
# - `--local-ranks-filter 0` shows only local rank 0's lines on the console. The files still
#   hold every rank's.
#
# **Predict:** the job has 4 ranks, 2 per node. Which startup lines does this cell show, and
# what is `LOCAL_RANK` of rank 2?
#
# <details><summary>Answer</summary>
#
# Only those of local rank 0 on each node: ranks 0 and 2 (the filter). Rank 2 is the first
# rank of node 1, so its `LOCAL_RANK` is 0. Ranks 1 and 3 are in the log files.
#
# </details>

# %%
two = torchrun(
    WORKER,
    "--tp-size",
    "2",
    "--out",
    str(WORK / "two"),
    "--epochs",
    "1",
    nnodes=2,
    nproc_per_node=2,
    log_dirs=logs,
    tee="3",
    local_ranks_filter="0",
)
assert two.ok, two.diagnosis()

# %% [markdown]
# Every rank's startup line, read from the log files (the console showed only local rank 0):

# %%
files = sorted(p for d in logs for p in d.rglob("stdout.log"))
for f in files:
    print(f.relative_to(WORK))
identity = {}
for f in files:
    identity.update(startup_lines(f.read_text()))
print(f"{'RANK':>4} {'LOCAL_RANK':>10} {'node':>4} {'dp':>3} {'tp':>3}")
for rank, who in sorted(identity.items()):
    print(f"{rank:>4} {who['local_rank']:>10} {who['node']:>4} {who['dp']:>3} {who['tp']:>3}")
assert sorted(identity) == [0, 1, 2, 3]
assert [identity[r]["local_rank"] for r in range(4)] == ["0", "1", "0", "1"]
assert not two.lines("spans nodes")  # tp 2 divides 2 ranks per node: each TP group on one node
# The console had local rank 0's lines only; the files have all four ranks'.
assert two.lines("rank 2 local_rank 0 ") and not two.lines("local_rank 1 ")

# %% [markdown]
# Each TP group `[0, 1]`, `[2, 3]` sits on one node, and nobody warned. With c10d, torchrun
# **ignores `--node-rank`** (it says so in its log): the rendezvous numbers the nodes itself
# (`GROUP_RANK`), so read it rather than assume it. Both nodes wrote their ledger files into one
# folder, as on a shared filesystem; without one, copy the files into one folder first.
# `Ledger.load` merges them:

# %%
merged = Ledger.load(WORK / "two" / "attempt0")
print(merged.summary())
assert merged.ok and merged.ranks() == [0, 1, 2, 3]

# %% [markdown]
# ## 6. A rank dies; torchrun restarts the job; the data resumes exactly once
#
# Two ranks, DP 2. The data position is saved every 2 steps. In the first attempt rank 1 dies
# (SIGKILL) in epoch 1 at step 3, after the checkpoint of step 2. With `--max-restarts=1`
# torchrun stops the other rank, starts both again (its count of restarts,
# `TORCHELASTIC_RESTART_COUNT`, is now 1), and they resume from the checkpoint: steps 2 and 3
# of epoch 1 are **redone**.
#
# **Predict:** rank 0 was waiting in step 3's all-reduce when rank 1 died. What happens to it?
#
# <details><summary>Answer</summary>
#
# Its all-reduce fails within a second or so ("Connection reset/closed by peer": gloo notices
# the dead peer's socket), or torchrun's monitor stops it first with SIGTERM. Either way the
# whole attempt ends; torchrun restarts every rank, not only the dead one.
#
# </details>

# %%
elastic = torchrun(
    WORKER, "--out", str(WORK / "elastic"), "--checkpoint-every", "2", "--kill", "1:1:3",
    nproc_per_node=2, max_restarts=1, tee="3",
)  # fmt: skip
elastic.raise_for_status()
assert elastic.lines("attempt 1 ")  # the ranks ran again, as the second attempt
print("\n".join(elastic.lines(r"failed \(exitcode")))

# %% [markdown]
# `load_attempts` reads each attempt's ledgers and where each attempt resumed from. The steps
# an attempt took after the checkpoint the next one resumed from were redone: they are marked
# `replayed` and kept apart from the steps that count.

# %%
attempts = load_attempts(WORK / "elastic")
print("attempts (attempt, resumed at epoch, steps done):", attempts.resumed)
for r in sorted(attempts.replayed.records, key=lambda r: (r.rank, r.epoch, r.step)):
    print(f"replayed: rank {r.rank} epoch {r.epoch} step {r.step} samples {list(r.sample_ids)}")
print(attempts.counted.summary())
replayed_ids = {i for r in attempts.replayed.records for i in r.sample_ids}
counted_ids = [i for r in attempts.counted.records if r.epoch == 1 for i in r.sample_ids]
assert attempts.resumed == [(0, 0, 0), (1, 1, 2)]
assert attempts.replayed.records and replayed_ids <= set(counted_ids)
assert attempts.exactly_once()  # every sample once per epoch among the steps that count
assert len(counted_ids) == len(set(counted_ids)) == 48

# %% [markdown]
# The samples of the replayed steps were trained on again after the restart, and counted once:
# the exactly-once proof holds on the steps that count. In a real job the model's checkpoint is
# taken at the same step as the data position; otherwise the model and the data disagree about
# what was trained on.
#
# ### Two nodes: each agent keeps its own count
#
# On one node there is one agent, and its count is the job's. On two nodes there are two. Run
# the same restart with one rank per node, and make rank 0 **wait** at the step where rank 1
# dies (`--others-block`), as an NCCL rank waits in a collective whose peer is gone (gloo
# would notice the closed socket and fail at once). Node 1's agent sees its rank fail, spends
# a restart, and goes back to the rendezvous. Node 0's agent sees a healthy rank and a node
# waiting to join: it restarts its rank for the **membership change**, which torchrun does not
# count as a restart (`agent/server/api.py`: "membership changes do not count as retries").
#
# **Predict:** in the second round, what `TORCHELASTIC_RESTART_COUNT` does each rank read? And
# would a store prefix `attempt{TORCHELASTIC_RESTART_COUNT}` let the two ranks meet?
#
# <details><summary>Answer</summary>
#
# The rank started by node 1's agent reads 1; the one started by node 0's agent reads 0. With
# that prefix they would write and wait under different keys and never meet (the issue this
# notebook was fixed for measured exactly that: `DistStoreError: wait timeout ... keys:
# /attempt1/...`). This file uses a new store per round and rank 0's attempt number instead.
#
# </details>

# %%
membership = torchrun(
    WORKER, "--out", str(WORK / "membership"), "--checkpoint-every", "2", "--kill", "1:1:3",
    "--others-block", "--timeout", "20", nnodes=2, max_restarts=1, echo=False,
)  # fmt: skip
membership.raise_for_status()
print("rank  attempt (rank 0's)  TORCHELASTIC_RESTART_COUNT (its agent's)")
counts = {}
for line in membership.lines(r"^rank \d+ local_rank .* attempt 1 "):
    words = line.split()
    counts[int(words[1])] = int(words[-1])
    print(f"{words[1]:>4}  {1:>18}  {words[-1]:>41}")
assert sorted(counts.values()) == [0, 1]  # the two agents disagree
assert load_attempts(WORK / "membership").exactly_once()

# %% [markdown]
# **When a node is replaced.** The rendezvous numbers the nodes of each round by sorting their
# descriptors (host address, agent process id, a counter), not by `--node-rank`. While the same
# agents run, the order holds (above, one agent started rank 0 in both rounds). A replacement
# node, or an agent started anew, brings a new descriptor that can sort first, and then **rank 0
# moves to another node**. This file's rank 0 reads the checkpoint; on a new node, a checkpoint on
# the old node's local disk is not there, and the job would silently start over. "Nodes need not
# share a filesystem" holds only when nothing is read back. So: keep checkpoints on storage every
# node sees (a shared filesystem, an object store), or refuse. The file refuses: when any agent
# has restarted its ranks (the largest count over the ranks, all-reduced) but rank 0 finds no
# trace of this job in `--out`, every rank raises and says where `--out` must live.
#
# ## 7. A node that never arrives
#
# Start only node 0 of a two-node job. Its agent waits in the rendezvous for `join_timeout`
# (600 s by default; 4 s here), then gives up without starting a rank.

# %%
try:
    torchrun(
        WORKER,
        "--out",
        str(WORK / "alone"),
        nnodes=2,
        start_nodes=[0],
        join_timeout_s=4,
        timeout_s=60,
        echo=False,
    ).raise_for_status()
except AgentError as exc:
    alone = exc.run
    print(wrap_message(str(exc)))  # broken between words for the output column
assert alone is not None and not alone.ok and alone.lines("RendezvousTimeoutError")
print(f"gave up after {alone.elapsed_s:.1f} s")

# %% [markdown]
# On a cluster this is a node that failed to start, a wrong `--rdzv-endpoint`, or a different
# `--rdzv-id`. A batch queue may also start nodes minutes apart: raise `join_timeout` then.
#
# ## 8. Bad input, refused before anything starts
#
# Three mistakes that torchrun itself lets run. `run_agents` checks them first, and each error
# says what to do. First, agents that disagree on `--nnodes`: measured with torch 2.13, one
# agent with `--nnodes=2` and one with `--nnodes=3` at one endpoint ran the job with 2 nodes,
# silently.

# %%
port = free_port()
mismatched = [
    torchrun_argv(WORKER, nnodes=n, endpoint=f"127.0.0.1:{port}", node_rank=i)
    for i, n in enumerate((2, 3))
]
try:
    run_agents(mismatched)
except AgentError as exc:
    print(wrap_message(str(exc)))  # broken between words for the output column
else:
    raise AssertionError("expected the mismatch to be refused")

# %% [markdown]
# A port already in use at the rendezvous endpoint: torchrun connects to whatever listens
# there and waits, and the rendezvous timeouts do not end that wait (measured: still waiting
# after 40 s with `join_timeout=5`).

# %%
with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    try:
        run_agents([torchrun_argv(WORKER, nnodes=1, endpoint=f"127.0.0.1:{taken}")])
    except AgentError as exc:
        print(wrap_message(str(exc)))  # broken between words for the output column
    else:
        raise AssertionError("expected the busy port to be refused")

# %% [markdown]
# A worker file with a syntax error would kill every rank at once; it is refused with its line:

# %%
broken = WORK / "broken_worker.py"
broken.write_text(WORKER.read_text().replace("def main(argv=None):", "def main(argv=None)"))
try:
    torchrun(broken, nproc_per_node=2)
except AgentError as exc:
    print(wrap_message(str(exc)))  # broken between words for the output column
else:
    raise AssertionError("expected the syntax error to be refused")

# %% [markdown]
# Every job above ran under a deadline (`timeout_s`, 60 s by default): past it, or when you
# interrupt the cell, every agent gets SIGTERM (torchrun stops its ranks), whatever is left a
# few seconds later is killed, and the agents' temporary folder is removed.
#
# ## 9. The same file, by hand
#
# In a terminal, from this folder (`torchrun` is `python -m torch.distributed.run`):
#
# ```bash
# torchrun --standalone --nproc-per-node=2 torchrun_worker.py --tp-size 2 --out ledger
# ```
#
# and on a GPU node, unchanged: `... torchrun_worker.py --backend nccl --tp-size 2 --out ledger`.
# Two nodes, each running (`--out` on storage both nodes share, for the restart):
#
# ```bash
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes=2 --nproc-per-node=4 \
#     --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB_ID --max-restarts=1 \
#     torchrun_worker.py --backend nccl --tp-size 4 --out /shared/ledger
# ```
#
# `docs/by-hand.md` in the repository says more (Slurm and PBS: `docs/scale-out.md`).
#
# ## Summary
#
# - torchrun sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`; the GPU is
#   `LOCAL_RANK`'s, never `RANK`'s.
# - Join with an explicit timeout; under NCCL, `set_device` first (`device_id=` does not set
#   it), collectives on the GPU, CPU agreements on a gloo group.
# - A TP group stays on one node when tp divides the ranks per node; warn when it does not.
# - `--max-restarts`: every agent restarts its own node's ranks (the failed node's on the
#   failure, the others' when it comes back); the data resumes from the last saved position, the
#   steps after it are redone, and the ledger proves each sample counted once.
# - `TORCHELASTIC_RESTART_COUNT` is each agent's own count: nodes disagree after a membership
#   change. Key per-attempt state on what every rank agrees on (a store per round, rank 0's
#   decision), and keep checkpoints where a moved rank 0 finds them.
# - `--rdzv-conf join_timeout=...` bounds the wait for a node that never comes.

# %%
work.cleanup()
