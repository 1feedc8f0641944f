#!/usr/bin/env bash
# bench/encoder/bench_encoder_cpu.sh — dfm's CPU encoder (all-MiniLM-L6-v2) in fp32, bf16 and int8 against its strongest
# peers on the same real chunk texts, in one run:
#   st        sentence-transformers on PyTorch 2.x (CPU), fp32
#   st-bf16   the same under torch.autocast("cpu", dtype=torch.bfloat16)
#   ort       ONNX Runtime, CPUExecutionProvider, on the fused graph: MiniLM exported to ONNX here from the local
#             weights (mean pooling and normalisation inside the graph), then ORT's transformer optimizer
#             (Attention, SkipLayerNormalization, Gelu fused) and ORT_ENABLE_ALL; its thread pool does not spin
#             (session.intra_op.allow_spinning 0: idle threads that spin burn CPU-seconds that are not encoding)
#   ort-int8  the same fused graph through onnxruntime.quantization.quantize_dynamic (QInt8 weights, per tensor
#             or with PER_CHANNEL=1 per channel; activations quantised at run time; MLAS uses VNNI)
# dfm runs once per precision in PRECISIONS (dfm encode --precision; encoder/bert_gemm.h).
# Peers come only from the peer venv (bench/peers.sh). A missing peer is an error: nothing is substituted.
#
#   bash bench/encoder/bench_encoder_cpu.sh                     N=300 texts per corpus, THREADS="1 2", ROUNDS=3
#   N=100 ROUNDS=2 THREADS=1 PEERS=ort PRECISIONS=fp32 CORPORA=gcide bash bench/encoder/bench_encoder_cpu.sh
#
# Method, per corpus C (CORPORA: names of $DFM_CACHE/corpus/C.jsonl; real 32-token chunk texts drawn from it)
# and thread count T (OMP/OpenBLAS/torch/ORT/Rayon threads all T):
#   - each peer's best batch size: one pass per size in BATCHES on the first SWEEP_N texts, least CPU-seconds
#     (dfm runs its default batch);
#   - ROUNDS rounds; each round runs every dfm precision and every peer once, in a rotating order (interleaved:
#     all sides see the same load). Each run is a fresh process: load, a warm-up call on 64 texts, then one
#     timed encode of all N texts (tokenisation included on every side, model loading excluded);
#   - min/median/max of wall and CPU-seconds (process CPU time, all threads) per side; the ratio is
#     peer CPU-s / dfm CPU-s of the same round (above 1: dfm faster), min/median/max over rounds;
#   - the last round's vectors compared with dfm fp32's: max abs error, min and mean cosine, and the recall@16
#     of each side's nearest neighbours among the N texts against dfm fp32's (what a lower precision must keep).
# dfm runs through its C API (bench/encoder/bench_encoder.c), with OpenBLAS's kernels corrected on CPUs OpenBLAS
# does not know, as dfm-train does (common/blas_core.h); the kernel set is printed in the table.
# Writes bench/results/encoder.json (the convention in bench/README.md; headline: dfm fp32 against the strongest
# fp32 peer at the fewest threads on the first corpus; every row's "case" says what the peers are compared on
# and its "goal" the ratio the issue asks for) and bench/results/encoder_cpu.md (the full tables). RECORD=0
# writes neither.
# Env: N, THREADS, ROUNDS, PEERS ("st ort ort-int8 st-bf16"), PRECISIONS ("fp32 bf16 int8"), CORPORA
#      ("gcide foldoc-1mb"), BATCHES ("8 16 32 64 128"), SWEEP_N (128), DFM_BATCH (dfm's batch; default: the
#      encoder's), PER_CHANNEL=1 (ort-int8 per-channel weights), MEMORY=1 adds the peak-RSS runs of
#      `dfm encode`, BUILD=0 runs the bench programs already in build/bench without making them, DFM_REV labels
#      the dfm build in the results (default: the git commit, flagged when encoder/ or common/ has uncommitted
#      edits), DFM_MODEL.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
N=${N:-300} THREADS=${THREADS:-"1 2"} ROUNDS=${ROUNDS:-3} PEERS=${PEERS:-"st ort ort-int8 st-bf16"}
PRECISIONS=${PRECISIONS:-"fp32 bf16 int8"} CORPORA=${CORPORA:-"gcide foldoc-1mb"}
BATCHES=${BATCHES:-"8 16 32 64 128"} SWEEP_N=${SWEEP_N:-128} DFM_BATCH=${DFM_BATCH:-} RECORD=${RECORD:-1}
MODEL=${DFM_MODEL:-$DFM_CACHE/models/all-MiniLM-L6-v2}
die() { echo "bench_encoder_cpu: $*" >&2; exit 1; }

