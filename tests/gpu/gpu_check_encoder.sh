#!/usr/bin/env bash
# tests/gpu/gpu_check_encoder.sh — the encoder's CUDA path on a real GPU, against the CPU path.
# Prepared in a session without a GPU; run it on a GPU machine from the repository root:
#
#   source tests/gpu/gpu_env.sh; OUT=/some/dir bash tests/gpu/gpu_check_encoder.sh
#
# (on the `run` tool's machine, which has no network and no model: first, here, `bash tests/gpu/gpu_carry.sh &&
# bash tests/gpu/encoder_carry.sh`, then carry [".gpu-carry"]; or `bash tests/gpu/gpu_session.sh encoder`).
#
# 0. the model folder: $DFM_MODEL if set and present, else /var/cache/dfm/models/all-MiniLM-L6-v2, else the
#    carried .gpu-carry/encoder (tests/gpu/encoder_carry.sh: the real weights rounded to fp16, the word-embedding
#    rows of tokens the texts below never use set to zero; unpacked into a temporary folder and checked
#    against its sha256), else, when a folder has the config and tokenizer but no weights (or
#    ENCODER_WEIGHTS=synthetic), a random model of the config's shape (python3 + numpy). Which weights were
#    used is printed and recorded ("weights" in the JSON);
# 1. builds build/dfm (CPU) and build-cuda/dfm (make CUDA=1 BUILD=build-cuda);
# 2. embeds the 344 golden texts (tests/data/encoder/wordpiece.golden.jsonl: real chunks + hard cases) on the
#    CPU (fp32); with carried weights, checks that every token id of these texts has its row carried;
# 3. probes the GPU with one text: no usable CUDA GPU ends the check here, status 2, with the reason;
# 4. embeds them on the GPU with --precision fp32, fp16, bf16 and checks every row: cosine >= 0.99999 (fp32) /
#    >= 0.999 (fp16, bf16), reports max abs errors;
# 5. benchmarks the GPU (fp16, fp32; batch 256, 1024) on GPU_N texts (default 50000: the golden chunk texts
#    repeated; each run takes seconds on an H200) and, if a Python with sentence-transformers and CUDA torch
#    is found: sentence-transformers fp32 on the golden texts vs the CPU rows (cosine >= 0.99999, same
#    weights, loaded offline from the same folder) and its fp16 speed on the same GPU_N texts;
# 6. writes $OUT/gpu_check_encoder.txt and $OUT/gpu_check_encoder.json (plus build_cpu.log, build_cuda.log).
# Exit status: 0 all bounds hold; 1 a bound failed; 2 no model, a build failed, or no usable GPU.
# Every encoder run is limited to STEP_TIMEOUT seconds (default 180). The whole check takes about 2-3 minutes
# on an H200 with 16 cores, most of it the two builds.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/build-cuda/gpu-check}
mkdir -p "$OUT"
LOG=$OUT/gpu_check_encoder.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
DEFAULT_MODEL=${DFM_DEFAULT_MODEL:-/var/cache/dfm/models/all-MiniLM-L6-v2}
CARRIED=$ROOT/.gpu-carry/encoder
GPU_N=${GPU_N:-50000}
JOBS=${JOBS:-$(nproc)}
STEP_TIMEOUT=${STEP_TIMEOUT:-180}
W=$(mktemp -d /tmp/dfm-gpu-enc-XXXXXX)
fail=0
reason=""
T0=$(date +%s)
# the JSON is assembled from the pieces in $W on every exit, early ones included
# shellcheck disable=SC2317  # (called by the EXIT trap)
finish() {
  local rc=$?
  if [ -z "$reason" ]; then if [ "$rc" = 0 ]; then reason="all bounds hold"; else reason="a bound failed"; fi; fi
  python3 - "$W" "$OUT/gpu_check_encoder.json" "$rc" "$reason" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, os, sys
w, out, rc, reason, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
def load(name, dflt=None):
    try: return json.load(open(os.path.join(w, name)))
    except Exception: return dflt
res = {"result": "PASS" if rc == 0 else "FAIL", "exit": rc, "reason": reason, "seconds": secs,
       "weights": load("weights.json"), "correctness": load("cmp.json", {}),
       "sentence_transformers": load("st.json")}
try: res["benchmark"] = [l.rstrip("\n") for l in open(os.path.join(w, "bench.txt"))]
except OSError: res["benchmark"] = []
json.dump(res, open(out, "w"), indent=1)
EOF
  if [ "$rc" = 0 ]; then say "RESULT: PASS ($(( $(date +%s) - T0 ))s)"
  else say "RESULT: FAIL (exit $rc: $reason; $(( $(date +%s) - T0 ))s)"; fi
  rm -rf "$W"
  exit "$rc"
}
trap finish EXIT
stop() { reason=$1; say "FAIL: $1"; exit "${2:-2}"; }

