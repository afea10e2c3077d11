# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 18 · The same function on a Slurm cluster, its ledger back in the notebook
#
# **Time:** 25 to 30 minutes. Running it top to bottom takes under a minute here: a two-node
# Slurm cluster starts on this machine in about a second, and each job pays a fresh
# `import torch` per rank.
#
# Everything so far ran on one machine. Research clusters run Slurm: you ask the scheduler for
# nodes, it queues your job, and `srun` starts one `torchrun` per node, which starts the ranks
# (notebook 14 did that part by hand). `ez.submit` hands the function you wrote for
# `ez.launch` to Slurm as it is, and brings back what `ez.launch` brings back: the results, the
# ledger, and errors told the same way.
#
# **Learning goals**
#
# - Submit a notebook function to a 2-node cluster; watch it queue, run and stream its output.
# - Read the job script it generates, line by line: what a cluster needs that a laptop does not.
# - Get the ledger back from the nodes and check, by hash, that the ranks saw exactly the samples
#   `ez.launch` gives them at the same layout.
# - See a rank's error and an interrupt arrive from the cluster as they do on the laptop.
# - Know what changes on a real site: accounts, partitions, GPUs, modules, NCCL, preemption.

# %%
import _thread
import threading

import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import get_random_dataset_fsdp_tp
from ezpz_nb.data.groups import make_layout
from ezpz_nb.launcher.failures import format_for_learner
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.slurm import LocalSlurm, SlurmError, SlurmInterrupted
from ezpz_nb.slurm.commands import find_conf
from ezpz_nb.slurm.k8s import manifest, to_yaml
from ezpz_nb.slurm.local import missing_tools
from ezpz_nb.slurm.outcome import sample_hash
from ezpz_nb.wrapping import wrap_message

# %% [markdown]
# ## 1. A cluster to submit to
#
# On a cluster's login node, Slurm is already there. On Linux with Debian's packages
# (`sudo apt-get install slurmctld slurmd slurm-client munge`) and root, `ezpz-nb slurm up`
# starts one on this machine: `munged`, the controller `slurmctld` and two `slurmd` that play
# the nodes `n1` and `n2`, everything in one temporary folder (nothing goes to `/etc`). The cell
# below uses whichever it finds, starts one if it can, and otherwise says why: the rest of the
# notebook then runs the same function with `ez.launch` and skips the Slurm cells.

# %%
started_here = None
if find_conf() is not None:
    SLURM = "found"  # a site's Slurm, or the cluster `ezpz-nb slurm up` started
elif not missing_tools():
    started_here = LocalSlurm.start()
    started_here.save_pointer()  # where ez.submit looks, as for `ezpz-nb slurm up`
    SLURM = f"started here in {started_here.folder}"
else:
    SLURM = ""
    print(
        wrap_message(
            f"No Slurm here: {missing_tools()}.\nOn macOS or Windows use a Linux machine, a "
            "container or a cluster's login node. The Slurm cells below are skipped; the "
            "ez.launch cells still run."
        )
    )
SKIPPED = "skipped: no Slurm cluster here (see section 1)"
if SLURM:
    print(f"Slurm: {SLURM}")
    if started_here is not None:
        print(started_here.status())


# %% [markdown]
# ## 2. The function: notebook 03's DP x TP loader
#
# Two TP peers per replica, two replicas: 4 ranks. On the cluster, 2 nodes x 2 ranks. The
# function is the one `ez.launch` runs; nothing in it knows where it runs.


# %%
def one_epoch():
    layout = make_layout(tp_size=2)
    built = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=16,
        dp_group=layout.dp_group,
        tp_group=layout.tp_group,
        seed=0,
    )
    loader = record(built["dataloader"], layout)
    for _batch in loader:
        pass  # the TP-sharded model would run here
    print(f"dp {layout.dp_rank} tp {layout.tp_rank}: {len(loader.records)} steps")
    return loader.ledger()


here = Ledger.from_results(ez.launch(one_epoch, world_size=4))
print("ez.launch, 4 ranks on this machine, sample-id hash:", sample_hash(here))

