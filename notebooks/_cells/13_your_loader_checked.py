# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 13 · Your loader, checked
#
# The earlier notebooks built every loader by hand. A real job loads through a library:
# PyTorch's `DataLoader`, Hugging Face `datasets`, torchdata, MosaicML `streaming`. Each
# promises to shard and resume correctly; none ships a check you can run on *your* pipeline.
# `ezpz_nb.verify` is that check. Give it a **factory**, `make_loader(layout) -> loader`, and a
# layout such as `dp=2,tp=2`: it starts real ranks, builds the loader on each, runs it for a few
# epochs and judges what every rank got against six rules:
#
# | rule | what goes wrong when it breaks |
# |---|---|
# | TP/CP peers get identical bytes | the TP shards of one layer compute on different data |
# | DP replicas get disjoint samples | a sample's gradient counts twice |
# | every sample exactly once an epoch | data silently skipped or repeated |
# | every rank takes as many steps | the longer ranks wait in a collective forever: a hang |
# | the global batch keeps its size | the effective learning rate changes |
# | the order changes between epochs | every epoch repeats the first one's order |
#
# **Time:** 40 to 50 minutes with the predictions (advanced track). Every check starts real
# ranks (a resume check starts fresh ones for each way of stopping), so running it takes
# longer than the core notebooks: 88 s measured on a 2-core machine under heavy load.
#
# **Learning goals**
#
# - Check a `DataLoader` + `DistributedSampler` and four classic mistakes, with the first rank,
#   step and sample at fault.
# - See what `datasets.distributed.split_dataset_by_node` really does on the installed version,
#   on map-style and streaming data, with shards that do and do not divide over the ranks, and
#   with `skip()`/`take()` after the split.
# - Stop and resume a torchdata `StatefulDataLoader` with workers in fresh ranks, and see which
#   ways of stopping it survives.
# - Where MosaicML `streaming` is installed: check its `replication` for TP peers and its
#   resumption, mid-epoch, at an epoch's end and at another world size.
# - Put the same check in a project's CI (pytest fixture, `ezpz-nb check`).
#
# Every dataset here is written by this notebook into a temporary folder: nothing is downloaded.

# %%
# %matplotlib inline
import json
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ezpz_nb as ez
from ezpz_nb.verify import check_contract, check_resume

N = 30  # samples in the map-style dataset


class Tokens(Dataset):
    """Sample i: 6 tokens computed from i alone (the same bytes on every rank), and i."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": torch.arange(6) + 7 * i, "index": i}


# %% [markdown]
# ## A right loader
#
# The factory gets the rank's `layout` (`dp_rank`, `dp_size`, `tp_rank`, the groups). The
# sampler shards over the **DP replicas**, not over the world, so the two TP peers of a replica
# get the same batches. The check calls `set_epoch` before each epoch, as a training loop must.


# %%
def right(layout):
    sampler = DistributedSampler(
        Tokens(), num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=True, seed=0
    )
    return DataLoader(Tokens(), batch_size=4, sampler=sampler)


report = check_contract(right, "dp=2,tp=2", epochs=2)
report

# %% [markdown]
# 30 samples over 2 replicas, 15 each, in batches of 4: the last batch of each replica holds 3,
# so the last global batch is 6 instead of 8. The report marks that *expected* and says why
# (`DataLoader(drop_last=False)`): a choice, not a bug. `report.steps` holds each rank's
# steps per epoch, and `report.to_json()` is the same report for a CI log.

# %%
assert report.ok, report.table()
print(report.steps)
for rule, verdict in json.loads(report.to_json())["rules"].items():
    print(f"  {rule}: {verdict}")

# %% [markdown]
# ### Pass, fail, not judged
#
# A rule says *pass* only on evidence. Where a run gives it none, the rule is *not judged*,
# with why, and the headline says `NOT ALL JUDGED` instead of `PASS`. One epoch has no second
# order to compare, so the reshuffle rule cannot be judged; a loader that asks for no shuffle
# leaves it unjudged too. A pass promises what these ranks saw on this layout for these epochs:
# TP peers identical, replicas disjoint, every sample once (but for what `drop_last` explains),
# equal step counts, at least one step, a steady global batch, a new order each epoch where a
# shuffle was asked for (docs/verify.md says it rule by rule).

# %%
one_epoch = check_contract(right, "dp=2,tp=2", epochs=1)
print(one_epoch.table().splitlines()[0])
print(one_epoch.not_judged)
assert one_epoch.verdict == "not judged" and set(one_epoch.not_judged) == {"reshuffle"}

# %% [markdown]
# ## Four classic mistakes
#
# Each factory below is one line away from `right`. The check names the rule each breaks and
# where it first shows: rank, step, sample.
#
# **Predict:** for each of the four, which rule of the table above breaks first?
#
# <details><summary>Answer</summary>
#
# `world_sharded`: TP peers get identical bytes (the sampler splits a TP pair). `no_sampler`:
# DP replicas get disjoint samples. `hand_sharded`: every rank takes as many steps (8, 8, 7, 7
# samples in batches of 1). `wrapped`: the order changes between epochs (the wrapper hides the
# sampler from `set_epoch`). The cell after the next one asserts exactly this.
#
# </details>


# %%
def world_sharded(layout):  # sharded over all 4 ranks: TP peers get different samples
    s = DistributedSampler(Tokens(), num_replicas=dist.get_world_size(), rank=dist.get_rank())
    return DataLoader(Tokens(), batch_size=4, sampler=s)


def no_sampler(layout):  # every replica reads everything
    return DataLoader(Tokens(), batch_size=4)


def hand_sharded(layout):  # tokens[r::w]: 30 over 4 replicas is 8, 8, 7, 7 samples
    part = torch.utils.data.Subset(Tokens(), range(layout.dp_rank, N, layout.dp_size))
    return DataLoader(part, batch_size=1)


class Epochless:
    """A wrapper that hides the sampler, so a loop's set_epoch never reaches it."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


