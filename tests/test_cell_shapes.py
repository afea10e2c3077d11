"""Cell code as people write it, on real ranks: in a plain script and in a real Jupyter kernel.

Guards the RecursionError that every function calling two helpers raised on the ranks
(rebinding helper A visited helper B, which visited A again), and the shapes around
it: chains, mutual and self recursion, cell classes and decorators, partials,
dataclasses, lambdas in globals, redefined helpers, rank-side globals that persist,
``%%ranks`` cells that call notebook helpers, code pasted from torchrun scripts, and
progress bars drawn with carriage returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ezpz_nb as ez
from ezpz_nb.launcher.settings import START_METHOD_ENV

pytestmark = pytest.mark.timeout(300)

# Each shape defines what it needs and adds ``name: (function, args)`` to CASES; the
# notebook and the script run every case locally and on the ranks and compare.
SHAPES = [
    """\
import dataclasses, functools
import torch.distributed as dist
import ezpz_nb as ez
CASES = {}
def helper_a(): return 1
def helper_b(): return 2
def two_helpers(): return helper_a() + helper_b()
CASES["two helpers"] = (two_helpers, ())""",
    """\
def chain_h(): return 5
def chain_g(): return chain_h() + 1
def chain_f(): return chain_g() * 2
CASES["chain of three"] = (chain_f, ())""",
    """\
def is_even(n): return True if n == 0 else is_odd(n - 1)
def is_odd(n): return False if n == 0 else is_even(n - 1)
CASES["mutual recursion"] = (is_even, (7,))""",
    """\
def fact(n): return 1 if n <= 1 else n * fact(n - 1)
def uses_fact(): return fact(6) + helper_a()
CASES["recursive helper"] = (uses_fact, ())""",
    """\
class Model:
    def __init__(self, k): self.k = k
    def forward(self): return helper_a() + self.k * helper_b() + self.twice()
    def twice(self): return 2 * fact(3)
CASES["class calling helpers"] = (lambda: Model(3).forward(), ())""",
    """\
def plus_helper(fn):
    @functools.wraps(fn)
    def wrapper(*args): return fn(*args) + helper_a()
    return wrapper
@plus_helper
def decorated(x): return helper_b() * x
CASES["decorator from the cell"] = (decorated, (4,))""",
    """\
def add3(a, b, c): return a + b + c + chain_f()
CASES["partial"] = (functools.partial(add3, 1, c=3), (2,))""",
    """\
@dataclasses.dataclass
class Config:
    n: int = 3
    def total(self): return self.n + helper_b()
CASES["dataclass"] = (lambda cfg: cfg.total(), (Config(n=7),))""",
    """\
square = lambda x: x * x + helper_a()
def uses_lambda(): return square(5)
CASES["lambda in a global"] = (uses_lambda, ())""",
]

# Run every case on 2 ranks; then the stateful shapes, which need an order.
RUNNER = """\
results = {}
with ez.Cluster(world_size=2) as cluster:
    for name, (fn, args) in CASES.items():
        results[name] = [fn(*args), cluster.run(fn, *args)]

    def set_state():
        global state
        state = 10 * dist.get_rank() + helper_b()
    def get_state(): return state
    cluster.run(set_state)
    results["globals kept between runs"] = [[2, 12], cluster.run(get_state)]

    class Counter:
        def bump(self):
            global bumps
            bumps = bumps + 1 if "bumps" in globals() else 1
            return bumps
    cluster.run(Counter().bump)
    results["method writing a global"] = [[2, 2], cluster.run(Counter().bump)]
    results["...read by a function"] = [[2, 2], cluster.run(lambda: bumps)]

    def helper_a(): return 100  # redefined "in a later cell": the new one must run
    results["redefined helper"] = [two_helpers(), cluster.run(two_helpers)]
