# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 16 · Evaluation that counts every sample once, and training by step count
#
# Two problems users of distributed loading report again and again. **Evaluation skewed by
# the sampler**: `DistributedSampler` pads every rank to the same length by repeating the
# first indices, so a metric counts some samples twice (pytorch issue #25162, open since 2019;
# rf-detr #1507 counted a 21-image split as 22); `drop_last` drops them instead; and uneven
# shards hang a model whose forward makes collectives (FSDP). **Training over streams**: a
# stream has no length, ranks run out at different steps and the others hang; Hugging Face's
# `Trainer` needs `max_steps` for a dataset without a length, and torchtitan's Grain loader
# refuses to stop at the data's end when DP > 1.
#
# **Learning goals**
#
# - Measure, on real ranks, which evaluation method is exact and keeps equal steps, for every
#   dataset size modulo the DP degree.
# - Combine a metric across ranks with one all-reduce of a sum and a count, not a mean of means.
# - Train for N steps over an endless stream: per-rank epoch counters, balanced coverage, a
#   resumable position, and an LR schedule counted in optimizer steps.
#
# **Time:** about 55 to 65 minutes with the predictions (advanced track): two lessons, exact
# evaluation (sections 1-4 and the exercise) and, optional, training by step count (section 5,
# about 20 of those minutes). Running the cells alone takes about 10 s on an idle 2-core machine.
#
# Everything runs on 4 gloo ranks on CPU. What carries over to NCCL on GPUs, torchrun and
# several nodes is said where it matters: the arithmetic of samples and steps is the same.

# %%
import math
import statistics

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.utils.data import DataLoader, DistributedSampler

import ezpz_nb as ez
from ezpz_nb import viz
from ezpz_nb.data import SteppedLoader, WeightedShard, eval_indices, global_mean
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.verify import check_eval, check_steps

# One warm group of 4 ranks for the whole notebook: a launch costs imports and a
# rendezvous, a run on warm ranks a few milliseconds. It stops with the kernel.
cluster = ez.Cluster(world_size=4, timeout=60)


def loss_of(i):
    """The per-sample loss a fixed model gives sample i: deterministic, different per sample."""
    return 0.5 + ((i * 7919) % 23) / 10


# %% [markdown]
# ## 1. What DistributedSampler hands each rank for evaluation
#
# **Predict** 10 samples, 4 ranks, `DistributedSampler(shuffle=False)`: how many samples does
# each rank evaluate, and how many does the metric count in all? Which ones twice?


# %%
def shards(n, drop_last):
    s = DistributedSampler(
        range(n), dist.get_world_size(), dist.get_rank(), False, drop_last=drop_last
    )
    return list(s)


for drop in (False, True):
    got = cluster.run(shards, 10, drop)
    counted = sorted(i for shard in got for i in shard)
    print(f"drop_last={drop}: {got}")
    print(
        f"   counted {len(counted)} samples of 10; twice: {sorted({i for i in counted if counted.count(i) > 1})}, never: {sorted(set(range(10)) - set(counted))}"
    )

# %% [markdown]
# Padding repeats indices 0 and 1 so every rank takes 3 steps; `drop_last` leaves 8 and 9 out
# so every rank takes 2. Either way the ranks stay in step, and the metric is wrong.
#
# ## 2. A mean of means is not the mean
#
# Now give each rank its own shard, `range(rank, n, world)`, with nothing repeated: shards of
# 3, 3, 2 and 2 samples. **Predict** is the mean of the four per-rank means the mean of the 10
# losses?


# %%
def per_rank_and_global(n):
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [loss_of(i) for i in range(rank, n, world)]
    mean_t = torch.tensor(statistics.fmean(mine), dtype=torch.float64)
    dist.all_reduce(mean_t)
    return {
        "rank mean": statistics.fmean(mine),
        "mean of means": float(mean_t) / world,
        "sum / count": global_mean(math.fsum(mine), len(mine)),  # one all_reduce of [sum, count]
    }


rows = cluster.run(per_rank_and_global, 10)
truth = statistics.fmean(loss_of(i) for i in range(10))
print("per-rank means:", [round(r["rank mean"], 4) for r in rows])
print(f"one process:   {truth:.6f}")
print(
    f"mean of means: {rows[0]['mean of means']:.6f}  (error {rows[0]['mean of means'] / truth - 1:+.2%})"
)
print(
    f"sum / count:   {rows[0]['sum / count']:.6f}  (error {rows[0]['sum / count'] / truth - 1:+.2%})"
)
assert rows[0]["sum / count"] == truth and rows[0]["mean of means"] != truth

