#!/usr/bin/env bash
# One short run (well under 5 minutes) of the GPU paths, for a machine with CUDA GPUs:
#   1. the GPU tests (pytest; they skip on machines without CUDA),
#   2. tp_broadcast under torchrun on nccl, one GPU per rank, ledger checked,
#   3. uneven steps under torchrun on nccl must fail, not hang (needs 2+ GPUs),
#   4. pin_memory / non_blocking host-to-device copies, measured (benchmarks/pin_memory.py).
# Prints PASS/FAIL per check and a summary; exits 1 if any check failed.
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

NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)') || NGPU=0
"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")'
echo "GPUs visible: $NGPU"
if [ "$NGPU" -lt 1 ]; then
    echo "FAIL  no CUDA GPU visible to torch: run this on a GPU node with a CUDA build of torch"
    exit 1
fi
NPROC=$(( NGPU < 4 ? NGPU : 4 ))
TP=$(( NPROC % 2 == 0 ? 2 : 1 ))

echo "== 1. GPU tests"
timeout 180 "$PY" -m pytest -q -rs -p no:cacheprovider tests -k "nccl or cuda or gpu"
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

echo "== 4. pin_memory and non_blocking: host-to-device copies while kernels run"
timeout 120 "$PY" benchmarks/pin_memory.py
report "pin_memory / non_blocking copies measured" $?

echo "gpu_check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
