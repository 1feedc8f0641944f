#!/usr/bin/env bash
# bench/bench_memory.sh — the benchmark where memory must matter (trainer/synth.h): does the memory DFM
# trains make the language model better, and by how much of what is possible?
#
#   bash bench/bench_memory.sh [WORK_DIR]     # writes bench/results/memory.md and memory.json
#
# Two corpora with the same key sets (same seed), a 2-layer x 64 backbone pretrained on each, DFM modules
# trained with the trainer's default flags:
#   keyed         keys follow a chain: predicted memory can know chunk c's key from chunk c-1;
#   keyed-random  independent keys: only the target memory (retrieval at inference) can help.
# Four rows:
#   1. keyed corpus, backbone pretrained on it: the backbone itself has learnt part of the chain from its
#      context, so memory can only add what it missed (the hard case);
#   2. keyed corpus, backbone pretrained on the keyed-random text: it knows the language (the key sets) but
#      not the corpus's knowledge (the chain), which the memory must supply: DFM's use case (a frozen LM,
#      a datastore holding what it does not know);
#   3. keyed-random, its own backbone, defaults: no mode may be worse than fusion off;
#   4. keyed-random, modules trained on the target memory only (--fusion-memory target): the fusion path
#      alone.
# Every evaluation mode the trainer reports is in the table, per-position CE inside a chunk, and the corpus's
# ideal cross-entropies (bench/keyed_ideal.py: key known, Bayes from context, Bayes from the chunk's own
# tokens). Sizes: see bench/keyed_lib.sh (THREADS, SEQS, PRE_STEPS, DFM_STEPS ...). About 5 minutes on 2
# idle cores.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/keyed_lib.sh"
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-bench-memory-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
RES=${RESULTS:-$HERE/results}
mkdir -p "$RES"
T0=$(date +%s)
has_flag() { "$DFM_TRAIN" train --help | grep -q -- "--$1 "; }

: >"$W/runs.jsonl"
for mode in keyed keyed-random; do
  echo "-- $mode: corpus, backbone ($PRE_STEPS steps)"
  keyed_data "$W/$mode" "$mode"
  keyed_pretrain "$W/$mode" "$W/$mode-pre"
done
# row CORPUS BACKBONE_CORPUS NAME [flags...]
row() {
  local corpus=$1 bb=$2 name=$3; shift 3
  echo "-- $corpus, backbone pretrained on $bb: DFM modules ($DFM_STEPS steps${*:+, $*})"
  local ev; ev=$(keyed_dfm "$W/$corpus" "$W/$bb-pre/model" "$W/$name" "$@")
  echo "{\"corpus\": \"$corpus\", \"backbone\": \"$bb\", \"flags\": \"${*:-defaults}\", \"eval\": $ev, \"ideal\": $(keyed_ideal "$W/$corpus")}" >>"$W/runs.jsonl"
  echo "   $ev"
}
row keyed keyed keyed-dfm
row keyed keyed-random keyed-lm-dfm
row keyed-random keyed-random random-dfm
has_flag fusion-memory && row keyed-random keyed-random random-target-dfm --fusion-memory target
python3 "$HERE/keyed_report.py" memory "$W/runs.jsonl" "$RES/memory.md" \
  --command "THREADS=$THREADS SEQS=$SEQS PRE_STEPS=$PRE_STEPS DFM_STEPS=$DFM_STEPS bash bench/bench_memory.sh" \
  --seconds $(( $(date +%s) - T0 ))
cp "$W/runs.jsonl" "$RES/memory.jsonl"
cat "$RES/memory.md"
