# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Explore the loading settings live
#
# **Time:** about 20 minutes. **Optional**: the last notebook of the core path, to skip when
# the workshop runs late, or to explore at home.
#
# Every picture in this notebook comes from a **real run**: 4 gloo ranks start, build the DP and TP
# groups, load with `DistributedSampler` (and, when asked, the TP leader broadcast), and record in a
# *sample ledger* which rank held which sample at which step. Nothing is simulated.
#
# **Learning goals**
#
# - Read the rank x step heatmap: TP peers must hold the same samples, DP replicas different ones.
# - Move one setting at a time in the explorer and predict the picture before it redraws.
# - Watch per-rank progress live, and see on the timeline where misaligned ranks stopped or hung.

# %%
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import RandomTokenDataset
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.viz.widgets import Explorer, Progress, explore_rank

# %% [markdown]
# ## The layout: 4 ranks as 2 DP replicas x 2 TP peers
#
# TP is innermost: ranks 0 and 1 form one TP group (one row), ranks 2 and 3 the other. Each row
# is one DP replica: the two rows must hold different data, the two ranks of a row the same.

# %%
viz.layout(4, 2)

# %% [markdown]
# ## One run by hand
#
# `explore_rank` is what the explorer runs on every rank: `make_layout`, then
# `get_random_dataset_fsdp_tp` with the settings given, then a few epochs through `record`.
# Here: 11 samples over 2 DP replicas with `drop_last=False`, so `DistributedSampler` pads the
# shorter replica with one repeated sample per epoch.

# %%
ledger = Ledger.from_results(
    ez.launch(
        explore_rank,
        tp_size=2,
        num_samples=11,
        batch_size=2,
        drop_last=False,
        epochs=2,
        world_size=4,
    )
)
print(ledger.summary())
assert [p.kind for p in ledger.check()] == ["dp_duplicate", "dp_duplicate"]

# %% [markdown]
# The heatmap has one row per rank and one column per sample of each batch; each epoch is a
# panel, the second below the first. Rows inside a TP group (between the white lines) are
# identical, the two groups differ, and the cell framed in vermillion in each epoch is the
# padding: a sample the other replica already had. `set_epoch` reshuffled the second epoch.

# %%
viz.heatmap(ledger)

# %% [markdown]
# With the TP broadcast on, only the TP leaders (`tp0`) ran the loader; their peers received
# every batch.

# %%
viz.loaded_vs_received(ledger)

# %% [markdown]
# ## The explorer
#
# Each control change reruns `explore_rank` on a live 4-rank cluster and redraws the heatmap
# and the coverage (0.3 s after the last change, so dragging a slider starts one run).
# Things to try, predicting the picture first:
#
# - `drop_last` on: the repeated sample disappears, and some samples are never seen.
# - `set_epoch` off: both epochs show the same order.
# - `pass dp_group` off: the sampler shards over the whole world and TP peers get different rows.
# - `tp size` 4 (one DP replica): every rank holds the whole dataset.

# %%
explorer = Explorer(world_size=4, tp_size=2, num_samples=11, batch_size=2)
explorer

# %% [markdown]
# The controls can also be set from code; `set` changes several at once and runs once.
# Without `dp_group` the ledger finds TP peers holding different samples. The cell then puts
# the explorer back in the sound setup that "Things to try" starts from.

# %%
wrong = explorer.set(dp_group=False, broadcast=False)
print(wrong.summary())
assert "tp_mismatch" in {p.kind for p in wrong.check()}
back = explorer.set(dp_group=True, broadcast=True)  # the setup "Things to try" starts from
assert {p.kind for p in back.check()} == {"dp_duplicate"}  # only the padded sample, as above

# %% [markdown]
# ## Progress, and a rank that falls behind
#
# `Progress` counts the steps each rank publishes while the run is in flight (bars in
# JupyterLab, text lines where there is no widget frontend). First a longer, healthy run:
# every rank takes the same 100 steps.

# %%
cluster = ez.Cluster(4, timeout=30)  # generous: this run is meant to finish
with Progress(cluster, total=100) as progress:
    cluster.run(explore_rank, tp_size=2, num_samples=200, batch_size=1, epochs=1)
assert progress.behind() == []


# %% [markdown]
# Now hand-made sharding, `dataset[rank::world]`: 10 samples over 4 ranks give ranks 0 and 1
# three batches, ranks 2 and 3 only two. The timeout is set to 3 s for this run.
#
# **Predict:** which ranks does `progress.behind()` name, and which ranks hang?
#
# <details><summary>Answer</summary>
#
# `behind()` names ranks 2 and 3: they took 2 steps of 3. But they are not the ones that hang:
# after their last batch they leave, and ranks 0 and 1 wait in their third `all_reduce` for
# ranks that will never join, until the timeout reports a hang.
#
# </details>


# %%
def hand_sharded(num_samples=10):
    layout = make_layout(tp_size=1)
    dataset = RandomTokenDataset(vocab_size=64, seq_length=4, num_samples=num_samples)
    mine = Subset(dataset, range(layout.rank, num_samples, layout.world_size))
    loader = record(DataLoader(mine, batch_size=1), layout)
    for _batch in loader:
        dist.all_reduce(torch.ones(1))  # stands in for the gradient all-reduce
    return loader.ledger()


cluster.timeout = 3  # short only for the run that is meant to hang
hang = None
try:
    with Progress(cluster, total=3) as progress:
        cluster.run(hand_sharded)
except ez.HangError as err:
    hang = err
print(hang)
assert hang is not None and progress.behind() == [2, 3]

# %% [markdown]
# The timeline shows the steps each rank took and, from the `HangError`, where each one was
# when the timeout expired. Its title says who caused the hang and who suffered it: ranks 2
# and 3 finished early (fewer steps, marked with a bar), ranks 0 and 1 hung, waiting in
# `all_reduce` for them. The longer bars belong to the victims, not the culprits.
#
# This run has one epoch. With more, ranks 2 and 3 would not be finished at that point: their
# first `all_reduce` of the next epoch would answer the third one of ranks 0 and 1, the steps of
# two epochs would be mixed without an error, and the hang would come only in the last epoch
# (notebook 02 shows it). Under torchrun, finished ranks exit, and a gloo rank still waiting
# fails within seconds with `Connection closed by peer` instead of a report like this one.

# %%
fig = viz.timeline(Ledger.from_events(hang.events), hang)
assert fig.ezpz_data["verdict"] == {"short": [2, 3], "hung": [0, 1]}
fig

# %%
cluster.close()

# %% [markdown]
# The explorer above stays live for the things to try. When you are done, `explorer.close()`
# stops its ranks for good: its controls turn grey and a change starts nothing (run its cell
# again for a new one). Restarting the kernel stops them too.

# %% [markdown]
# ## Summary
#
# - Every figure here came from real ranks: change one setting, predict, and check the picture.
# - `Progress` shows which ranks fall behind while a run is in flight; the timeline tells the
#   ranks that stopped early (the cause of a hang) from the ranks that waited for them.
#
# This is the end of the core path. For where to go from here (torchrun and Slurm, FSDP2,
# torchtitan, `StatefulDataLoader`), see *What next* at the end of `05_workshop.ipynb`.