def wrapped(layout):
    return Epochless(right(layout))


mistakes = {
    "world_sharded": check_contract(world_sharded, "dp=2,tp=2", epochs=1),
    "no_sampler": check_contract(no_sampler, "dp=2", epochs=1),
    "hand_sharded": check_contract(hand_sharded, "dp=4", epochs=1),
    "wrapped": check_contract(wrapped, "dp=2", epochs=2),
}
for name, rep in mistakes.items():
    f = rep.violations[0]
    print(f"{name:14} {rep.verdict}: {f.rule:13} {f.where()}")

# %% [markdown]
# `world_sharded` gives rank 1 other samples than its TP peer rank 0 from step 0; `no_sampler`
# gives replica 1 the samples replica 0 has; `hand_sharded` leaves ranks 2 and 3 one step short
# (the others would wait for them in the next collective); `wrapped` repeats epoch 0's order,
# because a wrapper without `set_epoch` hides the sampler. The check calls `set_epoch` where a
# training loop reaches it (the loader, its sampler, its batch sampler's sampler, its dataset),
# finds the shuffling sampler inside the wrapper, and names it in the hint
# (`mistakes["wrapped"].table()`). The figure colours each rank by the first rule it broke:

# %%
assert [rep.violations[0].rule for rep in mistakes.values()] == [
    "tp_identical",
    "dp_disjoint",
    "equal_steps",
    "reshuffle",
]
mistakes["world_sharded"].figure()
# %% [markdown]
# ## Hugging Face `datasets`: `split_dataset_by_node`
#
# `datasets.distributed.split_dataset_by_node(ds, rank, world_size)` is how HF datasets are
# sharded over ranks. Its documentation says what it does: a map-style `Dataset` is cut into
# `world_size` contiguous pieces; a streaming `IterableDataset` gives each rank whole shards
# (files) when the number of shards divides by `world_size`, and otherwise every rank reads
# every shard and keeps one example in `world_size`. That automatic choice is the default,
# `strategy="auto"`; datasets PR #8565 added `strategy="shards"` (always whole shards, and
# an error when there are fewer shards than ranks) and `strategy="examples"` (always one
# example in `world_size`), so a job can say which one it means. Here the data is JSON lines
# this notebook writes, 34 rows: as four files of 12, 12, 6 and 4 rows, and as three files of
# 12, 12 and 10.
#
# Every rank imports `datasets` when it first unpickles one (a few seconds on a busy laptop),
# so this section runs its checks on one `ez.Cluster` of 4 ranks that stays up between them
# (`cluster=`): the import is paid once.
#
# **Predict:** 34 rows over 4 ranks. Does every rank get the same number of rows: map-style;
# four files (12, 12, 6, 4 rows) streamed over 2 replicas; three files streamed over 4 ranks?
#
# <details><summary>Answer</summary>
#
# In none of the three. Map-style: 9, 9, 8, 8 (34 does not divide by 4). Four files over 2
# replicas: whole files, 12 + 6 and 12 + 4. Three files over 4 ranks: every rank reads every
# file and keeps one row in four, 9, 9, 8, 8. Every row is still seen once; the step counts
# differ, and that is a hang in the next collective. The cells below show it.
#
# </details>

