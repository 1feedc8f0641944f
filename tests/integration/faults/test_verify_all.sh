#!/usr/bin/env bash
# dfm verify checks every stage's files: a flipped bit or a truncation in a chunk shard or an
# embedding block, a damaged index shard and a deleted neighbour block each fail naming the file;
# --stages selects stages; dfm inspect refuses a truncated chunk shard instead of dropping the texts.
source "$(dirname "$0")/../lib.sh"
head -n 6 "$DFM_CORPUS" > "$WORK/corpus.jsonl"
cat > "$WORK/good.json" <<JSON
{"run": "$WORK/good", "inputs": ["$WORK/corpus.jsonl"], "tokenizer": "$DFM_TOKENIZER",
 "chunk": {"seq-len": 256}, "encode": {"device": "cpu", "model": "$DFM_MODEL", "block-chunks": 64},
 "write-targets": {"target-shards": 2}}
JSON
mpirun -np 2 "$DFM" build "$WORK/good.json" > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "build"; }
"$DFM" verify "$WORK/good" > "$WORK/out" || fail "verify of a good run"
for s in chunk encode index retrieve; do grep -q "^verify: $s: .* OK$" "$WORK/out" || { cat "$WORK/out"; fail "verify did not check $s"; }; done
grep -q "^verify: OK " "$WORK/out" || { cat "$WORK/out"; fail "verify did not check the targets"; }
ok "a good run verifies, every stage checked"
"$DFM" verify "$WORK/good" --stages chunk,retrieve > "$WORK/out" || fail "verify --stages chunk,retrieve"
[ "$(grep -c '^verify: ' "$WORK/out")" = 2 ] && grep -q "^verify: chunk:" "$WORK/out" && grep -q "^verify: retrieve:" "$WORK/out" ||
  { cat "$WORK/out"; fail "--stages chunk,retrieve checked other stages"; }
ok "--stages selects"
expect_fail "unknown stage 'tokens'" "$DFM" verify "$WORK/good" --stages chunk,tokens

flip() {  # file offset: xor one bit
  "$DFM_PYTHON" -c "import sys; p, o = sys.argv[1], int(sys.argv[2]); d = bytearray(open(p, 'rb').read()); d[o] ^= 1; open(p, 'wb').write(d)" "$1" "$2"
}
damaged() {  # name what file...: copy the good run to $WORK/name; the caller damages it
  rm -rf "$WORK/$1"; cp -r "$WORK/good" "$WORK/$1"
}
expect_verify_fails() {  # name what needle...
  local run=$WORK/$1 what=$2; shift 2
  if "$DFM" verify "$run" >/dev/null 2>"$WORK/err"; then fail "verify passed on $what"; fi
  for n in "$@"; do grep -qF -- "$n" "$WORK/err" || { cat "$WORK/err"; fail "verify on $what does not name '$n'"; }; done
  ok "$what: $(cut -c1-200 "$WORK/err")"
}

damaged chunkflip; flip "$WORK/chunkflip/chunk/chunks-00001.bin" 3000
expect_verify_fails chunkflip "a flipped bit in a chunk shard" "chunkflip/chunk/chunks-00001.bin" "checksum"
damaged chunktrunc; truncate -s -100 "$WORK/chunktrunc/chunk/chunks-00000.bin"
expect_verify_fails chunktrunc "a truncated chunk shard" "chunktrunc/chunk/chunks-00000.bin" "truncated"
expect_fail "chunktrunc/chunk/chunks-00000.bin" "$DFM" inspect "$WORK/chunktrunc" --chunk 3
damaged embflip; flip "$WORK/embflip/encode/emb-000001.bin" 5000
expect_verify_fails embflip "a flipped bit in an embedding block" "embflip/encode/emb-000001.bin" "checksum"
damaged embtrunc; truncate -s -8 "$WORK/embtrunc/encode/emb-000000.bin"
expect_verify_fails embtrunc "a truncated embedding block" "embtrunc/encode/emb-000000.bin" "truncated"
damaged idxflip; flip "$WORK/idxflip/index/index-00000.faiss" 2000
expect_verify_fails idxflip "a flipped bit in an index shard" "idxflip/index/index-00000.faiss" "checksum"
damaged nbrgone; rm "$WORK/nbrgone/retrieve/nbr-000001.bin"
expect_verify_fails nbrgone "a deleted neighbour block" "nbrgone/retrieve/nbr-000001.bin"
# neighbour blocks of another retrieval: the manifest names another index
damaged otherindex
"$DFM_PYTHON" -c "import json, sys; p = sys.argv[1]; m = json.load(open(p)); m['stages']['retrieve']['index_hash'] = '0123456789abcdef'; json.dump(m, open(p, 'w'))" "$WORK/otherindex/manifest.json"
expect_verify_fails otherindex "neighbour blocks of another index" "otherindex/retrieve/nbr-000000.bin" "index 0123456789abcdef"
# a stage still running is not verified as complete
damaged running
"$DFM_PYTHON" -c "import json, sys; p = sys.argv[1]; m = json.load(open(p)); m['stages']['encode']['state'] = 'running'; json.dump(m, open(p, 'w'))" "$WORK/running/manifest.json"
expect_verify_fails running "a stage recorded running" "stage 'encode'" "not complete"
# only the stages asked for: the chunk damage is not seen by --stages targets
"$DFM" verify "$WORK/chunkflip" --stages targets >/dev/null || fail "--stages targets looked at the chunk shards"
ok "--stages targets checks the targets only"
echo "test_verify_all: all ok"