# %% [markdown]
# ## 3. Submit it, and watch it queue and run
#
# `ez.submit` packs the function (by value, as `ez.launch` does), writes a job folder and an
# sbatch script, and submits it. It returns at once with a job handle; `job.result()` waits,
# showing Slurm's state (`squeue`'s reason while it queues) and each rank's output as it
# arrives, prefixed with its node and rank.
#
# **Predict:** will rank 0 run on `n1`?
#
# <details><summary>Answer</summary>
#
# Not necessarily. torchrun's rendezvous numbers the nodes in the order their agents join, so
# node `n2` may hold ranks 0 and 1. Code that needs "the first node" asks torch
# (`dist.get_rank() == 0`), never the host name.
#
# </details>

# %%
if SLURM:
    job = ez.submit(one_epoch, nodes=2, ranks_per_node=2, time="00:05:00")
    results = job.result()
    print(job, job.nodes())
else:
    print(SKIPPED)

# %% [markdown]
# ## 4. The script, line by line
#
# The job is one short file, saved in the job folder: `sbatch` it by hand and you get the same
# job (a test does exactly that and compares the ledgers).
#
# - `#SBATCH --nodes=2 --ntasks-per-node=1`: two nodes, **one task per node**: that task is
#   torchrun, which starts the node's ranks (`--nproc-per-node`). Asking Slurm for one task per
#   rank instead would start four torchruns.
# - `--time`: the time limit; Slurm ends the job there (`TIMEOUT`).
# - `--output`, `--chdir`: the job folder, which every node must see (a shared filesystem).
# - `head=...; addr=...`: the first node of the allocation hosts torchrun's c10d rendezvous;
#   its address comes from Slurm, because a node's name does not resolve everywhere.
# - `srun --kill-on-bad-exit=1`: one torchrun per node; if one node fails, Slurm ends the
#   others instead of leaving them waiting in a collective.
# - `--rdzv-id=$SLURM_JOB_ID`: every node's agent joins the same rendezvous.
# - `--max-restarts=0`: a failure ends the job and comes back to you (notebook 14 shows restarts).
# - `-m ezpz_nb.slurm.rank JOB_DIR`: each rank runs `ez.launch`'s own torchrun path and writes
#   its output, reply, stack dump and ledger file into the job folder.

# %%
if SLURM:
    print(job.script.read_text())
else:
    print(SKIPPED)

# %% [markdown]
# ## 5. The ledger comes home
#
# Each rank wrote its ledger file into the job folder as it went; `job.ledger()` merges them.
# Same layout, same seed: the sample-id stream per (epoch, step, rank) must equal `ez.launch`'s,
# and the hash says so in one line.

# %%
if SLURM:
    there = job.ledger()
    print("ez.submit on 2 nodes, sample-id hash: ", sample_hash(there))
    print("ez.launch on this machine:          ", sample_hash(here))
    assert sample_hash(there) == sample_hash(here)
    assert there.ok
    where = ", ".join(f"rank {r} on {n}" for r, n in job.nodes().items())
    fig = viz.heatmap(there)
    fig.suptitle(
        f"ez.submit on 2 nodes: {where}\n"
        f"the same sample ids as ez.launch on this machine (hash {sample_hash(there)})",
        fontsize=9,
    )
else:
    fig = viz.heatmap(here)
    fig.suptitle("ez.launch on this machine (no Slurm here)", fontsize=9)
fig

# %% [markdown]
# ## 6. A rank's error, and an interrupt
#
# Rank 1 divides by zero after the first collective. On the laptop, `ez.launch` raises a
# `RankError` naming the rank and your line, and says the other ranks were stopped. From the
# cluster, the same error arrives, and it names the node too.


# %%
def fails_on_rank_one():
    t = torch.ones(1)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        return 1 / 0
    dist.barrier()
    return t.item()


if SLURM:
    bad = ez.submit(fails_on_rank_one, nodes=2, time="00:05:00")
    try:
        bad.result()
    except ez.RankError as err:
        print(f"{type(err).__name__}: {err}".split("\n--- ")[0])  # the summary first
        print(format_for_learner(err.failures[1]))  # rank 1's traceback: your frames only
        assert err.ranks == [1]