# %%
import datasets  # the `notebook` (or `loaders`) extra: pip install 'ezpz_nb[notebook]'
from datasets.distributed import split_dataset_by_node

datasets.disable_progress_bars()
folder = Path(tempfile.mkdtemp(prefix="ezpz-nb13-"))
# Even with cache_dir= below, datasets leaves a lock file per load in its default cache
# (~/.cache/huggingface/datasets): point that into the folder too, so nothing outlives it.
datasets.config.HF_DATASETS_CACHE = folder / "hf"


def write_shards(name, sizes):
    """JSON-lines files of consecutive rows {"index": i, "input_ids": [i, i, i, i]}."""
    paths, start = [], 0
    for k, n in enumerate(sizes):
        path = folder / f"{name}-{k}.jsonl"
        path.write_text("".join(json.dumps({"index": i, "input_ids": [i] * 4}) + "\n"
                                for i in range(start, start + n)))  # fmt: skip
        paths.append(str(path))
        start += n
    return paths


four, three = write_shards("four", [12, 12, 6, 4]), write_shards("three", [12, 12, 10])
mapped = datasets.load_dataset("json", data_files=four, split="train", cache_dir=str(folder / "c"))
stream4 = datasets.load_dataset("json", data_files=four, split="train", streaming=True)
stream3 = datasets.load_dataset("json", data_files=three, split="train", streaming=True)
print(f"datasets {datasets.__version__}: {len(mapped)} rows; {stream4.num_shards} and "
      f"{stream3.num_shards} shards")  # fmt: skip


# %%
def hf_loader(ds):
    """A factory: split ``ds`` over the DP replicas, batches of 4."""

    def make_loader(layout):
        part = split_dataset_by_node(ds, rank=layout.dp_rank, world_size=layout.dp_size)
        return DataLoader(part.with_format("torch"), batch_size=4)

    return make_loader


hf_ranks = ez.Cluster(world_size=4)
rows = {"epochs": 1, "num_samples": len(mapped), "cluster": hf_ranks}  # a stream has no len()
hf = {
    "map-style over dp=4": check_contract(hf_loader(mapped), "dp=4", **rows),
    "4 shards over dp=2 x tp=2": check_contract(hf_loader(stream4), "dp=2,tp=2", **rows),
    "3 shards over dp=4": check_contract(hf_loader(stream3), "dp=4", **rows),
}
for name, rep in hf.items():
    steps = {r: s[0] for r, s in rep.steps.items()}
    broken = ", ".join(sorted({f.rule for f in rep.violations})) or "-"
    print(f"{name:26} {rep.verdict}  steps per rank {steps}  broken: {broken}")

# %% [markdown]
# Read the step counts. The map-style split gives 9, 9, 8, 8 rows, so 3, 3, 2, 2 batches of 4:
# ranks 2 and 3 finish first and ranks 0 and 1 would wait for them in their next collective.
# With 4 files over 2 replicas each replica reads two whole files, 12 + 6 and 12 + 4 rows: 5 and
# 4 batches, the hang reported in datasets #6437 and #6719 (its TP peers agree with each other,
# so TP is fine). With 3 files over 4 ranks the shards do not divide, so every rank reads every
# file and keeps one row in four: 9, 9, 8, 8 rows, unequal again. Every sample is seen exactly
# once in all three (judged against the 34 rows: a stream has no `len()`, so without
# `num_samples` that rule would read *not judged* after one epoch); the step counts are what
# breaks, and the reshuffle rule is *not judged* (one epoch, no shuffle asked for). The usual
# remedies: a per-rank `take(n)`
# with `n` the smallest share, or stop every rank when the first one runs out (notebook 04's
# step agreement).
#
# The installed version decides more than the step counts. datasets 4.0 to 4.8.2 restarted the
# one-in-`world_size` choice at every Arrow batch of the stream (datasets #8079, fixed by PR
# #8081 in 4.8.3): with batches of one row, as a single-shard WebDataset gives, rank 0 kept
# every row and ranks 1 to 3 got none, and torchtitan pinned `datasets<4.8` (#2631) until the
# fix. Every row is still seen once, so `exactly_once` passes; the same check catches it all
# the same: `equal_steps` fails, rank 0 stepping alone while the others take 0 steps (under
# DDP, a hang at the first all-reduce). That is why ezpz_nb asks for `datasets>=4.8.3`, and
# why a job checks the version it runs, not the one it read about.

