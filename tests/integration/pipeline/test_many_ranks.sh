#!/usr/bin/env bash
# The whole pipeline (dfm build: chunk, encode, index, retrieve, write-targets) at np = 1, 2, 4, 8 and 16
# (oversubscribed) gives the same records:
#  1. 3 documents, 96 chunks, 12 embedding blocks, 3 target shards: at np = 8 and 16 there are more ranks
#     than documents, and at 16 more ranks than blocks, sequences' worth of input and target shards:
#     ranks that read no input, own no chunk shard rows, encode no block and write no target shard;
#     The same with an IVF index (IVF2,Flat: trained once on a sample gathered from every rank, most of
#     which hold no vector; nprobe tuned on held-out queries), np = 1 and 16;
#  2. a corpus of one document, np = 1 and 16: with --exclude sequence (9 sequences for 16 ranks), and
#     with --exclude document, where every neighbour is excluded and every record is empty;
#  3. an empty corpus on 16 ranks is refused on every rank (no hang), naming the reason;
#  4. dfm chunk on mixed inputs (JSONL, JSONL.zst, plain text; 7 documents in 3 files), in both packing
#     modes: np = 16 gives the chunks of np = 1.
# Every np is compared with np = 1: the chunks (dfm chunk-dump), the embedding blocks, the neighbour
# blocks and the target shards byte for byte, and `dfm verify --compare`. Index shards are one per rank,
# so they are compared through what retrieval finds in them. Small on purpose (2 cores, 16 ranks): a
# 60 KB SentencePiece tokenizer from tests/data and a tiny random encoder (tests/tools/tiny_bert.py).
source "$(dirname "$0")/../lib.sh"
cd "$WORK"
TOK=$DFM_ROOT/tests/data/tokenizer/spm-llama2.tokenizer.json
"$DFM_PYTHON" "$DFM_ROOT/tests/tools/tiny_bert.py" "$DFM_MODEL" tiny || fail "tiny_bert.py"
head -n 3 "$DFM_CORPUS" > three.jsonl
head -n 1 "$DFM_CORPUS" > one.jsonl

# build NAME NP [CORPUS [EXCLUDE [INDEX]]]: run NAME-NP from CORPUS.jsonl (default NAME.jsonl) on NP ranks
build() {
  local c=${3:-$1} np=$2 r=$1-$2
  cat > "$r.json" <<JSON
{"run": "$r", "inputs": ["$c.jsonl"], "tokenizer": "$TOK",
 "chunk": {"seq-len": 128}, "encode": {"device": "cpu", "model": "tiny", "block-chunks": 8},
 "index": {"index": "${5:-auto}"}, "retrieve": {"k": 4, "query-block": 16, "exclude": "${4:-sequence}"},
 "write-targets": {"target-shards": 3, "block-queries": 8}}
JSON
  mpirun -np "$np" "$DFM" build "$r.json" > "$r.log" 2>&1 || { cat "$r.log"; fail "dfm build on $np ranks ($c)"; }
}
# same CORPUS NP: run CORPUS-NP holds the records of CORPUS-1
same() {
  local a=$1-1 b=$1-$2 f
  "$DFM" chunk-dump "$b" > "$b.dump" || fail "chunk-dump $b"
  cmp -s "$a.dump" "$b.dump" || fail "$b: the chunks differ from $a's"
  for f in $(cd "$a" && find encode retrieve targets -type f | sort); do
    cmp -s "$a/$f" "$b/$f" || fail "$b/$f differs from $a/$f"
  done
  [ "$(cd "$a" && find encode retrieve targets -type f | sort | xargs)" = "$(cd "$b" && find encode retrieve targets -type f | sort | xargs)" ] ||
    fail "$a and $b hold different sets of files"
  "$DFM" verify "$b" --compare "$a" > verify.log 2>&1 || { cat verify.log; fail "dfm verify $b --compare $a"; }
}
count() { "$DFM_PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"][sys.argv[2]]["counts"][sys.argv[3]])' "$1/manifest.json" "$2" "$3"; }

echo "== 1. 3 documents, np = 1, 2, 4, 8, 16"
build three 1
"$DFM" chunk-dump three-1 > three-1.dump
docs=$(count three-1 chunk documents) chunks=$(count three-1 chunk chunks) seqs=$(count three-1 chunk sequences)
blocks=$(ls three-1/encode | grep -c '^emb-')
[ "$docs" = 3 ] && [ "$blocks" -gt 8 ] && [ "$blocks" -lt 16 ] && [ "$seqs" -gt 16 ] ||
  fail "the corpus no longer makes the edge cases: $docs documents, $blocks blocks, $seqs sequences (want 3, 9..15, > 16)"
