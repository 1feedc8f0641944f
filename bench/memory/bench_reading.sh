#!/usr/bin/env bash
# bench/memory/bench_reading.sh — the reading lever (reconstruction pretraining) on the knowledge probes, each arm
# against its controls: does teaching the fusion to read its memory first make the memory itself matter?
#
# Per seed, on the invented-entity facts corpus (bench/memory/knowledge/facts.py) and the frozen SmolLM2-135M:
#   reading   `dfm-train train --objective reconstruct`: every corpus chunk regenerated from its own embedding
#             as the only memory (trainer/data/reading.h); the held-out chunks (whole documents, the run's last)
#             give reconstruction CE with the chunk's own slot against another chunk's slot (the shuffled control)
#   scratch   DFM training (CE + MSE, the trainer's default teacher forcing) for DFM_STEPS from fresh modules: the
#             same budget without the lever
#   read+dfm  the same DFM training starting from the reading stage's modules (--init-modules)
#   margin    (ARMS) scratch with the margin against shuffled memory (--margin-weight MARGIN_W --margin MARGIN:
#             trainer/run/margin.h); read+margin: the same after the reading stage
#   content   (ARMS) scratch with the content-only fusion (--content-only-fusion: no bias path around the memory);
#             centre: --centre-memory (slots minus the training targets' mean)
#   zero      (ARMS) scratch trained with every slot zeroed (--memory-ablation zero): the matched-capacity control
#   random    (ARMS) scratch trained on random-vector targets (--memory-ablation random: a fixed random direction per
#             chunk and slot): the value of the real targets, evaluated predicted
#   distill   (ARMS) KL toward the in-context teacher (--teacher, --distill-weight DISTILL_W): the frozen LM with the
#             text of each chunk's first PASTE neighbours pasted before the context (`dfm-train teacher`, computed
#             once per seed into WORK/sSEED/teacher.bin; its cost is recorded as a "teacher" line)
#   kd        (ARMS) the teacher's KL alone (--distill-weight DISTILL_W --ce-weight 0): no hard next-token CE
#   gain      (ARMS) the CE weighted by the teacher's gain over the LM alone (--gain-weighting GAIN_F)
#   lm        (ARMS) slots in the frozen LM's own space (`dfm-train slots`, trainer/data/lm_slots.h): each neighbour's
#             states after LM_LAYER blocks in LM_POOL slots (LM_POOL = 32: one per token) of the first LM_NB
#             neighbours, for training (--targets), the probes (score.py --targets) and, with read, a reading stage of
#             its own on each chunk's own states (--reading-slots; WORK/sSEED/reading-lm, recorded as "reading+lm")
#   predN     (ARMS) the predictor reads the mean of the LM's states after N blocks (--pred-input-layer N; N at most
#             the first fusion layer, cached by --cache-frozen) instead of the mean input embedding (0, the default):
#             the question's entity in context, which it needs to predict that entity's memory
#   lastN     (ARMS) the predictor's input averages only the previous chunk's last N tokens (--pred-input-tokens N;
#             last1: the last token's state, which with predN has read the whole context): a probe's prompt chunk is
#             mostly a filler every probe shares, which a whole-chunk mean keeps and the question's last token does not
#   skip      (ARMS) a linear path from the predictor's pooled input straight to its slots (--pred-skip): the map a ridge
#             regression finds (bench/memory/predictor_input.py), which the predictor's Transformer alone does not learn
#   mseW      (ARMS) the predictor's loss weighted W (--mse-weight W; 1 by default): whether a predictor pulled harder
#             toward its targets tells the questions apart
#   lmM       (ARMS) the same pooled to M slots per neighbour (M dividing 32: lm1 one mean vector, lm4 four): what
#             pooling costs; its files WORK/sSEED/lmM-*.bin, its reading stage reading-lmM ("reading+lmM")
#   recon     (ARMS) the reading objective kept alive during DFM training (--reconstruct-weight RECON_W,
#             trainer/run/reconstruct_mix.h): after each DFM micro-batch, one of the corpus' training chunks regenerated
#             from their own slot (with lm: their own LM-state slots); read+recon: after the reading stage, against
#             read+dfm; each line adds the held-out chunks' reconstruction at every evaluation ("reconstruct");
#             ctx (with recon): the reading pass is the corpus' own sequences, each chunk's memory its own slot, so the
#             chunk is regenerated after its real context (--reconstruct-context), as a question's value would be;
#             rshuf (with recon): each reading chunk reads another's slot (--reconstruct-memory shuffled): the same extra
#             passes over the corpus' text with nothing to read, the control that tells reading from more training
#   An arm is levers joined by "+", each adding its flags: e.g. content+centre, read+margin, read+content+centre+margin.
# Each DFM arm is scored on the probes (bench/memory/knowledge/score.py: answer log-prob summed over the answer and
# greedy exact match, fusion off / predicted / target / their shuffled controls / the fact pasted in context) and
# on its held-out corpus sequences (dfm-train's final evaluation: CE of every memory mode and its control).
# Results: OUT (bench/results/reading.jsonl: one line per seed and arm) and its table beside it (reading.md).
#
#   bash bench/memory/bench_reading.sh                       # SEEDS="1 2 3": about 50 min a seed on 2 cores
#   SEEDS=1 READ_STEPS=100 DFM_STEPS=60 PROBES=40 bash bench/memory/bench_reading.sh      # a quick look
#   ARMS=margin REUSE=1 SEEDS="1 2" bash bench/memory/bench_reading.sh  # one more arm beside earlier seeds' lines
# Knobs: SEEDS, ENTITIES (240; recorded in each line), PROBES (120 probe sequences, both forms), READ_STEPS (200), READ_LR (2e-3),
# DFM_STEPS (150: lines of another budget are their own rows, "ARM (N DFM steps)", against scratch at N), DFM_LR (2e-3), FUSION (21,26: before blocks 22 and 27), THREADS (2), WORK (/tmp/dfm-reading),
# ARMS ("scratch read+dfm"; also margin, read+margin), MARGIN_W (1), MARGIN (0.2 nats per token), PASTE (4),
# DISTILL_W (1), GAIN_F (0.2), RECON_W (1), LM_LAYER (16), LM_POOL (32), LM_NB (4), REUSE (0: 1 keeps
# the finished reading stage and DFM arms of WORK: a stage whose modules and cost are there is not trained again, and
# a reading stage kept records no line).
# UNSEEN (0): facts.py --unseen UNSEEN puts that many entities' documents last, and the DFM arms' and the reading stage's
# --val-seqs hold out exactly them (bench/memory/knowledge/held_out.py); score.json and the lines then add the probes
# of the seen and the unseen entities apart ("seen", "unseen"; probes_seen, probes_unseen; the report's unseen table).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
source "$ROOT/bench/memory/runs_lib.sh"  # the cache's paths, MPI as root, build()
SEEDS=${SEEDS:-"1 2 3"} ENTITIES=${ENTITIES:-240} PROBES=${PROBES:-120} READ_STEPS=${READ_STEPS:-200} READ_LR=${READ_LR:-2e-3}
DFM_STEPS_DEFAULT=150; DFM_STEPS=${DFM_STEPS:-$DFM_STEPS_DEFAULT} DFM_LR=${DFM_LR:-2e-3} FUSION=${FUSION:-21,26} THREADS=${THREADS:-2} NP=${NP:-2}
ARMS=${ARMS:-"scratch read+dfm"} MARGIN_W=${MARGIN_W:-1} MARGIN=${MARGIN:-0.2} REUSE=${REUSE:-0}
PASTE=${PASTE:-4} DISTILL_W=${DISTILL_W:-1} GAIN_F=${GAIN_F:-0.2} RECON_W=${RECON_W:-1}
LM_LAYER=${LM_LAYER:-16} LM_POOL=${LM_POOL:-32} LM_NB=${LM_NB:-4}
W=${WORK:-/tmp/dfm-reading}
T=256 L=32 B=4
mkdir -p "$W" bench/results
OUT=${OUT:-bench/results/reading.jsonl}
UNSEEN=${UNSEEN:-0}
T0=$(date +%s)


