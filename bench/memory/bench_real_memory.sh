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
# Knobs: SEEDS (1 2 3), PARTS (text probes), CORPORA (gcide foldoc manpages), TEXT_ARMS (scratch: DFM from fresh
# modules; read+dfm-style arms are levers joined by +: read (the reading stage first, READ_STEPS (200) steps of 16 chunks
# regenerated from their own embedding, then DFM from its modules), content (--content-only-fusion), centre
# (--centre-memory)), TEXT_BYTES (bytes of each real corpus, 250000), HOLDOUT (1 in N documents
# held out, 8), EPOCHS_TEXT (2),
# ENTITIES (240), PROBES (120 probes, both forms), EPOCHS_FACTS (4), FUSION (26,29), PRED_INPUT (16), THREADS (2),
# WORK (scratch folder, kept; default /tmp/dfm-real-memory).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source "$ROOT/bench/memory/runs_lib.sh"  # the cache's paths, MPI as root, build()
SEEDS=${SEEDS:-"1 2 3"} PARTS=${PARTS:-"text probes"} CORPORA=${CORPORA:-"gcide foldoc manpages"}
TEXT_ARMS=${TEXT_ARMS:-scratch} READ_STEPS=${READ_STEPS:-200} TEXT_BYTES=${TEXT_BYTES:-250000} EPOCHS_TEXT=${EPOCHS_TEXT:-2} HOLDOUT=${HOLDOUT:-8}
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
train() { # RUN OUT EPOCHS SEED [extra flags]
  local n steps run=$1 out=$2 epochs=$3 seed=$4
  shift 4
  n=$(nseq "$run")
  steps=$(( (epochs * (n - 2) + B - 1) / B ))
  timed "$out.cost" "$TRAIN" train --backbone "$DFM_LM" --data "$run" --targets "$run" --out "$out" --seq-len "$T" \
    --chunk-len $L --batch $B --steps "$steps" --lr 2e-3 --warmup $(( steps / 20 + 1 )) --fusion-layers "$FUSION" \
    --pred-input-layer "$PRED_INPUT" --val-seqs 2 --eval-batches 1 --seed "$seed" --threads "$THREADS" --no-ckpt \
    --cache-frozen "$@" > "$out.log" 2>&1 || { tail -20 "$out.log" >&2; exit 1; }
}

# the reading stage on a run's chunks (every chunk regenerated from its own embedding, the last 2 sequences held
# out): RUN OUT SEED
reading() {
  timed "$2.cost" "$TRAIN" train --objective reconstruct --backbone "$DFM_LM" --data "$1" --out "$2" --chunk-len $L \
    --slots 16 --batch 16 --steps "$READ_STEPS" --lr 2e-3 --warmup $(( READ_STEPS / 20 + 1 )) --fusion-layers "$FUSION" \
    --pred-input-layer "$PRED_INPUT" \
    --val-seqs 2 --eval-batches 4 --eval-every "$READ_STEPS" --seed "$3" --threads "$THREADS" --no-ckpt --cache-frozen \
    > "$2.log" 2>&1 || { tail -20 "$2.log" >&2; exit 1; }
}

for seed in $SEEDS; do
  if [[ " $PARTS " == *" text "* ]]; then
    for corpus in $CORPORA; do
      src=$DFM_CACHE/corpus/$corpus-1mb.jsonl d=$W/$corpus-s$seed
      mkdir -p "$d"
      # the first TEXT_BYTES of the corpus, split by document: about 1 in HOLDOUT documents held out, drawn by seed
      python3 bench/memory/text_split.py "$src" "$d" --seed "$seed" --max-bytes "$TEXT_BYTES" --every "$HOLDOUT"
      echo "== $corpus, seed $seed: datastore and training part, then the held-out part as a query-only run"
      build "$d/train" "$d/train.jsonl" $T "" document
      build "$d/heldout" "$d/heldout.jsonl" $T "$d/train" none
      for arm in $TEXT_ARMS; do
        # the reading stage's folder: reading (READ_STEPS 200, the first runs') or reading-N; one serves every arm
        rd=$d/reading tag=""
        [ "$READ_STEPS" = 200 ] || rd=$d/reading-$READ_STEPS tag=-r$READ_STEPS
        extra=() out=$d/dfm
        [ "$arm" = scratch ] || out=$d/dfm-$arm$tag
        for lv in ${arm//+/ }; do
          case $lv in
            scratch) ;;
            read)
              [ -f "$rd/dfm_modules.safetensors" ] || reading "$d/train" "$rd" "$seed"
              extra+=(--init-modules "$rd/dfm_modules.safetensors") ;;
            content) extra+=(--content-only-fusion) ;;
            centre) extra+=(--centre-memory) ;;
            *) echo "bench_real_memory: unknown lever '$lv' in text arm '$arm' (scratch, or read, content, centre joined by +)" >&2
               exit 2 ;;
          esac
        done
        train "$d/train" "$out" "$EPOCHS_TEXT" "$seed" ${extra[@]+"${extra[@]}"}
        nh=$(nseq "$d/heldout")
        "$TRAIN" eval --backbone "$DFM_LM" --modules "$out/dfm_modules.safetensors" --data "$d/heldout" \
          --targets "$d/heldout" --seq-len $T --batch $B --val-seqs "$(( nh - 1 ))" --threads "$THREADS" > "$out.eval.json" \
          2> "$out.eval.log" || { tail -20 "$out.eval.log" >&2; exit 1; }
        python3 - "$d" "$out" "$corpus" "$seed" "$nh" "$arm" "$TEXT_BYTES" "$HOLDOUT" "$rd" "$READ_STEPS" >> "$OUT" <<'PY'
import json, os, sys
d, out, corpus, seed, nh, arm, text_bytes, holdout, rd, read_steps = sys.argv[1:]
e = json.loads(open(out + ".eval.json").read().strip().splitlines()[-1])
tr = [json.loads(l) for l in open(out + "/log.jsonl") if '"loss"' in l]
r = {"part": "text", "corpus": corpus, "seed": int(seed), "arm": arm, "text_bytes": int(text_bytes), "holdout": int(holdout),
     "heldout_sequences": int(nh), "train_steps": len(tr),
     "redundancy": json.load(open(d + "/redundancy.json")), "eval": e}
# CPU seconds of the arm's training, with its reading stage's where it read first (one stage serves every such arm)
costs = [out + ".cost"] + ([rd + ".cost"] if "read" in arm.split("+") else [])
r["cpu_s"] = sum(float(open(f).read().split()[1]) for f in costs)
if "read" in arm.split("+"):  # the reading stage's held-out chunks: regenerated with their own slot, another's, none
    r["read_steps"] = int(read_steps)
    ev = [json.loads(l)["eval"] for l in open(rd + "/log.jsonl") if '"eval"' in l][-1]
    r["reading"] = {k: ev[k] for k in ("ce_none", "ce_target", "ce_target_shuffled", "acc_target", "acc_target_shuffled") if k in ev}
print(json.dumps(r))
PY
        tail -1 "$OUT" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); e=r["eval"]; print("   %s: held-out CE: off %.4f, predicted %.4f (control %.4f: effect %+.4f), target %.4f (control %.4f: effect %+.4f)" % (r["arm"], e["ce_none"], e["ce_pred"], e["ce_pred_shuffled"], e["memory_effect_pred"], e["ce_target"], e["ce_target_shuffled"], e["memory_effect_target"]))'
      done
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
