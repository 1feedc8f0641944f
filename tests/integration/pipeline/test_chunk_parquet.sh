#!/usr/bin/env bash
# dfm chunk on Parquet (written by pyarrow: tests/ref/make_parquet.py): every writer option set (snappy,
# zstd, gzip, none; dictionary and plain; data pages v1 and v2; nulls; many row groups and pages;
# large_string) and a FineWeb-shaped folder chunk, at np = 1, 2, 3, to the same bytes as the same texts
# given as JSONL (nulls as ""), with the row groups really spread over the ranks; files dfm cannot read
# are refused naming the file and the reason (two text columns, row groups sharing a column chunk); a file
# of 0 rows is read as no documents.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
MK=("$DFM_PYTHON" "$DFM_ROOT/tests/ref/make_parquet.py")
"${MK[@]}" variants --corpus "$DFM_CORPUS" --out "$WORK/pq" --jsonl "$WORK/js" > /dev/null || fail "writing the variants"
"${MK[@]}" fineweb --corpus "$DFM_CORPUS" --out "$WORK/fw" --jsonl "$WORK/fwj" --files 2 --rows-per-group 30 > /dev/null ||
  fail "writing the FineWeb-shaped folder"
counts() { "$DFM_PYTHON" -c 'import json,sys; c=json.load(open(sys.argv[1]))["stages"]["chunk"]["counts"]; print(c["documents"], c["empty_documents"])' "$1"; }
for set in variants fineweb; do
  if [ $set = variants ]; then P=("$WORK/pq/*.parquet"); J=("$WORK/js/*.jsonl"); else P=("$WORK/fw/data/CC-MAIN-2024-10/*.parquet"); J=("$WORK/fwj/*.jsonl"); fi
  mpirun -np 1 "$DFM" chunk "$WORK/$set-json" "${J[@]}" --tokenizer "$T" --seq-len 128 > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "$set JSONL"; }
  "$DFM" chunk-dump "$WORK/$set-json" > "$WORK/dump-$set-json"
  for np in 1 2 3; do
    DFM_LOG_LEVEL=debug mpirun -np $np "$DFM" chunk "$WORK/$set-$np" "${P[@]}" --tokenizer "$T" --seq-len 128 > "$WORK/log-$np" 2>&1 ||
      { cat "$WORK/log-$np"; fail "$set Parquet np=$np"; }
    "$DFM" chunk-dump "$WORK/$set-$np" > "$WORK/dump-$set-$np"
    cmp -s "$WORK/dump-$set-json" "$WORK/dump-$set-$np" || fail "$set: Parquet at np=$np differs from the JSONL"
    [ "$(counts "$WORK/$set-$np/manifest.json")" = "$(counts "$WORK/$set-json/manifest.json")" ] ||
      fail "$set np=$np: documents/empty $(counts "$WORK/$set-$np/manifest.json") vs JSONL $(counts "$WORK/$set-json/manifest.json")"
    busy=$(grep -c "share: [1-9][0-9]* documents" "$WORK/log-$np" || true)
    [ "$busy" = $np ] || { grep share "$WORK/log-$np"; fail "$set np=$np: $busy of $np ranks read documents"; }
    ok "$set np=$np: the same chunks as the JSONL ($(wc -l < "$WORK/dump-$set-$np") chunks; documents, empty: $(counts "$WORK/$set-$np/manifest.json"); all $np ranks read row groups)"
  done
done
[ "$(counts "$WORK/variants-1/manifest.json" | cut -d' ' -f2)" -gt 10 ] || fail "the variants hold too few nulls and empty texts"

# refusals
"${MK[@]}" refusals --out "$WORK/bad" > /dev/null || fail "writing the refusals"
C() { "$DFM" chunk "$@" --tokenizer "$T" --seq-len 64; }
B=$WORK/bad
expect_fail 'types.parquet: column "n" holds INT64 values, not strings' C "$WORK/r1" "$B/types.parquet" --text-field n
expect_fail 'types.parquet: column "blob" is binary' C "$WORK/r2" "$B/types.parquet" --text-field blob
expect_fail 'types.parquet: column "meta" is a list or a struct (its leaf meta.text)' C "$WORK/r3" "$B/types.parquet" --text-field meta
expect_fail 'types.parquet: column "tags" is a list or a struct' C "$WORK/r4" "$B/types.parquet" --text-field tags
expect_fail 'types.parquet: no column "body" (its columns: text, n, blob, meta, tags)' C "$WORK/r5" "$B/types.parquet" --text-field body
expect_fail 'encrypted.parquet: an encrypted Parquet file (encrypted footer' C "$WORK/r6" "$B/encrypted.parquet"
expect_fail 'encrypted-plainfooter.parquet: an encrypted Parquet file (plaintext footer' C "$WORK/r7" "$B/encrypted-plainfooter.parquet"
expect_fail 'utf8.parquet, row group 0, row 1 (row 1 of the file): invalid UTF-8 at byte 4' C "$WORK/r8" "$B/utf8.parquet"
C "$WORK/r9" "$B/utf8.parquet" --skip-bad-lines > /dev/null 2>&1 || fail "--skip-bad-lines on utf8.parquet"
grep -q '"bad_lines": 1' "$WORK/r9/manifest.json" || fail "the bad row was not counted"
ok "--skip-bad-lines counts the bad row"
n=$(stat -c %s "$B/crc.parquet")
cp "$B/crc.parquet" "$WORK/flip.parquet"
printf 'XXXXXXXX' | dd of="$WORK/flip.parquet" bs=1 seek=$((n / 2)) conv=notrunc status=none
expect_fail 'flip.parquet, row group 0: undecodable data near row 0: could not verify page integrity, CRC checksum verification failed' \
  C "$WORK/r10" "$WORK/flip.parquet"
