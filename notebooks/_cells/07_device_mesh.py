# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · DeviceMesh in the open, and a third dimension
#
# **Time:** about 40 minutes with the predictions (advanced track). Running the cells alone
# takes under a minute.
#
# Until now `make_layout` built the DP and TP groups for us. Underneath it is torch's
# `DeviceMesh`: the world laid out as an n-dimensional grid of ranks, with one process group
# per row of each dimension. This notebook builds the mesh by hand, feeds its groups to the
# sampler and the loader (as ezpz's own FSDP x TP example does), then adds a third dimension:
# context parallelism (CP), where ranks hold the **same** samples but **different parts** of
# each sequence. It ends with pipeline stages and the global batch size.
#
# **Learning goals**
#
# - Build a `dp x tp` mesh with `init_device_mesh` and read a rank's coordinates and groups.
# - Feed `mesh.get_group("dp")` to the sampler and `mesh.get_group("tp")` to the broadcast.
# - Split sequences over a CP dimension the way torch balances causal attention (head-tail),
#   with the position ids of each part; count the work per rank; see in the ledger that CP
#   peers share sample ids but not bytes.
# - Know which pipeline stage needs which part of a batch (masks and packing included).
# - Compute the global batch: micro-batch x gradient accumulation x DP size.

# %%
# %matplotlib inline
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp
from ezpz_nb.data.groups import Layout, layout_table
from ezpz_nb.ledger import Ledger, record

cluster = ez.Cluster(world_size=4, timeout=60)  # 4 ranks kept for the whole notebook

# %% [markdown]
# ## A 2 x 2 mesh
#
# `init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))` lays the 4 ranks out as a 2 x 2
# grid, the last dimension innermost: rank `r` sits at `(r // 2, r % 2)`. `mesh["dp"]` is the
# 1-D slice of the mesh along `dp` that contains this rank, `get_local_rank()` its coordinate
# there, and `mesh.get_group("dp")` the process group of that slice.
#
# **Predict**: which global ranks are in rank 3's DP group? In its TP group?
#
# <details><summary>Answer</summary>
#
# Rank 3 is at (dp 1, tp 1). Its DP group holds the ranks with the same tp coordinate: `[1, 3]`.
# Its TP group holds the ranks with the same dp coordinate: `[2, 3]`.
# </details>


# %%
def mesh_coordinates():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    return (
        mesh["dp"].get_local_rank(),
        mesh["tp"].get_local_rank(),
        dist.get_process_group_ranks(mesh.get_group("dp")),
        dist.get_process_group_ranks(mesh.get_group("tp")),
    )


coords = cluster.run(mesh_coordinates)
for rank, (dp, tp, dp_members, tp_members) in enumerate(coords):
    print(f"rank {rank}: dp {dp}, tp {tp}, DP group {dp_members}, TP group {tp_members}")
assert coords[3][2:] == ([1, 3], [2, 3])
# The same grid make_layout builds and plots (TP innermost).
assert [(r, c[0], c[1]) for r, c in enumerate(coords)] == layout_table(4, 2)

# %% [markdown]
# ## The mesh feeds the data
#
# As in ezpz's FSDP x TP example, the mesh's groups go straight into the data API: the DP group
# to shard over, the TP group to broadcast in. A `Layout` built from the mesh's coordinates tells
# the ledger where the rank sits. The ledger check passes: TP peers hold the same batch, the two
# DP replicas different ones.


# %%
def mesh_layout(mesh, names=("dp", "tp")):
    """This rank's Layout, read from a mesh with dimensions `names` (dp, [cp,] tp)."""
    coord = {n: (mesh[n].get_local_rank(), mesh[n].size()) for n in names}
    cp_rank, cp_size = coord.get("cp", (0, 1))
    return Layout(
        dist.get_rank(),
        dist.get_world_size(),
        *coord["dp"],
        *coord["tp"],
        mesh.get_group("dp"),
        mesh.get_group("tp"),
        cp_rank=cp_rank,
        cp_size=cp_size,
    )


def train_on_mesh():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    built = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=16,
        seed=0,
        dp_group=mesh.get_group("dp"),
        tp_group=mesh.get_group("tp"),
        broadcast_within_tp=True,
    )
    loader = record(built["dataloader"], mesh_layout(mesh))
    for _batch in loader:
        pass  # the FSDP x TP model would run here (notebook 08)
    return loader.ledger()


on_mesh = Ledger.from_results(cluster.run(train_on_mesh))
print(on_mesh.summary())
assert on_mesh.ok
assert on_mesh.sample_ids(0, 0) == on_mesh.sample_ids(1, 0) != on_mesh.sample_ids(2, 0)
viz.heatmap(on_mesh)

