# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 15 · The data state inside the checkpoint: one `dcp.save`, per DP rank, across world sizes
#
# **Time:** about 45 to 55 minutes with the predictions (advanced track). Running the cells takes
# well under a minute on 2 idle cores: one warm cluster of 4 ranks runs every job.
#
# Notebook 09 resumed a loader from its own `state_dict`, one file per rank. A real job writes
# one **distributed checkpoint** (`torch.distributed.checkpoint`, DCP) holding the FSDP2 x TP
# model, the optimizer and the loader, and that is where data goes missing: DCP writes each
# *key* once, so a loader state saved under the same key by every rank comes back as one rank's
# state on all of them. Here the capstone's model (notebook 08) trains on `dp 2 x tp 2`, is
# stopped, saved, and resumed, and the ledger of samples says what each way of saving did.
#
# **Learning goals**
#
# - Put the loader's state into the same `dcp.save` as model and optimizer, keyed per DP rank,
#   written once per TP group, and each process's random generators beside it:
#   `LoaderCheckpoint`.
# - See the traps fail with numbers: one key for every rank (which rank's copy DCP kept, what
#   the others replay), only rank 0 saving, the model restored but the loader fresh.
# - Resume at the same layout with the loss after the resume equal to the straight run's, max
#   abs diff 0.0, know why that holds here, and what else a GPU job must save or set.
# - Resume at another DP size (dp 4 -> 2 -> 3): refuse with a clear error, or re-shard exactly
#   from a global `consumed_samples`; never drop silently.
# - Write a loader's `state_dict`/`load_state_dict` for DCP, checked on real ranks.

# %%
import collections
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ezpz_nb as ez
from ezpz_nb.data import CheckpointLayoutError, GlobalOrderLoader, LoaderCheckpoint, ShardStream
from ezpz_nb.data.checkpoint import sub_layout
from ezpz_nb.data.groups import Layout
from ezpz_nb.examples.capstone import avg_reduces_correctly, parallelize
from ezpz_nb.models import CapstoneLM, RuleTokenDataset
from ezpz_nb.wrapping import wrap_message

N, BATCH, STEPS, STOP = 32, 2, 8, 3  # 32 samples, 2 DP replicas of batch 2: 8 steps an epoch
# One warm cluster for every job below, and a folder for the checkpoints: both go when the
# kernel stops (closing them in a last cell would end the exercise after Run All).
cluster = ez.Cluster(world_size=4, timeout=120)
work = tempfile.TemporaryDirectory(prefix="ezpz-nb15-")
print(cluster)

# %% [markdown]
# ## 1. The job: FSDP2 x TP, a sharded stream, and what goes into the checkpoint
#
# The loader is a `ShardStream`: DP rank `r` reads its own shard (samples `r, r+2, r+4 ...`)
# and masks a quarter of the input tokens with **its own** generator, as an augmentation
# would. Its `state_dict()` is `{"shard", "offset", "generator"}`, like the state of a
# sharded streaming dataset. TP peers read the same shard, so they hold the same state.
#
# Model and optimizer go in through DCP's own `get_state_dict`/`set_state_dict` (each rank
# holds its DTensor shards; DCP writes every shard once). The job saves after 3 steps, beside
# the same model and optimizer, one checkpoint for each way of saving the loader; a resumed job
# (`load=`) loads one of them:
#
# | way | what each rank puts in the checkpoint under `"data"` |
# |---|---|
# | `"keyed"` | `LoaderCheckpoint`: layout + `dp_rank_<r>: {loader}` + `rng_rank_<g>` (this process's generators) |
# | `"one key"` | `{"loader": loader.state_dict()}` on every rank |
# | `"rank 0"` | the same, on rank 0 only |
# | `"none"` | nothing is loaded: model and optimizer only (from the keyed checkpoint) |


