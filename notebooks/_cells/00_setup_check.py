# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Setup check
#
# **Time:** about 10 minutes. Run it before the workshop, on the machine you will use there.
#
# Before the tutorial proper, make sure this machine can start real
# `torch.distributed` ranks from a notebook cell.
#
# **Learning goals**
#
# - Check the Python, PyTorch and gloo versions the tutorial needs.
# - Start 4 real ranks from one cell with `ez.launch` and see each one answer.
# - Run your first collective, `all_reduce`, and know what a correct result looks like.
# - Know what to do when one of these checks fails.
#
# Every check below ends with an `assert`: if a check fails, the cell stops with an error that
# says which one.

# %% [markdown]
# The next cell is folded: it installs ezpz_nb on Colab, or any Jupyter where it is missing
# (it takes a minute). Here ezpz_nb is installed, so it does nothing: run it and move on.

# %% jupyter={"source_hidden": true}
import importlib.util
import subprocess
import sys

# The project's repository (pyproject.toml's Project-URL); OWNER is a placeholder until the
# repository is published.
REPOSITORY = "https://github.com/OWNER/ezpz_nb"

if importlib.util.find_spec("ezpz_nb") is None:
    if "/OWNER/" in REPOSITORY:
        raise RuntimeError(
            "ezpz_nb is not installed here and this notebook does not know the "
            "repository's address yet: set REPOSITORY above to it, or install "
            "ezpz_nb from its wheel (pip install ezpz_nb-*.whl)"
        )
    subprocess.check_call(
        [sys.executable, "-m", "pip", "install", "-q", f"ezpz_nb[notebook] @ git+{REPOSITORY}"]
    )

# %% [markdown]
# ## Is this machine ready?
#
# The same checks as `ezpz-nb doctor` in a terminal: versions, cores, gloo on the loopback
# interface, a 4-rank launch and its time, the Jupyter kernel, the widget frontend and the free
# memory. A line marked `FAIL` says what to do.

# %%
# %matplotlib inline
import torch
import torch.distributed as dist

import ezpz_nb as ez
from ezpz_nb.cli.doctor import run_checks

report = run_checks(budget=60)  # seconds: a busy laptop can be slow to start ranks
print(report)

assert report.ok, report.verdict


# %% [markdown]
# ## Four ranks say hello
#
# `ez.launch(fn, world_size=4)` starts 4 processes, joins them into one gloo process group, runs
# `fn` in each, and returns the 4 return values in rank order. Inside `fn`, `torch.distributed`
# is already initialised, so the usual calls just work.


# %%
def hello():
    return f"rank {dist.get_rank()} of {dist.get_world_size()}, backend {dist.get_backend()}"


greetings = ez.launch(hello, world_size=4)
for line in greetings:
    print(line)

assert greetings == [f"rank {r} of 4, backend gloo" for r in range(4)]


# %% [markdown]
# ## A first collective
#
# Each rank puts its own rank number in a tensor, then `all_reduce` adds the tensors of all
# ranks together, **in place, on every rank**. With ranks 0, 1, 2 and 3 every rank must end with
# 0 + 1 + 2 + 3 = 6.


# %%
def rank_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)  # default op: SUM
    return t.item()


totals = ez.launch(rank_sum, world_size=4)
print(totals)
assert totals == [6.0, 6.0, 6.0, 6.0]

# %% [markdown]
# ## Plots
#
# Later notebooks draw pictures of what the ranks did. This one draws the layout used in
# notebook 03: 4 ranks arranged as 2 data-parallel replicas × 2 tensor-parallel ranks.

# %%
from ezpz_nb import viz

viz.layout(4, 2)

# %% [markdown]
# ## When a check fails
#
# | Symptom | What to do |
# |---|---|
# | A `FAIL` line above | Do what its `what to do` says, then run the cell again; `ezpz-nb doctor` in a terminal runs the same checks. |
# | `ModuleNotFoundError: ezpz_nb` | Start JupyterLab with `make lab` from the repository root (or `ezpz-nb lab` where ezpz_nb is installed), or select the kernel of the `.venv` it created. |
# | `gloo MISSING` | Install an official PyTorch wheel (`pip install torch`); some builds leave gloo out. |
# | `No such kernel named python3` | `.venv/bin/python -m ipykernel install --sys-prefix --name python3` |
# | `ez.HangError` in the hello cell | Another program may hold the loopback interface busy; re-run the cell. If it persists, set `GLOO_SOCKET_IFNAME` to your loopback device (`lo` on Linux, `lo0` on macOS). |
# | `ez.RankError` | Read the traceback it carries: it is the failing rank's own. |
# | Slow first launch (several seconds) | Normal: the first call imports torch once in a helper process; later calls take a fraction of a second. |

# %% [markdown]
# ## Summary
#
# - Python, PyTorch and gloo are in place.
# - `ez.launch(fn, world_size=4)` ran `fn` on 4 real ranks and returned their results in rank order.
# - `dist.all_reduce` summed one tensor per rank, in place, on every rank: 0 + 1 + 2 + 3 = 6 everywhere.
#
# Next: **01 · Process groups**: the collectives, subgroups, and what a hang looks like.