# run a command; FILE gets "WALL_SECONDS CPU_SECONDS" of it (all its threads and children)
dfm_train() { # OUT STEPS SEED [extra flags]
  local out=$1 steps=$2 seed=$3; shift 3
  timed "$out.cost" "$TRAIN" train --backbone "$DFM_LM" --data "$d/corpus" --targets "$targets" --out "$out" --seq-len $T \
    --chunk-len $L --batch $B --steps "$steps" --lr "$DFM_LR" --warmup $(( steps / 20 + 1 )) --fusion-layers "$FUSION" \
    --val-seqs "$dfm_val" --eval-batches 2 --eval-every $(( steps / 3 )) --seed "$seed" --threads "$THREADS" --no-ckpt \
    --cache-frozen "$@" > "$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; exit 1; }
}

score() { # MODULES OUT [score.py flags]
  local mods=$1 out=$2; shift 2
  "$PY" bench/memory/knowledge/score.py --backbone "$DFM_LM" --modules "$mods" --run "$d/probes" --spans "$d/pt/spans.jsonl" \
    --probes "$d/probes.jsonl" --corpus-run "$d/corpus" --tokenizer "$TOK" --out "$out" --threads "$THREADS" "$@" > "$out.log" 2>&1 ||
    { tail -20 "$out.log" >&2; exit 1; }
}

