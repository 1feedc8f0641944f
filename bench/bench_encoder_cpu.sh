#!/usr/bin/env bash
# bench/bench_encoder_cpu.sh — the CPU encoder (all-MiniLM-L6-v2) against sentence-transformers on
# PyTorch CPU, same real chunk texts, same thread count, side by side in one run; plus achieved GFLOP/s
# against a measured SGEMM peak, and peak memory (RSS) of `dfm encode` at two sizes.
#
#   bash bench/bench_encoder_cpu.sh            N=2000 texts, THREADS=2
#   N=500 THREADS=1 ST_PYTHON=/path/python bash bench/bench_encoder_cpu.sh
#
# ST_PYTHON: a Python that can import sentence_transformers (default: $DFM_PYTHON, then
# /tmp/stvenv/bin/python). Without one, the comparison falls back to the NumPy reference
# (tests/ref/encoder_reference.py) and says so.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
N=${N:-2000}
THREADS=${THREADS:-2}
DFM=${DFM:-$ROOT/build/dfm}
MODEL=${DFM_MODEL:-$DFM_CACHE/models/all-MiniLM-L6-v2}
W=$(mktemp -d /tmp/dfm-bench-enc-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS DFM_PROGRESS=0

echo "== encoder CPU benchmark: $N real chunk texts, $THREADS threads, $(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores visible"
echo "   load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$DFM_PYTHON" tests/ref/encoder_reference.py texts --n "$N" --seed 31 --out "$W/texts.jsonl"

# ---- SGEMM peak: OpenBLAS at THREADS threads, a large square GEMM and the encoder's FFN shape ----
make -s --no-print-directory -C "$ROOT" build/bench/sgemm_peak
read -r PEAK PEAK_FFN < <(build/bench/sgemm_peak "$THREADS")
echo "SGEMM peak (OpenBLAS, $THREADS threads, best of 5): 2048^3 $PEAK GFLOP/s; encoder FFN shape 4096x1536x384 $PEAK_FFN GFLOP/s"

# ---- dfm and the baseline, interleaved ROUNDS times: the machine is shared, so interleaving puts both
# under the same load; medians and per-round ratios are reported, plus texts per CPU-second ----
ST_PYTHON=${ST_PYTHON:-}
if [ -z "$ST_PYTHON" ]; then
  for p in "$DFM_PYTHON" /tmp/stvenv/bin/python; do
    [ -x "$p" ] && "$p" -c "import sentence_transformers" 2>/dev/null && { ST_PYTHON=$p; break; }
  done
fi
cat > "$W/st.py" <<'PYEOF'
import json, sys, time
import torch
n_threads, model, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(n_threads)
from sentence_transformers import SentenceTransformer
texts = [json.loads(l)["text"] for l in open(path, encoding="utf-8")]
m = SentenceTransformer(model, device="cpu")
m.encode(texts[:64], batch_size=64)
with torch.inference_mode():
    t = time.time()
    e = m.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_tensor=True)
    dt = time.time() - t
open(path + ".st.f32", "wb").write(e.float().contiguous().numpy().tobytes())
import sentence_transformers, transformers
print(f"{len(texts) / dt:.1f} {dt:.3f} torch {torch.__version__}, sentence-transformers {sentence_transformers.__version__}, "
      f"transformers {transformers.__version__}, max_seq_length {m.max_seq_length}")
PYEOF
ROUNDS=${ROUNDS:-2}
if [ -n "$ST_PYTHON" ]; then BASE="sentence-transformers (PyTorch CPU, batch 64)"; else
  BASE="NumPy reference (float64; sentence-transformers not importable)"; fi
