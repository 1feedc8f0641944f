#!/usr/bin/env bash
# dfm chunk on gzip inputs: a Dolma-shaped folder of .json.gz files (one written by gzip, one by pigz,
# one of three concatenated members) and a .txt.gz chunk, at np = 1, 2, 3, to the same bytes as the same
# texts given uncompressed; a truncated, a corrupt, a bad-checksum, an empty and a reserved-flag .gz (and an
# empty .zst) are refused naming the file and the compressed offset; a document past --max-doc-bytes (a gzip
# bomb of one long line) is refused naming the file and line, or skipped and counted, in bounded memory.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
mkdir -p "$WORK/plain" "$WORK/dolma"
# Dolma's rows: id, text, source, added, metadata
"$DFM_PYTHON" - "$DFM_CORPUS" "$WORK/plain" <<'PY'
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()[:240]
for k in range(3):
    with open(f"{sys.argv[2]}/part-{k}.json", "w", encoding="utf-8") as f:
        for i, l in enumerate(lines[k * 80:(k + 1) * 80]):
            f.write(json.dumps({"id": f"gcide-{k}-{i}", "text": json.loads(l)["text"], "source": "gcide",
                                "added": "2026-12-02", "metadata": {"line": i}}) + "\n")
PY
gzip -c "$WORK/plain/part-0.json" > "$WORK/dolma/part-0.json.gz"
pigz -p 2 -b 32 -c "$WORK/plain/part-1.json" > "$WORK/dolma/part-1.json.gz"   # many deflate blocks
: > "$WORK/dolma/part-2.json.gz"                                               # three gzip members
for r in 1-20 21-50 51-80; do sed -n "${r/-/,}p" "$WORK/plain/part-2.json" | gzip -c >> "$WORK/dolma/part-2.json.gz"; done
[ "$(gzip -dc "$WORK/dolma/part-2.json.gz" | md5sum)" = "$(md5sum < "$WORK/plain/part-2.json")" ] || fail "test file set-up"
printf 'A plain text document.\nTwo lines, digits 12345 and emoji 🎉.\n' > "$WORK/plain/z.txt"
gzip -c "$WORK/plain/z.txt" > "$WORK/dolma/z.txt.gz"
for np in 1 2 3; do
  for kind in plain dolma; do
    mpirun -np $np "$DFM" chunk "$WORK/run-$kind-$np" "$WORK/$kind/*" --tokenizer "$T" --seq-len 128 > "$WORK/log" 2>&1 ||
      { cat "$WORK/log"; fail "chunk $kind np=$np"; }
    "$DFM" chunk-dump "$WORK/run-$kind-$np" > "$WORK/dump-$kind-$np"
  done
  cmp -s "$WORK/dump-plain-1" "$WORK/dump-dolma-$np" || fail ".gz inputs at np=$np differ from the plain inputs at np=1"
  cmp -s "$WORK/dump-plain-1" "$WORK/dump-plain-$np" || fail "plain inputs at np=$np differ from np=1"
  ok "np=$np: .json.gz and .txt.gz chunks equal the plain files' ($(wc -l < "$WORK/dump-dolma-$np") chunks)"
done
grep -q '"documents": 241' "$WORK/run-dolma-1/manifest.json" || fail "document count: $(grep -o '"documents": [0-9]*' "$WORK/run-dolma-1/manifest.json")"

