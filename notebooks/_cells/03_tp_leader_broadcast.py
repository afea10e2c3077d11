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
# **Time:** 35 to 40 minutes with the predictions, then exercise 5 of `05_workshop` (about 10
# minutes). Running the cells alone takes under a minute.
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
# - See a rank-seeded dataset give TP peers different tokens, and the ledger catch it; know
#   that the fix for seeding is a seed that does not depend on the rank.
# - Use `TPBroadcastDataLoader`: the TP leader loads, its peers receive identical bytes.
# - Measure the pickled broadcast, one broadcast per tensor and one packed broadcast, and know
#   where packing wins.

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
from ezpz_nb.ledger import Ledger, batch_digest, record

# %% [markdown]
# ## The DP × TP layout
#
# 4 ranks with `tp_size=2` form a 2 × 2 grid, TP innermost (the layout of ezpz and Megatron-LM;
# `DeviceMesh` lays out its dimensions in the order given, so `("dp", "tp")` puts TP innermost):
# ranks 0 and 1 are one TP group (one model replica), ranks 2 and 3 the other.
# The DP groups run across: ranks 0 and 2, ranks 1 and 3. Rows of the picture are TP groups.

# %%
viz.layout(4, 2)


# %% [markdown]
# `make_layout(tp_size)` builds both groups inside the ranks. Each rank reports the members of
# its groups.
#
# **Predict:** which ranks are in rank 3's TP group, and which in its DP group?
#
# <details><summary>Answer</summary>
#
# TP group `[2, 3]` (its row: the ranks that hold the same model replica), DP group `[1, 3]`
# (its column: the ranks at the same place in each replica).
#
# </details>


# %%
def my_groups():
    layout = make_layout(tp_size=2)
    return (
        layout.dp_rank,
        layout.tp_rank,
        dist.get_process_group_ranks(layout.tp_group),
        dist.get_process_group_ranks(layout.dp_group),
    )


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
#
# One difference from ezpz: its `RandomTokenDataset` yields each sample as a raw tensor of
# `seq_length + 1` tokens; ezpz_nb's yields a dict of `input_ids`, `labels` (the next tokens)
# and `index`, the sample's id, so that the ledger can always tell which sample a rank holds.


# %%
def one_epoch(pass_dp_group=True, broadcast=False, dataset_cls=None):
    layout = make_layout(tp_size=2)
    dataset = dataset_cls(vocab_size=100, seq_length=8, num_samples=16) if dataset_cls else None
    built = get_random_dataset_fsdp_tp(
        batch_size=2,
        vocab_size=100,
        seq_length=8,
        num_samples=16,
        dataset=dataset,
        dp_group=layout.dp_group if pass_dp_group else None,
        tp_group=layout.tp_group,
        broadcast_within_tp=broadcast,
        seed=0,
    )
    loader = record(built["dataloader"], layout)
    for _batch in loader:
        pass  # the TP-sharded model would run here
    return loader.ledger()


# %% [markdown]
# ## Pitfall: no `dp_group`
#
# Without `dp_group` the sampler shards over all 4 ranks, as if each were its own replica.
#
# **Predict:** do TP peers 0 and 1 get the same samples? Does anything crash?
#
# <details><summary>Answer</summary>
#
# No, and no. They get different samples: the model's two halves compute on different inputs,
# and nothing crashes. (Our version warns; ezpz's does not.) In the heatmap the two rows of each
# TP group differ, and the ledger check reports a `tp_mismatch`.
#
# </details>

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
# ## Pitfall: a dataset seeded by rank
#
# ezpz's random dataset (as of its commit 1229a17, Aug 2026, `src/ezpz/data/text.py`) draws all
# its tokens up front, from a generator seeded by `(rank + 1) * 1234`: the **global rank**.
# (Other versions of ezpz use a fixed seed and a fixed length instead.) Below is the same idea
# in a few lines, with the right `dp_group` this time.
#
# **Predict:** do TP peers 0 and 1 now get the same sample ids? The same tokens?
#
# <details><summary>Answer</summary>
#
# The same ids, different tokens: sample 3 on rank 0 is not sample 3 on rank 1. Nothing in the
# ids shows it; the ledger also keeps a digest of each batch's bytes, and its check finds that
# the bytes differ.
#
# </details>


