#!/usr/bin/env bash
# bench/memory/ablations.sh — the paper's ablation directions, small, on the keyed memory benchmark
# (bench/memory/bench_memory.sh): each row trains DFM modules with the defaults except one setting.
#
#   bash bench/memory/ablations.sh [WORK_DIR]     # writes bench/results/ablations.md and ablations.svg
#
#   chunk length   16 (default) / 32 / 64: a corpus and a backbone per length (the keys change per chunk)
#   slots K        4 (default) / 8 / 16: same tokens, targets with K slots (trainer/data/synth.h), one backbone
#   fusion layers  after layer 0 (early) / 1 (late) / both (default) of the 2-layer backbone
#   gate bias      0 (default, the paper's best) / -2
#   alignment      --memory-align next (default) / same (the old one), when the trainer has the flag
#   fusion memory  --fusion-memory predicted / target / mixed:0.5 (the default is the first row)
#   init and lr    (not in the paper) --init-std 0.05, and --lr 1e-2
#   keys           (not in the paper) 64 / 128 (default) / 256 keys in the chain: how much knowledge the
#                  corpus holds beyond what its own backbone absorbs (a corpus and a backbone per count)
# The benchmark's sizes (bench/memory/keyed_lib.sh: SEQS=3000 PRE_STEPS=600 DFM_STEPS=1500 unless set); about 10
# minutes on 2 idle cores. Δ is against fusion off of the same backbone.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/keyed_lib.sh"
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-ablations-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
RES=${RESULTS:-$HERE/../results}
mkdir -p "$RES"
T0=$(date +%s)
has_flag() { "$DFM_TRAIN" train --help | grep -q -- "--$1 "; }
: >"$W/runs.jsonl"

# one DFM run: ABLATION SETTING DATA BACKBONE OUT [flags...]
row() {
  local ab=$1 set=$2 data=$3 bb=$4 out=$5; shift 5
  local ev
  ev=$(keyed_dfm "$data" "$bb" "$out" "$@") || { echo "   $ab / $set: failed" >&2; return 0; }
  echo "{\"ablation\": \"$ab\", \"setting\": \"$set\", \"flags\": \"$*\", \"eval\": $ev}" >>"$W/runs.jsonl"
  echo "   $ab / $set: $ev"
}

echo "-- corpus and backbone, chunk length 16 ($PRE_STEPS pretraining steps)"
keyed_data "$W/L16" keyed
keyed_pretrain "$W/L16" "$W/L16-pre"
BB=$W/L16-pre/model
row "chunk length" "L=16 (default)" "$W/L16" "$BB" "$W/base"
for l in 32 64; do
  t=$(( l * 4 > T ? l * 4 : T )) # at least 4 chunks per sequence (chunk 0 has no memory)
  echo "-- chunk length $l: corpus and backbone (sequences of $t)"
  L=$l T=$t keyed_data "$W/L$l" keyed
  T=$t keyed_pretrain "$W/L$l" "$W/L$l-pre"
  L=$l T=$t row "chunk length" "L=$l (T=$t)" "$W/L$l" "$W/L$l-pre/model" "$W/L$l-dfm"
done
for k in 8 16; do
  keyed_data "$W/K$k" keyed --slots "$k"
  row "slots K" "K=$k" "$W/K$k" "$BB" "$W/K$k-dfm"
done
row "fusion layers" "after layer 0 (early)" "$W/L16" "$BB" "$W/f0" --fusion-layers 0
row "fusion layers" "after layer 1 (late)" "$W/L16" "$BB" "$W/f1" --fusion-layers 1
row "gate bias" "-2" "$W/L16" "$BB" "$W/g2" --gate-bias -2
if has_flag memory-align; then
  row "alignment" "same (old: chunk of the input token)" "$W/L16" "$BB" "$W/align-same" --memory-align same
fi
if has_flag fusion-memory; then
  FM_DEFAULT=$("$DFM_TRAIN" train --help | sed -n 's/.*--fusion-memory .*(default: \([^;)]*\).*/\1/p')
  for fm in predicted target mixed:0.5; do
    [ "$fm" = "$FM_DEFAULT" ] && continue # the default row
    row "fusion memory" "$fm" "$W/L16" "$BB" "$W/fm-${fm/:/}" --fusion-memory "$fm"
  done
fi
# not in the paper: the DFM modules' initial scale (the fusion's output is a product of four matrices drawn
# with --init-std) and a larger learning rate
row "init and lr" "--init-std 0.05" "$W/L16" "$BB" "$W/init05" --init-std 0.05
row "init and lr" "--lr 1e-2" "$W/L16" "$BB" "$W/lr1e2" --lr 1e-2
for n in 64 256; do
  echo "-- $n keys: corpus and backbone"
  keyed_data "$W/keys$n" keyed --keys "$n"
  keyed_pretrain "$W/keys$n" "$W/keys$n-pre"
  row "keys" "$n keys" "$W/keys$n" "$W/keys$n-pre/model" "$W/keys$n-dfm"
done
python3 "$HERE/keyed_report.py" ablations "$W/runs.jsonl" "$RES/ablations.md" "$RES/ablations.svg" \
  --command "THREADS=$THREADS SEQS=$SEQS PRE_STEPS=$PRE_STEPS DFM_STEPS=$DFM_STEPS bash bench/memory/ablations.sh" \
  --seconds $(( $(date +%s) - T0 ))
cp "$W/runs.jsonl" "$RES/ablations.jsonl"
cat "$RES/ablations.md"
