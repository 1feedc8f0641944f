#!/usr/bin/env bash
# Every kind of bad input to `dfm chunk` is refused with the file and line named, or, with
# --skip-bad-lines, counted in the manifest; nothing is dropped silently.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
C() { "$DFM" chunk "$@" --tokenizer "$T" --seq-len 64; }
printf '{"text": "good one"}\n{"text": "good two"}\n' > "$WORK/good.jsonl"

printf '{"text": "ok"}\n{"text": "broken\n{"text": "ok again"}\n' > "$WORK/malformed.jsonl"
expect_fail "malformed.jsonl:2" C "$WORK/r1" "$WORK/malformed.jsonl"

printf '{"text": "ok"}\n{"body": "no text"}\n' > "$WORK/nofield.jsonl"
expect_fail 'nofield.jsonl:2' C "$WORK/r2" "$WORK/nofield.jsonl"
expect_fail 'no "text" field' C "$WORK/r2" "$WORK/nofield.jsonl"

printf '{"text": 42}\n' > "$WORK/nonstring.jsonl"
expect_fail 'not a string' C "$WORK/r3" "$WORK/nonstring.jsonl"

printf '{"text": "ok"}\n{"text": "bad \xff\xfe bytes"}\n' > "$WORK/utf8.jsonl"
expect_fail 'utf8.jsonl:2' C "$WORK/r4" "$WORK/utf8.jsonl"
printf 'plain text with \xc3\x28 invalid UTF-8\n' > "$WORK/utf8.txt"
expect_fail 'invalid UTF-8 at byte 16' C "$WORK/r5" "$WORK/utf8.txt"

head -n 50 "$DFM_CORPUS" | zstd -q -o "$WORK/full.jsonl.zst"
head -c 20000 "$WORK/full.jsonl.zst" > "$WORK/cut.jsonl.zst"
expect_fail 'truncated zstd stream' C "$WORK/r6" "$WORK/cut.jsonl.zst"

cp "$WORK/good.jsonl" "$WORK/locked.jsonl"; chmod 000 "$WORK/locked.jsonl"
if [ "$(id -u)" = 0 ]; then  # root reads anything: use a folder instead of a file
  mkdir -p "$WORK/adir.jsonl"; expect_fail 'not a regular file' C "$WORK/r7" "$WORK/adir.jsonl"
else
  expect_fail 'cannot be read' C "$WORK/r7" "$WORK/locked.jsonl"
fi
expect_fail 'matches no file' C "$WORK/r8" "$WORK/nothing-*.jsonl"
expect_fail 'nope.jsonl' C "$WORK/r8" "$WORK/nope.jsonl"

"$DFM_PYTHON" - "$WORK/oov.bin" <<'PY'
import struct, sys
ids = [1, 2, 3, 999999, 5]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240801, 7, len(ids), *([0] * 253)) + struct.pack("<5I", *ids))
PY
expect_fail 'id 999999 is outside the vocabulary' C "$WORK/r9" "$WORK/oov.bin"
head -c 1030 "$WORK/oov.bin" > "$WORK/short.bin"
expect_fail 'short.bin: header says 5 tokens' C "$WORK/r10" "$WORK/short.bin"

# empty documents are counted, not failed; bad lines skipped and counted with --skip-bad-lines
printf '{"text": ""}\n{"text": "real text"}\n\n{"text": "broken\n{"body": 1}\n' > "$WORK/mixed.jsonl"
mpirun -np 2 "$DFM" chunk "$WORK/r11" "$WORK/mixed.jsonl" "$WORK/utf8.jsonl" --tokenizer "$T" --seq-len 64 --skip-bad-lines >/dev/null 2>&1 ||
  fail "--skip-bad-lines run failed"
"$DFM_PYTHON" - "$WORK/r11/manifest.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["stages"]["chunk"]["counts"]
assert c["bad_lines"] == 3, c      # broken JSON, missing field, invalid UTF-8
assert c["empty_documents"] == 1, c
assert c["documents"] == 2, c      # "real text" and utf8.jsonl's "ok"
print("counts", c)
PY
ok "skipped and empty documents counted"
# "\u0000" is valid JSON (web crawls hold it): chunked, with the ids HF `tokenizers` gives the same text
printf '{"text": "nul \\u0000 inside a document"}\n' > "$WORK/nul.jsonl"
C "$WORK/r14" "$WORK/nul.jsonl" >/dev/null 2>&1 || fail "a JSON line with \\u0000 was refused"
got=$("$DFM" chunk-dump "$WORK/r14" | head -1 | sed 's/.* : //' | cut -d' ' -f1-7)
want=$("$DFM_PYTHON" -c 'import sys; from tokenizers import Tokenizer
print(*Tokenizer.from_file(sys.argv[1]).encode("nul \u0000 inside a document", add_special_tokens=False).ids)' "$T")
[ "$got" = "$want" ] || fail "ids of a document with NUL: dfm '$got', tokenizers '$want'"
ok "NUL inside a JSON string chunked as tokenizers encodes it"
# a rank's failure stops all ranks with the message, not a hang
expect_fail 'malformed.jsonl' timeout 60 mpirun -np 3 "$DFM" chunk "$WORK/r12" "$WORK/good.jsonl" "$WORK/malformed.jsonl" --tokenizer "$T"
expect_fail 'multiple of --chunk-len' "$DFM" chunk "$WORK/r13" "$WORK/good.jsonl" --tokenizer "$T" --seq-len 100
echo "all bad-input checks passed"