print("RESULTS " + json.dumps(results))
"""


def _check(results: dict) -> None:
    names = {
        "two helpers",
        "chain of three",
        "mutual recursion",
        "recursive helper",
        "class calling helpers",
        "decorator from the cell",
        "partial",
        "dataclass",
        "lambda in a global",
        "globals kept between runs",
        "method writing a global",
        "...read by a function",
        "redefined helper",
    }
    assert set(results) == names
    for name, (local, remote) in results.items():
        if isinstance(local, list):
            assert remote == local, name
        else:
            assert remote == [local, local], name
    assert results["redefined helper"][0] == 102


@pytest.mark.system  # `python script.py`, as a user runs it: `make system`
def test_shapes_in_a_plain_script(tmp_path, short_tmp):
    """The same shapes from a script's __main__ (what `python script.py` pickles by value)."""
    script = tmp_path / "shapes.py"
    script.write_text("import json\n" + "\n".join(SHAPES) + "\n" + RUNNER)
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, TMPDIR=short_tmp),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULTS "))
    _check(json.loads(line[len("RESULTS ") :]))
    assert os.listdir(short_tmp) == []


# ---------------------------------------------------------------- in a real kernel
BAR = """\
import time
def draw_bar():
    for i in range(6):
        print(f"step {i}/5", end="\\r", flush=True)
        time.sleep(0.15)
    print()
    return "drawn"
ez.launch(draw_bar, world_size=2)"""

MAGIC = [
    "%load_ext ezpz_nb",
    "%%ranks -n 2\nscaled = two_helpers() * (rank + 1) + Model(1).forward()\nscaled",
    "def two_helpers(): return 40\nnotebook_only = 5",
    "%%ranks\ntwo_helpers() + scaled",
    "%%ranks\nnotebook_only + 1",
]


# What the spawned notebooks did beyond the shapes above (nbmake ran 01, 07 and 10 with
# spawned ranks: 146 CPU-s, against 25 forked): a DeviceMesh's new gloo groups
# (07), DataLoader workers forked from a spawned rank, with the cell's own dataset class
# (10), a rank's error and a hang, then a launch after it (01).
PATHS = [
    """\
import json, os
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
import ezpz_nb as ez

class Numbers(IterableDataset):
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
    def __iter__(self):
        info = get_worker_info()
        share, shares = self.rank * info.num_workers + info.id, self.world * info.num_workers
        yield from range(share, 16, shares)

def mesh_and_workers():
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    t = torch.ones(1)
    dist.all_reduce(t, group=mesh["tp"].get_group())
    loader = DataLoader(Numbers(dist.get_rank(), 2), batch_size=2, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=True)
    return t.item(), sorted(int(x) for _ in range(2) for batch in loader for x in batch)

print("PATHS " + json.dumps(ez.launch(mesh_and_workers, world_size=2, timeout=120)))""",
    # Set after the import warmed ranks (the standby pool, under spawn): must still count.
    """\
os.environ["EZPZ_SET_LATER"] = "yes"
print("LATER " + json.dumps(ez.launch(lambda: os.environ.get("EZPZ_SET_LATER"), world_size=2)))""",
    """\
def fails_on_one():
    if dist.get_rank() == 1:
        raise ValueError("rank one says no")
    return 0

try:
    ez.launch(fails_on_one, world_size=2, timeout=60)
except ez.RankError as err:
    print("ERROR " + json.dumps(str(err)))""",
    """\
def mismatched():
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(1))

try:
    ez.launch(mismatched, world_size=2, timeout=3)
except ez.HangError as err:
    print("HANG " + json.dumps({r: s.call for r, s in err.stacks.items()}))""",
    'print("AFTER " + json.dumps(ez.launch(lambda: dist.get_rank(), world_size=2, timeout=60)))',
]