# %%
class RankSeededTokens(Dataset):
    """Like ezpz's RandomTokenDataset at 1229a17: tokens drawn up front, seeded by the rank."""

    def __init__(self, vocab_size, seq_length, num_samples):
        g = torch.Generator().manual_seed((dist.get_rank() + 1) * 1234)  # the bug: ranks differ
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
# ## The TP leader loads and broadcasts
#
# With `broadcast_within_tp=True` the loader is wrapped in `TPBroadcastDataLoader`: rank 0 of
# each TP group (the *leader*) runs the real loader and broadcasts every batch to its peers,
# which never read from their loader (they still build it, and the dataset in it). Below, the
# rank-seeded dataset again.
#
# **Predict:** does the ledger check pass now?
#
# <details><summary>Answer</summary>
#
# Yes: inside each TP group only the leader's copy is read, and its peer receives exactly those
# bytes. But that hides the seeding bug, it does not fix it: see below.
#
# </details>

# %%
fixed = Ledger.from_results(
    ez.launch(one_epoch, broadcast=True, dataset_cls=RankSeededTokens, world_size=4)
)
print(fixed.summary())
assert fixed.ok
sources = {s.rank: s.source for s in fixed.records}
print(sources)
assert sources == {0: "loaded", 1: "received", 2: "loaded", 3: "received"}

# %% [markdown]
# ### The broadcast saves I/O; it does not fix the seeding
#
# The two DP leaders, ranks 0 and 2, still read their own rank-seeded copies: sample 0 is one
# thing on rank 0 and another on rank 2. Here each leader holds different samples, so no check
# can see it; but a job restarted with another layout, or a sample that reaches both replicas
# (padding, a second epoch), trains on different data under the same id. And every peer still
# builds its dataset: here, drawing all its tokens for nothing. Each rank below builds the
# dataset and reports a digest of its sample 0, first for the rank-seeded one, then for ezpz_nb's
# `RandomTokenDataset`, whose sample `i` depends only on `(seed, i)`.


# %%
def sample_zero(dataset_cls):
    dataset = dataset_cls(vocab_size=100, seq_length=8, num_samples=16)
    return batch_digest(dataset[0])[:8]


rank_seeded = ez.launch(sample_zero, RankSeededTokens, world_size=4)
rank_free = ez.launch(sample_zero, RandomTokenDataset, world_size=4)
print("sample 0, rank-seeded:    ", rank_seeded)
print("sample 0, seed per sample:", rank_free)
assert len(set(rank_seeded)) == 4 and len(set(rank_free)) == 1

# %% [markdown]
# The fix for seeding is a seed that does not depend on the rank (the same on every rank, per
# sample or per dataset); the broadcast is for I/O. Per rank, how many batches it loaded and how
# many it received: ranks 0 and 2 loaded all 4 of their steps, ranks 1 and 3 received all 4.
# Only half the ranks read data.

# %%
fig = viz.loaded_vs_received(fixed)
assert fig.ezpz_data["loaded"].tolist() == [4, 0, 4, 0]
assert fig.ezpz_data["received"].tolist() == [0, 4, 0, 4]
fig


# %% [markdown]
# ## How the batch travels, measured at two sizes
#
# ezpz calls `broadcast_object_list([batch])`: it pickles the batch and broadcasts its size,
# then its bytes (two collectives, plus pickling on both sides). Tensors can instead go as they
# are, when the receiver knows their shapes: **one broadcast per tensor**, or all of them
# **packed** into one buffer and sent in one broadcast (`ezpz_nb`'s `BatchBroadcaster`, which
# sends the shapes once and then only the bytes).
#
# Below, one TP group of 2 ranks times the three ways on two batches:
#
# - *small*: 4 × 128 tokens in 6 tensors (`input_ids`, `labels`, `attention_mask`,
#   `position_ids`, `loss_mask`, `index`), about 20 KB;
# - *large*: 32 × 2048 tokens in 3 tensors (`input_ids`, `labels`, `index`), about 1 MB.
#
# Times depend on this machine and on what else runs on it; the chart shows the median per batch
# on the receiving rank.
#
# **Predict:** at which size does packing clearly beat one broadcast per tensor?
#
# <details><summary>Answer</summary>
#
# At the small size. Every collective has a fixed cost, whatever its size (a fraction of a
# millisecond on gloo over loopback; smaller on NCCL, but there too): 6 tensors sent one by one
# pay it 6 times, the packed batch once. At 1 MB the bytes dominate: one per tensor and packed
# come out close (packing still saves 2 fixed costs, but copies the tensors into one buffer and
# out again). Packing saves collectives, not bytes.
#
# Where the pickled path lands depends on the machine and the moment. It pays 2 collectives plus
# pickling on both sides; one per tensor pays 6 collectives. At 20 KB those costs are close, so
# one run can order the two bars either way (on a busy 2-core machine they swap from run to
# run). At 1 MB pickling the bytes costs more than sending them, so there it is usually the
# slowest. Compare bars within one run, and rerun before you conclude.
#
# </details>


