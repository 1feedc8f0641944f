#!/usr/bin/env bash
# demo_train.sh — the training half of the demo, on a finished run's chunks and target shards: train the DFM
# modules (predictor, projector, gated fusion) on the FROZEN SmolLM2-135M (a real pretrained LM, converted
# from its GGUF by `make lm`), evaluate every mode on the held-out sequences (`dfm-train eval` gives the same
# table for saved modules) and say what the target memory is made of.
#
# What the demo chose, to fit about 8 minutes of training on 2 cores (a DFM step on the 30-layer, 576-wide LM
# runs about 170 tokens/s there): fusion blocks after layers 26 and 29 only (the backward pass stops at layer
# 26), the predictor reading the frozen hidden states after layer 15 (--pred-input-layer 16), 2 epochs of the
# run's training sequences in steps of 2 x 256 tokens with the frozen layers cached after the first epoch
# (--cache-frozen; DFM_STEPS overrides), 16 held-out sequences (VAL). The paper's depths for 30 layers (8,15,22,29;
# dfm-train's default) cost a backward through 22 layers: FUSION=8,15,22,29 PRED_INPUT=0.
#
# Reading first (#37, #44; bench/results/ladder.md, rung 5): a reading stage (`--objective reconstruct`,
# READ_STEPS=100) teaches the fusion to regenerate chunks from their own stored embedding; its held-out
# reconstruction with the chunk's own slot against another chunk's slot is printed; the DFM training then starts
# from those modules (READ_INIT=1; 0 starts from fresh ones, READ_STEPS=0 skips the stage). On the manual-page
# corpus reading first widened memory's own effect on held-out text on every seed (predicted +0.053/+0.066/+0.095
# nats/token against +0.031/+0.052/+0.085 from fresh modules).
#
# Then the memory's own effect on the held-out sequences (shuffled control minus own memory) and one held-out
# passage continued by `dfm-train generate` with fusion off and with predicted memory (scripts/demo_answer.py).
#
# PROBES=FILE (facts.py's probes.jsonl, set by demo.sh when the corpus holds its facts) then also asks questions about
# the invented entities, answered with fusion off and with predicted memory.
#
#   RUN=DIR [OUT=DIR] [PROBES=FILE] [BACKBONE=DIR|tiny] [READ_STEPS=100] [READ_INIT=1] [DFM_EPOCHS=2] [DFM_STEPS=N] [VAL=16] [FUSION=26,29] [PRED_INPUT=16] [THREADS=2] scripts/demo_train.sh
# BACKBONE defaults to the cache's SmolLM2 folder ($DFM_LM); BACKBONE=tiny pretrains the old 2-layer, 64-wide
# backbone on the run's tokens first (PRE_STEPS=300), as the demo did before a real LM could be had.
# OUT defaults to RUN/train. Progress (step, loss, tok/s, ETA) is printed every tenth of a run.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
: "${RUN:?set RUN to a run directory with targets}"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
[ -n "${DFM_LM:-}" ] || eval "$(sed -n 's/^\(DFM_LM\|DFM_PYTHON\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
BACKBONE=${BACKBONE:-$DFM_LM} PRE_STEPS=${PRE_STEPS:-300} DFM_EPOCHS=${DFM_EPOCHS:-2} THREADS=${THREADS:-2} VAL=${VAL:-16}
FUSION=${FUSION:-26,29} PRED_INPUT=${PRED_INPUT:-16} READ_STEPS=${READ_STEPS:-100} READ_INIT=${READ_INIT:-1}
K=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["retrieve"]["config"].get("k", 16))' "$RUN/manifest.json")
OUT=${OUT:-$RUN/train}
read -r SEQ NSEQ < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["stages"]["chunk"]
print(c["config"]["seq-len"], c["counts"]["sequences"])' "$RUN/manifest.json")
# the reading stage holds out the chunks of the DFM stage's held-out sequences: neither stage trains on them
L=32  # tokens per chunk: the run's and both stages'
READ_HELD=$(( VAL * SEQ / L ))
T0=$(date +%s)

