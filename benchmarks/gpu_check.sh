#!/usr/bin/env bash
# One short run (well under 5 minutes) of the GPU paths, for a machine with CUDA GPUs:
#   1. the GPU tests (pytest; they skip on machines without CUDA), among them global_mean and
#      every generator of a rank (its CUDA device's too) through a DCP save and load on NCCL
#      (tests/test_checkpoint.py::test_global_mean_and_rng_capture_on_cuda),
#   2. tp_broadcast under torchrun on nccl, one GPU per rank, ledger checked,
#   3. uneven steps under torchrun on nccl must fail, not hang (needs 2+ GPUs),
#   4. pin_memory / non_blocking host-to-device copies and the side-stream prefetch, measured
#      (benchmarks/pin_memory.py); host timers against CUDA events on a step, checked
#      (benchmarks/cuda_timing.py),
#   5. notebook 14's worker file (taken from the notebook) under torchrun on nccl; with 2+
#      GPUs also its checker (one node, two simulated nodes), its elastic restart, and the
#      membership-change restart of two simulated nodes (their agents' counts disagree),
#   6. the capstone (FSDP2 x TP) under torchrun on nccl, ledger checked,
#   7. a DCP checkpoint (model, optimizer, loader) saved on N GPUs, the job killed, and
#      resumed on N/2 (needs 2+ GPUs): 0 samples repeated, 0 never seen.
# Prints PASS/FAIL/SKIP per check and a summary; exits 1 if any check failed.
# Without a GPU it prints "SKIP: no GPU" and exits 0, unless nvidia-smi sees GPUs that
# torch does not (a CPU build of torch on a GPU node): then it exits 1.
#
# Usage, from anywhere:  bash benchmarks/gpu_check.sh     (PYTHON=... picks the interpreter)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=$(mktemp -d "${TMPDIR:-/tmp}/ezpz_nb_gpu_check.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
export OMP_NUM_THREADS=1
passed=0
failed=0

report() {  # report NAME STATUS(0=pass)
    if [ "$2" -eq 0 ]; then echo "PASS  $1"; passed=$((passed + 1))
    else echo "FAIL  $1"; failed=$((failed + 1)); fi
}

# One import of torch for both answers (each import costs seconds on a busy machine).
if INFO=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")'); then
    NGPU=${INFO%%$'\n'*}
    echo "${INFO#*$'\n'}"
else
    NGPU=0
fi
echo "GPUs visible: $NGPU"
# GPUs the driver sees; CUDA_VISIBLE_DEVICES hides some from torch on purpose.
SMI=0
if command -v nvidia-smi >/dev/null 2>&1; then
    SMI=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') || SMI=0
fi
if [ "$NGPU" -lt 1 ]; then
    if [ "$SMI" -gt 0 ]; then
        echo "FAIL  nvidia-smi sees $SMI GPU(s) but torch sees none: install a CUDA build of"
        echo "      torch (e.g. make .venv/bin/.installed TORCH=torch), or check CUDA_VISIBLE_DEVICES"
        exit 1
    fi
    echo "SKIP: no GPU (torch sees none, nor does nvidia-smi): nothing to check on this machine"
    exit 0
fi
if [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && [ "$SMI" -gt "$NGPU" ]; then
    echo "FAIL  nvidia-smi sees $SMI GPU(s) but torch sees only $NGPU: check the driver and torch's CUDA version"
    exit 1
fi
NPROC=$(( NGPU < 4 ? NGPU : 4 ))
TP=$(( NPROC % 2 == 0 ? 2 : 1 ))

echo "== 1. GPU tests"
# Only the files that hold GPU tests: a GPU node's Python may lack the notebook stack
# (jupyter_client, nbformat) that other test files import at collection.
GPU_TESTS=$(grep -l -e nccl -e cuda tests/test_*.py)
timeout 180 "$PY" -m pytest -q -rs -p no:cacheprovider $GPU_TESTS -k "nccl or cuda or gpu"
report "GPU tests (pytest -k 'nccl or cuda or gpu')" $?

echo "== 2. torchrun, nccl, $NPROC rank(s), tp $TP: tp_broadcast"
timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    -m ezpz_nb.examples.tp_broadcast --backend nccl --tp-size "$TP" --out "$OUT/tp" --check
report "torchrun nccl tp_broadcast (ledger in $OUT/tp checked)" $?

if [ "$NPROC" -ge 2 ]; then
    echo "== 3. torchrun, nccl, 2 ranks: uneven steps must end in an error (expected to fail)"
    timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
        -m ezpz_nb.examples.step_alignment --backend nccl --tp-size 1 --uneven \
        --step-timeout 5 --timeout 30 --out "$OUT/steps" >"$OUT/steps.log" 2>&1
    status=$?
    tail -n 5 "$OUT/steps.log"
    # 124 is timeout(1) killing it: that would be the hang this check guards against.
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ]
    report "torchrun nccl uneven steps fail fast (exit $status)" $?
else
    echo "SKIP  uneven steps on nccl: needs 2 GPUs (NCCL takes one GPU per rank)"
fi

echo "== 4. pin_memory, non_blocking, side-stream prefetch; host timers against CUDA events"
timeout 120 "$PY" benchmarks/pin_memory.py
report "pin_memory / non_blocking copies and side-stream prefetch measured" $?
timeout 60 "$PY" benchmarks/cuda_timing.py
report "CUDA events see a step's kernels, a host timer alone only their launches" $?

