#!/usr/bin/env bash
# bench/memory/bench_real_memory.sh — what DFM memory does for a real frozen LM (SmolLM2-135M), measured so that memory
# is told apart from the capacity the modules add, and knowledge the LM lacks from language it has.
#
#   held-out text  three real corpora from Debian packages: two dictionaries, which say each thing once (the demo's
#                  GCIDE; FOLDOC, the Free On-line Dictionary of Computing), and the Linux programmer's manual
#                  (manpages-dev, sections 2 and 3), whose pages repeat each other (shared errors, return values,
#                  families of calls). Each is split by document into a training part and a held-out part, and its
#                  cross-document redundancy is measured on that split: the share of the held-out part's word
#                  8-grams that occur in the training part. The datastore
#                  is the training part; held-out chunks retrieve from it (a query-only run: `dfm retrieve
#                  --datastore`). DFM modules train on the training part (retrieval there excludes a chunk's own
#                  document) and are evaluated on the held-out part in every mode and its shuffled control.
#   probes         facts about invented entities (bench/memory/knowledge/facts.py) as the corpus, the datastore and the
#                  training data; probe questions in wordings the corpus never uses, scored by answer log-prob and
#                  greedy exact match in every mode, the shuffled controls and the in-context reference
#                  (bench/memory/knowledge/score.py), with the analysis (predictor cosine, retrieval recall, gates,
#                  answer-token CE).
# Each over SEEDS (corpus split or fact corpus, and initialisation). Results: bench/results/real_memory.jsonl (one
# line per corpus/seed) and bench/results/real_memory.md (the tables, mean and spread over the seeds).
#
#   bash bench/memory/bench_real_memory.sh                       # about 2 hours on 2 cores
#   SEEDS="1" PARTS="probes" bash bench/memory/bench_real_memory.sh
# Knobs: SEEDS (1 2 3), PARTS (text probes), CORPORA (gcide foldoc manpages), TEXT_BYTES (bytes of each real corpus, 250000), HOLDOUT (1 in N documents
# held out, 8), EPOCHS_TEXT (2),
# ENTITIES (240), PROBES (120 probes, both forms), EPOCHS_FACTS (4), FUSION (26,29), PRED_INPUT (16), THREADS (2),
# WORK (scratch folder, kept; default /tmp/dfm-real-memory).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source "$ROOT/bench/memory/runs_lib.sh"  # the cache's paths, MPI as root, build()
SEEDS=${SEEDS:-"1 2 3"} PARTS=${PARTS:-"text probes"} CORPORA=${CORPORA:-"gcide foldoc manpages"} TEXT_BYTES=${TEXT_BYTES:-250000} EPOCHS_TEXT=${EPOCHS_TEXT:-2} HOLDOUT=${HOLDOUT:-8}
ENTITIES=${ENTITIES:-240} PROBES=${PROBES:-120} EPOCHS_FACTS=${EPOCHS_FACTS:-4} FUSION=${FUSION:-26,29}
PRED_INPUT=${PRED_INPUT:-16} THREADS=${THREADS:-2} NP=${NP:-2}
W=${WORK:-/tmp/dfm-real-memory}
T=256 L=32 B=2
mkdir -p "$W" bench/results
OUT=bench/results/real_memory.jsonl
T0=$(date +%s)


# sequences in a run (the chunk stage's count)
nseq() { python3 -c 'import json,sys; m=json.load(open(sys.argv[1]+"/manifest.json"))["stages"]["chunk"]; print(m["counts"]["sequences"])' "$1"; }

# train DFM modules on RUN for EPOCHS epochs (all its sequences but 2 held out); OUT folder
train() { # RUN OUT EPOCHS SEED
  local n steps
  n=$(nseq "$1")
  steps=$(( ($3 * (n - 2) + B - 1) / B ))
  "$TRAIN" train --backbone "$DFM_LM" --data "$1" --targets "$1" --out "$2" --seq-len "$T" --chunk-len $L --batch $B \
    --steps "$steps" --lr 2e-3 --warmup $(( steps / 20 + 1 )) --fusion-layers "$FUSION" --pred-input-layer "$PRED_INPUT" \
    --val-seqs 2 --eval-batches 1 --seed "$4" --threads "$THREADS" --no-ckpt --cache-frozen > "$2.log" 2>&1 ||
    { tail -20 "$2.log" >&2; exit 1; }
}

for seed in $SEEDS; do
  if [[ " $PARTS " == *" text "* ]]; then
    for corpus in $CORPORA; do
      src=$DFM_CACHE/corpus/$corpus-1mb.jsonl d=$W/$corpus-s$seed
      mkdir -p "$d"
      # the first TEXT_BYTES of the corpus, split by document: about 1 in HOLDOUT documents held out, drawn by seed
      python3 - "$src" "$d" "$seed" "$TEXT_BYTES" "$HOLDOUT" <<'PY'
