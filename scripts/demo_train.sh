#!/usr/bin/env bash
# demo_train.sh — the training half of the demo, on a finished run's chunks and target shards: train the DFM
# modules (predictor, projector, gated fusion) on the FROZEN SmolLM2-135M (a real pretrained LM, converted
# from its GGUF by `make lm`), evaluate every mode on the held-out sequences (`dfm-train eval` gives the same
# table for saved modules) and say what the target memory is made of.
#
# What the demo chose, to fit about 4 minutes of training on 2 cores (a DFM step on the 30-layer, 576-wide LM
# runs about 170 tokens/s there): fusion blocks after layers 26 and 29 only (the backward pass stops at layer
# 26), the predictor reading the frozen hidden states after layer 15 (--pred-input-layer 16), 60 steps of
# 2 x 256 tokens (30k tokens, a tenth of the corpus), 8 held-out sequences. The paper's depths for 30 layers
# (8,15,22,29; dfm-train's default) cost a backward through 22 layers: FUSION=8,15,22,29 PRED_INPUT=0.
#
# Before it, a short reading stage (`--objective reconstruct`, READ_STEPS=60; 0 skips it): the fusion learns to
# regenerate chunks from their own stored embedding, and the held-out reconstruction with the chunk's own slot
# against another chunk's slot is the demo's memory effect with its control (trainer/README.md, "Reading
# pretraining"; bench/results/reading.md). READ_INIT=1 starts the DFM training from those modules.
#
#   RUN=DIR [OUT=DIR] [BACKBONE=DIR|tiny] [READ_STEPS=60] [READ_INIT=0] [DFM_STEPS=60] [FUSION=26,29] [PRED_INPUT=16] [THREADS=2] scripts/demo_train.sh
# BACKBONE defaults to the cache's SmolLM2 folder ($DFM_LM); BACKBONE=tiny pretrains the old 2-layer, 64-wide
# backbone on the run's tokens first (PRE_STEPS=300), as the demo did before a real LM could be had.
# OUT defaults to RUN/train. Progress (step, loss, tok/s, ETA) is printed every tenth of a run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${RUN:?set RUN to a run directory with targets}"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
[ -n "${DFM_LM:-}" ] || eval "$(sed -n 's/^\(DFM_LM\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
BACKBONE=${BACKBONE:-$DFM_LM} PRE_STEPS=${PRE_STEPS:-300} DFM_STEPS=${DFM_STEPS:-60} THREADS=${THREADS:-2}
FUSION=${FUSION:-26,29} PRED_INPUT=${PRED_INPUT:-16} READ_STEPS=${READ_STEPS:-60} READ_HELD=${READ_HELD:-64} READ_INIT=${READ_INIT:-0}
K=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["retrieve"]["config"].get("k", 16))' "$RUN/manifest.json")
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
      tps = ""; loss = ""; ce = ""
      for (i = 7; i <= NF; i++) { if ($i == "tok/s") tps = $(i - 1); if ($i == "loss") loss = $(i + 1); if ($i == "(ce") ce = $(i + 1) }
      if (step % every == 0 || step == total) {
        eta = step > s0 ? (t - t0) / (step - s0) * (total - step) : 0
        printf "   step %5d/%d  loss %s%s  %6s tok/s  ETA %3ds\n", step, total, loss, ce != "" ? " (ce " ce ")" : "", tps, eta
        fflush()
      }
      next
    }
    /compact vocabulary|backbone |DFM modules|eval|saved|exported|error/ { sub(/^\[dfm [^]]*\] /, "   "); print; fflush() }'
}

if [ "$BACKBONE" = tiny ]; then
  echo "-- pretraining a tiny backbone (2 layers, hidden 64, compact vocabulary; $PRE_STEPS steps of 4 x $SEQ tokens)"
  "$TRAIN" pretrain --data "$RUN" --out "$OUT/pre" --compact-vocab --seq-len "$SEQ" --batch 4 --steps "$PRE_STEPS" \
    --lr 3e-3 --warmup 20 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --threads "$THREADS" --no-ckpt 2>&1 |
    progress "$PRE_STEPS"
  BACKBONE=$OUT/pre/model FUSION=0,1 PRED_INPUT=0
  SHAPE=(--batch 4 --pred-hidden 64 --val-seqs 0)