# %% [markdown]
# ## A third dimension: context parallelism
#
# Long sequences do not fit one rank's activations. Context parallelism splits **each
# sequence** over the CP ranks, **of the same samples**: the data is still sharded over DP
# only; inside a DP replica every CP rank takes the same samples, then keeps its own part of
# each sequence. Each part needs its **position ids** (the positions it holds, not 0, 1, 2...),
# or the model would think its part starts the sequence. Attention then exchanges keys and
# values between CP ranks (ring attention).
#
# Which part? The obvious split is contiguous: with `cp=2` and 8 tokens, positions 0-3 and 4-7.
# But attention is **causal**: position `p` attends to the `p + 1` positions up to itself, so
# the rank holding the end of the sequence does most of the work. torch's `context_parallel`
# (`torch.distributed.tensor.experimental`) therefore balances by default
# (`enable_load_balance=True`) with a **head-tail** split: cut the sequence into `2 x cp` chunks
# and give CP rank `r` chunk `r` and chunk `2 x cp - 1 - r`, when the length is a multiple of
# `2 x cp`. At length 8 with 2 CP ranks, rank 0 holds positions `[0, 1, 6, 7]`.
#
# **Predict**: at length 8 with 2 CP ranks, how many query-key pairs does each rank compute with
# the contiguous split, and with the head-tail one?
#
# <details><summary>Answer</summary>
#
# Contiguous: 1 + 2 + 3 + 4 = 10 on rank 0, 5 + 6 + 7 + 8 = 26 on rank 1. Head-tail: 1 + 2 + 7 +
# 8 = 18 and 3 + 4 + 5 + 6 = 18. At long lengths the contiguous split's last rank does about
# `2 x cp - 1` times the first's work: 3x with 2 CP ranks.
# </details>
#
# The head-tail order, built here on the CPU, and checked against torch's own load balancer:


# %%
def head_tail(length, cp_size):
    """Positions each CP rank holds under torch's default head-tail split."""
    chunks = torch.arange(length).view(2 * cp_size, length // (2 * cp_size))
    return [torch.cat([chunks[r], chunks[2 * cp_size - 1 - r]]).tolist() for r in range(cp_size)]


def contiguous(length, cp_size):
    return torch.arange(length).view(cp_size, -1).tolist()


def causal_pairs(positions):
    """Query-key pairs a rank computes under a causal mask: position p sees p + 1 keys."""
    return sum(p + 1 for p in positions)


print("head-tail at length 8, cp 2:", head_tail(8, 2))
for name, split in (("contiguous", contiguous), ("head-tail", head_tail)):
    print(f"{name:>10}: query-key pairs per CP rank {[causal_pairs(p) for p in split(8, 2)]}")
assert head_tail(8, 2) == [[0, 1, 6, 7], [2, 3, 4, 5]]
assert [causal_pairs(p) for p in contiguous(8, 2)] == [10, 26]
assert [causal_pairs(p) for p in head_tail(8, 2)] == [18, 18]
long = [causal_pairs(p) for p in contiguous(8192, 2)]
assert 2.99 < long[1] / long[0] < 3  # tends to 2 x cp - 1 = 3
assert len({causal_pairs(p) for p in head_tail(8192, 4)}) == 1  # balanced at any cp

try:  # torch's own order (a private module: its path may move between releases)
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _create_default_load_balancer,
    )
except ImportError:
    print("this torch keeps its load balancer elsewhere; the comparison is skipped")
else:
    for length, cp in ((8, 2), (16, 4), (24, 3)):
        order = _create_default_load_balancer(length, cp, "cpu")._generate_indices()[0]
        assert order.tolist() == sum(head_tail(length, cp), []), (length, cp)
    # Not a multiple of 2 x cp: torch does not balance (None) and splits contiguously.
    assert _create_default_load_balancer(6, 2, "cpu") is None
    print("matches torch's _HeadTailLoadBalancer at (8, 2), (16, 4) and (24, 3)")

# %% [markdown]
# Where the split happens differs between libraries. torch's `context_parallel` gives every CP
# rank the **whole batch** and shards it inside the `context_parallel(mesh, buffers=...,
# buffer_seq_dims=...)` context, so the loader stays as it is; its ring attention runs on CUDA
# only. picotron slices each sequence in the loader instead (contiguously). Below the loader
# does the head-tail slice itself, so that the ledger can show what each rank holds.
#
# With 8 ranks the mesh is `dp 2 x cp 2 x tp 2`. TP stays innermost: TP peers hold the same
# part, so the leader broadcast still works inside each TP group.
#
# **Predict**: rank 6 sits at (dp 1, cp 1, tp 0). Which positions does it hold, and which rank
# holds the same sample ids but positions `[0, 1, 6, 7]`?
#
# <details><summary>Answer</summary>
#
# Positions `[2, 3, 4, 5]` (CP rank 1). Rank 4, at (dp 1, cp 0, tp 0), holds the same samples,
# positions `[0, 1, 6, 7]`; rank 7 holds exactly what rank 6 holds (its TP peer).
# </details>