# the slots per neighbour of an LM-state lever: lmM pools to M, lm to LM_POOL
lm_pool() { local p=${1#lm}; echo "${p:-$LM_POOL}"; }
# the LM-state lever of an arm (lm, lm1, lm4 ...), empty when it has none
lm_lever() { local lv; IFS=+ read -ra lvs <<< "$1"; for lv in "${lvs[@]}"; do [[ $lv =~ ^lm[0-9]*$ ]] && echo "$lv"; done; return 0; }

lm_slots() { # OUT POOL [dfm-train slots flags]: the LM-state slots (LM_LAYER, POOL per neighbour), made once per seed
  local out=$1 pool=$2; shift 2
  [ -f "$out" ] || timed "$out.cost" "$TRAIN" slots --backbone "$DFM_LM" --chunk-len $L --layer "$LM_LAYER" --pool "$pool" \
    --threads "$THREADS" --out "$out" "$@" > "$out.log" 2>&1 || { tail -20 "$out.log" >&2; exit 1; }
}

record() { # SEED ARM DIR
  python3 - "$1" "$2" "$3" "$ENTITIES" >> "$OUT" <<'PY'
import json, os, sys
seed, arm, d, entities = sys.argv[1:]
r = {"seed": int(seed), "arm": arm, "entities": int(entities)}
lg = [json.loads(l) for l in open(d + "/log.jsonl")]
r["curve"] = [dict(step=e["step"], **{k: e["eval"].get(k) for k in ("ce_none", "ce_target", "ce_target_shuffled", "ce_pred",
                                                                    "ce_pred_shuffled", "acc_none", "acc_target",
                                                                    "acc_target_shuffled") if k in e["eval"]})
              for e in lg if "eval" in e]
rec = [dict(step=e["step"], **{k: e["reconstruct"].get(k) for k in ("ce_none", "ce_target", "ce_target_shuffled",
                                                                   "acc_target", "acc_target_shuffled")})
       for e in lg if "reconstruct" in e]
if rec:  # --reconstruct-weight: the held-out chunks regenerated from their own slot, a shuffled slot, fusion off
    r["reconstruct"] = rec
r["train_steps"] = max([e.get("step", 0) for e in lg] or [0])
if os.path.exists(d + ".cost"):
    w, c = open(d + ".cost").read().split()
    r["wall_s"], r["cpu_s"] = float(w), float(c)
if os.path.exists(d + "/score.json"):
    s = json.load(open(d + "/score.json"))
    r["probes"] = s["all"]
    r.update({"probes_" + k: s[k] for k in ("seen", "unseen") if s.get(k)})  # UNSEEN > 0
    r["probes_analysis"] = {k: s["analysis"].get(k) for k in ("retrieval_recall", "predictor_cosine_answer_chunk",
                                                             "predictor_cosine_partner_target",
                                                             "predictor_cosine_between_probes")}
print(json.dumps(r))
PY
}

for seed in $SEEDS; do
  d=$W/s$seed
  mkdir -p "$d"
  echo "== seed $seed: $ENTITIES invented entities; corpus, probes and their targets"
  "$PY" bench/memory/knowledge/facts.py --out "$d" --entities "$ENTITIES" --seed "$seed" --unseen "$UNSEEN" > /dev/null
  "$PY" bench/memory/knowledge/probe_tokens.py --probes "$d/probes.jsonl" --tokenizer "$TOK" --out "$d/pt" --limit "$PROBES" \
    --seed "$seed" > /dev/null
  [ -f "$d/corpus/manifest.json" ] || build "$d/corpus" "$d/corpus.jsonl" $T "" document
  [ -f "$d/probes/manifest.json" ] || build "$d/probes" "$d/pt/probes.bin" $(( 3 * L )) "$d/corpus" none
  nchunks=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["chunk"]["counts"]["chunks"])' "$d/corpus/manifest.json")
  read_val=$(( nchunks / 16 )) dfm_val=8  # held out: the reading stage's chunks, the DFM arms' sequences
  if [ "$UNSEEN" != 0 ]; then  # exactly the unseen tail
    held=$("$PY" bench/memory/knowledge/held_out.py --run "$d/corpus" --split "$d/unseen.json" --seq-len $T --tokenizer "$TOK")
    read -r dfm_val read_val <<< "$held"
  fi

  spaces=()  # the slot spaces of the arms that read first: "" (the embeddings) or an LM-state lever
  for arm in $ARMS; do
    sp=$(lm_lever "$arm")
    if [ -n "$sp" ]; then  # the LM-state slots: the corpus' neighbours, the probes' (from the corpus), each chunk's own
      pool=$(lm_pool "$sp")
      echo "   LM-state slots ($sp): after $LM_LAYER blocks, $pool per neighbour, $LM_NB neighbours"
      lm_slots "$d/$sp-corpus.bin" "$pool" --data "$d/corpus" --neighbours "$LM_NB"
      lm_slots "$d/$sp-probes.bin" "$pool" --data "$d/probes" --datastore "$d/corpus" --neighbours "$LM_NB"
      [[ "+$arm+" == *+read+* || "+$arm+" == *+recon+* ]] && lm_slots "$d/$sp-own.bin" "$pool" --data "$d/corpus" --own
    fi
    [[ "+$arm+" == *+read+* && " ${spaces[*]-} " != *" ${sp:-emb} "* ]] && spaces+=("${sp:-emb}")
  done
  for space in ${spaces[@]+"${spaces[@]}"}; do  # a reading stage for the arms that read first, per slot space
    [ "$space" = emb ] && space=
    dir=$d/read${space:+ing-$space} name=reading${space:++$space}
    if [ "$REUSE" = 1 ] && [ -f "$dir/dfm_modules.safetensors" ]; then
      echo "   $name: the finished stage in $dir kept (REUSE=1)"
      continue
    fi
    if [ -n "$space" ]; then rflags=(--slots $(( LM_NB * $(lm_pool "$space") )) --reading-slots "$d/$space-own.bin"); else rflags=(--slots 16); fi
    echo "   $name: $READ_STEPS steps of 16 chunks regenerated from their own slot(s)"
    timed "$dir.cost" "$TRAIN" train --objective reconstruct --backbone "$DFM_LM" --data "$d/corpus" --out "$dir" \
      --chunk-len $L "${rflags[@]}" --batch 16 --steps "$READ_STEPS" --lr "$READ_LR" --warmup $(( READ_STEPS / 20 + 1 )) \
      --fusion-layers "$FUSION" --val-seqs "$read_val" --eval-batches 4 --eval-every $(( READ_STEPS / 3 )) \
      --seed "$seed" --threads "$THREADS" --no-ckpt --cache-frozen > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
    record "$seed" "$name" "$dir"
    tail -1 "$OUT" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); c=r["curve"][-1]; print("   held-out reconstruction CE: own slot %.3f, shuffled slot %.3f, fusion off %.3f (%.0f CPU-s)" % (c["ce_target"], c["ce_target_shuffled"], c["ce_none"], r.get("cpu_s", 0)))'
  done

  if [[ " $ARMS " == *distill* || " $ARMS " == *gain* || " $ARMS " == *kd* ]] && [ ! -f "$d/teacher.bin" ]; then
    echo "   teacher: the LM with the text of each chunk's first $PASTE neighbours pasted"
    timed "$d/teacher.cost" "$TRAIN" teacher --backbone "$DFM_LM" --data "$d/corpus" --out "$d/teacher.bin" --seq-len $T \
      --chunk-len $L --paste "$PASTE" --threads "$THREADS" > "$d/teacher.log" 2>&1 || { tail -20 "$d/teacher.log" >&2; exit 1; }
    python3 - "$seed" "$d" "$PASTE" >> "$OUT" <<'PY'