import hashlib, json, sys
src, d, seed, limit, every = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
n, held, kept, tr, ho = 0, 0, 0, open(d + "/train.jsonl", "w"), open(d + "/heldout.jsonl", "w")
for line in open(src):
    if n >= limit:
        break
    n += len(line)
    doc = json.loads(line)
    h = int(hashlib.sha256((seed + doc["id"]).encode()).hexdigest(), 16)
    if h % every == 0:
        ho.write(line)
        held += 1
    else:
        tr.write(line)
        kept += 1
if held < 2 or kept < 2:
    sys.exit("bench_real_memory: %s: %d documents held out, %d kept in the first %d bytes: raise TEXT_BYTES or lower HOLDOUT"
             % (src, held, kept, limit))
tr.close(), ho.close()
# cross-document redundancy: the share of the held-out part's word 8-grams that occur anywhere in the training part
def grams(path):
    out = []
    for line in open(path):
        w = json.loads(line)["text"].split()
        out += [tuple(w[i:i + 8]) for i in range(len(w) - 7)]
    return out
seen, asked = set(grams(d + "/train.jsonl")), grams(d + "/heldout.jsonl")
json.dump({"ngram": 8, "heldout_ngrams": len(asked), "in_training_part": sum(g in seen for g in asked) / max(len(asked), 1)},
          open(d + "/redundancy.json", "w"))
PY
      echo "== $corpus, seed $seed: datastore and training part, then the held-out part as a query-only run"
      build "$d/train" "$d/train.jsonl" $T "" document
      build "$d/heldout" "$d/heldout.jsonl" $T "$d/train" none
      train "$d/train" "$d/dfm" "$EPOCHS_TEXT" "$seed"
      nh=$(nseq "$d/heldout")
      "$TRAIN" eval --backbone "$DFM_LM" --modules "$d/dfm/dfm_modules.safetensors" --data "$d/heldout" \
        --targets "$d/heldout" --seq-len $T --batch $B --val-seqs "$(( nh - 1 ))" --threads "$THREADS" > "$d/eval.json" 2> "$d/eval.log" ||
        { tail -20 "$d/eval.log" >&2; exit 1; }
      python3 - "$d" "$corpus" "$seed" "$nh" >> "$OUT" <<'PY'
import json, sys
d, corpus, seed, nh = sys.argv[1:]
e = json.loads(open(d + "/eval.json").read().strip().splitlines()[-1])
tr = [json.loads(l) for l in open(d + "/dfm/log.jsonl") if '"loss"' in l]
print(json.dumps({"part": "text", "corpus": corpus, "seed": int(seed), "heldout_sequences": int(nh),
                  "train_steps": len(tr), "redundancy": json.load(open(d + "/redundancy.json")), "eval": e}))
PY
      tail -1 "$OUT" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); e=r["eval"]; print("   held-out CE: off %.4f, predicted %.4f (control %.4f: effect %+.4f), target %.4f (control %.4f: effect %+.4f)" % (e["ce_none"], e["ce_pred"], e["ce_pred_shuffled"], e["memory_effect_pred"], e["ce_target"], e["ce_target_shuffled"], e["memory_effect_target"]))'
    done
  fi
  if [[ " $PARTS " == *" probes "* ]]; then
    d=$W/facts-s$seed
    mkdir -p "$d"
    echo "== probes, seed $seed: $ENTITIES invented entities, $PROBES probes in both forms"
    "$PY" bench/memory/knowledge/facts.py --out "$d" --entities "$ENTITIES" --seed "$seed" > /dev/null
    "$PY" bench/memory/knowledge/probe_tokens.py --probes "$d/probes.jsonl" --tokenizer "$TOK" --out "$d/pt" --limit "$PROBES" \
      --seed "$seed" > /dev/null
    build "$d/corpus" "$d/corpus.jsonl" $T "" document
    build "$d/probes" "$d/pt/probes.bin" $(( 3 * L )) "$d/corpus" none
    train "$d/corpus" "$d/dfm" "$EPOCHS_FACTS" "$seed"
    "$PY" bench/memory/knowledge/score.py --backbone "$DFM_LM" --modules "$d/dfm/dfm_modules.safetensors" --run "$d/probes" \
      --spans "$d/pt/spans.jsonl" --probes "$d/probes.jsonl" --corpus-run "$d/corpus" --tokenizer "$TOK" \
      --out "$d/score.json" --threads "$THREADS"
    python3 - "$d" "$seed" >> "$OUT" <<'PY'
import json, sys
d, seed = sys.argv[1:]
print(json.dumps({"part": "probes", "seed": int(seed), "score": json.load(open(d + "/score.json"))}))
PY
  fi
done
"$PY" bench/memory/real_memory_report.py "$OUT" > bench/results/real_memory.md
cat bench/results/real_memory.md
echo "bench_real_memory: done in $(( $(date +%s) - T0 ))s"
