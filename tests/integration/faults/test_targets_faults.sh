#!/usr/bin/env bash
# dfm verify / inspect on damaged targets: a flipped byte inside a record, a truncated data.mdb, an
# unknown record version, a shard of another run. Each must fail naming the shard (and key).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DFM_LOG_LEVEL=warn
T=$(mktemp -d /tmp/dfm-targets-faults-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
ARGS=(--synthetic 400 --k 6 --d 32 --target-shards 4 --seq-chunks 8)
"$DFM" write-targets "$T/good" "${ARGS[@]}" >/dev/null
"$DFM" verify "$T/good" --recompute-records 0.5 >"$T/out" || fail "verify of a good run"
grep -q "rebuilt from the run's neighbours and embeddings: identical" "$T/out" || { cat "$T/out"; fail "--recompute-records"; }
"$DFM" inspect "$T/good" --chunk 123 >"$T/inspect" || fail "inspect"
grep -q "^chunk 123 " "$T/inspect" && [ "$(grep -c 'rank ' "$T/inspect")" = 6 ] || { cat "$T/inspect"; fail "inspect output"; }
if "$DFM" inspect "$T/good" --chunk 400 >/dev/null 2>"$T/err"; then fail "inspect of a chunk past the end"; fi

# patch every copy of chunk ID's record in its data.mdb: at byte AT, set VALUE (or xor with XOR)
patch() {  # run id at mode value
  PYTHONPATH=$ROOT/python "$PY" - "$@" <<'PYEOF'
import struct, sys
import dfm_targets
run, cid, at, mode, val = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
r = dfm_targets.TargetRun(run)
sh = r.shards[cid // r.span]
with sh.env.begin() as txn:
    rec = bytes(txn.get(struct.pack(">Q", cid)))
r.close()
assert at < len(rec)
path = sh.dir + "/data.mdb"
data = bytearray(open(path, "rb").read())
pos = hits = 0
while (i := data.find(rec, pos)) >= 0:
    data[i + at] = (data[i + at] ^ val) if mode == "xor" else val
    pos, hits = i + len(rec), hits + 1
assert hits
open(path, "wb").write(bytes(data))
PYEOF
}
expect_verify_fails() {  # run what needle...
  local run=$1 what=$2; shift 2
  if "$DFM" verify "$run" >/dev/null 2>"$T/err"; then fail "verify passed on $what"; fi
  for n in "$@"; do grep -q -- "$n" "$T/err" || { cat "$T/err"; fail "verify on $what does not name '$n'"; }; done
  echo "ok: $what: $(cut -c1-220 "$T/err")"
}

cp -r "$T/good" "$T/flip"; patch "$T/flip" 205 150 xor 1
expect_verify_fails "$T/flip" "flipped byte" "shard-00002 key 00000000000000cd (chunk 205)" "checksum"
if "$DFM" inspect "$T/flip" --chunk 205 >/dev/null 2>"$T/err"; then fail "inspect of a damaged record"; fi
grep -q "chunk 205" "$T/err" || fail "inspect did not name the key"

cp -r "$T/good" "$T/ver"; patch "$T/ver" 333 4 set 3
expect_verify_fails "$T/ver" "unknown record version" "shard-00003 key 000000000000014d (chunk 333)" "version 3"

cp -r "$T/good" "$T/trunc"
f=$T/trunc/targets/shard-00001/data.mdb; truncate -s $(( $(stat -c %s "$f") - 4096 )) "$f"
expect_verify_fails "$T/trunc" "truncated data.mdb" "shard-00001/data.mdb" "truncated"

"$DFM" write-targets "$T/other" "${ARGS[@]}" --seed 2 >/dev/null
cp -r "$T/good" "$T/mixed"; rm -rf "$T/mixed/targets/shard-00003"; cp -r "$T/other/targets/shard-00003" "$T/mixed/targets/"
expect_verify_fails "$T/mixed" "a shard of another run" "shard-00003" "fingerprint"
if "$DFM" verify "$T/good" --tokens-run "$T/other" >/dev/null 2>"$T/err"; then fail "targets accepted for another run's tokens"; fi
grep -q "'synthetic' stage" "$T/err" || { cat "$T/err"; fail "--tokens-run mismatch not named"; }
echo "ok: targets checked against another run's tokens: refused"

cp -r "$T/good" "$T/gone"; rm "$T/gone/targets/shard-00000/shard.json"
expect_verify_fails "$T/gone" "an incomplete shard" "shard-00000/shard.json"
echo "test_targets_faults: all ok"