C() { "$DFM" chunk "$@" --tokenizer "$T" --seq-len 64; }
G=$WORK/dolma/part-0.json.gz
n=$(stat -c %s "$G")
head -c $((n / 2)) "$G" > "$WORK/cut.json.gz"
expect_fail "cut.json.gz is a truncated gzip stream (member 1, from compressed byte 0, ends early: the file ends after $((n / 2)) compressed bytes)" C "$WORK/r1" "$WORK/cut.json.gz"
head -c $((n - 4)) "$G" > "$WORK/notrailer.json.gz"   # the member's length field is missing
expect_fail "notrailer.json.gz is a truncated gzip stream" C "$WORK/r2" "$WORK/notrailer.json.gz"
# corrupt deflate data in the middle of the second member of part-2
cp "$WORK/dolma/part-2.json.gz" "$WORK/corrupt.json.gz"
m1=$(sed -n 1,20p "$WORK/plain/part-2.json" | gzip -c | wc -c)
printf '\xff\xff\xff\xff\xff\xff\xff\xff' | dd of="$WORK/corrupt.json.gz" bs=1 seek=$((m1 + 200)) conv=notrunc status=none
expect_fail "corrupt.json.gz: gzip error in member 2 (from compressed byte $m1) near compressed byte" C "$WORK/r3" "$WORK/corrupt.json.gz"
# a wrong CRC-32 in the trailer
cp "$G" "$WORK/crc.json.gz"
printf '\x00\x00\x00\x00' | dd of="$WORK/crc.json.gz" bs=1 seek=$((n - 8)) conv=notrunc status=none
expect_fail "crc.json.gz: gzip error in member 1" C "$WORK/r4" "$WORK/crc.json.gz"
expect_fail "CRC-32 or length in the member trailer does not match" C "$WORK/r4" "$WORK/crc.json.gz"
# bytes after the last member that are not a gzip member
{ cat "$G"; printf 'garbage after the member'; } > "$WORK/tail.json.gz"
expect_fail "tail.json.gz: gzip error in member 2 (from compressed byte $n) near compressed byte $((n + 10)): not a gzip member" C "$WORK/r5" "$WORK/tail.json.gz"
# an empty .gz or .zst is not an empty stream (gzip -t refuses it; it once read as no documents)
: > "$WORK/empty.json.gz"; : > "$WORK/empty.txt.zst"
expect_fail "empty.json.gz is empty (0 bytes): a .gz file holds at least one gzip member" C "$WORK/r6" "$WORK/empty.json.gz"
expect_fail "empty.txt.zst is empty (0 bytes): a .zst file holds at least one zstd frame" C "$WORK/r7" "$WORK/empty.txt.zst"
# reserved FLG bits (RFC 1952: a reader must refuse them), in the first member and in the second of part-2
cp "$G" "$WORK/flg.json.gz"; printf '\x20' | dd of="$WORK/flg.json.gz" bs=1 seek=3 conv=notrunc status=none
expect_fail "flg.json.gz: gzip member 1 (at compressed byte 0) sets reserved header flag bits (FLG 0x20)" C "$WORK/r8" "$WORK/flg.json.gz"
cp "$WORK/dolma/part-2.json.gz" "$WORK/flg2.json.gz"; printf '\x80' | dd of="$WORK/flg2.json.gz" bs=1 seek=$((m1 + 3)) conv=notrunc status=none
expect_fail "flg2.json.gz: gzip member 2 (at compressed byte $m1) sets reserved header flag bits (FLG 0x80)" C "$WORK/r9" "$WORK/flg2.json.gz"
# a gzip bomb: 64 MiB of one line in 65 KB, past the default --max-doc-bytes (32 MiB): refused at once, naming the
# file and the line, with the reader's memory bounded (a 261 KB file of a 256 MiB line once took 7.5 GB and 152 s)
"$DFM_PYTHON" - "$WORK/bomb.json.gz" <<'PY'
import gzip, sys
with gzip.open(sys.argv[1], "wb") as f:
    f.write(b'{"text": "a small first document"}\n{"text": "' + b"a" * (64 << 20) + b'"}\n{"text": "after it"}\n')
PY
expect_fail "bomb.json.gz (uncompressed byte 35, a line): a document (line 2) longer than 33554432 bytes (--max-doc-bytes" C "$WORK/r10" "$WORK/bomb.json.gz"
if [ -x /usr/bin/time ]; then
  /usr/bin/time -f %M -o "$WORK/rss" "$DFM" chunk "$WORK/r11" "$WORK/bomb.json.gz" --tokenizer "$T" --seq-len 64 --skip-bad-lines > /dev/null 2>&1 ||
    fail "the bomb with --skip-bad-lines"
  [ "$(tail -1 "$WORK/rss")" -lt 160000 ] || fail "the bomb took $(tail -1 "$WORK/rss") KB, more than the README's 160 MB per rank"
  grep -q '"bad_lines": 1' "$WORK/r11/manifest.json" && grep -q '"documents": 2' "$WORK/r11/manifest.json" ||
    fail "--skip-bad-lines: the long line is not skipped and counted"
  ok "the bomb with --skip-bad-lines: the line skipped and counted, the documents around it read, $(( $(tail -1 "$WORK/rss") / 1024 )) MB peak"
else
  echo "SKIP: the peak memory of the gzip bomb (no /usr/bin/time)"
fi
# the limit is settable, and applies to every kind: a line of a plain JSONL, a whole text file
expect_fail "part-0.json:1 (byte 0): a document longer than 100 bytes" C "$WORK/r12" "$WORK/plain/part-0.json" --max-doc-bytes 100
expect_fail "z.txt.gz (uncompressed byte 0): a document longer than 40 bytes" C "$WORK/r13" "$WORK/dolma/z.txt.gz" --max-doc-bytes 40
C "$WORK/r14" "$WORK/dolma/z.txt.gz" --max-doc-bytes 1000 > /dev/null 2>&1 || fail "z.txt.gz under --max-doc-bytes 1000"
ok "--max-doc-bytes sets the limit"
echo "all chunk gzip checks passed"
