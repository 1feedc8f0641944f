#!/usr/bin/env bash
# dfm chunk holds a bounded window of each rank's stream and spills the rest to RUN/chunk/.stream-RRRRR.tmp:
# with a 64-token window (every rank spills) the shards are byte-identical to the default window at
# np = 1 and 3, in both packing modes; the spill file holds the rest of the stream (4 bytes a token)
# when a rank is killed after tokenizing, and the re-run removes it and gives the same shards.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
head -n 60 "$DFM_CORPUS" > "$WORK/a.jsonl"
printf 'A plain text document.\nIt has two lines.\n' > "$WORK/c.txt"
"$DFM_PYTHON" "$DFM_ROOT/tests/ref/chunk_reference.py" make-bin --tokenizer "$T" --out "$WORK/d.bin" \
  --text "pretokenized doc one" --text "and doc two, also pretokenized"
INPUTS=("$WORK/a.jsonl" "$WORK/c.txt" "$WORK/d.bin")
same_shards() { # RUN_A RUN_B
  local a b
  a=$(ls -A "$1/chunk") b=$(ls -A "$2/chunk")
  [ "$a" = "$b" ] || fail "$1 and $2 have other files: $a / $b"
  for f in "$1"/chunk/*; do cmp -s "$f" "$2/chunk/$(basename "$f")" || fail "$(basename "$f") differs between $1 and $2"; done
}
for mode in plain doc-aligned; do
  flags=(--tokenizer "$T" --seq-len 256); [ $mode = doc-aligned ] && flags+=(--doc-aligned)
  for np in 1 3; do
    mpirun -np $np "$DFM" chunk "$WORK/big-$mode-$np" "${INPUTS[@]}" "${flags[@]}" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$mode np=$np"; }
    mpirun -np $np "$DFM" chunk "$WORK/win-$mode-$np" "${INPUTS[@]}" "${flags[@]}" --window-tokens 64 > "$WORK/log" 2>&1 ||
      { cat "$WORK/log"; fail "$mode np=$np, 64-token window"; }
    same_shards "$WORK/big-$mode-$np" "$WORK/win-$mode-$np"
    ok "$mode np=$np: a 64-token window gives the same shards, no spill file left"
  done
  "$DFM" chunk-dump "$WORK/win-$mode-1" > "$WORK/dump-1"; "$DFM" chunk-dump "$WORK/win-$mode-3" > "$WORK/dump-3"
  cmp -s "$WORK/dump-1" "$WORK/dump-3" || fail "$mode: np=3 chunks differ from np=1 with a 64-token window"
done
# rank 0 killed after tokenizing: its spill file is there, 4 bytes for every token beyond the window
R=$WORK/killed
DFM_FAULT=chunk:tokenized DFM_FAULT_RANK=0 "$DFM" chunk "$R" "${INPUTS[@]}" --tokenizer "$T" --seq-len 256 --window-tokens 64 \
  > "$WORK/log" 2>&1 && fail "the fault point did not kill the run"
[ -f "$R/chunk/.stream-00000.tmp" ] || fail "no spill file after a kill with a 64-token window: $(ls -a "$R/chunk")"
spilled=$(stat -c %s "$R/chunk/.stream-00000.tmp")
tokens=$("$DFM_PYTHON" -c "import json; print(json.load(open('$WORK/big-plain-1/manifest.json'))['stages']['chunk']['counts']['stream_tokens'])")
[ $((spilled % 256)) = 0 ] && [ $((spilled / 4)) -le "$tokens" ] && [ $((tokens - spilled / 4)) -le 64 ] ||
  fail "spill file has $spilled bytes for a stream of $tokens tokens and a 64-token window"
ok "killed after tokenizing: spill file holds $((spilled / 4)) of $tokens tokens"
"$DFM" chunk "$R" "${INPUTS[@]}" --tokenizer "$T" --seq-len 256 --window-tokens 64 > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "re-run after the kill"; }
same_shards "$WORK/big-plain-1" "$R"
ok "the re-run removed the stale spill file and wrote the same shard"
expect_fail "--window-tokens" "$DFM" chunk "$WORK/bad" "${INPUTS[@]}" --tokenizer "$T" --window-tokens 8
echo "all chunk window checks passed"