# %%
for rep in hf.values():
    assert [f.rule for f in rep.violations] == ["equal_steps"], rep.table()
    assert rep.rule_verdicts()["exactly_once"] == "pass", rep.table()
    if rep.layout["tp"] > 1:  # on dp=4 there are no TP peers: the rule is not covered
        assert rep.rule_verdicts()["tp_identical"] == "pass", rep.table()
    assert rep.rule_verdicts()["reshuffle"] == "not judged", rep.table()

# %% [markdown]
# ### `skip()` and `take()` after the split
#
# datasets #8568 reported that `skip()` on a split streaming dataset gave every rank the whole
# data; it was fixed upstream. What does the installed version do? Each of 2 ranks asks for
# `skip(3)` and for `take(4)` of its part:


# %%
def show_skip(ds, world=2, n=3):
    """Print each rank's part, its skip(n) and take(n + 1); say what skip() did."""
    parts = [split_dataset_by_node(ds, rank=r, world_size=world) for r in range(world)]
    own = [[x["index"] for x in part] for part in parts]
    skipped = [[x["index"] for x in part.skip(n)] for part in parts]
    for r, part in enumerate(parts):
        print(f"  rank {r}: own {own[r]}\n          skip({n}) {skipped[r]}")
        print(f"          take({n + 1}) {[x['index'] for x in part.take(n + 1)]}")
    if all(skipped[r] == own[r][n:] for r in range(world)):
        return f"skip({n}) drops the first {n} rows of each rank's own part"
    if any(len(s) >= sum(map(len, own)) - n for s in skipped):
        return f"skip({n}) gives a rank (nearly) the whole data, as in #8568"
    return f"skip({n}) drops {n} rows of the whole stream, before the split: each part changes"


for ds in (stream4, stream3):
    print(f"{ds.num_shards} shards over 2 ranks:")
    said = show_skip(ds)  # on its own line: with the version it passes 100 columns
    print(f"  -> on datasets {datasets.__version__}:\n  {said}")


# %%
def hf_skip(ds, n=3):
    """A factory: split ``ds`` over the DP replicas, then skip(n) on each."""

    def make_loader(layout):
        part = split_dataset_by_node(ds, rank=layout.dp_rank, world_size=layout.dp_size)
        return DataLoader(part.skip(n).with_format("torch"), batch_size=4)

    return make_loader


for ds in (stream4, stream3):
    rep = check_contract(hf_skip(ds), "dp=2,tp=2", epochs=1, num_samples=34, cluster=hf_ranks)
    never = next((f for f in rep.findings if f.kind == "never_seen"), None)
    print(f"{ds.num_shards} shards, skip(3) on each of 2 replicas: steps {rep.steps};\n"
          f"  never seen: {never.message.split(' were')[0].split(': ')[1] if never else 'none'}")  # fmt: skip
hf_ranks.close()

# %% [markdown]
# Compare each rank's lists: a resumed streaming job relies on exactly this when it skips the
# batches it already trained on, and the answer can depend on whether the shards divide over the
# ranks. Whatever the version does, the check says which samples the job never saw and whether
# the ranks still take the same number of steps. Where `skip()` acts on the whole stream, a
# resumed job that skips per rank what each rank already trained on gets another rank's rows:
# `check_resume` (next section) is the check for that.

# %% [markdown]
# ## torchdata `StatefulDataLoader`: stop, resume, with workers
#
# `check_resume` runs the loader straight through once, then stops it (mid-epoch, at an epoch
# boundary, and again right after a resume), saves `state_dict()` on every rank, and resumes
# from it **in fresh ranks**, as a restarted job does. The joined parts must see each sample
# exactly once per epoch, and the first place they part from the straight run is named.
#
# **Predict:** `StatefulDataLoader` with 2 workers over a plain `DistributedSampler`, stopped
# mid-epoch. The sampler has no state of its own: can the resumed loader still avoid repeating
# the batches already taken?
#
# <details><summary>Answer</summary>
#
# Yes: the loader counts the batches it yielded (across its workers) and, on resume, fast-forwards
# the sampler past them. The first table says so; the text after it says when the stateful
# sampler does worse.
#
# </details>