# %%
class ModelAndOptim:
    """A Stateful for dcp: each rank's own DTensor shards of model and optimizer."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state):
        set_state_dict(
            self.model, self.opt, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )


def train(root, steps, load=None, save_at=None):
    """Build model, optimizer, loader on dp 2 x tp 2; maybe load `load`'s way; take `steps` steps.

    With `save_at`, after that many steps the job saves model, optimizer and the loader in one
    dcp.save for each way in SAVES (one folder each), as a job stopped there would.
    """
    warnings.filterwarnings("ignore", category=FutureWarning)  # FSDP2's renamed collective
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    layout = Layout(dist.get_rank(), 4, dp, 2, tp, 2, mesh.get_group("dp"), mesh.get_group("tp"))
    torch.manual_seed(0)
    model = parallelize(CapstoneLM(), mesh)
    if not avg_reduces_correctly(mesh.get_group("dp")):  # gloo may sum for AVG: see notebook 08
        model.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    loader = ShardStream(RuleTokenDataset(num_samples=N), BATCH, dp, 2, seed=5)

    def state(data):
        """What each rank hands to dcp.save / dcp.load for one way of saving the loader."""
        out = {"app": ModelAndOptim(model, opt)}
        if data == "keyed":
            out["data"] = LoaderCheckpoint(loader, layout)
        elif data == "one key" or (data == "rank 0" and dist.get_rank() == 0):
            out["data"] = {"loader": loader.state_dict()}
        return out

    if load:  # "none" loads the keyed checkpoint's model and optimizer only
        loaded = state(load)
        dcp.load(loaded, checkpoint_id=f"{root}/{'keyed' if load == 'none' else load}")
        if isinstance(loaded.get("data"), dict):  # a plain dict is filled in place
            loader.load_state_dict(loaded["data"]["loader"])
    restored = loader.shard
    losses, seen, it = [], [], iter(loader)
    for step in range(steps):
        if step == save_at:
            for data in SAVES:
                dcp.save(state(data), checkpoint_id=f"{root}/{data}")
        batch = next(it)
        loss = torch.nn.functional.cross_entropy(
            model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean, group=layout.dp_group)
        losses.append(mean.item() / 2)
        seen.append(batch["index"].tolist())
    return {"dp_rank": dp, "tp_rank": tp, "shard": restored, "losses": losses, "seen": seen}


SAVES = ("keyed", "one key", "rank 0")  # "none" saves nothing of its own
straight = cluster.run(train, work.name, STEPS, save_at=STOP)
print("straight run, losses:", [round(x, 4) for x in straight[0]["losses"]])
print("DP rank 0 saw", straight[0]["seen"], "\nDP rank 1 saw", straight[2]["seen"])


# %% [markdown]
# ## 2. Resume at the same layout: the loss after the resume, bit for bit
#
# After 3 steps the job `dcp.save`d model, optimizer and `LoaderCheckpoint` (the straight run
# above saved there on its way, as a job stopped after step 3 would: a save reads, it changes
# nothing). A second job builds all of it fresh, `dcp.load`s, and takes the other 5.
#
# **Predict:** the largest difference between the resumed run's 5 losses and the straight
# run's last 5: 0.0, about 1e-7, or about 1e-3?


# %%
def join(second):
    """The ledger over the join, one TP leader per DP rank: (repeated, never seen)."""
    before = [b for r in straight if r["tp_rank"] == 0 for b in r["seen"][:STOP]]
    after = [b for r in second if r["tp_rank"] == 0 for b in r["seen"]]
    counts = collections.Counter(i for batch in before + after for i in batch)
    return sum(c - 1 for c in counts.values()), N - len(counts)


def resume(data):
    """A fresh job that loads the checkpoint saved `data`'s way and takes the other steps."""
    second = cluster.run(train, work.name, STEPS - STOP, load=data)
    diff = max(
        abs(a - b) for a, b in zip(second[0]["losses"], straight[0]["losses"][STOP:], strict=True)
    )
    return second, diff


second, diff = resume("keyed")
print(f"keyed per DP rank: max abs loss diff {diff}, (repeated, never seen) = {join(second)}")
assert diff == 0.0 and join(second) == (0, 0)