: > "$W/rates"
BASE_VER=""
for r in $(seq 1 "$ROUNDS"); do
  /usr/bin/time -f "%M %U %S" -o "$W/dfm.time" "$DFM" encode --texts "$W/texts.jsonl" --out "$W/dfm.bin" --device cpu \
    --model "$MODEL" > "$W/dfm.out" 2> "$W/dfm.err" || { cat "$W/dfm.err"; exit 1; }
  DFM_RATE=$(sed -n 's/.* \([0-9.]*\) texts\/s.*/\1/p' "$W/dfm.out")
  DFM_GF=$(sed -n 's/.* \([0-9.]*\) GFLOP\/s.*/\1/p' "$W/dfm.out")
  read -r DFM_RSS DFM_U DFM_S < <(tail -1 "$W/dfm.time")
  if [ -n "$ST_PYTHON" ]; then
    /usr/bin/time -f "%M %U %S" -o "$W/st.time" "$ST_PYTHON" "$W/st.py" "$THREADS" "$MODEL" "$W/texts.jsonl" > "$W/st.out" 2>/dev/null
    read -r BASE_RATE BASE_S BASE_VER < <(tail -1 "$W/st.out")
    read -r _ ST_U ST_S < <(tail -1 "$W/st.time")
  else
    T0=$(date +%s.%N)
    "$DFM_PYTHON" tests/ref/encoder_reference.py embed --texts "$W/texts.jsonl" --out "$W/ref.npy"
    BASE_S=$(echo "$(date +%s.%N) - $T0" | bc); BASE_RATE=$(echo "scale=1; $N / $BASE_S" | bc); ST_U=0; ST_S=0
  fi
  echo "round $r: dfm $DFM_RATE texts/s ($DFM_GF GFLOP/s, cpu ${DFM_U}+${DFM_S}s, peak RSS ${DFM_RSS} KB)," \
       "baseline $BASE_RATE texts/s (cpu ${ST_U}+${ST_S}s), ratio $(echo "scale=2; $DFM_RATE / $BASE_RATE" | bc)x," \
       "load $(cut -d' ' -f1 /proc/loadavg)"
  echo "$DFM_RATE $BASE_RATE $DFM_GF $(echo "$DFM_U + $DFM_S" | bc) $(echo "$ST_U + $ST_S" | bc)" >> "$W/rates"
done
[ -n "$BASE_VER" ] && echo "baseline: $BASE_VER"
if [ -n "$ST_PYTHON" ]; then
  "$DFM_PYTHON" - "$W/dfm.bin" "$W/texts.jsonl.st.f32" <<'PYEOF'
import sys, numpy as np
a = np.frombuffer(open(sys.argv[1], "rb").read()[128:], dtype="<f4").reshape(-1, 384).astype(np.float64)
b = np.frombuffer(open(sys.argv[2], "rb").read(), dtype="<f4").reshape(-1, 384).astype(np.float64)
cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
print(f"dfm vs sentence-transformers on the same {len(a)} texts: max abs error {np.abs(a - b).max():.3g}, min cosine {cos.min():.9f}")
PYEOF
fi
read -r MED_DFM MED_BASE MED_GF MED_DCPU MED_BCPU < <(python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
print(*(statistics.median(c) for c in zip(*rows)))' "$W/rates")
echo
printf '%-58s %12s %14s\n' "encoder ($N texts, $THREADS threads, median of $ROUNDS)" "texts/s" "texts/CPU-s"
printf '%-58s %12s %14s\n' "dfm encode --device cpu (OpenBLAS + OpenMP, fp32)" "$MED_DFM" "$(echo "scale=1; $N / $MED_DCPU" | bc)"
BCPU="-"; [ "$(echo "$MED_BCPU > 0" | bc)" = 1 ] && BCPU=$(echo "scale=1; $N / $MED_BCPU" | bc)
printf '%-58s %12s %14s\n' "$BASE" "$MED_BASE" "$BCPU"
echo "ratio dfm / baseline (medians): $(echo "scale=2; $MED_DFM / $MED_BASE" | bc)x wall-clock" \
     "$([ "$BCPU" != - ] && echo "; $(echo "scale=2; $MED_BCPU / $MED_DCPU" | bc)x per CPU-second")"
echo "dfm achieved $MED_GF GFLOP/s = $(echo "scale=0; 100 * $MED_GF / $PEAK" | bc)% of the measured SGEMM peak ($PEAK GFLOP/s)"
R2=$DFM_RSS

# ---- peak memory: --texts mode at N/4 and N, and run mode (bounded by --window, not by N) ----
head -n $((N / 4)) "$W/texts.jsonl" > "$W/quarter.jsonl"
/usr/bin/time -f "%M" -o "$W/q.rss" "$DFM" encode --texts "$W/quarter.jsonl" --out "$W/q.bin" --device cpu --model "$MODEL" >/dev/null 2>&1
R1=$(cat "$W/q.rss")
echo "peak RSS, dfm encode --texts: $((N / 4)) texts ${R1} KB, $N texts ${R2} KB; slope $(echo "scale=2; ($R2 - $R1) / ($N - $N / 4)" | bc) KB/text (texts and vectors held whole in this mode)"
for docs in 4 16; do
  head -$docs "$DFM_CORPUS" > "$W/c$docs.jsonl"
  "$DFM" chunk "$W/run$docs" "$W/c$docs.jsonl" --tokenizer "$DFM_TOKENIZER" --seq-len 256 >/dev/null 2>&1
  /usr/bin/time -f "%M" -o "$W/run$docs.rss" "$DFM" encode "$W/run$docs" --device cpu --model "$MODEL" >/dev/null 2>&1
  n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stages']['encode']['counts']['chunks'])" "$W/run$docs/manifest.json")
  echo "peak RSS, dfm encode RUN (one rank, --window 4096): $n chunks $(cat "$W/run$docs.rss") KB"
done
echo "   load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
