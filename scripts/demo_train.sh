#!/usr/bin/env bash
# demo_train.sh — the training half of the demo, on a finished run's chunks and target shards:
# pretrain a tiny Qwen3-style backbone on the run's tokens with a compact vocabulary (the ids the corpus
# uses, numbered densely: no LM weights can be fetched here, and a 151k-row LM head over a 1 MB corpus
# would be most of the time), freeze it, train the DFM modules (predictor, projector, gated fusion)
# against the targets, evaluate every mode on the held-out sequences (`dfm-train eval` gives the same
# table for saved modules) and say what the target memory is made of.
#   RUN=DIR [OUT=DIR] [PRE_STEPS=300] [DFM_STEPS=150] [THREADS=2] scripts/demo_train.sh
# OUT defaults to RUN/train. Progress (step, loss, tok/s, ETA) is printed every tenth of a run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${RUN:?set RUN to a run directory with targets}"
TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
PRE_STEPS=${PRE_STEPS:-300} DFM_STEPS=${DFM_STEPS:-150} THREADS=${THREADS:-2}
OUT=${OUT:-$RUN/train}
SEQ=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["chunk"]["config"]["seq-len"])' "$RUN/manifest.json")
T0=$(date +%s)

# The trainer's step lines, thinned to about ten, with an ETA from the elapsed time; other news kept.
# A step line: "[dfm r0/1 20.13s INFO] step   10/300 | loss 8.9184 ... | 564 tok/s | stall 0.0% | 1815 ms"
progress() {
  awk -v every="$(( $1 / 10 > 0 ? $1 / 10 : 1 ))" '
    $5 == "step" {
      split($6, s, "/"); step = s[1] + 0; total = s[2] + 0; t = $3 + 0
      if (!t0) { t0 = t; s0 = step - 1 }
      tps = ""; loss = ""
      for (i = 7; i <= NF; i++) { if ($i == "tok/s") tps = $(i - 1); if ($i == "loss") loss = $(i + 1) }
      if (step % every == 0 || step == total) {
        eta = step > s0 ? (t - t0) / (step - s0) * (total - step) : 0
        printf "   step %5d/%d  loss %s  %6s tok/s  ETA %3ds\n", step, total, loss, tps, eta
        fflush()
      }
      next
    }
    /compact vocabulary|backbone Qwen|DFM modules|eval|saved|exported|error/ { sub(/^\[dfm [^]]*\] /, "   "); print; fflush() }'
}

echo "-- pretraining a tiny backbone (2 layers, hidden 64, compact vocabulary; $PRE_STEPS steps of 4 x $SEQ tokens)"
"$TRAIN" pretrain --data "$RUN" --out "$OUT/pre" --compact-vocab --seq-len "$SEQ" --batch 4 --steps "$PRE_STEPS" \
  --lr 3e-3 --warmup 20 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --threads "$THREADS" --no-ckpt 2>&1 |
  progress "$PRE_STEPS"
echo "-- DFM training on the frozen backbone ($DFM_STEPS steps; then the held-out evaluation: every mode, and CE"
echo "   by position inside a chunk)"
"$TRAIN" train --backbone "$OUT/pre/model" --data "$RUN" --targets "$RUN" --out "$OUT/dfm" --seq-len "$SEQ" \
  --chunk-len 32 --batch 4 --steps "$DFM_STEPS" --lr 2e-3 --warmup 10 --fusion-layers 0,1 --pred-hidden 64 \
  --threads "$THREADS" --no-ckpt 2>&1 | progress "$DFM_STEPS"
echo "-- what the target memory is made of"
python3 "$ROOT/bench/target_composition.py" "$RUN"
echo "-- training half done in $(( $(date +%s) - T0 ))s; loss log: $OUT/dfm/log.jsonl" \
  "(python3 trainer/plot_log.py $OUT/dfm/log.jsonl curve.png)"
