#!/usr/bin/env bash
# bench/memory/bench_memory.sh — the benchmark where memory must matter (trainer/data/synth.h): does the memory DFM
# trains make the language model better, and by how much of what is possible?
#
#   bash bench/memory/bench_memory.sh [WORK_DIR]     # writes bench/results/memory.md and memory.json
#
# Corpora with the same key sets (seed 1 unless named), a 2-layer x 64 backbone pretrained on each, DFM
# modules trained with the trainer's default flags:
#   keyed           128 keys follow a chain: predicted memory can know chunk c's key from chunk c-1;
#   keyed-64-keys   the same with 64 keys: a chain small enough that the backbone learns much of it;
#   keyed-random    independent keys: only the target memory (retrieval at inference) can help.
# Rows:
#   1. keyed corpus, backbone pretrained on it: memory adds what the backbone did not absorb of the chain;
#      and the same with the corpus drawn from seeds 2 and 3 (keyed-seed2, keyed-seed3): how much of the
#      figure is the draw;
#   2. keyed-64-keys, backbone pretrained on it: the backbone absorbed more, and what is left is bounded
#      (the gain's split and the head's ceiling below say by what);
#   3. keyed corpus, backbone pretrained on the keyed-random text: it knows the language (the key sets) but
#      not the corpus's knowledge (the chain), which the memory must supply: DFM's use case (a frozen LM,
#      a datastore holding what it does not know);
#   4. keyed-random, its own backbone, defaults: no mode may be worse than fusion off;
#   5. keyed-random, modules trained on the target memory only (--fusion-memory target): the fusion path
#      alone.
# Every evaluation mode the trainer reports is in the table, per-position CE inside a chunk, and the corpus's
# ideal cross-entropies (bench/memory/keyed_ideal.py: key known, Bayes from context, Bayes from the chunk's own
# tokens). Sizes: see bench/memory/keyed_lib.sh (THREADS, SEQS, PRE_STEPS, DFM_STEPS ...). About 5 minutes on 2
# idle cores.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/keyed_lib.sh"
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-bench-memory-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
RES=${RESULTS:-$HERE/../results}
mkdir -p "$RES"
T0=$(date +%s)
has_flag() { "$DFM_TRAIN" train --help | grep -q -- "--$1 "; }

# the gain's split and the head's ceiling (bench/memory/keyed_analysis.py) need torch >= 2: the peer venv of bench/peers.sh
ANALYSIS_PYTHON=${ANALYSIS_PYTHON-/var/cache/dfm/peers-venv/bin/python}
if [ -n "$ANALYSIS_PYTHON" ] && ! "$ANALYSIS_PYTHON" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  echo "-- no torch >= 2 at $ANALYSIS_PYTHON (bash bench/peers.sh makes it): the gain's split is left out"
  ANALYSIS_PYTHON=
fi
: >"$W/runs.jsonl"
for mode in keyed keyed-random; do
  echo "-- $mode: corpus, backbone ($PRE_STEPS steps)"
  keyed_data "$W/$mode" "$mode"
  keyed_pretrain "$W/$mode" "$W/$mode-pre"
done
echo "-- keyed-64-keys: corpus, backbone ($PRE_STEPS steps)"
keyed_data "$W/keyed-64-keys" keyed --keys 64
keyed_pretrain "$W/keyed-64-keys" "$W/keyed-64-keys-pre"
for seed in 2 3; do
  echo "-- keyed-seed$seed: corpus, backbone ($PRE_STEPS steps)"
  keyed_data "$W/keyed-seed$seed" keyed --seed "$seed"
  keyed_pretrain "$W/keyed-seed$seed" "$W/keyed-seed$seed-pre"
done
# row CORPUS BACKBONE_CORPUS NAME [flags...]
row() {
  local corpus=$1 bb=$2 name=$3; shift 3
  echo "-- $corpus, backbone pretrained on $bb: DFM modules ($DFM_STEPS steps${*:+, $*})"
  local ev; ev=$(keyed_dfm "$W/$corpus" "$W/$bb-pre/model" "$W/$name" "$@")
  local an=null
  if [ "$corpus" != keyed-random ] && [ -n "$ANALYSIS_PYTHON" ]; then
    an=$("$ANALYSIS_PYTHON" "$HERE/keyed_analysis.py" --data "$W/$corpus" --backbone "$W/$bb-pre/model" --modules "$W/$name" \
      --seq-len "$T" --val-seqs "$VAL")
  fi
  echo "{\"corpus\": \"$corpus\", \"backbone\": \"$bb\", \"flags\": \"${*:-defaults}\", \"eval\": $ev, \"ideal\": $(keyed_ideal "$W/$corpus"), \"analysis\": $an}" >>"$W/runs.jsonl"
  echo "   $ev"
}
row keyed keyed keyed-dfm
row keyed-seed2 keyed-seed2 keyed-seed2-dfm
row keyed-seed3 keyed-seed3 keyed-seed3-dfm
row keyed-64-keys keyed-64-keys keyed64-dfm
row keyed keyed-random keyed-lm-dfm
row keyed-random keyed-random random-dfm
has_flag fusion-memory && row keyed-random keyed-random random-target-dfm --fusion-memory target
python3 "$HERE/keyed_report.py" memory "$W/runs.jsonl" "$RES/memory.md" \
  --command "THREADS=$THREADS SEQS=$SEQS PRE_STEPS=$PRE_STEPS DFM_STEPS=$DFM_STEPS bash bench/memory/bench_memory.sh" \
  --seconds $(( $(date +%s) - T0 ))
cp "$W/runs.jsonl" "$RES/memory.jsonl"
cat "$RES/memory.md"