# %% [markdown]
# 0.0: the resumed run computes the same numbers in the same order. On CPU with gloo the
# kernels are deterministic, every collective reduces over the same ranks in the same order,
# DCP writes and reads the exact fp32 bytes of every shard and of AdamW's moments and step
# count, and the loader restores its shard, offset **and** generator, so even the masked
# tokens are the same. torchtitan holds its loader to the same standard (PR #4088: max abs
# diff 0.0 for text and SFT; multimodal 0.0016 and Flux 0.00038 there).
#
# On NCCL GPUs the checkpoint is just as exact, but more state and more settings decide the
# numbers. Some CUDA kernels use atomics (they differ run to run unless
# `torch.use_deterministic_algorithms(True)`). NCCL's choice of algorithm repeats on the same
# topology, so two straight runs on the same nodes agree; a resume on other nodes or another
# topology may reduce in another order, and `NCCL_ALGO` alone does not pin it (the protocol
# and the channel count change the order too). There compare with a tolerance measured
# between two straight runs; the data ledger must still join with 0 repeated and 0 never seen.
#
# What a bit-exact GPU resume needs, and what each costs when it is missing:
#
# | what | saved or set by | if missing |
# |---|---|---|
# | the loader's place, per DP rank | `dp_rank_<r>` | samples repeated and never seen (section 3) |
# | torch's CPU generator | `rng_rank_<g>` | other masks and augmentations; the DataLoader workers' seeds, drawn from it at `iter()`, change too |
# | Python's and numpy's generators | `rng_rank_<g>` (numpy when imported) | other draws in code that uses `random` or `np.random` |
# | the CUDA generator of the rank's GPU | `rng_rank_<g>` (when CUDA is in use) | other dropout masks: the loss moves from the first step |
# | DTensor's RNG tracker (TP dropout) | the CUDA generator in torch 2.13 (its own states in releases that keep them: `rng_rank_<g>`) | TP peers drop different units: the sharded model computes another function |
# | deterministic kernels | `torch.use_deterministic_algorithms(True)` and `CUBLAS_WORKSPACE_CONFIG=:4096:8` set before CUDA starts | cuBLAS raises without the variable; without the switch, atomics differ in the last bits |
# | the same nodes and topology | the job's placement | another reduction order: last-bit differences |
#
# `LoaderCheckpoint.restored_rng` lists the generators the last load put back.
#
# ## 3. The traps
#
# **Predict:** with `{"loader": loader.state_dict()}` on every rank, which DP rank's shard does
# each rank continue after the load? How many samples are repeated over the join, and how many
# never seen?

# %%
for data in ("one key", "rank 0", "none"):
    second, diff = resume(data)
    shards = [r["shard"] for r in second]
    # One line per way, under 100 columns: a wider one breaks inside a number.
    print(f"{data:8}: shards after the load {shards}, (repeated, never seen) = {join(second)}")
    print(f"{'':8}  max abs loss diff {diff:.2e}")

# %% [markdown]
# - **one key:** DCP deduplicates values saved under one key (pytorch PR #125334): for each
#   flattened key it keeps the copy of the rank whose plan is smallest so far (in torch 2.13's
#   `dedup_save_plans`), not a fixed rank, and `dcp.load` hands that one copy to every rank.
#   Here rank 0's plan already held its model shards, so another rank's copy won: every rank
#   reads shard 1 after the load, its 10 remaining samples are trained twice and shard 0's 10
#   never. (With nothing planned before it, rank 0's copy wins: `tests/test_checkpoint.py`.)
#   That is the default planner; `DefaultSavePlanner(dedup_save_to_lowest_rank=True)` pins the
#   copy to the lowest rank, which still gives every rank the same one. The keys of one state
#   can even come from different ranks (`shard` from one, `generator` from another).
#   torchtitan #291 is this symptom ("all ranks receiving the same state_dict of dataloader").
# - **rank 0:** only rank 0 put a loader state in; the others load nothing and start their
#   shard over (6 repeated, 6 never seen here). Rank 1, rank 0's TP peer, starts over while
#   rank 0 resumes: one TP group is now fed two different batches, and its sharded layers
#   compute nonsense without an error (torchtitan #409 warned "DataLoader state is empty" on
#   the other ranks; SimpleTuner #2986 saw 2 of 12 images twice, 2 never).
# - **none:** model and optimizer are back, the loader starts the epoch over: every rank
#   replays what it trained on before the stop, and the loss moves off the straight run.
#
# `LoaderCheckpoint` keys each DP rank's state `dp_rank_<r>`; TP peers write the same key,
# holding their TP leader's part, so the one copy DCP keeps per TP group is the leader's and
# every peer resumes at its leader's step. Before a byte is written `state_dict()` checks that
# each peer agrees with its leader on all it tracks (fingerprints gathered over the TP group;
# a `TPBroadcastDataLoader` peer, which loads nothing, tracks only its step): a difference
# raises `CheckpointStateError` on every rank. Below, rank 1 (the TP peer of rank 0) takes one
# step more than its leader before the save.
#
# **Predict:** which ranks raise, and which ranks' `dcp.save` completes?


