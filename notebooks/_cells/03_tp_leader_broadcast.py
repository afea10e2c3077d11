# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Tensor parallelism and the leader broadcast
#
# With tensor parallelism (TP) several ranks split **one** model replica between them, so they
# must all compute on **the same batch**. Data parallelism (DP) still wants different batches per
# replica. This notebook builds the DP × TP layout on 4 real ranks, shows two ways TP peers
# silently get different inputs, and the fix: only one rank per TP group loads, and broadcasts.
#
# **Learning goals**
#
# - Read the DP × TP layout: which ranks form a TP group, which a DP group.
# - See the `dp_group=None` pitfall: sharding over the whole world splits TP peers apart.
# - See a rank-seeded dataset give TP peers different tokens, and the ledger catch it.
# - Use `TPBroadcastDataLoader`: the TP leader loads, its peers receive identical bytes.
# - Measure the pickled broadcast against the tensor broadcast.

# %%
# %matplotlib inline
import time

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, default_collate

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset, get_random_dataset_fsdp_tp
from ezpz_nb.data.broadcast import BatchBroadcaster
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record

# %% [markdown]
# ## The DP × TP layout
#
# 4 ranks with `tp_size=2` form a 2 × 2 grid, TP innermost (the layout of ezpz, Megatron-LM and
# `DeviceMesh`): ranks 0 and 1 are one TP group (one model replica), ranks 2 and 3 the other.
# The DP groups run across: ranks 0 and 2, ranks 1 and 3. Rows of the picture are TP groups.

# %%
viz.layout(4, 2)


# %% [markdown]
# `make_layout(tp_size)` builds both groups inside the ranks. Each rank reports the members of
# its groups:

# %%
def my_groups():
    layout = make_layout(tp_size=2)
    return (layout.dp_rank, layout.tp_rank,
            dist.get_process_group_ranks(layout.tp_group),
            dist.get_process_group_ranks(layout.dp_group))


groups = ez.launch(my_groups, world_size=4)
for rank, (dp, tp, tp_members, dp_members) in enumerate(groups):
    print(f"rank {rank}: dp_rank {dp}, tp_rank {tp}, TP group {tp_members}, DP group {dp_members}")
assert [g[2] for g in groups] == [[0, 1], [0, 1], [2, 3], [2, 3]]
assert [g[3] for g in groups] == [[0, 2], [1, 3], [0, 2], [1, 3]]


# %% [markdown]
# ## One function for the rest of the notebook
#
# `get_random_dataset_fsdp_tp` (the API of `ezpz.data.distributed`) builds the dataset, the
# `DistributedSampler` and the loader. The function below runs one epoch of 16 samples in
# batches of 2 and records the ledger; its flags switch on the pitfalls one at a time.

# %%
def one_epoch(pass_dp_group=True, broadcast=False, dataset_cls=None):
    layout = make_layout(tp_size=2)
    dataset = dataset_cls(vocab_size=100, seq_length=8, num_samples=16) if dataset_cls else None
    built = get_random_dataset_fsdp_tp(
        batch_size=2, vocab_size=100, seq_length=8, num_samples=16, dataset=dataset,
        dp_group=layout.dp_group if pass_dp_group else None,
        tp_group=layout.tp_group, broadcast_within_tp=broadcast, seed=0)
    loader = record(built["dataloader"], layout)
    for _batch in loader:
        pass  # the TP-sharded model would run here
    return loader.ledger()


# %% [markdown]
# ## Pitfall 1: no `dp_group`
#
# Without `dp_group` the sampler shards over all 4 ranks, as if each were its own replica. The
# TP peers 0 and 1 then get different samples: the model's two halves compute on different
# inputs, and nothing crashes. (Our version warns; ezpz's does not.) In the heatmap the two rows
# of each TP group differ, and the ledger check reports a `tp_mismatch`.

# %%
no_dp = Ledger.from_results(ez.launch(one_epoch, pass_dp_group=False, world_size=4))
print(no_dp.summary())
assert any(p.kind == "tp_mismatch" for p in no_dp.check())
assert no_dp.sample_ids(0, 0) != no_dp.sample_ids(1, 0)
assert no_dp.sample_ids(2, 0) != no_dp.sample_ids(3, 0)
viz.heatmap(no_dp)

# %% [markdown]
# With `dp_group` the rows of each TP group are identical and the two groups hold different
# samples:

# %%
right = Ledger.from_results(ez.launch(one_epoch, world_size=4))
print(right.summary())
assert right.ok
assert right.sample_ids(0, 0) == right.sample_ids(1, 0)
assert right.sample_ids(2, 0) == right.sample_ids(3, 0)
assert not set(right.sample_ids(0, 0)) & set(right.sample_ids(2, 0))
viz.heatmap(right)


# %% [markdown]
# ## Pitfall 2: a dataset seeded by rank
#
# ezpz's random dataset draws its tokens once, from a generator seeded by the **global rank**.
# Below is the same idea in a few lines. With the right `dp_group`, TP peers now agree on the
# sample *ids*, but the same sample id holds different tokens on rank 0 and on rank 1. Nothing in
# the ids shows it; the ledger also keeps a digest of each batch's bytes, and its check finds
# that the bytes differ.

