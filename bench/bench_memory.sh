#!/usr/bin/env bash
# bench/bench_memory.sh — the benchmark where memory must matter (trainer/synth.h): does the memory DFM
# trains make the language model better, and by how much of what is possible?
#
#   bash bench/bench_memory.sh [WORK_DIR]     # writes bench/results/memory.md and memory.json
#
# Two corpora with the same key sets (same seed), 2-layer x 64 backbones pretrained on each, DFM modules
# trained with the trainer's default flags:
#   keyed         keys follow a chain: predicted memory can know chunk c's key from chunk c-1;
#   keyed-random  independent keys: only the target memory (retrieval at inference) can help; the
#                 modules are trained on the target memory (--fusion-memory target) when the trainer has
#                 that flag, so this row tests the fusion path alone.
# A third row trains the keyed modules with the best setting measured so far (a larger initial scale of
# the modules). Every evaluation mode the trainer reports is in the table, per-position CE inside a chunk when the
# trainer logs it, and the corpus's ideal cross-entropies (bench/keyed_ideal.py: key known, Bayes from
# context, Bayes from the chunk's own tokens). Sizes: see bench/keyed_lib.sh (THREADS, SEQS, PRE_STEPS,
# DFM_STEPS ...). About 6 minutes on 2 idle cores.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/keyed_lib.sh"
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-bench-memory-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
RES=${RESULTS:-$HERE/results}
mkdir -p "$RES"
T0=$(date +%s)
has_flag() { "$DFM_TRAIN" train --help | grep -q -- "--$1 "; }
RANDOM_FLAGS=()
has_flag fusion-memory && RANDOM_FLAGS=(--fusion-memory target)

: >"$W/runs.jsonl"
for mode in keyed keyed-random; do
  echo "-- $mode: corpus, backbone ($PRE_STEPS steps)"
  keyed_data "$W/$mode" "$mode"
  keyed_pretrain "$W/$mode" "$W/$mode-pre"
  flags=()
  [ "$mode" = keyed-random ] && flags=("${RANDOM_FLAGS[@]}")
  echo "-- $mode: DFM modules ($DFM_STEPS steps${flags[*]:+, ${flags[*]}})"
  ev=$(keyed_dfm "$W/$mode" "$W/$mode-pre/model" "$W/$mode-dfm" "${flags[@]}")
  ideal=$(keyed_ideal "$W/$mode")
  echo "{\"corpus\": \"$mode\", \"flags\": \"${flags[*]:-defaults}\", \"eval\": $ev, \"ideal\": $ideal}" >>"$W/runs.jsonl"
  echo "   $ev"
done
# the best setting measured so far, for comparison with the defaults (see bench/ablations.sh)
BEST=(--init-std 0.05)
echo "-- keyed: DFM modules with ${BEST[*]}"
ev=$(keyed_dfm "$W/keyed" "$W/keyed-pre/model" "$W/keyed-best" "${BEST[@]}")
echo "{\"corpus\": \"keyed\", \"flags\": \"${BEST[*]}\", \"eval\": $ev, \"ideal\": $(keyed_ideal "$W/keyed")}" >>"$W/runs.jsonl"
echo "   $ev"
python3 "$HERE/keyed_report.py" memory "$W/runs.jsonl" "$RES/memory.md" \
  --command "THREADS=$THREADS SEQS=$SEQS PRE_STEPS=$PRE_STEPS DFM_STEPS=$DFM_STEPS bash bench/bench_memory.sh" \
  --seconds $(( $(date +%s) - T0 ))
cp "$W/runs.jsonl" "$RES/memory.jsonl"
cat "$RES/memory.md"