# ---- the peers: only from the peer venv, each checked before anything is timed ----
PY=$(bash bench/peers.sh --python) || die "the peer venv is missing or stale: run bash bench/peers.sh (no other peer is used)"
for p in $PEERS; do
  case $p in
    st|st-bf16) "$PY" -c "import torch, sentence_transformers" ||
          die "peer $p (sentence-transformers on torch) does not import from $PY; run bash bench/peers.sh" ;;
    ort) "$PY" -c "import onnxruntime, onnx, torch, transformers, tokenizers" ||
          die "peer ort (onnxruntime + onnx export) does not import from $PY; run bash bench/peers.sh" ;;
    ort-int8) "$PY" -c "import onnxruntime.quantization, onnx, torch, transformers, tokenizers" ||
          die "peer ort-int8 (onnxruntime.quantization + onnx export) does not import from $PY; run bash bench/peers.sh" ;;
    *) die "unknown peer '$p' in PEERS (st, st-bf16, ort, ort-int8)" ;;
  esac
done
for p in $PRECISIONS; do
  case $p in fp32|bf16|int8) ;; *) die "unknown precision '$p' in PRECISIONS (fp32, bf16, int8)" ;; esac
done
[[ " $PRECISIONS " == *" fp32 "* ]] || die "PRECISIONS must include fp32: every side's neighbours are checked against dfm fp32's"
for c in $CORPORA; do [ -f "$DFM_CACHE/corpus/$c.jsonl" ] || die "no corpus $DFM_CACHE/corpus/$c.jsonl (CORPORA)"; done
[ -f "$MODEL/model.safetensors" ] || die "no model at $MODEL (make deps installs it)"

W=$(mktemp -d /tmp/dfm-bench-enc-XXXXXX)
trap 'rm -rf "$W"' EXIT
export DFM_PROGRESS=0 TOKENIZERS_PARALLELISM=true
if [ "${BUILD:-1}" = 1 ]; then
  make -s --no-print-directory -C "$ROOT" build/bench/bench_encoder $([ "${MEMORY:-0}" = 1 ] && echo build/dfm) ||
    die "the build failed"
fi

echo "== encoder CPU benchmark: $N real chunk texts per corpus ($CORPORA), precisions $PRECISIONS, peers $PEERS, threads $THREADS, $ROUNDS interleaved rounds, $(date -u '+%F %T') UTC"
echo "   $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores visible, load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ " $PEERS " == *" ort"* ]]; then
  "$PY" bench/encoder/encoder_peer.py export "$MODEL" "$W/minilm.onnx" 2>"$W/export.err" | tee "$W/export.out" ||
    { tail -20 "$W/export.err" >&2; die "exporting the fused ONNX graph failed"; }
fi
if [[ " $PEERS " == *" ort-int8 "* ]]; then
  "$PY" bench/encoder/encoder_peer.py quantize "$W/minilm.onnx" "$W/minilm-int8.onnx" $([ "${PER_CHANNEL:-0}" = 1 ] && echo --per-channel) \
    2>"$W/quant.err" | tee -a "$W/export.out" || { tail -20 "$W/quant.err" >&2; die "quantize_dynamic failed"; }
fi
EXPORT_OUT=; [ -s "$W/export.out" ] && EXPORT_OUT=$W/export.out
peer_model() { case $1 in ort) echo "$W/minilm.onnx" ;; ort-int8) echo "$W/minilm-int8.onnx" ;; *) echo "$MODEL" ;; esac; }
side_name() { if [ "$1" = fp32 ]; then echo dfm; else echo "dfm-$1"; fi; }

