#!/usr/bin/env bash
# `dfm encode` after `dfm chunk` on a small corpus: the embedding blocks are byte-identical at 1, 2 and 3
# ranks; the manifest records counts, outputs, block_chunks, dim, dtype and the model; a re-run keeps
# finished blocks and redoes a missing or corrupt one with the same bytes; fp16 output differs from
# fp32 only by rounding; the compute precision is recorded and a stage is never continued in another one;
# bad options and a missing chunk stage are refused clearly.
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1
M=${DFM_MODEL:-/var/cache/dfm/models/all-MiniLM-L6-v2}
head -6 "$DFM_CORPUS" > "$WORK/small.jsonl"
printf '{"text": "<|endoftext|>"}\n' >> "$WORK/small.jsonl"   # a document that decodes to nothing
"$DFM" chunk "$WORK/base" "$WORK/small.jsonl" --tokenizer "$DFM_TOKENIZER" --seq-len 128 --doc-aligned >/dev/null
N=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stages']['chunk']['counts']['chunks'])" "$WORK/base/manifest.json")
[ "$N" -gt 150 ] || fail "expected a few hundred chunks, got $N"
ok "chunked: $N chunks"

E() { "$DFM" encode "$@" --device cpu --model "$M" --block-chunks 64 --window 48; }
for np in 1 2 3 4; do
  cp -r "$WORK/base" "$WORK/np$np"
  mpirun -np $np "$DFM" encode "$WORK/np$np" --device cpu --model "$M" --block-chunks 64 --window 48 \
    > "$WORK/np$np.log" 2>&1 || { cat "$WORK/np$np.log"; fail "encode at np $np"; }
done
nb=$(( (N + 63) / 64 ))
[ "$(ls "$WORK/np1/encode" | grep -c '^emb-.*\.bin$')" = $nb ] || fail "expected $nb block files"
for np in 2 3 4; do
  for f in "$WORK"/np1/encode/emb-*.bin; do
    cmp "$f" "$WORK/np$np/encode/$(basename "$f")" || fail "block $(basename "$f") differs between np 1 and np $np"
  done
done
ok "$nb blocks identical at np 1, 2, 3, 4"

python3 - "$WORK/np3/manifest.json" "$N" <<'EOF' || fail "manifest encode stage"
import json, sys
m = json.load(open(sys.argv[1]))["stages"]["encode"]; n = int(sys.argv[2])
assert m["state"] == "complete" and m["ranks"] == 3, m["state"]
assert m["dim"] == 384 and m["dtype"] == "fp32" and m["block_chunks"] == 64
assert m["precision"] == "fp32" and m["config"]["precision"] == "fp32", (m.get("precision"), m["config"])
assert m["counts"]["chunks"] == n and m["counts"]["encoded"] == n
assert m["counts"]["empty"] >= 1, m["counts"]          # the <|endoftext|>-only document
assert sum(o["n_rows"] for o in m["outputs"]) == n
assert [o["first_chunk"] for o in m["outputs"]] == list(range(0, n, 64))
assert len(m["model"]["hash"]) == 16 and m["timings"]["total_s"] > 0
print("manifest ok:", m["counts"])
EOF

# the rows are unit vectors, and each chunk's row is the encoding of its decoded text
python3 - "$WORK/np1/encode/emb-000000.bin" <<'EOF' || fail "block contents"
import struct, sys
import math
b = open(sys.argv[1], "rb").read()
dim, n = struct.unpack_from("<I", b, 16)[0], struct.unpack_from("<Q", b, 32)[0]
for r in range(n):
    v = struct.unpack_from("<%df" % dim, b, 128 + 4 * dim * r)
    assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4, r
print("unit rows:", n)
EOF

# resume: nothing to do; then a deleted and a corrupted block are redone with identical bytes
out=$(E "$WORK/np2" 2>&1)
grep -q "nothing to do" <<<"$out" || fail "re-run of a complete stage should do nothing: $out"
cp "$WORK/np1/encode/emb-000001.bin" "$WORK/keep1.bin"
rm "$WORK/np2/encode/emb-000001.bin"
printf 'X' | dd of="$WORK/np2/encode/emb-000002.bin" bs=1 seek=300 conv=notrunc 2>/dev/null
python3 - "$WORK/np2/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["stages"]["encode"]["state"] = "running"; json.dump(m, open(sys.argv[1], "w"))
EOF
out=$(mpirun -np 2 "$DFM" encode "$WORK/np2" --device cpu --model "$M" --block-chunks 64 --window 48 2>&1) || fail "resume: $out"
grep -q "blocks ($((nb - 2)) kept)" <<<"$out" || fail "resume should keep $((nb - 2)) blocks: $out"
for f in "$WORK"/np1/encode/emb-*.bin; do cmp "$f" "$WORK/np2/encode/$(basename "$f")" || fail "resumed $(basename "$f") differs"; done
ok "resume kept $((nb - 2)) blocks, redid 2 with identical bytes"