# %%
def stateful_loader(*args, **kwargs):
    """torchdata's StatefulDataLoader, without the warning its constructor gives on every rank.

    torchdata 0.11 (its last release) calls `torch.set_vital`, which torch 2.13 deprecates:
    one "'set_vital' is deprecated" warning per rank and per part of a check, none of it
    ours to fix. Filtered around that one call, on the rank that makes the loader; its
    DataLoader workers are forked later and make no loader.
    """
    import warnings

    from torchdata.stateful_dataloader import StatefulDataLoader

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(*args, **kwargs)


def stateful(layout, num_workers=2):
    s = DistributedSampler(Tokens(), num_replicas=layout.dp_size, rank=layout.dp_rank, seed=0)
    return stateful_loader(
        Tokens(), batch_size=4, sampler=s, num_workers=num_workers,
        multiprocessing_context="fork" if num_workers else None,
    )  # fmt: skip


def stateful_sampler(layout):
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    s = StatefulDistributedSampler(
        Tokens(), num_replicas=layout.dp_size, rank=layout.dp_rank, seed=0
    )
    return stateful_loader(Tokens(), batch_size=4, sampler=s)


with_workers = check_resume(stateful, "dp=2", epochs=2, scenarios=["mid-epoch"])
print(with_workers.table())
sampler_resume = check_resume(stateful_sampler, "dp=2", epochs=2)
print(sampler_resume.table())

# %% [markdown]
# Read the two tables. `StatefulDataLoader` over a plain `DistributedSampler` resumes exactly
# once with two workers: it counts the batches it yielded and fast-forwards the sampler. With
# torchdata's own `StatefulDistributedSampler`, the report says for each way of stopping
# whether the joined run matched the straight one, and if not, at which rank and step and the
# likely cause (an epoch that ends at once after a state saved at its end; a loaded offset
# forgotten when the state is saved again before a step). The same check runs with
# `resume_layout="dp=4"` (another world size) or `resume_options={"num_workers": 1}`.

# %%
assert with_workers.ok, with_workers.table()
assert all(f.hint for f in sampler_resume.violations if f.rule == "resume")

# %% [markdown]
# ## MosaicML `streaming`
#
# `streaming.StreamingDataset` shards local MDS files over the ranks itself, `replication=tp`
# gives each group of `tp` consecutive ranks (a TP group, TP innermost as here) the same samples,
# and its `StreamingDataLoader` saves a position in *samples of the whole job*, which MosaicML
# promises to resume at another world size. It is an optional extra of its own
# (`pip install 'ezpz_nb[streaming]'` in a separate virtual environment: version 0.13 pins
# `numpy<2.2` and pulls torchvision, transformers and cloud SDKs), so this part runs only where it
# is installed, and takes its own one to two minutes here: every part of a check starts fresh
# ranks, and each imports streaming (with torchvision and transformers), 6-7 s for 4 ranks on 2
# cores against 0.1-1.6 s to open the dataset.

# %%
try:
    import streaming
except Exception as exc:  # noqa: BLE001 - not only ImportError, see the message
    # `import streaming` imports torchvision, which raises RuntimeError ("operator
    # torchvision::nms does not exist") when it was built for another torch (PyPI's CUDA
    # torchvision beside a CPU torch): say so instead of failing the notebook.
    streaming = None
    print(
        f"MosaicML streaming cannot be imported here, skipped:\n  {type(exc).__name__}: {exc}\n"
        "To run this part, in a separate virtual environment: install torch and torchvision\n"
        "from one index (e.g. both from PyTorch's CPU index), then pip install "
        "'ezpz_nb[streaming]'"
    )

# %%
if streaming is not None:
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset

    M = 48  # divides over 2 and 4 replicas in batches of 4: no padding hides what we look at
    mds = folder / "mds"
    with MDSWriter(out=str(mds), columns={"index": "int", "tokens": "bytes"}, size_limit=256) as w:
        for i in range(M):
            w.write({"index": i, "tokens": bytes([i % 256]) * 8})

    def mosaic(layout):
        import logging
        import os

        # Its reminder to count replicated samples once (StreamingDataLoader does), printed
        # by every resumed part: once here is enough.
        logging.getLogger("streaming.base.dataset").setLevel(logging.ERROR)
        # streaming reads the job's layout from torchrun's variables; ez.launch's ranks
        # are in a process group already, so hand it the same numbers (one machine).
        world = str(dist.get_world_size())
        os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=world,
                          LOCAL_RANK=str(dist.get_rank()), LOCAL_WORLD_SIZE=world)  # fmt: skip
        ds = StreamingDataset(
            local=str(mds), batch_size=4, replication=layout.tp_size, shuffle=True, shuffle_seed=7
        )
        # Its coordination state lives in shared memory, freed by atexit handlers that a
        # rank leaving with os._exit never runs: note the block's prefix to free it below.
        with open(folder / "shm-prefixes", "a") as f:
            f.write(f"{ds._shm_prefix_int}\n")
        return StreamingDataLoader(ds, batch_size=4)

    mosaic_contract = check_contract(mosaic, "dp=2,tp=2", epochs=2)
    print(mosaic_contract.table())
    mosaic_resume = check_resume(
        mosaic, "dp=2,tp=2", epochs=2, scenarios=["mid-epoch", "epoch boundary"]
    )
    print(mosaic_resume.table())
    mosaic_elastic = check_resume(
        mosaic, "dp=2,tp=2", epochs=2, resume_layout="dp=4", scenarios=["mid-epoch"]
    )
    print(mosaic_elastic.table())