# %%
class RankSeededTokens(Dataset):
    """Like ezpz's RandomTokenDataset: tokens drawn up front, seeded by the global rank."""

    def __init__(self, vocab_size, seq_length, num_samples):
        g = torch.Generator().manual_seed(dist.get_rank())  # the bug: peers differ
        self.tokens = torch.randint(0, vocab_size, (num_samples, seq_length + 1), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        t = self.tokens[i]
        return {"input_ids": t[:-1], "labels": t[1:], "index": i}


seeded = Ledger.from_results(ez.launch(one_epoch, dataset_cls=RankSeededTokens, world_size=4))
print(seeded.summary())
first = {s.rank: s for s in seeded.records if s.epoch == 0 and s.step == 0}
assert first[0].sample_ids == first[1].sample_ids and first[0].digest != first[1].digest
assert any(p.kind == "tp_mismatch" for p in seeded.check())

# %% [markdown]
# ## The fix: the TP leader loads and broadcasts
#
# With `broadcast_within_tp=True` the loader is wrapped in `TPBroadcastDataLoader`: rank 0 of
# each TP group (the *leader*) runs the real loader and broadcasts every batch to its peers,
# which never touch the dataset. Even the rank-seeded dataset is now harmless, because only one
# copy of it is ever read per TP group: the ledger check passes.

# %%
fixed = Ledger.from_results(
    ez.launch(one_epoch, broadcast=True, dataset_cls=RankSeededTokens, world_size=4))
print(fixed.summary())
assert fixed.ok
sources = {s.rank: s.source for s in fixed.records}
print(sources)
assert sources == {0: "loaded", 1: "received", 2: "loaded", 3: "received"}

# %% [markdown]
# Per rank, how many batches it loaded and how many it received: ranks 0 and 2 loaded all 4 of
# their steps, ranks 1 and 3 received all 4. Only half the ranks do any I/O.

# %%
fig = viz.loaded_vs_received(fixed)
assert fig.ezpz_data["loaded"].tolist() == [4, 0, 4, 0]
assert fig.ezpz_data["received"].tolist() == [0, 4, 0, 4]
fig


# %% [markdown]
# ## Pickled versus tensor broadcast, measured
#
# How the batch travels matters. ezpz calls `broadcast_object_list([batch])`: it pickles the
# batch, broadcasts its size, then the bytes (two collectives, plus pickling on both sides).
# Tensors can instead go as they are, when the receiver knows their shapes. `ezpz_nb`'s
# `BatchBroadcaster` packs the whole batch into one buffer: one broadcast per step.
#
# Below each TP group times the three ways on a 32 × 2048-token batch (about 1 MB). Times depend
# on this machine and on what else runs on it; the chart shows the medians per batch.

# %%
def time_broadcasts(reps=15):
    layout = make_layout(tp_size=2)
    group, src = layout.tp_group, dist.get_global_rank(layout.tp_group, 0)
    dataset = RandomTokenDataset(vocab_size=50_000, seq_length=2048, num_samples=32)
    batch = default_collate([dataset[i] for i in range(32)])  # input_ids, labels, index

    def pickled():
        box = [batch if layout.is_tp_leader else None]
        dist.broadcast_object_list(box, src=src, group=group)

    buffers = {k: torch.empty_like(v) for k, v in batch.items()}  # shapes known in advance

    def one_per_tensor():
        for k, buf in buffers.items():
            dist.broadcast(batch[k] if layout.is_tp_leader else buf, src=src, group=group)

    channel = BatchBroadcaster(group)

    def packed():
        channel.send(batch) if layout.is_tp_leader else channel.recv()

    medians = {}
    for name, send in (("pickled (ezpz)", pickled), ("one per tensor", one_per_tensor),
                       ("packed (ezpz_nb)", packed)):
        send()  # warm-up (the packed path sends its spec once)
        times = []
        for _ in range(reps):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            send()
            times.append(time.perf_counter() - t0)
        medians[name] = 1e3 * sorted(times)[len(times) // 2]
    return medians


timings = ez.launch(time_broadcasts, world_size=2)[1]  # as seen by the receiving rank
for name, ms in timings.items():
    print(f"{name:>18}: {ms:6.2f} ms per batch")

fig, ax = plt.subplots(figsize=(6, 2.4))
ax.barh(list(timings), list(timings.values()), color=["#D55E00", "#56B4E9", "#0072B2"])
ax.set_xlabel("ms per 1 MB batch (median, receiving rank)")
ax.set_title("TP broadcast of one batch, 2 ranks, gloo")
plt.show()

# %% [markdown]
# ## Summary
#
# - Layout with TP innermost: TP groups `[0, 1]`, `[2, 3]`; DP groups `[0, 2]`, `[1, 3]`.
# - Shard over the **DP** group: without `dp_group`, TP peers get different samples.
# - A dataset seeded by rank gives TP peers the same ids but different bytes; only a byte digest
#   (the ledger's) catches it.
# - `TPBroadcastDataLoader`: the leader loads, peers receive identical bytes, half the I/O.
# - The pickled path pays for pickling and two collectives per batch; the packed path sends raw
#   tensor bytes in one collective. Compare the bars on your machine.
#
# Next: **04 · Step alignment**: what keeps leaders and peers taking the same number of steps.
