#!/usr/bin/env bash
# llm.c token shards pass between the two programs (schemas/token_shard.md): what `dfm-train synth` writes
# is chunked by `dfm chunk` with the same ids, and an llm.c uint32 shard (20240801/7) and a uint16 one
# (20240520/1) are read by `dfm-train --data`; an unknown header is refused by both, naming it.
source "$(dirname "$0")/../lib.sh"
T=$DFM_TOKENIZER
"$DFM_TRAIN" synth --out "$WORK/syn" --seqs 4 --seq-len 64 --vocab 300 >/dev/null 2>&1 || fail "synth"
"$DFM_PYTHON" - "$WORK/syn/tokens.bin" <<'PY' || fail "synth's tokens.bin is not llm.c's uint32 shard"
import struct, sys
h = struct.unpack_from("<3i", open(sys.argv[1], "rb").read())
assert h[:2] == (20240801, 7), h
PY
"$DFM" chunk "$WORK/run" "$WORK/syn/tokens.bin" --tokenizer "$T" --seq-len 64 >/dev/null 2>&1 ||
  fail "dfm chunk refused the shard dfm-train synth wrote"
"$DFM_PYTHON" - "$WORK/syn/tokens.bin" "$WORK/u16.bin" "$WORK/bad.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<3i", b)[2]
ids = struct.unpack_from("<%dI" % n, b, 1024)
open(sys.argv[2], "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *ids))
open(sys.argv[3], "wb").write(struct.pack("<256i", 20240801, 9, n, *([0] * 253)) + struct.pack("<%dI" % n, *ids))
PY
# the chunked ids equal the shard's ids (up to the EOS that ends the stream's documents)
got=$("$DFM" chunk-dump "$WORK/run" | head -1 | sed 's/.* : //' | cut -d' ' -f1-16)
want=$("$DFM_PYTHON" -c 'import struct,sys; b=open(sys.argv[1],"rb").read(); print(*struct.unpack_from("<16I", b, 1024))' "$WORK/syn/tokens.bin")
[ "$got" = "$want" ] || fail "chunked ids '$got' differ from the shard's '$want'"
ok "dfm chunk reads what dfm-train synth writes, id for id"
for f in "$WORK/syn/tokens.bin" "$WORK/u16.bin"; do
  "$DFM_TRAIN" pretrain --data "$f" --out "$WORK/pre-$(basename "$f")" --seq-len 64 --batch 1 --steps 1 --layers 1 \
    --hidden 16 --heads 2 --kv-heads 1 --val-seqs 1 --threads 1 >"$WORK/log" 2>&1 || { cat "$WORK/log"; fail "dfm-train --data $f"; }
done
ok "dfm-train reads llm.c's uint32 (20240801/7) and uint16 (20240520/1) shards"
expect_fail "magic 20240801 version 9" "$DFM_TRAIN" pretrain --data "$WORK/bad.bin" --out "$WORK/pre-bad" --seq-len 64 --steps 1
expect_fail "20240801" "$DFM" chunk "$WORK/run-bad" "$WORK/bad.bin" --tokenizer "$T" --seq-len 64
echo "all token-shard interop checks passed"