else:
    print(SKIPPED)

# %% [markdown]
# Interrupting the cell that waits (the stop button, or Ctrl-C) cancels the job with `scancel`
# and says so: nothing stays in the queue holding nodes. Here a timer presses stop for you two
# seconds in, while rank 0 waits in a barrier that rank 1 never reaches.


# %%
def hangs_on_rank_zero():
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        threading.Event().wait()


if SLURM:
    stuck = ez.submit(hangs_on_rank_zero, nodes=2, time="00:05:00", timeout=300)
    threading.Timer(2.0, _thread.interrupt_main).start()
    try:
        stuck.result()
    except SlurmInterrupted as stop:
        print(stop)
else:
    print(SKIPPED)

# %% [markdown]
# Slurm's own failures end the wait with Slurm's words: an unknown partition is refused at once,
# a job that stays pending past `result(start_deadline=...)` is cancelled with `squeue`'s
# reason, and a job that reaches its time limit ends as `TIMEOUT`.

# %%
if SLURM:
    try:
        ez.submit(one_epoch, partition="no-such-partition")
    except SlurmError as refused:
        print(refused)
else:
    print(SKIPPED)

# %% [markdown]
# ## 7. What changes on a real site
#
# The function does not change. The job around it does, through `ez.submit`'s arguments:
#
# - **Accounts and partitions**: `partition="gpu"`, `slurm_args=["--account=myproject"]`.
#   `sinfo` lists the partitions; your site's docs say which account to charge.
# - **GPUs**: `slurm_args=["--gpus-per-node=4"]` with `ranks_per_node=4` and `backend="nccl"`;
#   keep `--ntasks-per-node=1` (torchrun starts the ranks; each takes `LOCAL_RANK` as its GPU).
# - **Modules and venvs on the nodes**: `setup=["module load cuda/12.4", "source ~/venv/bin/activate"]`
#   and `python="python"`: the nodes must import the same torch and ezpz_nb as the notebook.
# - **NCCL's environment**: on InfiniBand NCCL finds the fabric itself; on Ethernet, or when it
#   picks the wrong interface, `setup=["export NCCL_SOCKET_IFNAME=ib0"]` (or `eth0`), and
#   `NCCL_DEBUG=INFO` to see what it chose. gloo ignores both.
# - **A shared job folder**: `job_root=` on a filesystem every node mounts (home or a project
#   space, not `/tmp`): the function, the replies and the ledgers travel through it.
# - **Preemption**: `slurm_args=["--signal=USR1@120", "--requeue"]` warns the job two minutes
#   before it is stopped and puts it back in the queue. Save a DCP checkpoint with the loader's
#   state when the signal comes (notebook 15) and load it at start: the requeued job resumes at
#   the same sample, and `Ledger.merge_runs` checks that no sample was seen twice or skipped.
#
# Kubernetes takes the same job: the Kubeflow training operator starts one pod per node and
# sets torchrun's variables. There is no shared filesystem by default, so the job folder is a
# volume every pod mounts (or the ledger goes to object storage):

# %%
spec = job.spec if SLURM else None
if spec is not None:
    print(to_yaml(manifest(spec, image="registry.example/ezpz-nb:latest")))

# %% [markdown]
# ## Summary
#
# - `ez.submit(fn, nodes=..., ranks_per_node=...)` runs the function you wrote for `ez.launch`
#   under `srun` + `torchrun` and gives back its results, output and merged ledger.
# - The job is one script you can read and `sbatch` yourself; the job folder on a shared
#   filesystem carries the function there and the answers back.
# - Errors read as on the laptop (`RankError` with the node, `HangError` with every rank's
#   stack); Slurm's own refusals and time limits quote Slurm; an interrupt cancels the job.
# - The sample-id hash proves the cluster fed every rank exactly what the laptop did.
#
# The whole path, from this notebook to Slurm and Kubernetes, with the pitfalls: `docs/scale-out.md`.

# %%
if started_here is not None:
    started_here.stop()  # the daemons end, their folder goes