# %%
def peers_apart(root):
    """dp 2 x tp 2: rank 1 one step ahead of its TP leader, then one dcp.save on every rank."""
    layout, _ = sub_layout(2, 2)
    loader = GlobalOrderLoader(RuleTokenDataset(num_samples=16), BATCH, layout.dp_rank, 2)
    it = iter(loader)
    for _ in range(2 if dist.get_rank() == 1 else 1):
        next(it)
    try:
        dcp.save({"data": LoaderCheckpoint(loader, layout)}, checkpoint_id=f"{root}/apart")
    except Exception as exc:  # noqa: BLE001 - DCP wraps each rank's error in its own
        return type(exc).__name__ + (": TP peers disagree" if "TP peers" in str(exc) else "")
    return "saved"


apart = cluster.run(peers_apart, work.name)
print(*(f"rank {r}: {a}" for r, a in enumerate(apart)), sep="\n")
assert all("TP peers disagree" in a for a in apart)

# %% [markdown]
# Every rank raised, before a byte was written: the gather that compares the peers reaches every
# DP rank, so no rank is left waiting inside `dcp.save`.
#
# ## 4. Resume at another DP size: dp 4 -> 2 -> 3
#
# The job now runs on 4 ranks (tp 1 so it fits 2 cores), stops after 2 steps, resumes on 2
# ranks for 2 steps, and finishes on 3. The loader is a `GlobalOrderLoader`: one global order
# per epoch, DP rank `r` takes every `D`-th sample of each global step, and its place is one
# global `consumed_samples`. 48 samples: 16 at dp 4, 8 at dp 2, 24 at dp 3.
#
# **Predict:** with `on_new_layout="refuse"`, what happens at dp 2? With `"reshard"`, how many
# samples are repeated or never seen over both joins?


# %%
def part(dp, steps, design, load=None, save=None):
    """Run on the first `dp` ranks (tp 1) of the warm cluster; the others sit this one out."""
    made = sub_layout(dp)
    if made is None:
        return None
    layout, group = made
    rng = "per-sample" if design == "reshard" else "per-rank"
    ds = RuleTokenDataset(num_samples=48)
    loader = GlobalOrderLoader(ds, BATCH, layout.dp_rank, dp, seed=3, mask_rate=0.25, rng=rng)
    ckpt = LoaderCheckpoint(loader, layout, on_new_layout=design)
    if load:
        try:
            ckpt.prepare_load(load, group)  # reads the saved layout; refuses what cannot resume
        except CheckpointLayoutError as exc:
            return f"refused: {exc}"
        dcp.load({"data": ckpt}, checkpoint_id=load, process_group=group)
    it = iter(loader)
    seen = [i for _ in range(steps) for i in next(it)["index"].tolist()]
    if save:
        dcp.save({"data": ckpt}, checkpoint_id=save, process_group=group)
    return seen


for design in ("refuse", "reshard"):
    at4, at2 = f"{work.name}/{design}_dp4", f"{work.name}/{design}_dp2"
    a = cluster.run(part, 4, 2, design, save=at4)
    b = cluster.run(part, 2, 2, design, load=at4, save=at2)
    if isinstance(b[0], str):
        print(wrap_message(f"{design}: {b[0]}"))  # broken between words for the output column
        continue
    c = cluster.run(part, 3, 4, design, load=at2)
    counts = collections.Counter(i for run in (a, b, c) for seen in run if seen for i in seen)
    repeated, never = sum(n - 1 for n in counts.values()), 48 - len(counts)
    print(f"{design}: dp 4 -> 2 -> 3, {repeated} repeated, {never} never seen")
    assert (repeated, never) == (0, 0)

