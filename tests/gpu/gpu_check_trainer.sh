#!/usr/bin/env bash
# tests/gpu/gpu_check_trainer.sh — the CUDA trainer on a real GPU, against the CPU reference.
# The one command for a GPU machine (prepared without a GPU; see trainer/README.md, "CUDA path"):
#
#   OUT=/some/dir bash tests/gpu/gpu_check_trainer.sh          # build, parity, end to end, benchmark
#   NO_BENCH=1 ...                                           # skip the benchmark (bench/trainer/bench_train_gpu.sh)
#   BUILD_ONLY=1 ...                                         # build the CUDA tree and the checkers only
#   SKIP_MAKE=1 ...                                          # checkers only (make cuda-checks, not all;
#                                                            # what tests/py/cuda/test_train_cuda_check.py runs)
#   BUILD_DIR=DIR ...                                        # the build folder (default build-cuda)
# On a machine without the project's libraries, first `source tests/gpu/gpu_env.sh` (tests/gpu/gpu_carry.sh
# prepares what it unpacks).
#
# 1. make CUDA=1 BUILD=build-cuda all, then make CUDA=1 BUILD=build-cuda cuda-checks (if `all` fails the
#    checkers are still built and run: they need only nvcc, cuBLAS, OpenBLAS and OpenMP);
# 2. three checkers (tests/cuda/), each against the CPU code (rel = max|gpu-cpu| / max|cpu| per tensor):
#    - ops_cuda_check:       every kernel of ops_cuda.h vs ops.c (fp32 1e-5, bf16 2e-2), determinism;
#    - attention_cuda_check: flash attention vs attention_forward/backward (fp32 1e-5), determinism;
#    - model_cuda_check:     whole training steps (loss terms, every gradient tensor, eval modes, AdamW,
#      bit-identical repeats) for 9 model variants, fp32 (1e-4) and bf16 frozen backbone (5e-2, cos 0.999);
# 3. end to end (needs step 1): dfm-train on synthetic data, CPU vs GPU fp32 (losses of 5 pretraining
#    steps within 1e-4, with each attention), two GPU runs bit-identical (checkpoints), DFM training in bf16
#    (attention auto), the stall fraction and the memory report;
# 4. bench/trainer/bench_train_gpu.sh (124M and ~1B backbones, pretraining and DFM, dfm vs PyTorch).
# Writes $OUT/gpu_check_trainer_YYYY-MM-DD.txt (everything) plus the benchmark's files. Exit 0 all
# passed, 1 a bound failed, 2 build or CUDA error (or no GPU).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD_DIR=${BUILD_DIR:-build-cuda}
OUT=${OUT:-$ROOT/$BUILD_DIR/gpu-check}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"
LOG=$OUT/gpu_check_trainer_$(date -u +%F).txt
: > "$LOG"
BLOG=$OUT/build.log
: > "$BLOG"
say() { echo "$*" | tee -a "$LOG"; }
status=0
worse() { [ "$1" -gt "$status" ] && status=$1; [ "$1" = 2 ] && status=2; return 0; }

say "== dfm trainer GPU check $(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvcc >/dev/null || { say "FAIL: nvcc not on PATH (install the CUDA toolkit or add it to PATH)"; exit 2; }
say "nvcc: $(nvcc --version | tail -1)"
{ command -v nvidia-smi >/dev/null && nvidia-smi -L; } 2>&1 | tee -a "$LOG" || say "nvidia-smi: none here"

# the CPU objects the checkers link with need no MPI: without mpicc, plain cc compiles them
MK=(make -j"$JOBS" --no-print-directory CUDA=1 BUILD="$BUILD_DIR")
command -v mpicc >/dev/null || MK+=(CC=cc)
made=0
if [ "${SKIP_MAKE:-0}" != 1 ]; then
  say "-- build: make CUDA=1 BUILD=$BUILD_DIR all"
  if "${MK[@]}" all >> "$BLOG" 2>&1; then made=1
  else say "FAIL: make CUDA=1 (see build.log); building the checkers alone"; tail -15 "$BLOG" | tee -a "$LOG"; worse 2; fi
fi
say "-- build the checkers: make CUDA=1 BUILD=$BUILD_DIR cuda-checks"
"${MK[@]}" cuda-checks >> "$BLOG" 2>&1 ||
  { say "FAIL: building the checkers (see build.log)"; tail -30 "$BLOG" | tee -a "$LOG"; worse 2; }
BIN=$BUILD_DIR/checks
[ "${BUILD_ONLY:-0}" = 1 ] && { say "built the checkers in $BIN (BUILD_ONLY=1: not run)"; exit $status; }

run_checker() {
  [ -x "$BIN/$1" ] || return 0
  say "-- $1 (CPU side: OpenBLAS on 1 thread)"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout "${CHECK_TIMEOUT:-300}" "$BIN/$1" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  say "$1: exit $rc"
  worse "$rc"
}
run_checker ops_cuda_check
run_checker attention_cuda_check
run_checker model_cuda_check