# %%
class CPSlices:
    """Yield each batch of `loader` cut to this CP rank's head-tail part of every sequence."""

    def __init__(self, loader, cp_rank, cp_size):
        self.loader, self.cp_rank, self.cp_size = loader, cp_rank, cp_size
        self.source = getattr(loader, "source", "loaded")  # read by the ledger

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            mine = torch.tensor(head_tail(batch["input_ids"].shape[1], self.cp_size)[self.cp_rank])
            yield {
                "input_ids": batch["input_ids"][:, mine],
                "labels": batch["labels"][:, mine],
                "position_ids": mine.expand(len(batch["index"]), -1),
                "index": batch["index"],
            }


def train_with_cp():
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    layout = mesh_layout(mesh, ("dp", "cp", "tp"))
    built = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=8,
        seed=0,
        dp_group=layout.dp_group,
        tp_group=layout.tp_group,
        broadcast_within_tp=True,
    )
    loader = record(CPSlices(built["dataloader"], layout.cp_rank, layout.cp_size), layout)
    first = None
    for batch in loader:
        first = batch if first is None else first
    return loader.ledger(), first["position_ids"][0].tolist(), first["input_ids"][0].tolist()


results = ez.launch(train_with_cp, world_size=8, timeout=60)
with_cp = Ledger.from_results([led for led, _, _ in results])
positions = {rank: pos for rank, (_, pos, _) in enumerate(results)}
where = {r.rank: f"dp{r.dp_rank},cp{r.cp_rank},tp{r.tp_rank}" for r in with_cp.records}
print(with_cp.summary())
for rank in range(8):
    print(
        f"rank {rank} ({where[rank]}): samples {with_cp.sample_ids(rank, 0)}, "
        f"positions of its first sample {positions[rank]}"
    )
assert with_cp.ok  # CP peers differ in bytes, which is right; TP peers do not
assert positions[6] == [2, 3, 4, 5] and positions[4] == [0, 1, 6, 7]
assert with_cp.sample_ids(4, 0) == with_cp.sample_ids(6, 0) != with_cp.sample_ids(0, 0)
step0 = {r.rank: r for r in with_cp.records if r.step == 0}
assert step0[6].digest == step0[7].digest != step0[4].digest
# The two CP parts put back in position order are the whole sequence the dataset holds.
sample = RandomTokenDataset(100, 8, num_samples=8)[with_cp.sample_ids(4, 0)[0]]
rebuilt = dict(zip(positions[4] + positions[6], results[4][2] + results[6][2], strict=True))
assert [rebuilt[p] for p in range(8)] == sample["input_ids"].tolist()

# %% [markdown]
# The heatmap labels rows with all three coordinates: inside a DP replica (between white lines)
# all four rows hold the same sample ids. The picture below it shows what the ids cannot:
# which token positions each rank holds of the first sample it took.

# %%
viz.heatmap(with_cp)

# %%
held = np.full((8, 8), np.nan)
for rank, pos in positions.items():
    held[rank, pos] = with_cp.layout()[rank][0]  # colour: the DP replica
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.imshow(held, cmap="cividis", vmin=0, vmax=1.3, aspect="auto")
for rank, pos in positions.items():
    for p in pos:
        dark = with_cp.layout()[rank][0] == 0  # cividis is dark at the low end
        ax.text(
            p,
            rank,
            str(p),
            ha="center",
            va="center",
            fontsize=8,
            color="white" if dark else "black",
        )
ax.set_yticks(range(8), [f"r{r} ({where[r]})" for r in range(8)], fontsize=8)
ax.set_xlabel("token position in the sequence")
ax.set_title(
    "Positions each rank holds of its first sample:\nCP ranks split the sequence "
    "head-tail, TP peers hold the same part",
    fontsize=10,
)
plt.show()

# %% [markdown]
# ## Pipeline stages: who needs what
#
# With pipeline parallelism (PP) the model's layers are split into stages on different ranks.
# Only the **first** stage embeds tokens, so only it needs `input_ids` (and `position_ids`);
# only the **last** stage computes the loss, so it needs `labels` **and** `loss_mask` (which
# tokens count: not padding, not the prompt). A stage that applies an explicit attention mask
# needs `attention_mask` too: Megatron-LM's `get_batch_on_this_tp_rank` gives the first stage
# `tokens`, `position_ids` and `attention_mask`, the last `labels`, `loss_mask` and
# `attention_mask`. With **packed** sequences (several documents in one row) every stage's
# attention needs the document boundaries, so that no token attends across documents: Megatron
# passes them to every stage as `cu_seqlens` in its `PackedSeqParams`. The stages between
# otherwise receive activations from the previous stage and need no batch. All stages of one
# pipeline must still agree on the *samples* (the labels must belong to the inputs): shard over
# DP, never over PP.
#
# Below a `pp 2 x dp 2` mesh. Both stages of a pipeline build the same sampler (DP group), add
# the masks a real batch carries, and keep only their part.