# %% [markdown]
# Two designs, both honest:
#
# - **refuse** (per-rank state): a place saved by each of 4 DP ranks cannot be split over 2 or
#   3. A plain per-rank key would not even notice at a smaller DP size: `dp_rank_0` and
#   `dp_rank_1` load, the places of old ranks 2 and 3 are silently dropped. The layout saved
#   beside them turns that into an error that says what differs.
# - **reshard** (a global counter): the DP ranks' `consumed_samples` is checked equal at save;
#   the new ranks cut the rest of the same global order anew. The randomness must then be per
#   sample (seeded by seed, epoch, index), because per-rank generators have no owner at another
#   DP size: `LoaderCheckpoint` refuses a loader that is not `reshardable`.
#
# | library | on a changed DP size |
# |---|---|
# | torchtitan | refuses (per-DP-rank `dp_rank_<r>` keys; PR #816) |
# | torchdata `StatefulDataLoader` | per-rank, per-worker state: same `num_workers` and world size |
# | MosaicML streaming | re-shards: global sample position over canonical nodes |
# | Megatron-LM | re-shards: a global `consumed_samples` |
# | Megatron Energon | redistributes when the total worker count stays equal |
#
# docs/checkpoint.md cites where each of these is written.
#
# ## 5. Exercise: a loader's state for DCP
#
# Write the two functions DCP will call through a `Stateful` on every rank, for the
# `ShardStream` of section 1: `loader_state(loader, layout)` returns the dict this rank puts
# under `"data"`, and `load_loader_state(loader, layout, state)` restores from what `dcp.load`
# filled in (its template is `loader_state` of a fresh loader). The checker draws the dataset,
# two loader seeds, two save steps and the loader's batch size (`loader.batch_size`: never
# assume one) on `dp 2 x tp 2` and on `dp 4 x tp 1`. At each place it
# saves two loaders built with other seeds and set to that place (their checkpoints must
# match), loads one into a fresh loader of the run's own seed on other ranks, then compares
# samples and masked tokens with a straight run. The saves may write nothing but their
# checkpoint (no file of your own, no socket, no process left running), and they run on ranks
# the checker starts for them (a few seconds), every thread confined, so nothing your code
# leaves in a rank runs outside. So save the place, not the loader: read the state dcp.load
# hands you, and key it by what the layout says.

# %% tags=["workshop"]
import ezpz_nb.workshop.dcp_state as ex

loader_state = load_loader_state = None  # your code: two functions


# %% tags=["workshop"]
ex.check_loader_state(loader_state, load_loader_state)

# %% tags=["solutions"]
import ezpz_nb.workshop.dcp_state as ex


def loader_state(loader, layout):
    return {f"dp_rank_{layout.dp_rank}": loader.state_dict()}  # generator included


def load_loader_state(loader, layout, state):
    loader.load_state_dict(state[f"dp_rank_{layout.dp_rank}"])


# %% tags=["solutions"]
assert ex.check_loader_state(loader_state, load_loader_state).passed

# %% [markdown]
# ## What to take away
#
# - DCP writes each key once. A loader state needs one key per DP rank; TP peers may share it,
#   after checking they agree.
# - Save the RNG the loader draws from with its place, or the resumed batches differ; on a GPU
#   job also every generator of each process (CUDA's, numpy's, DTensor's: the checklist in
#   section 2), and set deterministic kernels.
# - The resume standard: the loss after the resume equals the straight run's (max abs diff 0.0
#   on gloo/CPU; on GPUs within what two straight runs differ by) and the ledger joins with 0
#   repeated, 0 never seen.
# - At another DP size, refuse with what differs, or re-shard from a global counter with
#   per-sample randomness; never drop a rank's state silently.
