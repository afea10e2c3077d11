"""``make gpu-check`` (benchmarks/gpu_check.sh) on machines without a usable GPU.

The GPU paths themselves only run on a GPU node; here the script must say so and
succeed, except where the driver sees GPUs that torch cannot use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
pytest_plugins = ["pytester"]


def _run(tmp_path: Path, fake_smi: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if fake_smi is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{fake_smi}'\n")
        smi.chmod(0o755)
    # Our folder first: a real nvidia-smi elsewhere on PATH must not decide the case.
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )


def test_gpu_check_skips_and_succeeds_without_a_gpu(tmp_path):
    """Guards: issue 28: without any GPU, make gpu-check printed FAIL and exited 1; it must
    print "SKIP: no GPU" and exit 0."""
    done = _run(tmp_path, "")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SKIP: no GPU" in done.stdout


def test_gpu_check_fails_when_the_driver_sees_gpus_that_torch_does_not(tmp_path):
    """Guards: a CPU build of torch on a GPU node must not pass as "no GPU": nvidia-smi lists
    a GPU, torch sees none, the script exits 1 and says to install a CUDA build."""
    done = _run(tmp_path, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nvidia-smi sees 1 GPU(s) but torch sees none" in done.stdout
    assert "SKIP" not in done.stdout


def test_gpu_check_runs_the_cuda_test_of_global_mean_and_the_rng_capture(
    pytester: pytest.Pytester,
):
    """Guards issue 46: the CUDA half of global_mean and the RNG capture runs where a GPU is,
    through `make gpu-check`: the script's own file selection and `-k` expression pick it."""
    import re

    text = SCRIPT.read_text()
    grep = re.search(r"GPU_TESTS=\$\(grep -l (.*?) tests/test_\*\.py\)", text)
    keyword = re.search(r'-k "([^"]+)"', text)
    assert grep and keyword, "gpu_check.sh no longer selects its GPU tests as this test reads"
    chosen = subprocess.run(
        f"grep -l {grep[1]} tests/test_*.py", shell=True, cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert "tests/test_checkpoint.py" in chosen
    # Collected in this process (pytest's own -k and collection, without a second
    # interpreter importing torch: ~4 CPU-s on 2 cores).
    run = pytester.inline_run(
        "--collect-only", "-p", "no:cacheprovider",
        str(ROOT / "tests" / "test_checkpoint.py"), "-k", keyword[1],
    )  # fmt: skip
    names = [item.name for item in run.getcall("pytest_collection_finish").session.items]
    assert "test_global_mean_and_rng_capture_on_cuda" in names, names
    assert "test_global_mean_and_rng_capture_on_cpu" not in names
