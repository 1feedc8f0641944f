#!/usr/bin/env bash
# tests/gpu/encoder_carry.sh — put into .gpu-carry/encoder/ (git-ignored) what tests/gpu/gpu_check_encoder.sh
# needs of the encoder model on a GPU machine that has no copy of it and no network. Run it HERE, after
# tests/gpu/gpu_carry.sh (which replaces the whole .gpu-carry/ folder, this one included):
#
#   bash tests/gpu/gpu_carry.sh && bash tests/gpu/encoder_carry.sh      # then the run tool's carry [".gpu-carry"]
#
# The model folder ($DFM_MODEL, default /var/cache/dfm/models/all-MiniLM-L6-v2) holds 90.9 MB of fp32
# weights; with the ~23 MiB of libraries and the ~4 MB of tracked files, not even an fp16 copy (45.4 MB,
# 38.7 MB xz-compressed) leaves room under the 64 MiB that travels. So what travels is:
#   - the small files the encoder and sentence-transformers read: config.json, tokenizer.json, vocab.txt,
#     tokenizer_config.json, special_tokens_map.json, sentence_bert_config.json, modules.json,
#     config_sentence_transformers.json and every module folder modules.json names (1_Pooling/config.json);
#   - model.safetensors.xz: the REAL weights rounded to fp16 (F16 tensors, which encoder/ reads as fp32;
#     integer tensors unchanged), in which the rows of embeddings.word_embeddings.weight of the tokens
#     that no text of the check uses are set to zero. A zero row is only ever read for a token that
#     occurs in the input, so for the check's texts (the 344 golden texts of
#     tests/data/encoder/wordpiece.golden.jsonl; the benchmark repeats its chunk texts) the embeddings
#     are exactly those of the fp16-rounded model. The kept token ids are listed in encoder_carry.json and
#     the check refuses texts that use any other. 21.5 MB (20.5 MiB); 2404 of 30522 rows are kept.
#   - encoder_carry.json: provenance (source folder and its sha256, what was done, the kept ids, the
#     sha256 of the uncompressed file) and, measured here on the CPU, how far the carried weights move
#     the golden texts' embeddings from the full fp32 model's (min cosine, max abs error).
# The check unpacks it into a temporary folder (never into .gpu-carry/, whose size is what travels).
#
# Options:  --full-vocab   keep every row (fp16, ~37 MiB compressed: does not fit next to the libraries)
#           --no-weights   only the small files: the check then synthesizes a random model of the same
#                          shape (python3 + numpy on the GPU machine)
# Environment: DFM_MODEL (source folder), KEEP_TEXTS (colon-separated JSONL files with a "text" field
#   whose tokens are kept too), DFM_PYTHON (a Python with numpy; default the cache's venv, then python3),
#   DFM (default build/dfm, made with 'make build/dfm' if missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
SRC=${DFM_MODEL:-/var/cache/dfm/models/all-MiniLM-L6-v2}
C=$ROOT/.gpu-carry/encoder
DFM=${DFM:-build/dfm}
GOLDEN=tests/data/encoder/wordpiece.golden.jsonl
LIMIT_MIB=64
MODE=pruned
for a in "$@"; do
  case $a in
    --full-vocab) MODE=full ;;
    --no-weights) MODE=none ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "encoder_carry: unknown option $a (--full-vocab, --no-weights)" >&2; exit 2 ;;
  esac
done
die() { echo "encoder_carry: ERROR: $*" >&2; exit 1; }
say() { echo "encoder_carry: $*"; }

for f in config.json model.safetensors; do
  [ -f "$SRC/$f" ] || die "$SRC/$f not found (set DFM_MODEL to the encoder model folder; 'make deps' fetches the default)"
done
[ -f "$SRC/tokenizer.json" ] || [ -f "$SRC/vocab.txt" ] || die "$SRC has neither tokenizer.json nor vocab.txt"
PY=""
for p in "${DFM_PYTHON:-}" /var/cache/dfm/venv/bin/python python3; do
  [ -n "$p" ] && "$p" -c "import numpy" 2>/dev/null && { PY=$p; break; }
done
[ -n "$PY" ] || die "no Python with numpy (set DFM_PYTHON; 'make deps' makes the venv)"
[ -f .gpu-carry/manifest.tsv ] || say "note: no .gpu-carry/manifest.tsv yet: run tests/gpu/gpu_carry.sh FIRST (it replaces .gpu-carry/ whole)"