if [ $made = 1 ] && nvidia-smi -L >/dev/null 2>&1; then
  say "-- end to end: dfm-train on synthetic data, CPU vs GPU"
  W=$(mktemp -d /tmp/dfm-gpu-e2e-XXXXXX)
  CPU_TRAIN=$BUILD_DIR/dfm-train
  $CPU_TRAIN synth --out "$W/s" --vocab 512 --seqs 200 --seq-len 128 --chunk-len 16 >> "$BLOG" 2>&1
  common=(--data "$W/s/tokens.bin" --layers 2 --hidden 128 --heads 4 --kv-heads 2 --seq-len 128 --batch 4 --steps 5
          --warmup 1 --eval-batches 1 --val-seqs 8 --seed 3 --threads 4)
  $CPU_TRAIN pretrain "${common[@]}" --out "$W/cpu" >> "$BLOG" 2>&1
  $CPU_TRAIN pretrain "${common[@]}" --out "$W/g1" --device cuda --precision fp32 --attention reference >> "$BLOG" 2>&1
  $CPU_TRAIN pretrain "${common[@]}" --out "$W/g2" --device cuda --precision fp32 --attention reference >> "$BLOG" 2>&1
  $CPU_TRAIN pretrain "${common[@]}" --out "$W/g3" --device cuda --precision fp32 --attention flash >> "$BLOG" 2>&1
  python3 - "$W" <<'EOF' 2>&1 | tee -a "$LOG"
import json, math, sys
w = sys.argv[1]
def losses(d):
    return [json.loads(l)["loss"] for l in open(f"{w}/{d}/log.jsonl") if '"loss"' in l]
try:
    c, g1, g3 = losses("cpu"), losses("g1"), losses("g3")
except OSError as e:
    print(f"FAIL end-to-end: a run did not finish ({e}); see build.log"); sys.exit(2)
def worst_rel(x, y):  # inf for a non-finite loss or a missing step (a plain max() drops NaN)
    if len(x) != len(y) or not x:
        return math.inf
    return max(abs(a - b) / abs(a) if math.isfinite(a) and math.isfinite(b) and a else math.inf for a, b in zip(x, y))
worst, worst3 = worst_rel(c, g1), worst_rel(c, g3)
print(f"{'PASS' if worst <= 1e-4 else 'FAIL'} pretraining, 5 steps: CPU {c[-1]:.6f} vs GPU fp32 {g1[-1]:.6f}, worst rel {worst:.2e} (bound 1e-4)")
print(f"{'PASS' if worst3 <= 1e-4 else 'FAIL'} pretraining with flash attention: worst rel {worst3:.2e} (bound 1e-4)")
same = open(f"{w}/g1/ckpt_final.bin", "rb").read() == open(f"{w}/g2/ckpt_final.bin", "rb").read()
print(f"{'PASS' if same else 'FAIL'} two GPU runs give {'bit-identical' if same else 'DIFFERENT'} checkpoints")
sys.exit(0 if worst <= 1e-4 and worst3 <= 1e-4 and same else 1)
EOF
  worse "${PIPESTATUS[0]}"
  $CPU_TRAIN train --backbone "$W/cpu/model" --data "$W/s/tokens.bin" --targets "$W/s/targets.bin" --out "$W/dfm" \
    --chunk-len 16 --fusion-layers 0,1 --seq-len 128 --batch 8 --steps 20 --warmup 2 --eval-batches 2 --val-seqs 16 \
    --device cuda --precision bf16 2>&1 | tee "$W/dfm.log" >> "$BLOG"
  if grep -q "eval step 20" "$W/dfm.log"; then
    say "PASS DFM training on the GPU (bf16): $(grep -m1 'engine:' "$W/dfm.log" | sed 's/.*engine: //')"
    say "     $(grep 'step    20/' "$W/dfm.log" | sed 's/.*INFO\] //')"
    say "     $(grep 'eval step 20' "$W/dfm.log" | sed 's/.*INFO\] //')"
  else say "FAIL DFM training on the GPU (see build.log)"; tail -5 "$W/dfm.log" | tee -a "$LOG"; worse 1; fi
  rm -rf "$W"
fi

if [ $made = 1 ] && [ "${NO_BENCH:-0}" != 1 ] && nvidia-smi -L >/dev/null 2>&1 && [ -f bench/trainer/bench_train_gpu.sh ]; then
  say "-- benchmark: bench/trainer/bench_train_gpu.sh"
  DFM_TRAIN=$BUILD_DIR/dfm-train OUT=$OUT timeout "${BENCH_TIMEOUT:-420}" bash bench/trainer/bench_train_gpu.sh 2>&1 | tee -a "$LOG"
  say "benchmark: exit ${PIPESTATUS[0]}"
fi
say "exit status $status; results in $LOG"
exit "$status"