say "== encoder GPU check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi -L 2>&1 | tee -a "$LOG" || say "(nvidia-smi failed or is missing; the CUDA probe below decides)"

# ---- 0. the model folder and its weights -----------------------------------------------------------------
MODEL=""; SRCDIR=""
for d in "${DFM_MODEL:-}" "$DEFAULT_MODEL" "$CARRIED"; do
  [ -n "$d" ] || continue
  if [ -f "$d/config.json" ] && { [ -f "$d/model.safetensors" ] || [ -f "$d/model.safetensors.xz" ]; }; then SRCDIR=$d; break; fi
  [ -n "${DFM_MODEL:-}" ] && [ "$d" = "$DFM_MODEL" ] && say "DFM_MODEL=$DFM_MODEL has no config.json + model.safetensors; looking further"
done
if [ -z "$SRCDIR" ] || [ "${ENCODER_WEIGHTS:-}" = synthetic ]; then   # no weights anywhere: config + tokenizer?
  for d in ${SRCDIR:+"$SRCDIR"} "${DFM_MODEL:-}" "$DEFAULT_MODEL" "$CARRIED"; do
    [ -n "$d" ] && [ -f "$d/config.json" ] && { [ -f "$d/tokenizer.json" ] || [ -f "$d/vocab.txt" ]; } && { SRCDIR=$d; break; }
  done
  [ -n "$SRCDIR" ] || stop "no encoder model: neither \$DFM_MODEL (${DFM_MODEL:-unset}), $DEFAULT_MODEL nor $CARRIED holds config.json and a tokenizer. HINT: run 'bash tests/gpu/encoder_carry.sh' before the GPU session and carry .gpu-carry"
  say "-- synthesizing a random model of the shape of $SRCDIR/config.json"
  PYNP=""
  for p in python3 "${DFM_PYTHON:-}" /var/cache/dfm/venv/bin/python; do
    [ -n "$p" ] && "$p" -c "import numpy" 2>/dev/null && { PYNP=$p; break; }
  done
  [ -n "$PYNP" ] || stop "no Python with numpy to synthesize a model (set DFM_PYTHON)"
  mkdir -p "$W/model"
  (cd "$SRCDIR" && find . -maxdepth 2 -type f ! -name 'model.safetensors*' ! -name encoder_carry.json -size -1024k -print0 |
     xargs -0 -r cp --parents -t "$W/model") || stop "cannot copy $SRCDIR's small files"
  "$PYNP" - "$W/model" <<'EOF' 2>&1 | tee -a "$LOG"
import json, os, struct, sys
import numpy as np
d = sys.argv[1]; c = json.load(open(os.path.join(d, "config.json")))
H, FF, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
P, TV = c.get("max_position_embeddings", 512), c.get("type_vocab_size", 2)
rng = np.random.default_rng(1234)
t = {}
def mat(name, *shape): t[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
def ln(name): t[name + ".weight"] = (1 + rng.standard_normal(H) * 0.02).astype(np.float32); t[name + ".bias"] = (rng.standard_normal(H) * 0.02).astype(np.float32)
mat("embeddings.word_embeddings.weight", V, H); mat("embeddings.position_embeddings.weight", P, H)
mat("embeddings.token_type_embeddings.weight", TV, H); ln("embeddings.LayerNorm")
for l in range(L):
    p = f"encoder.layer.{l}."
    for n in ("query", "key", "value"): mat(p + f"attention.self.{n}.weight", H, H); mat(p + f"attention.self.{n}.bias", H)
    mat(p + "attention.output.dense.weight", H, H); mat(p + "attention.output.dense.bias", H); ln(p + "attention.output.LayerNorm")
    mat(p + "intermediate.dense.weight", FF, H); mat(p + "intermediate.dense.bias", FF)
    mat(p + "output.dense.weight", H, FF); mat(p + "output.dense.bias", H); ln(p + "output.LayerNorm")
mat("pooler.dense.weight", H, H); mat("pooler.dense.bias", H)
hdr, off = {"__metadata__": {"format": "pt", "dfm": "synthetic random weights, seed 1234"}}, 0
for k, a in t.items(): hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}; off += a.nbytes
hj = json.dumps(hdr).encode(); hj += b" " * (-(8 + len(hj)) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(hj)) + hj)
    for a in t.values(): f.write(a.tobytes())