# .gpu-carry/ must stay git-ignored (an unignored folder would travel with every run, and be committed)
EXCL=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
case $EXCL in /*) ;; *) EXCL=$ROOT/$EXCL ;; esac
mkdir -p "$(dirname "$EXCL")"
grep -qxF /.gpu-carry/ "$EXCL" 2>/dev/null || echo /.gpu-carry/ >>"$EXCL"
mkdir -p .gpu-carry
git check-ignore -q .gpu-carry/encoder/config.json 2>/dev/null || die ".gpu-carry/ is not ignored by git (add /.gpu-carry/ to $EXCL)"

T=$(mktemp -d /tmp/dfm-encoder-carry-XXXXXX)
trap 'rm -rf "$T" "$C.tmp"' EXIT
rm -rf "$C.tmp"; mkdir -p "$C.tmp"

# ---- the small files ---------------------------------------------------------------------------------
for f in config.json tokenizer.json vocab.txt tokenizer_config.json special_tokens_map.json sentence_bert_config.json \
         modules.json config_sentence_transformers.json; do
  if [ -f "$SRC/$f" ]; then cp "$SRC/$f" "$C.tmp/"; fi
done
if [ -f "$SRC/modules.json" ]; then   # module folders (1_Pooling, ...): their small config files
  for d in $(python3 -c 'import json,sys; print(" ".join(m.get("path","") for m in json.load(open(sys.argv[1])) if m.get("path")))' "$SRC/modules.json"); do
    [ -d "$SRC/$d" ] || continue
    mkdir -p "$C.tmp/$d"
    find "$SRC/$d" -maxdepth 1 -type f -size -1024k -exec cp {} "$C.tmp/$d/" \;
  done
fi

# ---- the weights ---------------------------------------------------------------------------------------
if [ $MODE != none ]; then
  [ -x "$DFM" ] || make -j2 "$DFM" >/dev/null || die "cannot build $DFM"
  # the check's texts, built exactly as tests/gpu/gpu_check_encoder.sh builds them, and any KEEP_TEXTS
  python3 - "$GOLDEN" "$T/golden.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")][1:]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for r in rows: f.write(json.dumps({"text": r["text"]}, ensure_ascii=False) + "\n")
EOF
  texts=("$T/golden.jsonl")
  IFS=: read -r -a extra <<<"${KEEP_TEXTS:-}"
  for f in "${extra[@]}"; do
    [ -n "$f" ] || continue
    [ -f "$f" ] || die "KEEP_TEXTS: $f not found"
    texts+=("$f")
  done
  i=0
  for f in "${texts[@]}"; do
    say "tokenizing (and embedding, full fp32 model, CPU) $f"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$DFM" encode --texts "$f" --out "$T/full$i.bin" --tokens-out "$T/ids$i.jsonl" \
      --model "$SRC" --device cpu >"$T/enc.log" 2>&1 || { tail -5 "$T/enc.log" >&2; die "$DFM encode failed on $f"; }
    i=$((i + 1))
  done
  say "writing fp16 weights ($MODE vocabulary) and compressing them (xz; about a minute)"
  "$PY" - "$SRC" "$C.tmp" "$MODE" "$GOLDEN" "${texts[*]}" "$T"/ids*.jsonl <<'EOF'
import hashlib, json, lzma, os, struct, sys
import numpy as np
src, dst, mode, golden, texts, idfiles = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
path = os.path.join(src, "model.safetensors")
raw = open(path, "rb").read()
n = struct.unpack_from("<Q", raw, 0)[0]
hdr = json.loads(raw[8:8 + n])
data = memoryview(raw)[8 + n:]
meta = hdr.pop("__metadata__", {}) or {}
cfg = json.load(open(os.path.join(src, "config.json")))
V = cfg["vocab_size"]
keep = {0, 100, 101, 102, 103}   # [PAD] [UNK] [CLS] [SEP] [MASK]
for f in idfiles:
    for l in open(f):
        keep.update(json.loads(l)["ids"])
keep = sorted(i for i in keep if 0 <= i < V)
wte = [k for k in hdr if k.endswith("embeddings.word_embeddings.weight")]
if len(wte) != 1: sys.exit(f"expected one word_embeddings tensor, found {wte}")
np_dt = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}
out, names = {}, sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
worst = 0.0
for k in names:
    v = hdr[k]; s, e = v["data_offsets"]
    if v["dtype"] in ("F32", "F16"):
        a = np.frombuffer(data[s:e], dtype=np_dt[v["dtype"]]).reshape(v["shape"]).astype(np.float32)
        h = a.astype(np.float16)
        if not np.isfinite(h).all(): sys.exit(f"{k}: values beyond the fp16 range")
        worst = max(worst, float(np.abs(h.astype(np.float32) - a).max()) if a.size else 0.0)
        if k == wte[0] and mode == "pruned":
            mask = np.ones(a.shape[0], bool); mask[keep] = False; h[mask] = 0
        out[k] = ("F16", v["shape"], h.tobytes())
    else:   # integer buffers (position_ids) as they are
        out[k] = (v["dtype"], v["shape"], bytes(data[s:e]))
# wider dtypes first, so every tensor starts at a multiple of its element size
order = sorted(out, key=lambda k: (out[k][0] == "F16", names.index(k)))
h2, off = {}, 0
for k in order:
    dt, shape, b = out[k]; h2[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}; off += len(b)
src_sha = hashlib.sha256(raw).hexdigest()
what = "fp16 rounding of every float tensor" + (
    f"; embeddings.word_embeddings.weight rows zeroed except the {len(keep)} token ids of encoder_carry.json"
    if mode == "pruned" else "")
h2["__metadata__"] = dict({k: str(v) for k, v in meta.items()}, dfm_source_sha256=src_sha, dfm_carry=what)
hj = json.dumps(h2, separators=(",", ":")).encode()
hj += b" " * (-(8 + len(hj)) % 8)
blob = struct.pack("<Q", len(hj)) + hj + b"".join(out[k][2] for k in order)
sha = hashlib.sha256(blob).hexdigest()
xz = lzma.compress(blob, preset=6)
open(os.path.join(dst, "model.safetensors.xz"), "wb").write(xz)
info = {
    "what": "weights of " + os.path.basename(os.path.normpath(src)) + ": " + what,
    "source": os.path.abspath(src), "source_sha256": src_sha, "source_bytes": len(raw),
    "dtype": "F16", "vocab": mode,
    "texts": ["the %d golden texts of %s" % (sum(1 for _ in open(golden)) - 1, golden)] + texts.split()[1:],
    "kept_token_ids": keep if mode == "pruned" else None, "n_kept": len(keep) if mode == "pruned" else V,
    "vocab_size": V, "max_abs_fp16_rounding": worst,
    "model_sha256": sha, "model_bytes": len(blob), "xz_bytes": len(xz),
}
json.dump(info, open(os.path.join(dst, "encoder_carry.json"), "w"), indent=1)
print(f"encoder_carry: {len(blob)} bytes fp16 safetensors -> {len(xz)} bytes xz; "
      f"{info['n_kept']} of {V} vocabulary rows; largest fp16 rounding {worst:.3g}")
EOF

  # ---- check it: unpack as the GPU check does, embed the texts on the CPU, compare with the full model
  mkdir -p "$T/model"
  cp -r "$C.tmp"/. "$T/model/"
  rm -f "$T/model/model.safetensors.xz"
  python3 - "$C.tmp" "$T/model/model.safetensors" <<'EOF'
import hashlib, json, lzma, sys
info = json.load(open(sys.argv[1] + "/encoder_carry.json"))
b = lzma.decompress(open(sys.argv[1] + "/model.safetensors.xz", "rb").read())
if hashlib.sha256(b).hexdigest() != info["model_sha256"]: sys.exit("encoder_carry: unpacked weights: sha256 mismatch")
open(sys.argv[2], "wb").write(b)
EOF
  i=0
  for f in "${texts[@]}"; do
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$DFM" encode --texts "$f" --out "$T/carried$i.bin" --model "$T/model" \
      --device cpu >"$T/enc.log" 2>&1 || { tail -5 "$T/enc.log" >&2; die "$DFM encode with the carried weights failed"; }
    i=$((i + 1))
  done
  "$PY" - "$C.tmp/encoder_carry.json" "$T" "$i" <<'EOF'
import json, struct, sys
import numpy as np
info_path, t, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(p):
    b = open(p, "rb").read()
    dim, n = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<Q", b, 32)[0]
    return np.frombuffer(b, dtype=np.float32, count=dim * n, offset=128).reshape(n, dim).astype(np.float64)
a = np.concatenate([rows(f"{t}/full{i}.bin") for i in range(k)])
b = np.concatenate([rows(f"{t}/carried{i}.bin") for i in range(k)])
cos = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
r = {"rows": int(len(a)), "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
     "max_abs_error": float(np.abs(a - b).max()),
     "note": "dfm CPU fp32, carried weights vs the full fp32 model, on the texts above"}
info = json.load(open(info_path)); info["cpu_fp32_vs_full_model"] = r
json.dump(info, open(info_path, "w"), indent=1)
print(f"encoder_carry: CPU fp32 embeddings, carried vs full model, {r['rows']} texts: min cosine "
      f"{r['min_cosine']:.7f}, mean cosine {r['mean_cosine']:.7f}, max abs error {r['max_abs_error']:.3g}")
EOF
else
  python3 - "$C.tmp/encoder_carry.json" "$SRC" <<'EOF'
import json, os, sys
json.dump({"what": "no weights: the check synthesizes a random model of this config's shape",
           "source": os.path.abspath(sys.argv[2]), "vocab": "none"}, open(sys.argv[1], "w"), indent=1)
EOF
fi

rm -rf "$C"; mv "$C.tmp" "$C"

# ---- what travels: tracked and untracked-not-ignored files, plus .gpu-carry/ ---------------------------
sum_sizes() { xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
tree_b=$(git ls-files -z -c -o --exclude-standard | sum_sizes)
enc_b=$(find "$C" -type f -print0 | sum_sizes)
carry_b=$(find .gpu-carry -type f -print0 | sum_sizes)
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
total=$((tree_b + carry_b))
say "$C: $(mib "$enc_b") ($MODE weights)"
say "travels: working tree $(mib "$tree_b") + .gpu-carry/ $(mib "$carry_b") = $(mib "$total") of $LIMIT_MIB MiB"
[ "$total" -lt $((LIMIT_MIB * 1048576 - 4 * 1048576)) ] ||
  { echo "encoder_carry: WARNING: less than 4 MiB left under the $LIMIT_MIB MiB limit; use the default (pruned) or --no-weights" >&2; }
say "on the GPU machine (carry [\".gpu-carry\"]): source tests/gpu/gpu_env.sh; OUT=\$OUT bash tests/gpu/gpu_check_encoder.sh"
