#!/usr/bin/env bash
# scripts/gpu_check_encoder.sh — the encoder's CUDA path on a real GPU, against the CPU path.
# Prepared in a session without a GPU; run it on a GPU machine from the repository root:
#
#   OUT=/some/dir bash scripts/gpu_check_encoder.sh
#
# 1. builds build/dfm (CPU) and build-cuda/dfm (make CUDA=1 BUILD=build-cuda);
# 2. embeds the 344 golden texts (tests/data/encoder/wordpiece.golden.jsonl: real chunks + hard cases)
#    on the CPU (fp32) and on the GPU with --compute fp32, fp16, bf16;
# 3. checks every row: cosine >= 0.99999 (fp32) / >= 0.999 (fp16, bf16), and reports max abs errors;
# 4. benchmarks the GPU (fp16, fp32) on GPU_N texts (default 50000; the golden chunk texts repeated)
#    and, if a Python with sentence-transformers and CUDA torch is found, sentence-transformers fp16
#    on the same texts; prints texts/s, the ratio, achieved TFLOP/s;
# 5. writes everything to $OUT/gpu_check_encoder.txt and $OUT/gpu_check_encoder.json.
# Exit status non-zero if the build or any bound fails. Needs the model folder ($DFM_MODEL, default
# /var/cache/dfm/models/all-MiniLM-L6-v2) and python3 (standard library only; numpy if present).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build-cuda/gpu-check}
mkdir -p "$OUT"
LOG=$OUT/gpu_check_encoder.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
MODEL=${DFM_MODEL:-/var/cache/dfm/models/all-MiniLM-L6-v2}
GPU_N=${GPU_N:-50000}
JOBS=${JOBS:-$(nproc)}
W=$(mktemp -d /tmp/dfm-gpu-enc-XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0

say "== encoder GPU check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi -L 2>&1 | tee -a "$LOG"
[ -f "$MODEL/model.safetensors" ] || { say "FAIL: model folder $MODEL not found (set DFM_MODEL)"; exit 2; }

say "-- build (CPU, then CUDA=1)"
make -j"$JOBS" build/dfm > "$OUT/build_cpu.log" 2>&1 || { say "FAIL: CPU build (see build_cpu.log)"; tail -20 "$OUT/build_cpu.log" | tee -a "$LOG"; exit 2; }
make -j"$JOBS" CUDA=1 BUILD=build-cuda build-cuda/dfm > "$OUT/build_cuda.log" 2>&1 || { say "FAIL: CUDA build (see build_cuda.log)"; tail -30 "$OUT/build_cuda.log" | tee -a "$LOG"; exit 2; }

python3 - "$W" "$GPU_N" <<'EOF'
import json, sys
w, n = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open("tests/data/encoder/wordpiece.golden.jsonl", encoding="utf-8")][1:]
texts = [r["text"] for r in rows]
with open(f"{w}/golden.jsonl", "w", encoding="utf-8") as f:
    for t in texts: f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
chunks = [r["text"] for r in rows if r["name"].startswith("chunk/")]
with open(f"{w}/bench.jsonl", "w", encoding="utf-8") as f:
    for i in range(n): f.write(json.dumps({"text": chunks[i % len(chunks)]}, ensure_ascii=False) + "\n")
EOF

enc() { "$@" --model "$MODEL" 2>&1 | tail -1; }
say "-- correctness: CPU fp32 vs CUDA fp32 / fp16 / bf16 on $(wc -l < "$W/golden.jsonl") texts"
say "cpu:  $(OMP_NUM_THREADS=$JOBS enc build/dfm encode --texts "$W/golden.jsonl" --out "$W/cpu.bin" --device cpu)"
for c in fp32 fp16 bf16; do
  say "cuda $c: $(enc build-cuda/dfm encode --texts "$W/golden.jsonl" --out "$W/cuda_$c.bin" --device cuda --compute $c)"
done
python3 - "$W" "$OUT/gpu_check_encoder.json" <<'EOF' | tee -a "$LOG"
import json, math, struct, sys
w, out = sys.argv[1], sys.argv[2]
def rows(p):
    b = open(p, "rb").read()
    dim, n = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<Q", b, 32)[0]
    v = struct.unpack_from("<%df" % (dim * n), b, 128)
    return [v[i * dim:(i + 1) * dim] for i in range(n)]
cpu = rows(f"{w}/cpu.bin")
res, ok = {}, True
for c, bound in (("fp32", 0.99999), ("fp16", 0.999), ("bf16", 0.999)):
    try: g = rows(f"{w}/cuda_{c}.bin")
    except Exception as e:
        print(f"FAIL {c}: no output ({e})"); ok = False; continue
    cos = [sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)) for a, b in zip(cpu, g)]
    err = max(abs(x - y) for a, b in zip(cpu, g) for x, y in zip(a, b))
    good = len(g) == len(cpu) and min(cos) >= bound
    ok &= good
    res[c] = {"rows": len(g), "min_cosine": min(cos), "max_abs_error": err, "bound": bound, "pass": good}
    print(f"{'PASS' if good else 'FAIL'} cuda {c} vs cpu fp32: {len(g)} rows, min cosine {min(cos):.7f} (bound {bound}), max abs error {err:.3g}")
json.dump(res, open(out, "w"), indent=1)
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || fail=1

say "-- benchmark: $GPU_N chunk texts"
for c in fp16 fp32; do
  for b in 256 1024; do
    say "cuda $c batch $b: $(enc build-cuda/dfm encode --texts "$W/bench.jsonl" --out "$W/b.bin" --device cuda --compute $c --batch $b)"
  done
done
ST_PY=""
for p in "${DFM_PYTHON:-}" /var/cache/dfm/venv/bin/python python3; do
  [ -n "$p" ] && "$p" -c "import sentence_transformers, torch; assert torch.cuda.is_available()" 2>/dev/null && { ST_PY=$p; break; }
done
if [ -n "$ST_PY" ]; then
  "$ST_PY" - "$MODEL" "$W/bench.jsonl" <<'EOF' 2>/dev/null | tail -1 | tee -a "$LOG"
import json, sys, time, torch
from sentence_transformers import SentenceTransformer
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
m = SentenceTransformer(sys.argv[1], device="cuda").half()
m.encode(texts[:1024], batch_size=256)
torch.cuda.synchronize(); t = time.time()
m.encode(texts, batch_size=256, convert_to_tensor=True)
torch.cuda.synchronize(); dt = time.time() - t
print(f"sentence-transformers fp16 batch 256: {len(texts) / dt:.1f} texts/s ({dt:.2f}s, torch {torch.__version__})")
EOF
else
  say "sentence-transformers with CUDA torch: not available here; no GPU baseline"
fi
say "(peak dense fp16 tensor TFLOP/s of an H100/H200 SXM is about 990; fp32 non-tensor about 67)"
[ $fail = 0 ] && say "RESULT: PASS" || say "RESULT: FAIL"
exit $fail
