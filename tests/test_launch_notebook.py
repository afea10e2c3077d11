"""The launcher inside a real Jupyter kernel: notebook functions, the magic, cell lines."""

from __future__ import annotations

import os
import time

import nbformat
import psutil
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient

CELLS = [
    # 0: functions defined in the notebook, a closure and a lambda
    """\
import torch, torch.distributed as dist
import ezpz_nb as ez

def who():
    print("hello from", dist.get_rank())
    return dist.get_rank()

base = 3
def make(k):
    return lambda: k * dist.get_rank() + base

print(ez.launch(who, world_size=2), ez.launch(make(2), world_size=2),
      ez.launch(lambda: dist.get_world_size(), world_size=3))""",
    # 1: a failing rank shows the cell's own line
    """\
def bad():
    if dist.get_rank() == 1:
        raise KeyError("oops-in-cell")
    dist.barrier()
try:
    ez.launch(bad, world_size=2)
except ez.RankError as e:
    print(e)""",
    # 2: a hang names the call and the cell line
    """\
def stuck():
    if dist.get_rank() == 0:
        dist.barrier()
    else:
        dist.all_reduce(torch.ones(1))
try:
    ez.launch(stuck, world_size=2, timeout=2)
except ez.HangError as e:
    print(e)""",
    # 3: the magic, with state kept between cells
    "%load_ext ezpz_nb",
    """\
%%ranks -n 2
import os
x = rank * 10
print("x is", x)
os.getpid()""",
    """\
%%ranks
x + 100""",
]


@pytest.mark.system  # a Jupyter kernel of its own (~7 s quiet): `make system`
@pytest.mark.timeout(300)
def test_launcher_in_a_notebook(tmp_path):
    """Guards: notebook-defined functions, live output in the right cell, cell lines in
    errors, the %%ranks magic, and no rank left once the kernel is gone."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    client = NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()

    def text(i: int) -> str:
        return "".join(o.get("text", "") for o in nb.cells[i].outputs)

    assert "[0, 1] [3, 5] [3, 3, 3]" in text(0)
    assert "[rank 0] hello from 0" in text(0) and "[rank 1] hello from 1" in text(0)
    assert "hello from" not in text(1) + text(2) + text(4)  # output stays in its cell

    err = text(1)
    assert "rank 1" in err and "KeyError: 'oops-in-cell'" in err
    assert 'raise KeyError("oops-in-cell")' in err  # the cell's source line

    hang = text(2)
    assert "rank 0: barrier() at line 3 of cell In[3]" in hang
    assert "rank 1: all_reduce() at line 5 of cell In[3]" in hang

    magic = text(4)
    assert "[rank 0] x is 0" in magic and "[rank 1] x is 10" in magic
    pids = [int(line.split("Out: ")[1]) for line in magic.splitlines() if "Out: " in line]
    assert len(pids) == 2
    assert "[rank 0] Out: 100" in text(5) and "[rank 1] Out: 110" in text(5)

    # The kernel has been shut down by nbclient: its ranks must be gone too.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) for p in pids)


@pytest.mark.system  # a Jupyter kernel of its own per case (~3 s each, quiet): `make system`
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "code",
    [
        "pass",  # imported only: the forkserver warmed up, and no launch ever came
        "ez.launch(lambda: 1, world_size=2)",  # one-shot: only the forkserver and tracker stay
        "c = ez.Cluster(2); c.run(lambda: 1)",  # a cluster the notebook never closed
    ],
)
def test_graceful_kernel_shutdown_runs_exit_handlers_and_leaves_nothing(code, short_tmp):
    """Guards Jupyter's normal shutdown (nbmake, JupyterLab): ipykernel waits for every child
    in its process group; multiprocessing's forkserver and resource tracker used to keep it
    waiting until its manager killed it, so its exit handlers never ran and multiprocessing's
    pymp-* folder stayed in the temporary directory after every notebook."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ, TMPDIR=short_tmp))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        # atexit is last-in, first-out: this marker runs before multiprocessing's cleanup.
        marker = os.path.join(short_tmp, "exit-handlers-ran")
        reply = kc.execute_interactive(
            f"import atexit, ezpz_nb as ez\n{code}\natexit.register(open, {marker!r}, 'w')",
            timeout=120,
            output_hook=lambda msg: None,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        km.shutdown_kernel(now=False)  # what nbclient does after the last cell
        kc.stop_channels()
    assert sorted(os.listdir(short_tmp)) == ["exit-handlers-ran"]


_FORKSERVER_PID = "__import__('multiprocessing.forkserver').forkserver._forkserver._forkserver_pid"


@pytest.mark.system  # a Jupyter kernel of its own per case (~3.5 s each, quiet): `make system`
@pytest.mark.timeout(180)
@pytest.mark.parametrize("warmup", ["1", "0"])
def test_import_in_a_kernel_warms_the_forkserver_and_env_set_later_still_counts(warmup, short_tmp):
    """Guards the first launch's second-long wait (the forkserver importing torch): in a
    kernel it starts at import, unless EZPZ_NB_WARMUP=0. Variables the notebook sets
    afterwards still reach the ranks, even those torch reads at import."""
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ, TMPDIR=short_tmp, EZPZ_NB_WARMUP=warmup))
    kc = km.client()
    kc.start_channels()
    out: list[str] = []

    def hook(msg: dict) -> None:
        out.append(msg["content"].get("text", ""))

    try:
        kc.wait_for_ready(timeout=60)
        code = (
            f"import os, ezpz_nb as ez\nprint('warm', {_FORKSERVER_PID} is not None)\n"
            "os.environ['TORCH_DISTRIBUTED_DEBUG'] = 'DETAIL'\n"
            "os.environ['EZPZ_SET_LATER'] = 'yes'\n"
            "import torch.distributed as dist\n"
            "print('ranks', ez.launch(lambda: (str(dist.get_debug_level()),"
            " os.environ['EZPZ_SET_LATER']), world_size=2))"
        )
        reply = kc.execute_interactive(code, timeout=120, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        km.shutdown_kernel(now=False)
        kc.stop_channels()
    text = "".join(out)
    assert f"warm {warmup == '1'}" in text
    assert "ranks [('DebugLevel.DETAIL', 'yes'), ('DebugLevel.DETAIL', 'yes')]" in text
    assert os.listdir(short_tmp) == []


def test_no_warm_up_in_a_plain_script(short_tmp):
    """A script (or torchrun) that imports ezpz_nb starts no forkserver it did not ask for."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", f"import ezpz_nb; print({_FORKSERVER_PID})"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TMPDIR=short_tmp),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