print(f"synthetic model: {sum(a.size for a in t.values())} random fp32 weights (N(0, 0.02), seed 1234)")
EOF
  [ "${PIPESTATUS[0]}" = 0 ] || stop "cannot synthesize a model (python3 with numpy needed)"
  MODEL=$W/model
  WEIGHTS_KIND=synthetic
  WEIGHTS_DESC="SYNTHETIC random fp32 weights (N(0,0.02), seed 1234) in the shape of $SRCDIR/config.json, with its real tokenizer: the check compares CPU and GPU on a model that is not the real one"
elif [ -f "$SRCDIR/model.safetensors" ]; then
  MODEL=$SRCDIR
  WEIGHTS_KIND=full
  WEIGHTS_DESC="the model folder's own weights: $SRCDIR/model.safetensors ($(stat -c %s "$SRCDIR/model.safetensors") bytes)"
else
  say "-- unpacking the carried weights of $SRCDIR"
  mkdir -p "$W/model"
  cp -r "$SRCDIR"/. "$W/model/" || stop "cannot copy $SRCDIR"
  rm -f "$W/model/model.safetensors.xz"
  WEIGHTS_DESC=$(python3 - "$SRCDIR" "$W/model/model.safetensors" 2>"$W/unpack.err" <<'EOF'
import hashlib, json, lzma, sys
info = json.load(open(sys.argv[1] + "/encoder_carry.json"))
b = lzma.decompress(open(sys.argv[1] + "/model.safetensors.xz", "rb").read())
if hashlib.sha256(b).hexdigest() != info["model_sha256"]: sys.exit("sha256 of the unpacked weights differs from encoder_carry.json")
open(sys.argv[2], "wb").write(b)
cmp = info.get("cpu_fp32_vs_full_model") or {}
print(f"CARRIED {info['what']} (source sha256 {info['source_sha256'][:16]}...; measured when carried: dfm CPU fp32 "
      f"vs the full fp32 model on {cmp.get('rows')} texts: min cosine {cmp.get('min_cosine', float('nan')):.7f}, "
      f"max abs error {cmp.get('max_abs_error', float('nan')):.3g})")
EOF
  ) || stop "cannot unpack $SRCDIR/model.safetensors.xz: $(tail -1 "$W/unpack.err")"
  MODEL=$W/model
  WEIGHTS_KIND=carried
fi
say "weights: $WEIGHTS_DESC"
python3 - "$W/weights.json" "$WEIGHTS_KIND" "$WEIGHTS_DESC" "$SRCDIR" <<'EOF'
import json, os, sys
w = {"kind": sys.argv[2], "description": sys.argv[3], "folder": os.path.abspath(sys.argv[4])}
try:
    info = json.load(open(os.path.join(sys.argv[4], "encoder_carry.json")))
    if sys.argv[2] == "carried":
        info.pop("kept_token_ids", None); w["carry"] = info
except OSError: pass
json.dump(w, open(sys.argv[1], "w"), indent=1)
EOF

# ---- 1. builds -------------------------------------------------------------------------------------------
say "-- build (CPU, then CUDA=1)"
make -j"$JOBS" build/dfm > "$OUT/build_cpu.log" 2>&1 || { tail -20 "$OUT/build_cpu.log" | tee -a "$LOG"; stop "CPU build (see build_cpu.log)"; }
make -j"$JOBS" CUDA=1 BUILD=build-cuda build-cuda/dfm > "$OUT/build_cuda.log" 2>&1 || { tail -30 "$OUT/build_cuda.log" | tee -a "$LOG"; stop "CUDA build (see build_cuda.log)"; }
say "builds done ($(( $(date +%s) - T0 ))s)"

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
with open(f"{w}/one.jsonl", "w", encoding="utf-8") as f: f.write(json.dumps({"text": chunks[0]}) + "\n")
EOF