head -c $((n / 2)) "$B/crc.parquet" > "$WORK/cut.parquet"
expect_fail 'cut.parquet: not a Parquet file (no PAR1 magic at its start and end); a truncated copy?' C "$WORK/r11" "$WORK/cut.parquet"
printf 'PAR1 not really PAR1' > "$WORK/footer.parquet"
expect_fail 'footer.parquet: unreadable Parquet footer' C "$WORK/r12" "$WORK/footer.parquet"
gzip -c "$B/types.parquet" > "$WORK/types.parquet.gz"
expect_fail 'types.parquet.gz: a compressed Parquet file' C "$WORK/r13" "$WORK/types.parquet.gz"
# the reader's memory cap: a 3 MB page under a 2 MiB cap is refused, not allocated; 8 MiB reads it
"$DFM_PYTHON" -c 'import sys, pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({"text": ["x" * 3000000, "small"]}), sys.argv[1], compression="snappy", use_dictionary=False)' "$WORK/bigpage.parquet"
expect_fail 'bigpage.parquet, row group 0: reading it would take more than 2 MiB of memory' env DFM_PARQUET_MAX_MB=2 "$DFM" chunk "$WORK/r14" "$WORK/bigpage.parquet" --tokenizer "$T" --seq-len 64
DFM_PARQUET_MAX_MB=8 C "$WORK/r15" "$WORK/bigpage.parquet" > /dev/null 2>&1 || fail "bigpage.parquet under an 8 MiB cap"
ok "DFM_PARQUET_MAX_MB=8 reads it"

# odd but valid, and hostile: a table of 0 rows (pyarrow writes one row group of 0 rows, data page offset 0:
# it was refused as damaged); two columns named text (the last was read silently); three row groups of which
# two point at the same column chunk (each was read again: an amplification bomb, 10,000 row groups of a
# 382 KB file gave 400,000 documents)
"$DFM_PYTHON" - "$WORK" <<'PY' || fail "writing the odd Parquet files"
import sys, pyarrow as pa, pyarrow.parquet as pq
w = sys.argv[1]
pq.write_table(pa.table({"text": pa.array([], pa.string())}), w + "/empty.parquet")
pq.write_table(pa.table({"text": ["one small document", "and another"]}), w + "/small.parquet")
pq.write_table(pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "text"]),
               w + "/twotext.parquet")
texts = [f"document number {i} about overlapping chunks" for i in range(6)] * 3
pq.write_table(pa.table({"text": texts}), w + "/groups.parquet", row_group_size=6, use_dictionary=False,
               compression="none", write_statistics=False)
def zz(v):  # a thrift compact i64: zigzag varint
    v, out = (v << 1) ^ (v >> 63), b""
    while v >= 0x80:
        out, v = out + bytes([(v & 0x7F) | 0x80]), v >> 7
    return out + bytes([v])
data = open(w + "/groups.parquet", "rb").read()
md = pq.ParquetFile(w + "/groups.parquet").metadata
o1, o2 = (zz(md.row_group(i).column(0).data_page_offset) for i in (1, 2))
n = int.from_bytes(data[-8:-4], "little")
foot = data[-8 - n:-8]
assert len(o1) == len(o2) and foot.count(o2) == 2, "the footer layout changed: rewrite this test's patch"
open(w + "/overlap.parquet", "wb").write(data[:-8 - n] + foot.replace(o2, o1) + data[-8:])
md = pq.ParquetFile(w + "/overlap.parquet").metadata
assert md.row_group(2).column(0).data_page_offset == md.row_group(1).column(0).data_page_offset
PY
C "$WORK/r16" "$WORK/empty.parquet" "$WORK/small.parquet" > "$WORK/r16.log" 2>&1 || { cat "$WORK/r16.log"; fail "a Parquet file of 0 rows beside another is refused"; }
[ "$(counts "$WORK/r16/manifest.json")" = "2 0" ] || fail "0 rows + 2 rows: documents, empty $(counts "$WORK/r16/manifest.json"), not 2 0"
ok "a Parquet file of 0 rows (one empty row group) is read as no documents"
expect_fail 'twotext.parquet: two columns are named "text" (columns 0 and 1)' C "$WORK/r17" "$WORK/twotext.parquet"
expect_fail 'overlap.parquet: row groups 1 and 2: their "text" column chunks overlap' C "$WORK/r18" "$WORK/overlap.parquet"
C "$WORK/r19" "$WORK/groups.parquet" > /dev/null 2>&1 || fail "the same file before the patch"
ok "the unpatched file of three row groups is read"
echo "all chunk Parquet checks passed"
