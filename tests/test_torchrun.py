"""The walkthroughs under torch's own launcher: ``python -m torch.distributed.run``.

Each test starts torchrun as a subprocess (as a user on a cluster would), then
reads the ledger files the ranks wrote (``DIR/rank{r}.jsonl``). This is the CI
check that a notebook's worker runs unchanged outside the notebook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from ezpz_nb.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
# A hang would otherwise block CI; the examples' own timeouts end a stuck run first.
LIMIT_S = 120


def torchrun(nproc: int, module: str, *args: str) -> subprocess.CompletedProcess:
    """``torchrun --standalone`` on ``module`` (a module name, or a script's path)."""
    target = [module] if module.endswith(".py") else ["-m", f"ezpz_nb.examples.{module}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)  # torchrun sets its own; stale ones from a caller must not leak in
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", *target, *args]
    # torchrun leaves a torchelastic_* folder in TMPDIR: give it one we remove.
    with tempfile.TemporaryDirectory(prefix="ezpz-tr", dir="/tmp") as tmp:
        return subprocess.run(cmd, cwd=ROOT, env=dict(env, TMPDIR=tmp), capture_output=True,
                              text=True, timeout=LIMIT_S)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def test_tp_broadcast_under_torchrun_leaves_a_sound_ledger_per_rank(tmp_path):
    proc = torchrun(4, "tp_broadcast", "--out", str(tmp_path), "--tp-size", "2", "--check")
    assert proc.returncode == 0, output(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}.jsonl" for r in range(4)]
    ledger = Ledger.load(tmp_path)
    assert ledger.ok, ledger.summary()
    assert ledger.ranks() == [0, 1, 2, 3]
    assert ledger.layout() == {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)}
    digests: dict[tuple[int, int, int], set[str]] = defaultdict(set)
    for r in ledger.records:
        digests[(r.epoch, r.dp_rank, r.step)].add(r.digest)
        assert r.source == ("loaded" if r.tp_rank == 0 else "received")
    assert digests and all(len(d) == 1 for d in digests.values())  # TP peers: same bytes
    for (epoch, dp_rank, step), ds in digests.items():  # DP replicas: different batches
        if dp_rank == 0:
            assert ds != digests[(epoch, 1, step)]
    assert "All checks passed." in proc.stdout
    # The point of the files: plot a cluster run afterwards, as in the notebooks.
    from ezpz_nb import viz

    assert viz.png_bytes(viz.heatmap(ledger)).startswith(b"\x89PNG")


def test_uneven_steps_under_torchrun_fail_with_a_named_error_not_a_hang(tmp_path):
    """Guards the 30-minute hang: one replica with fewer batches must end the job
    with an error naming the mismatch, and leave the partial ledgers behind."""
    proc = torchrun(2, "step_alignment", "--out", str(tmp_path), "--tp-size", "1",
                    "--uneven", "--step-timeout", "3", "--timeout", "30")
    assert proc.returncode != 0, output(proc)
    assert "StepTimeoutError" in proc.stdout + proc.stderr, output(proc)
    ledger = Ledger.load(tmp_path)
    assert ledger.ranks() == [0, 1]
    assert "step_mismatch" in {p.kind for p in ledger.check()}


def test_run_in_place_gives_every_rank_the_list_launch_would(tmp_path):
    script = tmp_path / "probe.py"
    # Each rank writes its own file: the ranks' stdout lines interleave.
    script.write_text(
        "import json, sys\n"
        "import torch.distributed as dist\n"
        "from ezpz_nb.examples.common import ensure_distributed, run_in_place\n"
        "got = run_in_place(lambda k: dist.get_rank() * k, 10)\n"
        "again = ensure_distributed()\n"
        "with open(f'{sys.argv[1]}/rank{dist.get_rank()}.json', 'w') as f:\n"
        "    json.dump([got, again], f)\n"
    )
    proc = torchrun(2, str(script), str(tmp_path))
    assert proc.returncode == 0, output(proc)
    for r in (0, 1):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == [[0, 10], False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tp_broadcast_under_torchrun_on_nccl(tmp_path):
    nproc = min(4, torch.cuda.device_count())
    tp = 2 if nproc % 2 == 0 else 1
    proc = torchrun(nproc, "tp_broadcast", "--backend", "nccl", "--tp-size", str(tp),
                    "--out", str(tmp_path), "--check")
    assert proc.returncode == 0, output(proc)
    ledger = Ledger.load(tmp_path)
    assert ledger.ok and ledger.ranks() == list(range(nproc)), ledger.summary()
