#!/usr/bin/env bash
# dfm chunk on a mixed corpus (JSONL, JSONL.zst, plain text, llm.c .bin) at np = 1..4:
# identical chunks for every rank count, in both packing modes, and the token stream equal to
# an independent Hugging Face tokenization (tests/ref/chunk_reference.py).
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
head -n 120 "$DFM_CORPUS" > "$WORK/a.jsonl"
sed -n '121,200p' "$DFM_CORPUS" | zstd -q -o "$WORK/b.jsonl.zst"
printf 'A plain text document.\nIt has two lines, digits 12345 and emoji 🎉.\n' > "$WORK/c.txt"
"$DFM_PYTHON" "$DFM_ROOT/tests/ref/chunk_reference.py" make-bin --tokenizer "$T" --out "$WORK/d.bin" \
  --text "pretokenized doc one" --text "and doc two, also pretokenized"
INPUTS=("$WORK/a.jsonl" "$WORK/b.jsonl.zst" "$WORK/c.txt" "$WORK/d.bin")
for mode in plain doc-aligned; do
  flags=(--tokenizer "$T" --seq-len 256); [ $mode = doc-aligned ] && flags+=(--doc-aligned)
  for np in 1 2 3 4; do
    mpirun -np $np "$DFM" chunk "$WORK/run-$mode-$np" "${INPUTS[@]}" "${flags[@]}" > "$WORK/log-$mode-$np" 2>&1 ||
      { cat "$WORK/log-$mode-$np"; fail "chunk np=$np $mode"; }
    "$DFM" chunk-dump "$WORK/run-$mode-$np" > "$WORK/dump-$mode-$np"
    cmp -s "$WORK/dump-$mode-1" "$WORK/dump-$mode-$np" || fail "$mode: np=$np differs from np=1"
    ok "$mode np=$np identical ($(wc -l < "$WORK/dump-$mode-$np") chunks)"
  done
  "$DFM_PYTHON" "$DFM_ROOT/tests/ref/chunk_reference.py" check --tokenizer "$T" --dump "$WORK/dump-$mode-1" \
    --manifest "$WORK/run-$mode-1/manifest.json" --seq-len 256 --chunk-len 32 $([ $mode = doc-aligned ] && echo --doc-aligned) -- "${INPUTS[@]}" ||
    fail "$mode: chunks differ from the reference packing"
  ok "$mode matches the Hugging Face reference"
done
# the same run again is a no-op; other options on the same run directory are refused
out=$("$DFM" chunk "$WORK/run-plain-1" "${INPUTS[@]}" --tokenizer "$T" --seq-len 256 2>&1) || fail "rerun failed: $out"
grep -q "already complete" <<<"$out" || fail "rerun not skipped: $out"
expect_fail "other inputs or options" "$DFM" chunk "$WORK/run-plain-1" "${INPUTS[@]}" --tokenizer "$T" --seq-len 512
echo "all chunk MPI checks passed"
