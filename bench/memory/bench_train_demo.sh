#!/usr/bin/env bash
# bench/memory/bench_train_demo.sh — a small end-to-end DFM training run on synthetic data (minutes on 2 CPU
# cores): pretrain a tiny Qwen3-style backbone, freeze it, train the DFM modules on informative target
# memory, and print held-out CE with predicted memory, with fusion off and with the target memory.
#
#   bash bench/memory/bench_train_demo.sh [OUT_DIR]      # default: a temporary folder, removed at the end
#   DATA=RUN TARGETS=RUN bash bench/memory/bench_train_demo.sh   # a `dfm chunk` run and its targets instead
#
# Synthetic data (dfm-train synth --mode keyed, trainer/data/synth.h): each 16-token chunk has a hidden key that
# decides its tokens and usually follows a chain; a chunk's target memory encodes its key, so a predictor
# can learn it from the previous chunk. The full measurement, with ideals and a random-key control, is
# bench/memory/bench_memory.sh. Knobs: PRE_STEPS, DFM_STEPS, THREADS.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DFM_TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
THREADS=${THREADS:-2} PRE_STEPS=${PRE_STEPS:-300} DFM_STEPS=${DFM_STEPS:-300}
T=${T:-128} L=${L:-16}
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-demo-train-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
if [ -z "${DATA:-}" ]; then
  "$DFM_TRAIN" synth --out "$W/data" --mode keyed --seq-len "$T" --chunk-len "$L" --seqs 2000
  DATA=$W/data/tokens.bin TARGETS=$W/data/targets.bin
fi
"$DFM_TRAIN" pretrain --data "$DATA" --out "$W/pre" --seq-len "$T" --batch 8 --steps "$PRE_STEPS" --lr 3e-3 \
  --warmup 20 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --val-seqs 48 --threads "$THREADS" 2>&1 |
  grep -E "backbone|eval|saved|error"
"$DFM_TRAIN" train --backbone "$W/pre/model" --data "$DATA" --targets "$TARGETS" --out "$W/dfm" --seq-len "$T" \
  --chunk-len "$L" --batch 8 --steps "$DFM_STEPS" --lr 2e-3 --warmup 20 --fusion-layers 0,1 --pred-hidden 64 \
  --val-seqs 48 --eval-every $((DFM_STEPS / 3)) --threads "$THREADS" 2>&1 | grep -E "DFM modules|eval|exported|error"
echo "loss curve: $W/dfm/log.jsonl (python3 trainer/plot_log.py $W/dfm/log.jsonl out.png)"