for np in 2 4 8 16; do
  build three $np
  same three $np
  ok "np=$np == np=1: $chunks chunks of $docs documents in $blocks blocks, $(count three-$np targets records) records in 3 target shards"
done
# the edge cases did happen at np = 16: ranks whose chunk shard is empty (no input), empty index shards
empty=$("$DFM_PYTHON" -c 'import json,sys; print(sum(o["n_chunks"] == 0 for o in json.load(open(sys.argv[1]))["stages"]["chunk"]["outputs"]))' three-16/manifest.json)
[ "$empty" -ge 13 ] || fail "np=16 on 3 documents: only $empty of 16 ranks had no input (want >= 13)"
ok "np=16: $empty ranks read no document; 16 ranks for $blocks embedding blocks and 3 target shards"
build ivf 1 three sequence IVF2,Flat
"$DFM" chunk-dump ivf-1 > ivf-1.dump
build ivf 16 three sequence IVF2,Flat
grep -q "tuning nprobe=2 margin=16: recall@4" ivf-16.log || { grep retrieve ivf-16.log; fail "np=16: no nprobe tuning logged for the IVF index"; }
same ivf 16
ok "IVF2,Flat: np=16 == np=1 (trained on a sample from 16 ranks, nprobe tuned alike)"

echo "== 2. one document, np = 1 and 16; --exclude sequence and document"
for ex in sequence document; do
  build one-$ex 1 one $ex
  "$DFM" chunk-dump one-$ex-1 > one-$ex-1.dump
  build one-$ex 16 one $ex
  same one-$ex 16
  "$DFM" verify one-$ex-16 > verify.log 2>&1 || { cat verify.log; fail "verify one-$ex-16"; }
  n=$(count one-$ex-1 chunk chunks) empty=$(grep -o '[0-9]* empty' verify.log | head -n 1)
  if [ $ex = document ]; then [ "$empty" = "$n empty" ] || fail "--exclude document on one document: want $n empty records, verify says: $(tail -n 1 verify.log)"; fi
  ok "one document, --exclude $ex ($n chunks, $(count one-$ex-1 chunk sequences) sequences, $empty records): np=16 == np=1"
done

echo "== 3. an empty corpus on 16 ranks"
: > empty.jsonl
sed 's/one-document-1/empty-16/; s/one.jsonl/empty.jsonl/' one-document-1.json > empty-16.json
timeout 300 mpirun -np 16 "$DFM" build empty-16.json > empty-16.log 2>&1 && fail "an empty corpus was accepted"
[ $? != 124 ] || fail "16 ranks on an empty corpus hung (killed after 300 s)"
[ "$(grep -c 'the inputs hold no text' empty-16.log)" -ge 1 ] || { cat empty-16.log; fail "the refusal of an empty corpus does not say why"; }
ok "empty corpus on 16 ranks: refused ($(grep -o 'the inputs hold no text[^[]*' empty-16.log | head -n 1))"

echo "== 4. dfm chunk, mixed inputs, np = 1 and 16, both packing modes"
sed -n '4,7p' "$DFM_CORPUS" > m.jsonl
sed -n '8,9p' "$DFM_CORPUS" | zstd -q -o m.jsonl.zst
printf 'A plain text document.\nIt has two lines.\n' > m.txt
for mode in plain doc-aligned; do
  flags=(--tokenizer "$TOK" --seq-len 64); [ $mode = doc-aligned ] && flags+=(--doc-aligned)
  for np in 1 16; do
    mpirun -np $np "$DFM" chunk "mixed-$mode-$np" m.jsonl m.jsonl.zst m.txt "${flags[@]}" > "mixed-$mode-$np.log" 2>&1 ||
      { cat "mixed-$mode-$np.log"; fail "chunk np=$np $mode"; }
    "$DFM" chunk-dump "mixed-$mode-$np" > "mixed-$mode-$np.dump" || fail "chunk-dump mixed-$mode-$np"
  done
  cmp -s "mixed-$mode-1.dump" "mixed-$mode-16.dump" || fail "chunk $mode: np=16 differs from np=1"
  ok "chunk $mode on 3 files, 7 documents: np=16 == np=1 ($(count mixed-$mode-1 chunk chunks) chunks)"
done
echo "all many-rank checks passed"