# %%
# What each stage keeps of a batch (unpacked sequences; packed ones add cu_seqlens to every stage).
NEEDS = {
    "first": {"index", "input_ids", "position_ids", "attention_mask"},
    "last": {"index", "labels", "loss_mask", "attention_mask"},
}


def pipeline_parts():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    stage, last = mesh["pp"].get_local_rank(), mesh["pp"].size() - 1
    keep = (NEEDS["first"] if stage == 0 else set()) | (NEEDS["last"] if stage == last else set())
    built = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=8,
        seed=0,
        dp_group=mesh.get_group("dp"),
    )
    got = []
    for batch in built["dataloader"]:
        ids = batch["input_ids"]
        batch["position_ids"] = torch.arange(ids.shape[1]).expand_as(ids)
        batch["attention_mask"] = torch.ones_like(ids)
        batch["loss_mask"] = torch.ones(ids.shape)  # 0 where a token must not count
        got.append({k: v for k, v in batch.items() if k in keep})
    return stage, sorted(got[0]), [b["index"].tolist() for b in got]


parts = cluster.run(pipeline_parts)
for rank, (stage, keys, ids) in enumerate(parts):
    print(f"rank {rank}: stage {stage} keeps {keys},\n  samples {ids}")  # under 100 columns
assert parts[0][1] == sorted(NEEDS["first"]) and parts[2][1] == sorted(NEEDS["last"])
assert parts[0][2] == parts[2][2]  # stage 0 and stage 1 of pipeline 0: the same samples

# %% [markdown]
# ## The global batch
#
# One optimizer step sees **micro-batch x accumulation steps x DP size** samples: each DP replica
# runs `accum` micro-batches before the gradients are reduced and the step taken. TP, CP and PP
# ranks do not add samples: they split the work on the same ones.
#
# **Predict**: with 8 ranks as `dp 2 x cp 2 x tp 2`, micro-batch 2 and 4 accumulation steps, how
# many samples does one optimizer step see?
#
# <details><summary>Answer</summary>
#
# 2 x 4 x 2 = 16. Only the DP size counts; the CP and TP ranks share samples.
# </details>
#
# The ledger can check it on the 4-rank `dp 2 x tp 2` run above: micro-batches of 2, and with
# 4 accumulation steps per optimizer step the DP replicas together must see 16 different samples
# per optimizer step.


# %%
def global_batch(ledger, accum):
    """Distinct samples per optimizer step: micro-steps grouped by `accum`, over all ranks."""
    seen = {}
    for r in ledger.records:
        seen.setdefault((r.epoch, r.step // accum), set()).update(r.sample_ids)
    return sorted({len(ids) for ids in seen.values()})


micro, accum, dp = 2, 4, 2
print("samples per optimizer step:", global_batch(on_mesh, accum=accum))
assert global_batch(on_mesh, accum=accum) == [micro * accum * dp]
assert global_batch(with_cp, accum=2) == [2 * 2 * 2]  # CP and TP add no samples

# %%
cluster.close()

# %% [markdown]
# ## Summary
#
# - `init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))`: the last dimension is
#   innermost; `mesh["dp"].get_local_rank()` is a rank's coordinate, `mesh.get_group("dp")` its
#   group. `make_layout` builds the same grid.
# - Shard over the DP group, broadcast in the TP group, whatever other dimensions exist.
# - CP ranks hold the same samples, different parts of each sequence, with their position ids.
#   torch balances causal attention with a head-tail split (rank `r`: chunks `r` and
#   `2 x cp - 1 - r`); a contiguous split gives the last rank up to `2 x cp - 1` times the work.
#   torch shards inside `context_parallel` (whole batch on every CP rank; ring attention on
#   CUDA); the ledger records `cp_rank` and only asks ranks of the same CP part for identical
#   bytes.
# - Pipeline stages share samples: the first needs `input_ids` and `position_ids`, the last
#   `labels` and `loss_mask` (both the attention mask, if the model takes one); with packed
#   sequences every stage needs the document boundaries (`cu_seqlens`).
# - Global batch = micro-batch x accumulation x DP size; TP, CP and PP add no samples.
#
# Next: **08 · Capstone**: a real model trained with FSDP2 x TP on this layout.
