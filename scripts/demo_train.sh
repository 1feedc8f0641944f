#!/usr/bin/env bash
# demo_train.sh — the training end of the demo, on a finished run's chunks and target shards:
# pretrain a tiny Qwen3-style backbone on the run's tokens (no LM weights can be fetched here), freeze
# it, train the DFM modules (predictor, projector, gated fusion) with CE + MSE against the targets,
# and report held-out CE with predicted memory, with fusion off, and with the target memory.
#   RUN=DIR [PRE_STEPS=120] [DFM_STEPS=60] [THREADS=2] scripts/demo_train.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${RUN:?set RUN to a run directory with targets}"
TRAIN=$ROOT/build/dfm-train
PRE_STEPS=${PRE_STEPS:-120} DFM_STEPS=${DFM_STEPS:-60} THREADS=${THREADS:-2}
SEQ=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["chunk"]["config"]["seq-len"])' "$RUN/manifest.json")
W=$RUN/train
echo "-- pretraining a tiny backbone (2 layers, hidden 64; $PRE_STEPS steps of 4 x $SEQ tokens)"
"$TRAIN" pretrain --data "$RUN" --out "$W/pre" --seq-len "$SEQ" --batch 4 --steps "$PRE_STEPS" --lr 3e-3 \
  --warmup 10 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --threads "$THREADS" 2>&1 | grep -E "eval|saved|error"
echo "-- DFM training on the frozen backbone ($DFM_STEPS steps)"
"$TRAIN" train --backbone "$W/pre/model" --data "$RUN" --targets "$RUN" --out "$W/dfm" --seq-len "$SEQ" \
  --chunk-len 32 --batch 4 --steps "$DFM_STEPS" --lr 2e-3 --warmup 5 --fusion-layers 0,1 --pred-hidden 64 \
  --eval-every "$DFM_STEPS" --threads "$THREADS" 2>&1 | grep -E "DFM modules|eval|exported|error"
echo "-- loss log: $W/dfm/log.jsonl (python3 trainer/plot_log.py $W/dfm/log.jsonl curve.png)"