# %% [markdown]
# A rank with 2 samples weighs as much as a rank with 3 in the mean of means. Sum the metric
# and count the samples on each rank, all-reduce the pair once, divide: that is what one
# process computes. (Notebook 11 does the same for the training loss over tokens.)
#
# ## 3. Five methods, every size, three DP degrees
#
# Each method gives a rank a list of sample indices and weights:


# %%
def padding(n, rank, world):
    return list(DistributedSampler(range(n), world, rank, False)), None


def drop_last(n, rank, world):
    return list(DistributedSampler(range(n), world, rank, False, drop_last=True)), None


def uneven(n, rank, world):
    return list(range(rank, n, world)), None


def weight_zero(n, rank, world):
    return eval_indices(n, rank, world)  # padded with index 0 at weight 0 (ezpz_nb.data)


# %% [markdown]
# Uneven shards leave a rank one step short. Under FSDP every forward all-gathers the
# parameters, so each eval step is a collective and the short rank leaves the others waiting.
# `torch.distributed.algorithms.Join` lets a rank that ran out *shadow* the others' collectives
# until all are done, if the step is a `Joinable` with a hook that knows which collective to
# shadow. Here is an eval step whose collective is an all-reduce of `[loss, weight]`:


# %%
class EvalStep(Joinable):
    """One eval step that all-reduces [weighted loss, weight] every step (as FSDP's forward
    all-gathers every step); a rank that ran out shadows it with zeros."""

    def __init__(self, group):
        super().__init__()
        self.group, self.total = group, torch.zeros(2, dtype=torch.float64)

    def __call__(self, loss, weight):
        Join.notify_join_context(self)  # one small all-reduce: "I am still stepping"
        pair = torch.tensor([loss * weight, weight], dtype=torch.float64)
        dist.all_reduce(pair, group=self.group)
        self.total += pair

    def join_hook(self, **kwargs):
        return ShadowStep(self)

    @property
    def join_device(self):  # where Join's own all-reduce runs: on NCCL, the rank's GPU
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return self.group


class ShadowStep(JoinHook):
    def __init__(self, step):
        self.step = step

    def main_hook(self):  # the joined rank's stand-in for the step's collective
        pair = torch.zeros(2, dtype=torch.float64)
        dist.all_reduce(pair, group=self.step.group)
        self.step.total += pair


# %% [markdown]
# `DistributedDataParallel` is a `Joinable`: its hook shadows the gradient all-reduce.
# FSDP is not, and cannot be simply: a rank with no batch has no forward to run, and the
# all-gathers and reduce-scatters of a forward and backward depend on the model's layers and
# its wrapping, which a hook would have to replay call by call. So under FSDP (or HSDP, or
# with a metric all-reduced every step) every DP rank must take the same number of eval steps.
# TP alone does not need it: TP peers share one DP shard, so they always take equal steps; the
# hang comes from collectives that span DP ranks.
#
# **Predict** for each method: exact on every size? equal steps? would it hang under FSDP?
#
# The grid runs on the warm 4 ranks in one call: DP groups of 2, 3 and 4 ranks, sizes
# `N .. N+dp-1` (every remainder), one step per sample.

# %%
N = 10
METHODS = {  # name: (shard, how the step combines)
    "sampler padding": (padding, "sum+count"),  # DistributedSampler's
    "drop_last": (drop_last, "sum+count"),
    "uneven + Join": (uneven, "join"),
    "uneven + sum/count": (uneven, "sum+count"),
    "padding, weight 0": (weight_zero, "sum+count"),
}


def evaluate(indices, weights, how, group):
    """This rank's pass: the metric every rank ends with, and its step count."""
    weights = weights or [1.0] * len(indices)
    if how == "join":
        step = EvalStep(group)
        with Join([step]):
            for i, w in zip(indices, weights, strict=True):
                step(loss_of(i), w)
        return float(step.total[0] / step.total[1]), len(indices)
    total = math.fsum(loss_of(i) * w for i, w in zip(indices, weights, strict=True))
    return global_mean(total, math.fsum(weights), group), len(indices)


def grid(methods, n0):
    rank, out = dist.get_rank(), []
    for dp in (2, 3, 4):
        group = dist.new_group(list(range(dp)))  # every rank makes every group, in order
        if rank >= dp:
            continue
        for n in range(n0, n0 + dp):
            for name, (shard, how) in methods.items():
                indices, weights = shard(n, rank, dp)
                metric, steps = evaluate(indices, weights, how, group)
                out.append((dp, n, name, metric, steps))
    return out


