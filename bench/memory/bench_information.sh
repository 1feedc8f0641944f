#!/usr/bin/env bash
# bench/memory/bench_information.sh — rung 2 of the diagnostic ladder (information): how much of what follows a
# chunk is decodable from its target memory at all, outside the LM, for each thing a slot may hold.
#
# Per seed, on the invented-entity facts corpus (bench/memory/knowledge/facts.py; the data of bench_reading.sh:
# corpus run, retrieve --exclude document; probe run retrieving from the corpus's index, --exclude none), and per
# slot variant (`dfm write-targets --slots-hold neighbour|continuation|both`, every seed's runs rewritten in
# place): bench/memory/information.py fits closed-form ridge readouts from a chunk's target memory to the bag of
# tokens of that chunk on a corpus's chunks (its last 10 % of documents held out, the 10 % before them choose the
# ridge strength), then scores
#   probes    the answer's first token among the first tokens of every scored probe answer, from the probe's own
#             target memory against another entity's probe's memory (the shuffled control of score.py), and the
#             same readout from the prompt chunk's embedding alone (no memory: the query readout)
#   held-out  the held-out corpus chunks' token bags (average precision per chunk), own memory against another
#             chunk's
# and, where no readout is involved, how often the text of a probe's valid slots holds the answer (text recall).
# Each seed's readouts are fitted twice: on the next seed's corpus (other invented entities: the readout cannot
# learn the probed facts from its training chunks, so what it decodes comes from the memory; the clean measure)
# and on the probes' own corpus (where it can, as the query readout then shows).
# Results: bench/results/information.jsonl (one line per seed, variant and training corpus) and
# bench/results/information.md.
#
#   bash bench/memory/bench_information.sh     # SEEDS="1 2 3": about 7 CPU-minutes, 5 min wall on 2 busy cores
#   SEEDS="1 2" VARIANTS=neighbour bash bench/memory/bench_information.sh                  # a quick look
# Knobs: SEEDS ("1 2 3"; one seed gives no readout fitted on another corpus), VARIANTS ("neighbour continuation
# both"), ENTITIES (240), PROBES (120 probes, each in both forms), WORK (/tmp/dfm-info), NP (2 ranks for the
# builds), OUT (bench/results/information.jsonl; the page is OUT with .md for .jsonl).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source "$ROOT/bench/memory/runs_lib.sh"  # the cache's paths, MPI as root, build()
SEEDS=${SEEDS:-"1 2 3"} VARIANTS=${VARIANTS:-"neighbour continuation both"} ENTITIES=${ENTITIES:-240}
PROBES=${PROBES:-120} NP=${NP:-2}
W=${WORK:-/tmp/dfm-info}
T=256 L=32
OUT=${OUT:-bench/results/information.jsonl}
mkdir -p "$W" "$(dirname "$OUT")"
: > "$OUT"
T0=$(date +%s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

# run a command or function; FILE gets "WALL_SECONDS CPU_SECONDS" of it (bash's time: its children included)
retarget() { # RUN VARIANT: rewrite RUN's targets with slots holding VARIANT
  mpirun -np "$NP" "$DFM" write-targets "$1" --target-shards 2 --dtype fp16 --slots-hold "$2" --force \
    > "$1.targets.log" 2>&1 || { tail -20 "$1.targets.log" >&2; exit 1; }
}

data() { # DIR SEED: the facts, the probes and their token sequences
  "$PY" bench/memory/knowledge/facts.py --out "$1" --entities "$ENTITIES" --seed "$2" > /dev/null
  "$PY" bench/memory/knowledge/probe_tokens.py --probes "$1/probes.jsonl" --tokenizer "$TOK" --out "$1/pt" \
    --limit "$PROBES" --seed "$2" > /dev/null
}

record() { # SEED VARIANT DIR TRAIN(own|other) TRAIN_SEED NAME: the result NAME.json as a line of OUT, with its costs
  "$PY" - "$@" >> "$OUT" <<'PY'
import json, os, sys
seed, v, d, train, train_seed, name = sys.argv[1:]
r = {"seed": int(seed), "variant": v, "train": train, "train_seed": int(train_seed)}
r.update(json.load(open(os.path.join(d, name + ".json"))))
cost = {}  # the data, the runs and the targets are counted on the line of the readouts fitted on the own corpus
parts = [("data", ["data"]), ("corpus", ["corpus"]), ("probes", ["probes"]),
         ("targets", ["targets-%s" % v, "targets-%s.probes" % v])] if train == "own" else []
for part, files in parts + [("info", [name])]:
    for f in (os.path.join(d, x + ".cost") for x in files):
        if os.path.exists(f):
            w, c = open(f).read().split()
            e = cost.setdefault(part, {"wall_s": 0.0, "cpu_s": 0.0})
            e["wall_s"], e["cpu_s"] = round(e["wall_s"] + float(w), 1), round(e["cpu_s"] + float(c), 1)
r["cost"] = cost
print(json.dumps(r, sort_keys=True))
PY
}

info() { # SEED VARIANT TRAIN_SEED NAME: information.py on seed's probes, fitted on TRAIN_SEED's corpus
  local d=$W/s$1 t=$W/s$3/corpus
  timed "$d/$4.cost" "$PY" bench/memory/information.py --corpus-run "$d/corpus" --probe-run "$d/probes" \
    --train-corpus-run "$t" --spans "$d/pt/spans.jsonl" --tokenizer "$TOK" --out "$d/$4.json" \
    --save-arrays "$d/arrays-$4.npz" > "$d/$4.log" 2>&1 || { tail -20 "$d/$4.log" >&2; exit 1; }
  echo "   seed $1, $2, fitted on seed $3's corpus: $(tail -1 "$d/$4.log" | cut -c14-)"
}

for seed in $SEEDS; do
  d=$W/s$seed
  mkdir -p "$d"
  echo "== seed $seed: $ENTITIES invented entities; corpus, probes and their targets"
  timed "$d/data.cost" data "$d" "$seed"
  [ -f "$d/corpus/manifest.json" ] || timed "$d/corpus.cost" build "$d/corpus" "$d/corpus.jsonl" $T "" document
  [ -f "$d/probes/manifest.json" ] ||
    timed "$d/probes.cost" build "$d/probes" "$d/pt/probes.bin" $(( 3 * L )) "$d/corpus" none
done
read -r -a seeds <<< "$SEEDS"
[ ${#seeds[@]} -gt 1 ] || echo "   one seed: no readout fitted on another seed's corpus (the clean measure needs two)"
for v in $VARIANTS; do
  echo "== slots hold: $v"
  for seed in "${seeds[@]}"; do  # every seed's targets first: a readout may be fitted on another seed's corpus
    timed "$W/s$seed/targets-$v.cost" retarget "$W/s$seed/corpus" "$v"
    timed "$W/s$seed/targets-$v.probes.cost" retarget "$W/s$seed/probes" "$v"
  done
  for i in "${!seeds[@]}"; do
    seed=${seeds[$i]}
    info "$seed" "$v" "$seed" "info-$v"
    record "$seed" "$v" "$W/s$seed" own "$seed" "info-$v"
    if [ ${#seeds[@]} -gt 1 ]; then
      other=${seeds[$(( (i + 1) % ${#seeds[@]} ))]}
      info "$seed" "$v" "$other" "info-$v-other"
      record "$seed" "$v" "$W/s$seed" other "$other" "info-$v-other"
    fi
  done
done
"$PY" bench/memory/information.py --report "$OUT" > "${OUT%.jsonl}.md"
cat "${OUT%.jsonl}.md"
echo "bench_information: done in $(( $(date +%s) - T0 ))s"