# enc ARGS...: one encoder run, at most STEP_TIMEOUT seconds; prints its last line (the summary or the error)
enc() {
  local o rc
  o=$(timeout "$STEP_TIMEOUT" "$@" --model "$MODEL" 2>&1); rc=$?
  [ $rc = 124 ] && o="$o
TIMEOUT after ${STEP_TIMEOUT}s"
  echo "$o" | tail -1
  return $rc
}

# ---- 2. the CPU reference -------------------------------------------------------------------------------
NG=$(wc -l < "$W/golden.jsonl")
say "-- CPU fp32 reference on $NG texts"
line=$(OMP_NUM_THREADS=$JOBS enc build/dfm encode --texts "$W/golden.jsonl" --out "$W/cpu.bin" --tokens-out "$W/cpu_ids.jsonl" --device cpu)
rc=$?
say "cpu:  $line"
[ $rc = 0 ] || stop "the CPU encoder failed: $line"
if [ "$WEIGHTS_KIND" = carried ]; then
  python3 - "$SRCDIR/encoder_carry.json" "$W/cpu_ids.jsonl" <<'EOF' | tee -a "$LOG"
import json, sys
kept = set(json.load(open(sys.argv[1]))["kept_token_ids"] or [])
used = set()
for l in open(sys.argv[2]): used.update(json.loads(l)["ids"])
miss = sorted(used - kept) if kept else []
print(f"carried vocabulary rows: {len(used)} token ids used by the texts, {len(miss)} not carried" + (f": {miss[:20]}" if miss else ""))
sys.exit(1 if miss else 0)
EOF
  [ "${PIPESTATUS[0]}" = 0 ] || stop "the texts use token ids whose word-embedding rows were not carried (zero). HINT: re-run tests/gpu/encoder_carry.sh (KEEP_TEXTS=...) for these texts"
fi

# ---- 3. is there a GPU? -------------------------------------------------------------------------------------
say "-- CUDA probe (one text)"
probe=$(enc build-cuda/dfm encode --texts "$W/one.jsonl" --out "$W/probe.bin" --device cuda --precision fp32) ||
  stop "the CUDA encoder cannot run one text (no usable GPU, or a CUDA error): $probe"
say "probe: $probe"

# ---- 4. correctness -----------------------------------------------------------------------------------------
say "-- correctness: CPU fp32 vs CUDA fp32 / fp16 / bf16 on $NG texts"
for c in fp32 fp16 bf16; do
  say "cuda $c: $(enc build-cuda/dfm encode --texts "$W/golden.jsonl" --out "$W/cuda_$c.bin" --device cuda --precision $c)"
done
python3 - "$W" "$W/cmp.json" <<'EOF' | tee -a "$LOG"
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
        print(f"FAIL {c}: no output ({e})"); ok = False; res[c] = {"pass": False, "error": str(e)}; continue
    # a non-finite value scores -inf / inf (min() and max() keep the first of NaN and a number)
    cos = [sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b)) for a, b in zip(cpu, g)]
    cos = [c_ if math.isfinite(c_) else -math.inf for c_ in cos] or [-math.inf]
    err = max(abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf for a, b in zip(cpu, g) for x, y in zip(a, b))
    good = len(g) == len(cpu) and min(cos) >= bound
    ok &= good
    res[c] = {"rows": len(g), "min_cosine": min(cos), "max_abs_error": err, "bound": bound, "pass": good}
    print(f"{'PASS' if good else 'FAIL'} cuda {c} vs cpu fp32: {len(g)} rows, min cosine {min(cos):.7f} (bound {bound}), max abs error {err:.3g}")
json.dump(res, open(out, "w"), indent=1)
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || fail=1

# ---- 5. benchmark, sentence-transformers ----------------------------------------------------------------------
say "-- benchmark: $GPU_N chunk texts"
: > "$W/bench.txt"
for c in fp16 fp32; do
  for b in 256 1024; do
    line="cuda $c batch $b: $(enc build-cuda/dfm encode --texts "$W/bench.jsonl" --out "$W/b.bin" --device cuda --precision $c --batch $b)"
    say "$line"; echo "$line" >> "$W/bench.txt"
  done
done
ST_PY=""
for p in "${DFM_PYTHON:-}" /var/cache/dfm/venv/bin/python python3; do
  [ -n "$p" ] && timeout 120 "$p" -c "import sentence_transformers, torch; assert torch.cuda.is_available()" 2>/dev/null && { ST_PY=$p; break; }