else
  [ -f "$BACKBONE/config.json" ] || { echo "demo_train: no LM at '$BACKBONE' (make lm)" >&2; exit 1; }
  SHAPE=(--batch 2 --val-seqs 8)
fi
INIT=()
if [ "$READ_STEPS" -gt 0 ] && [ "$BACKBONE" != "$OUT/pre/model" ]; then
  echo "-- reading: teach the fusion to read its memory first ($READ_STEPS steps of 16 chunks, each regenerated from its own"
  echo "   embedding as the only memory after the prompt \"Text:\"; held out: the run's last $READ_HELD chunks, never trained on)"
  "$TRAIN" train --objective reconstruct --backbone "$BACKBONE" --data "$RUN" --out "$OUT/read" --chunk-len 32 --slots "$K" \
    --batch 16 --steps "$READ_STEPS" --lr 2e-3 --warmup $(( READ_STEPS / 10 + 1 )) --fusion-layers "$FUSION" \
    --pred-input-layer "$PRED_INPUT" --val-seqs "$READ_HELD" --eval-batches 2 --threads "$THREADS" --no-ckpt --cache-frozen 2>&1 |
    progress "$READ_STEPS" | grep -v ' eval '
  python3 - "$OUT/read/log.jsonl" <<'PY'
import json, sys
e = [json.loads(l)["eval"] for l in open(sys.argv[1]) if '"eval"' in l][-1]
print("   memory read: held-out chunks regenerated with their own slot %.3f nats/token, with another chunk's slot %.3f,"
      " fusion off %.3f: the memory itself gives %+.3f nats/token" % (e["ce_target"], e["ce_target_shuffled"], e["ce_none"],
                                                                     e["ce_target_shuffled"] - e["ce_target"]))
print("   tokens regenerated exactly (top-1): %.1f %% with their own slot, %.1f %% with another chunk's, %.1f %% with fusion off"
      % (100 * e["acc_target"], 100 * e["acc_target_shuffled"], 100 * e["acc_none"]))
PY
  # READ_INIT=1: the DFM training starts from the reading modules. Off by default: on this corpus it left the
  # DFM memory effect where it was and the held-out CE 0.01 higher (bench/results/report-demo.md); on the
  # knowledge probes it helped (bench/results/reading.md)
  if [ "$READ_INIT" = 1 ]; then INIT=(--init-modules "$OUT/read/dfm_modules.safetensors"); fi
fi
echo "-- DFM training on the frozen $(basename "$BACKBONE") ($DFM_STEPS steps; fusion after layers $FUSION, predictor input"
echo "   after layer $(( PRED_INPUT - 1 )); then the held-out evaluation: every mode, and CE by position inside a chunk)"
"$TRAIN" train --backbone "$BACKBONE" --data "$RUN" --targets "$RUN" --out "$OUT/dfm" --seq-len "$SEQ" \
  --chunk-len 32 "${SHAPE[@]}" --steps "$DFM_STEPS" --lr 2e-3 --warmup $(( DFM_STEPS / 10 + 1 )) --fusion-layers "$FUSION" \
  --pred-input-layer "$PRED_INPUT" --threads "$THREADS" --no-ckpt "${INIT[@]}" 2>&1 | progress "$DFM_STEPS"
echo "-- what the target memory is made of"
python3 "$ROOT/bench/memory/target_composition.py" "$RUN"
echo "-- training half done in $(( $(date +%s) - T0 ))s; loss log: $OUT/dfm/log.jsonl" \
  "(python3 trainer/plot_log.py $OUT/dfm/log.jsonl curve.png)"
