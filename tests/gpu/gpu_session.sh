#!/usr/bin/env bash
# tests/gpu/gpu_session.sh — what a session with a GPU machine runs, as one command within its limits.
#
#   OUT=DIR bash tests/gpu/gpu_session.sh [STAGE ...]      stages in order (default: trainer bench encoder)
#     trainer   make CUDA=1, tests/gpu/gpu_check_trainer.sh without the benchmark: kernel, flash-attention
#               and whole-model parity checkers, end to end CPU vs GPU, determinism
#     bench     bench/trainer/bench_train_gpu.sh: 124M and ~1B backbones, pretraining and DFM, dfm vs PyTorch
#     encoder   tests/gpu/gpu_check_encoder.sh: the encoder's CUDA path vs its CPU path, and its speed
#
# For the `device` tool (its README): first, here, `bash tests/gpu/gpu_carry.sh` (libraries, ~23 MiB) and,
# for the encoder stage, `bash tests/gpu/encoder_carry.sh`; then run with carry [".gpu-carry"]:
#   bash tests/gpu/gpu_session.sh trainer bench
# The whole command stays under DEADLINE_S seconds (default 560, under the tool's 600 s): a stage that
# would not fit in what is left is skipped and said so. Everything lands in $OUT as at most 8 files:
# the stages' result files plus session.log and logs.tgz (build logs, per-run logs).
# Exit status: the worst of the stages' (0 pass, 1 a bound failed, 2 build/CUDA error or skipped).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT to the folder that comes back}
DEADLINE_S=${DEADLINE_S:-560}
T0=$(date +%s)
WORK=$(mktemp -d /tmp/dfm-gpu-session-XXXXXX)
mkdir -p "$OUT"
SLOG=$OUT/session.log
: > "$SLOG"
say() { echo "[gpu_session $(( $(date +%s) - T0 ))s] $*" | tee -a "$SLOG"; }
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
status=0
worse() { [ "$1" -gt "$status" ] && status=$1; return 0; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$WORK" . 2>/dev/null
  say "done: exit $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap finish EXIT

[ $# -gt 0 ] || set -- trainer bench encoder
say "stages: $*; deadline ${DEADLINE_S}s; $(date -u +%FT%TZ); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1 && say "$(nvidia-smi -L | head -1)" || say "nvidia-smi failed: no GPU?"
if [ -f tests/gpu/gpu_env.sh ]; then
  # shellcheck disable=SC1091
  source tests/gpu/gpu_env.sh >> "$SLOG" 2>&1 || say "gpu_env.sh reported missing pieces (see above); going on"
fi
export JOBS=${JOBS:-$(nproc)}

built=0
build() {
  [ $built = 1 ] && return 0
  say "build: make CUDA=1 BUILD=build-cuda all (-j$JOBS)"
  if make -j"$JOBS" CUDA=1 BUILD=build-cuda all > "$WORK/build.log" 2>&1; then built=1; say "build ok"
  else say "build FAILED: $(grep -m3 -E 'error|Error' "$WORK/build.log" | tr '\n' ' ')"; worse 2; fi
}

for stage in "$@"; do
  case $stage in
    trainer)
      need=200
      [ "$(left)" -ge $need ] || { say "skip trainer: $(left)s left, needs ~${need}s"; worse 2; continue; }
      build
      say "trainer checks (tests/gpu/gpu_check_trainer.sh, NO_BENCH=1)"
      OUT=$WORK/trainer SKIP_MAKE=$((built == 1 ? 0 : 1)) NO_BENCH=1 CHECK_TIMEOUT=$(( $(left) - 60 )) \
        timeout $(( $(left) - 20 )) bash tests/gpu/gpu_check_trainer.sh > "$WORK/trainer.out" 2>&1
      rc=$?; worse $rc
      cp "$WORK"/trainer/gpu_check_trainer_*.txt "$OUT/" 2>/dev/null
      say "trainer: exit $rc; $(grep -c '^PASS' "$WORK/trainer.out") PASS lines, $(grep -c '^FAIL' "$WORK/trainer.out") FAIL lines"
      grep -E '^(FAIL|RESULT)' "$WORK/trainer.out" | head -20 | tee -a "$SLOG" ;;
    bench)
      need=150
      [ "$(left)" -ge $need ] || { say "skip bench: $(left)s left, needs ~${need}s"; worse 2; continue; }
      build
      [ $built = 1 ] || { say "skip bench: no CUDA build"; continue; }
      say "bench (bench/trainer/bench_train_gpu.sh, budget $(( $(left) - 30 ))s)"
      DFM_TRAIN=build-cuda/dfm-train OUT=$WORK/bench BUDGET_S=$(( $(left) - 30 )) \
        timeout $(( $(left) - 10 )) bash bench/trainer/bench_train_gpu.sh > "$WORK/bench.out" 2>&1
      rc=$?; worse $rc
      cp "$WORK"/bench/bench_train_gpu.md "$WORK"/bench/bench_train_gpu.json "$OUT/" 2>/dev/null
      say "bench: exit $rc"
      tail -20 "$WORK/bench.out" | tee -a "$SLOG" ;;
    encoder)
      need=150
      [ "$(left)" -ge $need ] || { say "skip encoder: $(left)s left, needs ~${need}s"; worse 2; continue; }
      say "encoder check (tests/gpu/gpu_check_encoder.sh)"
      OUT=$WORK/encoder timeout $(( $(left) - 10 )) bash tests/gpu/gpu_check_encoder.sh > "$WORK/encoder.out" 2>&1
      rc=$?; worse $rc
      cp "$WORK"/encoder/gpu_check_encoder.txt "$WORK"/encoder/gpu_check_encoder.json "$OUT/" 2>/dev/null
      say "encoder: exit $rc"
      tail -8 "$WORK/encoder.out" | tee -a "$SLOG" ;;
    *) say "unknown stage $stage (trainer, bench, encoder)"; worse 2 ;;
  esac
done
exit $status