import json, re, sys
seed, d, paste = sys.argv[1:]
line = [l for l in open(d + "/teacher.log") if l.startswith("teacher:")][-1]
m = re.search(r"(\d+) rows with pasted text: teacher ([\d.]+), LM alone ([\d.]+)", line)
w, c = open(d + "/teacher.cost").read().split()
print(json.dumps({"seed": int(seed), "arm": "teacher", "paste": int(paste), "rows": int(m.group(1)),
                  "ce_teacher": float(m.group(2)), "ce_alone": float(m.group(3)), "wall_s": float(w), "cpu_s": float(c)}))
PY
    tail -1 "$OUT"
  fi

  for arm in $ARMS; do
    out=$d/${arm/+/-}
    [ "$DFM_STEPS" = "$DFM_STEPS_DEFAULT" ] || out+="-$DFM_STEPS"  # another budget's modules are their own, never reused for this one
    echo "   $arm: $DFM_STEPS DFM steps"
    extra=() sflags=() targets=$d/corpus rdir=$d/read sp=$(lm_lever "$arm")
    [ -n "$sp" ] && rdir=$d/reading-$sp
    IFS=+ read -ra levers <<< "$arm"
    for lv in "${levers[@]}"; do
      case $lv in
        scratch|dfm) ;;
        read) extra+=(--init-modules "$rdir/dfm_modules.safetensors") ;;
        lm|lm[0-9]*) targets=$d/$lv-corpus.bin; sflags=(--targets "$d/$lv-probes.bin") ;;
        margin) extra+=(--margin-weight "$MARGIN_W" --margin "$MARGIN") ;;
        content) extra+=(--content-only-fusion) ;;
        centre) extra+=(--centre-memory) ;;
        zero) extra+=(--memory-ablation zero) ;;
        random) extra+=(--memory-ablation random) ;;
        pred[0-9]*) extra+=(--pred-input-layer "${lv#pred}") ;;
        mse[0-9]*) extra+=(--mse-weight "${lv#mse}") ;;
        last[0-9]*) extra+=(--pred-input-tokens "${lv#last}") ;;
        skip) extra+=(--pred-skip) ;;
        distill) extra+=(--teacher "$d/teacher.bin" --distill-weight "$DISTILL_W") ;;
        kd) extra+=(--teacher "$d/teacher.bin" --distill-weight "$DISTILL_W" --ce-weight 0) ;;
        gain) [[ " ${extra[*]} " == *--teacher* ]] || extra+=(--teacher "$d/teacher.bin"); extra+=(--gain-weighting "$GAIN_F") ;;
        recon) extra+=(--reconstruct-weight "$RECON_W"); [ -n "$sp" ] && extra+=(--reading-slots "$d/$sp-own.bin") ;;
        ctx) extra+=(--reconstruct-context) ;;
        rshuf) extra+=(--reconstruct-memory shuffled) ;;
        *) echo "bench_reading: unknown lever '$lv' in arm '$arm' (scratch, read+dfm, or levers joined by +: read, margin, content, centre, zero, random, distill, kd, gain, recon, ctx, rshuf, lm, lmM, predN, mseW, lastN, skip)" >&2; exit 2 ;;
      esac
    done
    if [ "$REUSE" = 1 ] && [ -f "$out/dfm_modules.safetensors" ] && [ -f "$out.cost" ]; then
      echo "   $arm: the trained modules in $out kept (REUSE=1)"
    else
      dfm_train "$out" "$DFM_STEPS" "$seed" "${extra[@]}"
    fi
    score "$out/dfm_modules.safetensors" "$out/score.json" "${sflags[@]}"
    record "$seed" "$arm" "$out"
    tail -1 "$OUT" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); p=r["probes"]; c=r["curve"][-1]; print("   probes (answer log-prob / EM): off %.2f / %.1f%%, target %.2f / %.1f%%, target shuffled %.2f, predicted %.2f / %.1f%%, predicted shuffled %.2f; held-out CE target %.4f vs shuffled %.4f" % (p["none"]["logprob"], 100*p["none"]["exact"], p["target"]["logprob"], 100*p["target"]["exact"], p["target_shuffled"]["logprob"], p["predicted"]["logprob"], 100*p["predicted"]["exact"], p["predicted_shuffled"]["logprob"], c["ce_target"], c["ce_target_shuffled"]))'
  done
done
"$PY" bench/memory/reading_report.py "$OUT" > "${OUT%.jsonl}.md"  # each results file its own table
cat "${OUT%.jsonl}.md"
echo "bench_reading: done in $(( $(date +%s) - T0 ))s"