# The kernel tests run twice: with the platform's ranks (Linux: forked from a
# forkserver) and with spawned ones, as on macOS and Windows (EZPZ_NB_START_METHOD, the
# variable conftest.py's --spawn-notebook sets for a notebook): every cell's code then
# travels by value into fresh interpreters. The spawned run is a system test (`make
# system`): each of its ~18 ranks imports torch afresh (19 of the file's 26 CPU-s, measured
# on 2 cores); the quick run keeps the forked one, which runs the same cell code by value,
# and test_pool.py's spawned kernel, which launches from the standby pool.
@pytest.fixture(
    scope="module", params=["forked", pytest.param("spawned", marks=pytest.mark.system)]
)
def kernel(request):
    from jupyter_client import KernelManager

    env = {k: v for k, v in os.environ.items() if k != START_METHOD_ENV}
    if request.param == "spawned":
        env[START_METHOD_ENV] = "spawn"
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)

    def run(code: str) -> tuple[str, list[dict]]:
        msgs: list[dict] = []
        reply = kc.execute_interactive(code, timeout=120, output_hook=msgs.append)
        text = "".join(m["content"].get("text", "") for m in msgs if m["msg_type"] == "stream")
        errors = [m["content"] for m in msgs if m["msg_type"] == "error"]
        if reply["content"]["status"] != "ok":
            text += "\n".join(e["ename"] + ": " + e["evalue"] for e in errors)
        return text, msgs

    yield run
    km.shutdown_kernel(now=False)
    kc.stop_channels()


def test_shapes_in_a_kernel(kernel):
    """The same shapes, one per cell, then the runner, in a Jupyter kernel."""
    kernel("import json")
    for cell in SHAPES:
        text, _ = kernel(cell)
        assert "Error" not in text, text
    text, _ = kernel(RUNNER)
    line = next(x for x in text.splitlines() if x.startswith("RESULTS "))
    _check(json.loads(line[len("RESULTS ") :]))


def test_a_mesh_loader_workers_an_error_and_a_hang_in_a_kernel(kernel):
    """The spawned notebooks' own paths, in both kinds of ranks: the mesh's TP group sums
    2, each rank's two persistent workers yield its disjoint half of 0..15 in each of two
    epochs, a variable set after the import reaches the ranks (under spawn, standby ranks
    started before it was set), the error names rank 1, its message and the learner's
    function, the hang says where each rank waited, and the next launch runs."""
    text = "".join(kernel(cell)[0] for cell in PATHS)  # a cell each, as in the notebooks
    said = {
        line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
        for line in text.splitlines()
        if line.split(" ", 1)[0] in ("PATHS", "LATER", "ERROR", "HANG", "AFTER")
    }
    assert set(said) == {"PATHS", "LATER", "ERROR", "HANG", "AFTER"}, text
    (sum0, mine0), (sum1, mine1) = said["PATHS"]
    assert sum0 == sum1 == 2.0
    # Two epochs of persistent workers: each rank's half twice, the halves disjoint.
    assert sorted(mine0 + mine1) == sorted(list(range(16)) * 2), said
    assert not set(mine0) & set(mine1), said
    assert said["LATER"] == ["yes", "yes"]
    error = said["ERROR"]
    assert "rank 1" in error and "rank one says no" in error and "fails_on_one" in error, error
    assert said["HANG"] == {"0": "barrier", "1": "all_reduce"}, said["HANG"]
    assert said["AFTER"] == [0, 1]


def test_ranks_cells_call_notebook_helpers(kernel):
    """%%ranks cells get the notebook's functions and classes (a later definition wins);
    the notebook's data does not travel, and the NameError says so."""
    for cell in SHAPES[:1] + SHAPES[3:5]:
        kernel(cell)
    outs = [kernel(cell)[0] for cell in MAGIC]
    # two_helpers() * (rank + 1) + Model(1).forward() = 3 * (rank + 1) + (1 + 2 + 12)
    assert "[rank 0] Out: 18" in outs[1] and "[rank 1] Out: 21" in outs[1]
    assert "[rank 0] Out: 58" in outs[3] and "[rank 1] Out: 61" in outs[3]  # 40 + scaled
    assert "RankError" in outs[4] and "notebook_only" in outs[4]
    assert "only the notebook's functions, classes and modules arrive" in outs[4]