# The trainer's step lines, thinned to about ten, with an ETA from the elapsed time; other news kept.
# A step line: "[dfm r0/1 20.13s INFO] step   10/300 | loss 8.9184 ... | 564 tok/s | stall 0.0% | 1815 ms"
# mawk (Debian's awk) reads a pipe in blocks unless -W interactive: the lines would come in bursts
AWK=(awk); awk -W version 2>&1 | grep -q mawk && AWK=(awk -W interactive)
progress() {
  "${AWK[@]}" -v every="$(( $1 / 10 > 0 ? $1 / 10 : 1 ))" '
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
  B=4
else
  [ -f "$BACKBONE/config.json" ] || { echo "demo_train: no LM at '$BACKBONE' (make lm)" >&2; exit 1; }
  SHAPE=(--batch 2 --val-seqs "$VAL")
  B=2
fi
DFM_STEPS=${DFM_STEPS:-$(( (DFM_EPOCHS * (NSEQ - VAL) + B - 1) / B ))}
INIT=()
if [ "$READ_STEPS" -gt 0 ] && [ "$BACKBONE" != "$OUT/pre/model" ]; then
  echo "-- reading: teach the fusion to read its memory first ($READ_STEPS steps of 16 chunks, each regenerated from its own"
  echo "   embedding as the only memory after the prompt \"Text:\"; held out: the run's last $READ_HELD chunks, never trained on)"
  "$TRAIN" train --objective reconstruct --backbone "$BACKBONE" --data "$RUN" --out "$OUT/read" --chunk-len "$L" --slots "$K" \
    --batch 16 --steps "$READ_STEPS" --lr 2e-3 --warmup $(( READ_STEPS / 10 + 1 )) --fusion-layers "$FUSION" \
    --pred-input-layer "$PRED_INPUT" --val-seqs "$READ_HELD" --eval-batches 2 --threads "$THREADS" --no-ckpt --cache-frozen 2>&1 |
    progress "$READ_STEPS" | grep --line-buffered -v ' eval '
  python3 - "$OUT/read/log.jsonl" <<'PY'
import json, sys
e = [json.loads(l)["eval"] for l in open(sys.argv[1]) if '"eval"' in l][-1]
print("   memory read: held-out chunks regenerated with their own slot %.3f nats/token, with another chunk's slot %.3f,"
      " fusion off %.3f: the memory itself gives %+.3f nats/token" % (e["ce_target"], e["ce_target_shuffled"], e["ce_none"],
                                                                     e["ce_target_shuffled"] - e["ce_target"]))
print("   tokens regenerated exactly (top-1): %.1f %% with their own slot, %.1f %% with another chunk's, %.1f %% with fusion off"
      % (100 * e["acc_target"], 100 * e["acc_target_shuffled"], 100 * e["acc_none"]))
PY
  if [ "$READ_INIT" = 1 ]; then INIT=(--init-modules "$OUT/read/dfm_modules.safetensors"); fi
fi
echo "-- DFM training on the frozen $(basename "$BACKBONE") ($DFM_STEPS steps; fusion after layers $FUSION, predictor input"
echo "   after layer $(( PRED_INPUT - 1 )); then the held-out evaluation: every mode, and CE by position inside a chunk)"
"$TRAIN" train --backbone "$BACKBONE" --data "$RUN" --targets "$RUN" --out "$OUT/dfm" --seq-len "$SEQ" \
  --chunk-len "$L" "${SHAPE[@]}" --steps "$DFM_STEPS" --lr 2e-3 --warmup $(( DFM_STEPS / 10 + 1 )) --fusion-layers "$FUSION" \
  --pred-input-layer "$PRED_INPUT" --threads "$THREADS" --no-ckpt --cache-frozen ${INIT[@]+"${INIT[@]}"} 2>&1 |
  progress "$DFM_STEPS"
python3 - "$OUT/dfm/log.jsonl" <<'PY'
import json, sys
e = [json.loads(l)["eval"] for l in open(sys.argv[1]) if '"eval"' in l][-1]
if "ce_pred_shuffled" in e:
    def effect(m):  # the effect, its standard error over the batches, and on how many batches it is positive
        xs = e.get("memory_effect_%s_batches" % m) or []
        se = e.get("memory_effect_%s_se" % m)
        return "%+.4f nats/token%s" % (e["memory_effect_" + m], "" if se is None else
                                       " +- %.4f (standard error over %d batches; positive on %d of them)"
                                       % (se, len(xs), sum(x > 0 for x in xs)))
    print("   memory's own effect on the held-out sequences (the same modules fed another sequence's memory, minus its own):")
    print("     predicted memory (no retrieval) %.4f against %.4f: %s" % (e["ce_pred"], e["ce_pred_shuffled"], effect("pred")))
    if e.get("ce_target") is not None:
        print("     target memory (retrieved)       %.4f against %.4f: %s" % (e["ce_target"], e["ce_target_shuffled"],
                                                                           effect("target")))
    print("     fusion off (the frozen LM alone) %.4f" % e["ce_none"])
PY
if [ "$BACKBONE" = "$DFM_LM" ] || [ -f "$BACKBONE/tokenizer.json" ]; then
  echo "-- one held-out passage continued from memory (dfm-train generate: fusion off, then predicted memory)${PROBES:+, then questions}"
  PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH} "${DFM_PYTHON:-python3}" "$ROOT/scripts/demo_answer.py" "$RUN" \
    --train "$TRAIN" --backbone "$BACKBONE" --modules "$OUT/dfm/dfm_modules.safetensors" --tokenizer "$BACKBONE/tokenizer.json" \
    --val "$VAL" --pred-input-layer "$PRED_INPUT" --fusion-layers "$FUSION" --threads "$THREADS" ${PROBES:+--probes "$PROBES"}
fi
echo "-- what the target memory is made of"
python3 "$ROOT/bench/memory/target_composition.py" "$RUN"
echo "-- training half done in $(( $(date +%s) - T0 ))s; loss log: $OUT/dfm/log.jsonl" \
  "(python3 trainer/plot_log.py $OUT/dfm/log.jsonl curve.png)"