# fp16 storage: half the bytes, same vectors to fp16 rounding
cp -r "$WORK/base" "$WORK/h"
E "$WORK/h" --dtype fp16 >/dev/null 2>&1 || fail "fp16 encode"
python3 - "$WORK/np1/encode/emb-000000.bin" "$WORK/h/encode/emb-000000.bin" <<'EOF' || fail "fp16 vs fp32"
import math, struct, sys
a, h = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
assert struct.unpack_from("<I", h, 20)[0] == 1 and len(h) - 128 == (len(a) - 128) // 2
fa = struct.unpack_from("<%df" % ((len(a) - 128) // 4), a, 128)
fh = struct.unpack_from("<%de" % ((len(h) - 128) // 2), h, 128)
err = max(abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf for x, y in zip(fa, fh))
assert err < 1e-3, err
print("fp16 max abs difference", err)
EOF

# the precision is part of the stage contract: a complete or interrupted fp32 stage is not continued in
# another precision (no run mixes them); --force re-encodes every block in the new one
expect_fail "precision" E "$WORK/np2" --precision bf16
python3 - "$WORK/np2/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["stages"]["encode"]["state"] = "running"; json.dump(m, open(sys.argv[1], "w"))
EOF
expect_fail "precision" E "$WORK/np2" --precision int8
for f in "$WORK"/np1/encode/emb-*.bin; do cmp "$f" "$WORK/np2/encode/$(basename "$f")" || fail "a refused resume changed $(basename "$f")"; done
if grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo; then
  E "$WORK/np2" --precision int8 --force >/dev/null 2>&1 || fail "int8 encode with --force"
  python3 - "$WORK/np2/manifest.json" "$WORK/np1/encode/emb-000000.bin" "$WORK/np2/encode/emb-000000.bin" <<'EOF' || fail "int8 stage"
import json, math, struct, sys
m = json.load(open(sys.argv[1]))["stages"]["encode"]
assert m["precision"] == "int8" and m["config"]["precision"] == "int8" and "cpu int8" in m["model"]["describe"], m
a, b = open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
n, dim = struct.unpack_from("<Q", a, 32)[0], struct.unpack_from("<I", a, 16)[0]
cos = [sum(x * y for x, y in zip(struct.unpack_from("<%df" % dim, a, 128 + 4 * dim * r),
                                  struct.unpack_from("<%df" % dim, b, 128 + 4 * dim * r))) for r in range(n)]
assert a != b and min(cos) > 0.99, min(cos)
print("int8 stage: min cosine to fp32 %.4f over %d rows" % (min(cos), n))
EOF
  expect_fail "precision" E "$WORK/np2"
  ok "the precision is in the stage contract: fp32 <-> int8 refused without --force, recorded in the manifest"
else
  expect_fail "needs AVX-512" E "$WORK/np2" --precision int8 --force
  ok "the precision is in the stage contract (int8 refused on this CPU: no avx512_vnni)"
fi

# refusals
expect_fail "--dtype fp8" E "$WORK/np1" --dtype fp8
expect_fail "no fp16 path" E "$WORK/np1" --precision fp16 --force
expect_fail "built without CUDA" "$DFM" encode "$WORK/np1" --device cuda --model "$M"
mkdir -p "$WORK/empty"
expect_fail "manifest.json" E "$WORK/empty"
expect_fail "config.json" "$DFM" encode "$WORK/np1" --device cpu --model "$WORK/nomodel" --force
OTHER=$(dirname "$(dirname "$DFM_TOKENIZER")")/llama-3.2/tokenizer.json
[ -f "$OTHER" ] && expect_fail "is not the one that made the chunks" E "$WORK/np1" --force --tokenizer "$OTHER"
echo "PASS"