done
if [ -n "$ST_PY" ]; then
  say "-- sentence-transformers ($ST_PY) on the same folder, offline"
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 timeout $((STEP_TIMEOUT * 2)) \
    "$ST_PY" - "$MODEL" "$W" <<'EOF' > "$W/st.out" 2>&1
import json, os, struct, sys, time
import numpy as np, torch
import sentence_transformers
from sentence_transformers import SentenceTransformer, models
model_dir, w = sys.argv[1], sys.argv[2]
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
r = {"versions": f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__}"}
try:
    m = SentenceTransformer(model_dir, device="cuda"); r["loaded"] = "the folder (modules.json)"
except Exception as e:   # build it from the same folder: Transformer + mean Pooling + Normalize
    print(f"SentenceTransformer({model_dir}) failed: {e!r}; building Transformer + Pooling + Normalize")
    f = os.path.join(model_dir, "sentence_bert_config.json")
    cfg = json.load(open(f)) if os.path.exists(f) else {}
    t = models.Transformer(model_dir, max_seq_length=cfg.get("max_seq_length", 256))
    m = SentenceTransformer(modules=[t, models.Pooling(t.get_word_embedding_dimension(), pooling_mode="mean"), models.Normalize()], device="cuda")
    r["loaded"] = "models.Transformer + Pooling(mean) + Normalize"
golden = [json.loads(l)["text"] for l in open(f"{w}/golden.jsonl", encoding="utf-8")]
b = open(f"{w}/cpu.bin", "rb").read()
dim, n = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<Q", b, 32)[0]
cpu = np.frombuffer(b, dtype=np.float32, count=dim * n, offset=128).reshape(n, dim).astype(np.float64)
m.float()
e = m.encode(golden, batch_size=64, convert_to_numpy=True, normalize_embeddings=True).astype(np.float64)
cos = (e * cpu).sum(1) / np.sqrt((e * e).sum(1) * (cpu * cpu).sum(1))
bound = 0.99999
r["fp32_vs_dfm_cpu"] = {"rows": int(len(e)), "min_cosine": float(cos.min()), "max_abs_error": float(np.abs(e - cpu).max()),
                        "bound": bound, "pass": bool(len(e) == n and cos.min() >= bound)}
print(f"{'PASS' if r['fp32_vs_dfm_cpu']['pass'] else 'FAIL'} sentence-transformers fp32 (CUDA) vs dfm cpu fp32: {len(e)} rows, "
      f"min cosine {cos.min():.7f} (bound {bound}), max abs error {np.abs(e - cpu).max():.3g}")
texts = [json.loads(l)["text"] for l in open(f"{w}/bench.jsonl", encoding="utf-8")]
m.half()
m.encode(texts[:1024], batch_size=256)
torch.cuda.synchronize(); t0 = time.time()
m.encode(texts, batch_size=256, convert_to_tensor=True)
torch.cuda.synchronize(); dt = time.time() - t0
r["fp16_batch256_texts_per_s"] = len(texts) / dt
print(f"sentence-transformers fp16 batch 256: {len(texts) / dt:.1f} texts/s ({dt:.2f}s, {r['versions']}; loaded {r['loaded']})")
json.dump(r, open(f"{w}/st.json", "w"), indent=1)
EOF
  st_rc=$?
  grep -v -iE 'warn|^\s*$' "$W/st.out" | tail -4 | tee -a "$LOG"
  if [ -f "$W/st.json" ]; then
    python3 -c "import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))['fp32_vs_dfm_cpu']['pass'] else 1)" "$W/st.json" || fail=1
    grep '^sentence-transformers fp16' "$W/st.out" >> "$W/bench.txt"
  else
    say "sentence-transformers run did not finish (exit $st_rc): no comparison, no baseline; its last lines:"
    tail -5 "$W/st.out" | tee -a "$LOG"
  fi
else
  say "sentence-transformers with CUDA torch: not available here; no GPU baseline"
fi
say "(peak dense fp16 tensor TFLOP/s of an H100/H200 SXM is about 990; fp32 non-tensor about 67)"
say "weights: $WEIGHTS_DESC"
[ $fail = 0 ] || reason="a bound failed (see the FAIL lines)"
exit $fail