# %% [markdown]
# Where `streaming` is installed, the cell above printed three tables (on `streaming` 0.13);
# where it is not, it printed only why it skipped, and what follows is what those tables show.
#
# - The contract holds: TP peers get the same samples through `replication`, the two replicas
#   split the 48 samples, and `shuffle_seed` with the epoch gives each epoch a new order.
# - Stopped mid-epoch and resumed in fresh ranks, the run continues exactly where it stopped.
# - Stopped **at an epoch boundary**, it does not: the saved position is "epoch 0, sample 48",
#   so the resumed loader's first `iter()` is what is left of epoch 0, nothing, and a loop that
#   counts epochs itself loses the next epoch. Save the state inside an epoch, not after its
#   last batch.
# - Resumed at **another world size** (dp=2,tp=2 to dp=4), every sample is still seen exactly
#   once: the position counts samples of the whole job, and the rest of the epoch is cut anew
#   over 4 ranks. Each rank's batches differ from the straight run's, which the report marks as
#   expected. Under torchrun on several machines, set nothing: streaming reads the same
#   variables from torchrun, and `replication` still needs TP innermost (consecutive ranks).

# %%
if streaming is not None:
    from multiprocessing import shared_memory

    from streaming.base.constant import SHM_TO_CLEAN

    print(f"streaming {streaming.__version__}")
    assert not mosaic_contract.failed, mosaic_contract.table()  # unshuffled: reshuffle not judged
    led = mosaic_contract.ledger

    def ids(rank, epoch):
        return [r.sample_ids for r in led.steps(rank, epoch)]

    for e in led.epochs():  # TP peers (ranks 0,1 and 2,3): the same samples at every step
        assert ids(0, e) == ids(1, e) and ids(2, e) == ids(3, e), mosaic_contract.table()
    assert ids(0, 0) != ids(0, 1)  # a new order in epoch 1
    by_scenario = {f.message.split("]")[0][1:]: f for f in mosaic_resume.violations}
    assert set(by_scenario) == {"epoch boundary"}, mosaic_resume.table()
    boundary = by_scenario["epoch boundary"]
    assert boundary.epoch == 1 and "got no batch" in boundary.message, boundary
    assert "ended the epoch early" in boundary.hint, boundary
    assert mosaic_elastic.ok, mosaic_elastic.table()
    assert any(f.rule == "resume" and f.expected for f in mosaic_elastic.findings)
    # Free the shared memory the ranks left (what their atexit handlers would have done).
    freed = 0
    for prefix in set((folder / "shm-prefixes").read_text().split()):
        for name in SHM_TO_CLEAN:
            try:
                block = shared_memory.SharedMemory(f"{int(prefix):06}_{name}")
            except FileNotFoundError:
                continue
            block.close()
            block.unlink()
            freed += 1
    print(f"freed {freed} shared memory blocks")

# %%
import shutil

shutil.rmtree(folder, ignore_errors=True)  # the data this notebook wrote: nothing outlives it

# %% [markdown]
# ## In your project's CI
#
# Installing ezpz_nb adds a pytest fixture (no torch is imported until a test uses it):
#
# ```python
# def test_loader_contract(loader_contract):
#     from myproject.data import make_loader   # make_loader(layout) -> DataLoader
#     loader_contract(make_loader, "dp=2,tp=2", epochs=2)   # fails with the table
# ```
#
# and a command that exits 1 on a violation:
#
# ```bash
# ezpz-nb check myproject.data:make_loader --layout dp=2,tp=2
# ```
#
# Under torchrun (`torchrun --nproc_per_node=4 -m ezpz_nb check ...`) the check runs in place on
# torchrun's ranks. `docs/verify.md` has both in full.