echo "== 5. notebook 14's worker file, torchrun, nccl, $NPROC rank(s), tp $TP"
# The file the notebook's %%writefile cells write, taken from the stored notebook.
"$PY" -c 'import sys; from ezpz_nb.agents.by_hand import worker_from_notebook as w
open(sys.argv[2], "w").write(w(sys.argv[1]))' notebooks/14_torchrun_by_hand.ipynb "$OUT/torchrun_worker.py"
report "notebook 14's worker extracted" $?
timeout 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    "$OUT/torchrun_worker.py" --backend nccl --tp-size "$TP" --out "$OUT/nb14"
status=$?
[ "$status" -eq 0 ] && "$PY" -c 'import sys; from ezpz_nb.ledger import Ledger
led = Ledger.load(sys.argv[1]); print(led.summary()); sys.exit(0 if led.ok else 1)' "$OUT/nb14/attempt0"
report "torchrun nccl notebook 14 worker (ledger in $OUT/nb14 checked)" $?
if [ "$NGPU" -ge 2 ]; then
    # Two simulated nodes on one machine: each gets its own GPUs (CUDA_VISIBLE_DEVICES).
    timeout 240 "$PY" -c 'import sys; from ezpz_nb.agents.by_hand import check_worker
check_worker(sys.argv[1], backend="nccl"); print("check_worker: all good")' "$OUT/torchrun_worker.py"
    report "notebook 14 checker on nccl (2 nodes x 3 at tp 2, a rank killed once; under 6 GPUs 1 node x 2 with the kill, then 2 nodes x 1)" $?
    # torchrun() starts its agents with a store per rendezvous round (ROUND_STORE).
    timeout 180 "$PY" -c 'import sys; from ezpz_nb.agents.agents import torchrun
from ezpz_nb.agents.by_hand import load_attempts
torchrun(sys.argv[1], "--backend", "nccl", "--out", sys.argv[2], "--checkpoint-every", "2",
         "--kill", "1:1:3", nproc_per_node=2, max_restarts=1, timeout_s=170).raise_for_status()
got = load_attempts(sys.argv[2]); print(got.resumed, got.counted.summary())
sys.exit(0 if got.exactly_once() and got.replayed.records else 1)' "$OUT/torchrun_worker.py" "$OUT/elastic"
    report "notebook 14 elastic restart on nccl (a rank killed, resumed exactly once)" $?
    # Two simulated nodes, one GPU each: rank 1 dies, rank 0 waits; node 0's agent restarts
    # for the membership change without counting it, so the counts must disagree (0 and 1).
    timeout 180 "$PY" -c 'import sys; from ezpz_nb.agents.agents import torchrun
from ezpz_nb.agents.by_hand import load_attempts
gpus = [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
run = torchrun(sys.argv[1], "--backend", "nccl", "--out", sys.argv[2], "--checkpoint-every", "2",
               "--kill", "1:1:3", "--others-block", "--timeout", "60", nnodes=2, max_restarts=1,
               node_envs=gpus, timeout_s=170).raise_for_status()
counts = sorted(int(ln.split()[-1]) for ln in run.lines(r"^rank \d+ local_rank .* attempt 1 "))
got = load_attempts(sys.argv[2]); print("restart counts", counts, got.resumed)
sys.exit(0 if counts == [0, 1] and got.exactly_once() else 1)' "$OUT/torchrun_worker.py" "$OUT/membership"
    report "notebook 14 membership-change restart on nccl (2 nodes x 1 GPU, counts 0 and 1)" $?
else
    echo "SKIP  notebook 14 checker and elastic restart on nccl: need 2 GPUs (one per rank)"
fi

echo "== 6. capstone, torchrun, nccl, $NPROC rank(s), tp $TP"
timeout 180 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC" \
    -m ezpz_nb.examples.capstone --backend nccl --tp-size "$TP" --out "$OUT/capstone" --check
report "torchrun nccl capstone (ledger in $OUT/capstone checked)" $?

if [ "$NGPU" -ge 2 ]; then
    echo "== 7. dcp_resume, torchrun, nccl: saved on $NGPU rank(s), killed, resumed on $((NGPU / 2))"
    timeout 180 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" \
        -m ezpz_nb.examples.dcp_resume --backend nccl --out "$OUT/dcp_a" \
        --checkpoint "$OUT/dcp_ckpt" --save-at 2 --kill
    timeout 180 "$PY" -m torch.distributed.run --standalone --nproc_per_node=$((NGPU / 2)) \
        -m ezpz_nb.examples.dcp_resume --backend nccl --out "$OUT/dcp_b" --resume-from "$OUT/dcp_ckpt" \
    && "$PY" -c 'import sys; from ezpz_nb.examples.dcp_resume import join
got = join(*sys.argv[1:], num_samples=48); print("repeated, never seen:", got); sys.exit(got != (0, 0))' \
        "$OUT/dcp_a" "$OUT/dcp_b"
    report "torchrun nccl DCP resume at another world size (0 repeated, 0 never seen)" $?
else
    echo "SKIP  DCP resume at another world size on nccl: need 2 GPUs (one per rank)"
fi

echo "gpu_check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