def test_progress_bar_updates_live_in_one_display_per_rank(kernel):
    """A rank redrawing a line with carriage returns shows one display per rank, updated
    in place while it runs, ending on the last text; not one glued line at the end."""
    kernel("import ezpz_nb as ez")
    text, msgs = kernel(BAR)
    shown = [
        (m["msg_type"], m["content"]["data"]["text/plain"])
        for m in msgs
        if m["msg_type"] in ("display_data", "update_display_data")
    ]
    for r in (0, 1):
        mine = [t for _, t in shown if t.startswith(f"[rank {r}] ")]
        # Several distinct states arrived one by one (live), in order, ending on the last.
        assert len(set(mine)) >= 3, shown
        steps = [int(t.split("step ")[1].split("/")[0]) for t in mine]
        assert steps == sorted(steps) and steps[-1] == 5
    assert [k for k, _ in shown].count("display_data") == 2  # one display per rank
    assert "step 0/5step" not in text and "\r" not in text


# ---------------------------------------------------------------- pasted code, our faults
def _init_process(rank, size, fn, backend="gloo"):
    """The shape of PyTorch's distributed tutorial: each process sets up its own group."""
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    return fn(rank, size)


def _sum_ranks(rank, size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def _script_end():
    import torch.distributed as dist

    value = _sum_ranks(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()  # what scripts do at the end
    return value


def test_pasted_init_process_group_runs_and_a_wrong_rank_explains_itself():
    import torch.distributed as dist

    assert (
        ez.launch(lambda: _init_process(dist.get_rank(), 3, _sum_ranks), world_size=3) == [3.0] * 3
    )
    with pytest.raises(ez.RankError) as info:
        ez.launch(lambda: _init_process(0, 2, _sum_ranks), world_size=2)
    msg = str(info.value)
    assert "rank 1 failed" in msg and "already placed this process as rank 1 of 2" in msg
    assert "Pass rank=dist.get_rank()" in msg


def test_destroy_process_group_in_a_run_does_not_break_the_next():
    import torch.distributed as dist

    with ez.Cluster(world_size=2) as c:
        assert c.run(_script_end) == [1.0, 1.0]
        assert c.run(_script_end) == [1.0, 1.0]
        assert c.run(lambda: dist.get_world_size()) == [2, 2]


class _BreaksOnTheRanks:
    """Pickles fine in the notebook; rebuilding it on a rank raises."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise ValueError("refusing to be rebuilt")


def test_a_failure_in_our_code_shows_our_frames_and_says_so():
    """Guards the empty traceback a RecursionError in the rank's own plumbing gave."""
    with pytest.raises(ez.RankError) as info:
        ez.launch(lambda x: 1, _BreaksOnTheRanks(), world_size=2)
    msg = str(info.value)
    assert "inside ezpz_nb, before your function ran" in msg
    assert "launcher/rank.py" in msg and "wire.py" in msg and "in loads_job" in msg  # ours
    assert "in _refuse" in msg and "refusing to be rebuilt" in msg
    assert "ezpz_nb failed on this rank before your function ran" in msg


# ---------------------------------------------------------------- random call graphs
@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(world_size=2) as c:
        yield c


graphs = st.integers(min_value=1, max_value=6).flatmap(
    lambda n: st.lists(
        st.tuples(st.integers(-9, 9), st.lists(st.integers(0, n - 1), max_size=3)),
        min_size=n,
        max_size=n,
    )
)


def _graph_source(graph: list[tuple[int, list[int]]]) -> str:
    """Functions f0..fn-1; fi adds its constant to what its callees (cycles allowed,
    itself included) return one level deeper; depth 0 stops the recursion."""
    parts = []
    for i, (const, callees) in enumerate(graph):
        calls = " + ".join(f"{k + 2} * f{j}(d - 1)" for k, j in enumerate(callees)) or "0"
        parts.append(
            f"def f{i}(d):\n    if d <= 0:\n        return {const}\n    return {const} + {calls}\n"
        )
    return "\n".join(parts)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(graph=graphs, depth=st.integers(0, 4))
def test_random_call_graphs_give_the_local_value_on_the_ranks(cluster, graph, depth):
    ns: dict = {"__name__": "__main__"}  # as in a notebook or a script: sent by value
    exec(textwrap.dedent(_graph_source(graph)), ns)
    local = ns["f0"](depth)
    assert cluster.run(ns["f0"], depth) == [local, local]