: > "$W/runs"     # C T side round wall cpu batch gflop blas
: > "$W/agree"    # C T pair rows= max_abs_err= min_cos= mean_cos= recall16=
: > "$W/versions"
for C in $CORPORA; do
 DFM_CORPUS=$DFM_CACHE/corpus/$C.jsonl "$PY" tests/ref/encoder_reference.py texts --n "$N" --seed 31 --out "$W/texts.jsonl"
 head -n "$SWEEP_N" "$W/texts.jsonl" > "$W/sweep.jsonl"
 echo "-- corpus $C: $(wc -l < "$W/texts.jsonl") texts"
 for T in $THREADS; do
  export OMP_NUM_THREADS=$T OPENBLAS_NUM_THREADS=$T MKL_NUM_THREADS=$T RAYON_NUM_THREADS=$T
  echo "-- $C, $T thread(s)"
  declare -A BATCH=()
  for p in $PEERS; do
    "$PY" bench/encoder/encoder_peer.py sweep "$p" "$(peer_model "$p")" "$W/sweep.jsonl" "$T" $BATCHES \
      --tokenizer-dir "$MODEL" > "$W/sweep.$p.$T" 2>"$W/err" || { tail -20 "$W/err" >&2; die "peer $p failed (sweep)"; }
    BATCH[$p]=$(sed -n 's/^best_batch=//p' "$W/sweep.$p.$T")
    echo "   $p batch sweep on $SWEEP_N texts (CPU-s): $(sed -n 's/.* batch=\([0-9]*\) .*cpu_seconds=\([0-9.]*\).*/\1:\2/p' "$W/sweep.$p.$T" | tr '\n' ' ')-> batch ${BATCH[$p]}"
  done
  sides=()
  for p in $PRECISIONS; do sides+=("$(side_name "$p")"); done
  sides+=($PEERS)
  for r in $(seq 1 "$ROUNDS"); do
    k=$(( (r - 1) % ${#sides[@]} ))
    order=("${sides[@]:$k}" "${sides[@]:0:$k}")
    line="   round $r:"
    for s in "${order[@]}"; do
      if [[ $s == dfm* ]]; then
        prec=${s#dfm-}; [ "$prec" = dfm ] && prec=fp32
        build/bench/bench_encoder "$MODEL" "$W/texts.jsonl" 1 "$W/$s.$T.f32" "${DFM_BATCH:-0}" "$prec" > "$W/out" 2>"$W/err" ||
          { tail -20 "$W/err" >&2; die "dfm's bench_encoder ($prec) failed"; }
        b=${DFM_BATCH:-default}
      else
        "$PY" bench/encoder/encoder_peer.py run "$s" "$(peer_model "$s")" "$W/texts.jsonl" "$T" 1 "${BATCH[$s]}" \
          --out "$W/$s.$T.f32" --tokenizer-dir "$MODEL" > "$W/out" 2>"$W/err" ||
          { tail -20 "$W/err" >&2; die "peer $s failed"; }
        sed -n "s/^version /$s: /p" "$W/out" >> "$W/versions"
        b=${BATCH[$s]}
      fi
      wall=$(sed -n 's/.* seconds=\([0-9.]*\) cpu_seconds.*/\1/p' "$W/out")
      cpu=$(sed -n 's/.* cpu_seconds=\([0-9.]*\).*/\1/p' "$W/out")
      gf=$(sed -n 's/.* gflop=\([0-9.]*\).*/\1/p' "$W/out")
      blas=$(sed -n 's/.* blas=\([^ ]*\).*/\1/p' "$W/out")
      echo "$C $T $s $r $wall $cpu $b ${gf:-0} ${blas:--}" >> "$W/runs"
      line="$line $s ${cpu} CPU-s (${wall} s wall);"
    done
    echo "$line load $(cut -d' ' -f1 /proc/loadavg)"
  done
  for s in "${sides[@]}"; do
    [ "$s" = dfm ] || echo "$C $T dfm-vs-$s $("$PY" bench/encoder/encoder_peer.py compare "$W/dfm.$T.f32" "$W/$s.$T.f32")" >> "$W/agree"
  done
  [[ " $PEERS " == *" st "* && " $PEERS " == *" ort "* ]] &&
    echo "$C $T ort-vs-st $("$PY" bench/encoder/encoder_peer.py compare "$W/ort.$T.f32" "$W/st.$T.f32")" >> "$W/agree"
 done
done

sort -u "$W/versions" > "$W/versions.u"
MD=$W/encoder_cpu.md
DFM_REV=${DFM_REV:-"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- encoder common 2>/dev/null || echo ' + uncommitted encoder/common edits')"}
"$PY" bench/encoder/encoder_summary.py --runs "$W/runs" --agree "$W/agree" --versions "$W/versions.u" --dfm-rev "$DFM_REV" \
  ${EXPORT_OUT:+--export "$EXPORT_OUT"} --n "$N" --rounds "$ROUNDS" --cpu "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" \
  --flags "$(grep -o -w 'avx512f\|avx512_bf16\|avx512_vnni\|amx_bf16\|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
  --md "$MD" --json "$W/encoder.json"
cat "$MD"
if [ "$RECORD" = 1 ]; then
  mkdir -p bench/results
  cp "$MD" bench/results/encoder_cpu.md
  cp "$W/encoder.json" bench/results/encoder.json
  echo "recorded bench/results/encoder_cpu.md and bench/results/encoder.json"
fi

# ---- optional: peak memory of `dfm encode` (texts mode at N/4 and N; run mode bounded by --window) ----
if [ "${MEMORY:-0}" = 1 ]; then
  DFM=${DFM:-$ROOT/build/dfm}
  for f in quarter full; do
    if [ $f = quarter ]; then head -n $((N / 4)) "$W/texts.jsonl" > "$W/$f.jsonl"; else cp "$W/texts.jsonl" "$W/$f.jsonl"; fi
    /usr/bin/time -f "%M" -o "$W/$f.rss" "$DFM" encode --texts "$W/$f.jsonl" --out "$W/$f.bin" --device cpu \
      --model "$MODEL" >/dev/null 2>&1 || die "dfm encode --texts failed"
    echo "peak RSS, dfm encode --texts, $(wc -l < "$W/$f.jsonl") texts: $(cat "$W/$f.rss") KB"
  done
  for docs in 4 16; do
    head -$docs "$DFM_CORPUS" > "$W/c$docs.jsonl"
    "$DFM" chunk "$W/run$docs" "$W/c$docs.jsonl" --tokenizer "$DFM_TOKENIZER" --seq-len 256 >/dev/null 2>&1
    /usr/bin/time -f "%M" -o "$W/run$docs.rss" "$DFM" encode "$W/run$docs" --device cpu --model "$MODEL" >/dev/null 2>&1
    echo "peak RSS, dfm encode RUN (one rank, --window 4096), $docs documents: $(cat "$W/run$docs.rss") KB"
  done
fi
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