per_rank = cluster.run(grid, METHODS, N)
cells = {}  # (method, dp, n) -> (error, steps per rank)
for dp in (2, 3, 4):
    for n in range(N, N + dp):
        exact = statistics.fmean(loss_of(i) for i in range(n))
        for name in METHODS:
            got = [row for r in range(dp) for row in per_rank[r] if row[:3] == (dp, n, name)]
            cells[name, dp, n] = (max(abs(m / exact - 1) for *_, m, _ in got), [s for *_, s in got])


def fmt(err):
    return "0" if err < 1e-12 else f"{err:.1%}"


cols = [(dp, n) for dp in (2, 3, 4) for n in range(N, N + dp)]
print("metric error against one process (as a fraction of the exact mean)")
print(f"{'':19}" + "".join(f"{f'dp{dp} N{n}':>9}" for dp, n in cols))  # 100 columns
for name in METHODS:
    print(f"{name:19}" + "".join(f"{fmt(cells[name, dp, n][0]):>9}" for dp, n in cols))
print("\nsteps per rank (! = unequal: a per-step collective without Join would hang)")
for name in METHODS:
    line = ""
    for dp, n in cols:
        s = cells[name, dp, n][1]
        line += f"{'/'.join(map(str, s)) + ('!' if len(set(s)) > 1 else ''):>9}"
    print(f"{name:19}" + line)

# %% [markdown]
# Every number above came from the ranks. Read the two tables together:
#
# - **padding** and **drop_last** keep equal steps and are off wherever `dp` does not divide
#   `N` (one size in `dp` is right: the one with no remainder);
# - **uneven + Join** and **uneven + sum/count** are exact, with unequal steps: Join made the
#   short rank shadow the per-step collective, which FSDP cannot do; the sum/count method is
#   safe only when the eval step itself makes no collective (a plain, replicated model);
# - **padding, weight 0** is exact and keeps equal steps on every cell.

# %%
exact_everywhere = {m for m in METHODS if all(cells[m, dp, n][0] < 1e-12 for dp, n in cols)}
equal_steps = {m for m in METHODS if all(len(set(cells[m, dp, n][1])) == 1 for dp, n in cols)}
would_hang = {m for m in METHODS if m not in equal_steps and METHODS[m][1] != "join"}
print("exact on every cell:     ", sorted(exact_everywhere))
print("equal steps on every cell:", sorted(equal_steps))
print("exact AND equal steps:   ", sorted(exact_everywhere & equal_steps))
print("unequal steps, no Join (hangs under FSDP):", sorted(would_hang))
assert exact_everywhere & equal_steps == {"padding, weight 0"}

# %% [markdown]
# ### One hang, on purpose
#
# Uneven shards on 3 ranks with the eval step's all-reduce (a stand-in for FSDP's all-gather)
# and no Join: 10 samples give ranks 4, 3 and 3 steps. **Predict** which rank is left waiting,
# and in which call. The launcher stops the ranks after 3 s and shows where each was.


# %%
def hangs_without_join(n):
    rank, world = dist.get_rank(), dist.get_world_size()
    for i in range(rank, n, world):
        pair = torch.tensor([loss_of(i), 1.0], dtype=torch.float64)
        # A collective every step: rank 0's 4th finds no partner.
        dist.all_reduce(pair)


hang = None
try:
    ez.launch(hangs_without_join, 10, world_size=3, timeout=3)
except ez.HangError as err:
    hang = err
    print(str(err).splitlines()[0])
    for stack in err.stacks.values():
        print("  ", stack.describe())
assert isinstance(hang, ez.HangError)

# %% [markdown]
# Under torchrun on gloo, the ranks that finished exit and the waiting one fails within a
# second or two with "Connection closed by peer". On NCCL nothing closes: the waiting rank sits
# in its collective until the NCCL watchdog's timeout (10 minutes by default) aborts it, and
# torchrun does not stop it when the others exit 0. Step counts predict the hang before it
# happens: that is how the grid above says "would hang" without waiting for one per cell.
#
# ## 4. The library's helper, and the check
#
# `WeightedShard(dataset, dp_rank, dp_size)` is the weight-0 method as a dataset: every rank gets
# `ceil(N / dp)` items, each with its `"index"` and `"weight"`. `check_eval` runs a loader
# factory on real ranks and judges it with no slack: a sample counted twice or never is a
# violation (a training check, `check_contract`, calls padding "expected").


