#!/usr/bin/env bash
# Special-token text inside a document: the literal string of a special token is matched as that token
# (Hugging Face's default, split_special_tokens=False), and a document ends after every EOS id whatever
# the input format. A JSONL line "A<|endoftext|>B" is therefore packed exactly as an llm.c .bin holding
# the documents A and B: the same tokens, documents, chunk records, in both packing modes.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
eos=$("$DFM" tokenize --tokenizer "$T" '<|endoftext|>')
[ "$eos" = 151643 ] || fail "<|endoftext|> in text should be the special token 151643, got '$eos'"
printf '%s\n' '{"text": "first part<|endoftext|>second part, a little longer"}' '{"text": "third"}' \
  '{"text": "ends with the separator<|endoftext|>"}' > "$WORK/a.jsonl"
"$DFM_PYTHON" "$DFM_ROOT/tests/ref/chunk_reference.py" make-bin --tokenizer "$T" --out "$WORK/b.bin" \
  --text "first part" --text "second part, a little longer" --text "third" --text "ends with the separator" --text ""
for mode in plain doc-aligned; do
  flags=(--tokenizer "$T" --seq-len 32 --chunk-len 4); [ $mode = doc-aligned ] && flags+=(--doc-aligned)
  for in in a.jsonl b.bin; do
    "$DFM" chunk "$WORK/$mode-$in" "$WORK/$in" "${flags[@]}" > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "chunk $in ($mode)"; }
    "$DFM" chunk-dump "$WORK/$mode-$in" > "$WORK/dump-$mode-$in"
  done
  diff "$WORK/dump-$mode-a.jsonl" "$WORK/dump-$mode-b.bin" || fail "$mode: the JSONL with literal <|endoftext|> packs differently from the .bin"
  docs=$("$DFM_PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['stages']['chunk']['counts']['documents'])" "$WORK/$mode-a.jsonl/manifest.json")
  [ "$docs" = 5 ] || fail "$mode: 3 lines with 2 literal separators are 5 documents, the manifest says $docs"
  "$DFM_PYTHON" "$DFM_ROOT/tests/ref/chunk_reference.py" check --tokenizer "$T" --dump "$WORK/dump-$mode-a.jsonl" \
    --manifest "$WORK/$mode-a.jsonl/manifest.json" --seq-len 32 --chunk-len 4 $([ $mode = doc-aligned ] && echo --doc-aligned) -- "$WORK/a.jsonl" ||
    fail "$mode: chunks differ from the Hugging Face reference"
  ok "$mode: JSONL with literal <|endoftext|> = the .bin of its 5 documents = the reference"
done
echo "all special-token checks passed"