# %%
def make_batch(rows, seq_length, extra):
    dataset = RandomTokenDataset(vocab_size=50_000, seq_length=seq_length, num_samples=rows)
    batch = default_collate([dataset[i] for i in range(rows)])  # input_ids, labels, index
    if extra:
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        batch["position_ids"] = torch.arange(seq_length).expand(rows, -1).contiguous()
        batch["loss_mask"] = torch.ones(rows, seq_length)
    return batch


def time_broadcasts(reps=15):
    layout = make_layout(tp_size=2)
    group, src = layout.tp_group, dist.get_global_rank(layout.tp_group, 0)
    medians = {}
    for size, batch in (
        ("small", make_batch(4, 128, extra=True)),
        ("large", make_batch(32, 2048, extra=False)),
    ):
        buffers = {k: torch.empty_like(v) for k, v in batch.items()}  # shapes known in advance
        channel = BatchBroadcaster(group)

        def pickled(batch=batch):
            box = [batch if layout.is_tp_leader else None]
            dist.broadcast_object_list(box, src=src, group=group)

        def one_per_tensor(batch=batch, buffers=buffers):
            for k, buf in buffers.items():
                dist.broadcast(batch[k] if layout.is_tp_leader else buf, src=src, group=group)

        def packed(batch=batch, channel=channel):
            channel.send(batch) if layout.is_tp_leader else channel.recv()

        for name, send in (
            ("pickled (ezpz)", pickled),
            ("one per tensor", one_per_tensor),
            ("packed (ezpz_nb)", packed),
        ):
            send()  # warm-up (the packed path sends its spec once)
            times = []
            for _ in range(reps):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                send()
                times.append(time.perf_counter() - t0)
            medians[size, name] = 1e3 * sorted(times)[len(times) // 2]
    return medians


timings = ez.launch(time_broadcasts, world_size=2)[1]  # as seen by the receiving rank
ways = ["pickled (ezpz)", "one per tensor", "packed (ezpz_nb)"]
for size in ("small", "large"):
    print(f"{size}: " + ", ".join(f"{w} {timings[size, w]:.2f} ms" for w in ways))

fig, axes = plt.subplots(1, 2, figsize=(9, 2.4))
for ax, (size, label) in zip(
    axes,
    (("small", "small batch: 6 tensors, ~20 KB"), ("large", "large batch: 3 tensors, ~1 MB")),
    strict=True,
):
    ax.barh(ways, [timings[size, w] for w in ways], color=["#D55E00", "#56B4E9", "#0072B2"])
    ax.set_xlabel("ms per batch (median, receiving rank)")
    ax.set_title(label)
axes[1].set_yticklabels([])
fig.suptitle("TP broadcast of one batch, 2 ranks, gloo")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Summary
#
# - Layout with TP innermost: TP groups `[0, 1]`, `[2, 3]`; DP groups `[0, 2]`, `[1, 3]`.
# - Shard over the **DP** group: without `dp_group`, TP peers get different samples.
# - A dataset seeded by rank gives TP peers the same ids but different bytes; only a byte digest
#   (the ledger's) catches it. The fix is a seed that does not depend on the rank.
# - `TPBroadcastDataLoader`: the leader loads, its peers receive identical bytes and read
#   nothing: half the I/O. It hides a rank-seeded dataset inside a TP group; it does not fix it.
# - How the batch travels: packing the tensors into one broadcast wins when a batch has many
#   small tensors (one fixed cost instead of one per tensor); for a large batch the bytes
#   dominate and it is close to one broadcast per tensor. The pickled path pays for pickling and
#   two collectives per batch: against one broadcast per tensor on small batches it can go
#   either way, and on large batches pickling dominates. Compare the bars on your machine, more
#   than once.
#
# Now do exercise 5 in `05_workshop.ipynb`.
#
# Next: **04 · Step alignment**: what keeps leaders and peers taking the same number of steps.