# %%
class Losses(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"index": i, "loss": torch.tensor(loss_of(i), dtype=torch.float64)}


def padded_loader(layout):
    sampler = DistributedSampler(Losses(), layout.dp_size, layout.dp_rank, shuffle=False)
    return DataLoader(Losses(), batch_size=2, sampler=sampler)


def weighted_loader(layout):
    return DataLoader(WeightedShard(Losses(), layout.dp_rank, layout.dp_size), batch_size=2)


bad = check_eval(padded_loader, "dp=4", cluster=cluster)
good = check_eval(weighted_loader, "dp=4", cluster=cluster)
print(bad, good, sep="\n\n")
assert not bad.ok and good.ok

# %% [markdown]
# On GPUs the same loop sums `loss * weight` on the device and all-reduces one 2-element
# tensor after the loop. `global_mean` builds that tensor where the group's collectives run
# (the rank's GPU under NCCL, which raises on a CPU tensor; the CPU under gloo), in float64:
# NCCL reduces float64 like any dtype, and a float32 count stops being exact past 2**24
# (16.7 M) samples. accelerate's `gather_for_metrics`
# trims the padded tail instead; Composer slices the repeated samples off (docs/evaluation.md
# compares them).
#
# ## 5. (optional) Training for N steps over an endless stream
#
# A second lesson, about 20 minutes: skip it in a short session and come back to it when you
# train over streams.
#
# Training by epochs over shards of different sizes (or a stream without a length) leaves the
# ranks with different step counts. Count steps instead: `SteppedLoader` repeats the dataset
# endlessly on each rank and stops every rank after `steps` batches. Each epoch deals one
# permutation over the ranks, so within an epoch no sample goes to two ranks and the ranks'
# shares differ by at most one; each rank counts **its own** epochs.
#
# **Predict** 10 samples over 4 ranks (shares 3, 3, 2, 2), batches of 2, 8 steps: how many
# epochs does rank 0 start, and rank 3?
#
# The loop accumulates gradients over `ACCUM` micro-steps, and the LR schedule counts
# **optimizer** steps: 8 micro-steps are 4 optimizer steps, so the schedule `lr_at(k, 4)`
# (warm-up over one step, then linear decay) is read with the optimizer step `k`.

# %%
STEPS, BATCH, ACCUM = 8, 2, 2


def lr_at(k, opt_steps, peak=0.1):
    """The LR of optimizer step k of opt_steps: warm-up over the first, then linear decay."""
    return peak * min(k + 1, opt_steps - k) / opt_steps


def train(steps, batch, accum):
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, dtype=torch.float64)
    loader = SteppedLoader(Losses(), batch, rank, world, steps=steps, seed=0)
    epochs, lrs = [], []
    with record(loader) as rec:
        for micro, b in enumerate(rec):
            epochs.append(b["epoch"].tolist())
            pred = model(b["index"].double().unsqueeze(1) / N).squeeze(1)
            ((pred - b["loss"]) ** 2).mean().div(accum).backward()
            if (micro + 1) % accum == 0:  # an optimizer step: the schedule counts these
                lr = lr_at((micro + 1) // accum - 1, steps // accum)
                with torch.no_grad():
                    for p in model.parameters():
                        dist.all_reduce(p.grad)
                        p -= lr * p.grad / world
                        p.grad = None
                lrs.append(lr)
    return rec.ledger(), epochs, lrs, loader.state_dict()


runs = cluster.run(train, STEPS, BATCH, ACCUM)
ledger = Ledger.from_results([r[0] for r in runs])
epochs = {rank: r[1] for rank, r in enumerate(runs)}
for rank, r in enumerate(runs):
    print(
        f"rank {rank}: {len(r[1])} steps, epochs started {r[1][-1][-1] + 1}, position {r[3]['step']}"
    )
print("LR per optimizer step:", [round(x, 3) for x in runs[0][2]])
assert {len(r[1]) for r in runs} == {STEPS} and len(runs[0][2]) == STEPS // ACCUM
viz.epoch_wraps(ledger, epochs)

# %% [markdown]
# Every rank took 8 steps. Rank 0 (share 3) wrapped 5 times, rank 3 (share 2) 7 times: each
# row's colour changes at its own vermillion bars, sometimes inside a batch. Every step reached
# the all-reduce on every rank, whatever the data's size.
#
# **Predict** the same schedule fed the micro-step counter instead of the optimizer-step
# counter: what LR does the 3rd optimizer step use?

# %%
opt_steps = STEPS // ACCUM
right = [lr_at(k, opt_steps) for k in range(opt_steps)]
wrong = [lr_at(micro, opt_steps) for micro in range(ACCUM - 1, STEPS, ACCUM)]  # micro-steps
print("counted in optimizer steps:", [round(x, 3) for x in right])
print("counted in micro-steps:    ", [round(x, 3) for x in wrong])
assert right == runs[0][2] and min(wrong) < 0

# %% [markdown]
# Counted in micro-steps, the schedule runs out halfway and this notebook's formula turns the
# LR negative: the optimizer then climbs the loss. Libraries fail differently: Hugging Face's
# linear schedule clamps at 0 (the rest of training silently learns nothing), and
# `OneCycleLR` raises once stepped past its total. With `torch.optim.lr_scheduler`, build the schedule over
# `steps // accum` and call `sched.step()` right after `opt.step()`, once per optimizer step
# (Hugging Face's `Trainer` counts `max_steps` in optimizer steps too). The update here is
# written by hand because building a `torch.optim` optimizer imports `torch._dynamo`, seconds
# per rank on a small machine; the counting is the same.
#
# `state_dict()` is the position: the step alone, since each rank's epoch and offset follow
# from it. Saved per DP rank (torch's distributed checkpoint needs one key per rank), it
# resumes exactly. `check_steps` is verify's steps mode: it judges that every rank yields the
# steps asked for and that every epoch all ranks finished dealt each sample once, shares
# within one.


# %%
def stepped(layout):
    return SteppedLoader(Losses(), BATCH, layout.dp_rank, layout.dp_size, steps=STEPS)


report = check_steps(stepped, "dp=4", steps=STEPS, cluster=cluster)
print(report)
assert report.ok and report.judgement("balanced_coverage").passed

# %% [markdown]
# ## Exercise: an evaluation loop exact on any N and dp
#
# Write `exact_mean(dataset, dp_rank, dp_size)`: each rank reads its share of `dataset`
# (`len(dataset)`, `dataset[i]["loss"]`) and every rank returns the mean loss over all samples,
# equal to one process's. The checker draws a fresh size and DP degree (2 to 4 ranks, a size
# the degree does not divide) at each run, and says which dodge an answer matches: padding,
# `drop_last`, or a mean of per-rank means. Reading every sample on every rank is refused too,
# and so is a rank that reads nothing: every sample must be read once, on some rank. The
# checker also watches what each rank sends: its own (sum, count) through a collective, not its
# losses, and not through the process group's key-value store or a file. It counts, from
# outside the ranks, the bytes that crossed between them (the kernel's per-connection counters,
# on Linux) against what the collectives it saw carry: data sent around them (a process group
# or a socket of your own) is seen too. And on Linux your function runs where it may write no
# file and open no socket of its own, TCP, UDP or unix (Landlock and a seccomp filter), on ranks
# the checker starts for it with every thread confined: what the ranks share goes through the
# collectives.

# %% tags=["workshop"]
import ezpz_nb.workshop.exact_eval as ex


def exact_mean(dataset, dp_rank, dp_size):
    raise NotImplementedError  # your code: this rank's share, then one collective


# %% tags=["workshop"]
ex.check_exact_mean(exact_mean)

# %% tags=["solutions"]
import ezpz_nb.workshop.exact_eval as ex


def exact_mean(dataset, dp_rank, dp_size):
    pair = torch.zeros(2, dtype=torch.float64)  # [sum of losses, count]
    for i in range(dp_rank, len(dataset), dp_size):
        pair += torch.tensor([dataset[i]["loss"], 1.0], dtype=torch.float64)
    dist.all_reduce(pair)  # after the loop: a short shard makes no extra collective
    return float(pair[0] / pair[1])


# %% tags=["solutions"]
assert ex.check_exact_mean(exact_mean).passed

# %% [markdown]
# ## What to take away
#
# - For evaluation, `DistributedSampler`'s padding counts samples twice and `drop_last` never
#   counts some: the metric is off whenever `dp` does not divide `N`.
# - Pad with weight-0 samples (`WeightedShard`) and all-reduce the weighted sum and the count:
#   exact on every size, and every rank takes as many steps (needed under FSDP, which cannot
#   join). Uneven shards are exact only if the step makes no collective, or under `Join`.
# - Never average per-rank means; all-reduce sums and counts.
# - Over streams, train by step count: every rank takes N steps, counts its own epochs, and
#   resumes from the step; build the LR schedule in optimizer steps.
