#!/usr/bin/env bash
# test_retrieve_mpi.sh — `dfm index` + `dfm retrieve` under mpirun on 1..4 ranks against an independent
# NumPy brute force (tests/ref/retrieval_reference.py), on a synthetic run made in the real file formats
# (tests/tools/retrieve_mkrun.c: 3000 chunks, dim 32, duplicates for ties, documents that
# span chunks, all-padding chunks, an uneven last block).
#   1. Flat, every exclusion policy, np = 1, 2, 3, 4: rows equal the reference exactly (ids, mask;
#      scores within 1e-5) and the neighbour files are byte-identical across rank counts.
#   2. L2 metric, --query-window 2, a tiny --margin (forces re-searches): exact on np = 2.
#   3. IVF-Flat and IVF-PQ on np = 1, 2, 3: recall@16 above a threshold, files identical across np,
#      --measure-recall recorded in the manifest.
#   3b. An IVF index at retrieve's defaults is tuned to recall@16 >= 0.95 (nprobe 1 is not), recorded.
#   3c. IVF16,PQ4np, whose codes bound the recall: with the margin held (--max-margin 16) the tuning visits every
#       list and falls short, recorded as not reached; at the defaults a stalled doubling of the lists is undone and
#       the margin widened until 0.95 (the reference agrees), the same files on np 1 and 2.
#   4. Errors: too few training points, a corrupted index, a metric mismatch — clear messages.
#   5. Resume by block: a rank SIGKILLed after writing a block; the re-run (on another rank count) keeps
#      the finished blocks untouched (same inode), searches a damaged one again, and ends with the files
#      and counts of an uninterrupted run.
#   6. A query-only run (--datastore): another run's queries against this index, exact on np 1, 2, 3
#      (the reference reads the datastore the stage names), files identical; IVF on np 1 and 3; its
#      targets hold the datastore's rows (verify recomputes every record); refusals.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none
T=$(mktemp -d /tmp/dfm-test-retrieve-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mpi() { local np=$1; shift; mpirun -np "$np" --oversubscribe "$@"; }

# the generator links against the library the test is about (make tools; a no-op after make test)
make -s --no-print-directory -C "$ROOT" build/tools/retrieve_mkrun
"$ROOT/build/tools/retrieve_mkrun" "$T/base" 3000 32 16 700 7

fresh() { rm -rf "$1"; mkdir -p "$1"; cp -r "$T/base/chunk" "$T/base/encode" "$T/base/manifest.json" "$1/"; }

echo "== 1. Flat, every exclusion policy, np 1..4: exact against NumPy, identical across np"
for np in 1 2 3 4; do
  R=$T/flat$np; fresh "$R"
  mpi $np "$DFM" index "$R" --index Flat 2>"$T/log" || { cat "$T/log"; fail "index np=$np"; }
  for ex in none self sequence document; do
    mpi $np "$DFM" retrieve "$R" --exclude $ex --margin 4 --query-block 300 --force 2>"$T/log" || { cat "$T/log"; fail "retrieve np=$np $ex"; }
    "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --check || fail "np=$np exclude=$ex differs from the reference"
    mkdir -p "$T/out/$np/$ex"; cp "$R"/retrieve/nbr-*.bin "$T/out/$np/$ex/"
    if [ $np -gt 1 ]; then
      for f in "$T/out/1/$ex"/nbr-*.bin; do cmp -s "$f" "$T/out/$np/$ex/$(basename "$f")" || fail "$(basename "$f") differs between np=1 and np=$np ($ex)"; done
    fi
  done
done
grep -q '"items_kept"' "$T/flat4/manifest.json" || fail "no retrieve counts in the manifest"
# the reference must be able to fail: swap the first two neighbours of one row (bytes 128.. = row 0 ids;
# row 2 is the second chunk of sequence 0, so it has neighbours)
R=$T/flat1; off=$((128 + 2 * (8 * 16 + 4 * 16 + 8)))
"$PY" - "$R/retrieve/nbr-000000.bin" $off <<'EOF'
import sys
p, off = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read())
b[off:off + 8], b[off + 8:off + 16] = b[off + 8:off + 16], b[off:off + 8]
open(p, "wb").write(b)
EOF
if "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --check >/dev/null; then fail "the reference accepted a swapped row"; fi

echo "== 2. L2, --query-window 2, tiny margin, np 2"
R=$T/l2; fresh "$R"
mpi 2 "$DFM" index "$R" --index Flat --metric l2 2>"$T/log" || { cat "$T/log"; fail "index l2"; }
mpi 2 "$DFM" retrieve "$R" --exclude document --query-window 2 --margin 0 --k 12 2>"$T/log" || { cat "$T/log"; fail "retrieve l2"; }
grep -q "re-searches" "$T/log" || fail "no re-search count logged"
"$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --check || fail "L2 / window 2 differs from the reference"
# retrieve on another rank count than the index was built with (2 shards on 3 ranks: one rank has none)
mpi 3 "$DFM" retrieve "$R" --exclude self --k 12 --force 2>"$T/log" || { cat "$T/log"; fail "retrieve on 3 ranks of a 2-shard index"; }
"$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --check || fail "3 ranks over 2 shards differs from the reference"

echo "== 3. IVF-Flat and IVF-PQ: recall above threshold, identical across np"
for spec in "IVF16,Flat:--nprobe 4:0.95" "IVF8,PQ8np:--nprobe 8:0.75"; do
  IFS=: read -r fac opt thr <<<"$spec"
  for np in 1 2 3; do
    R=$T/ivf$np; fresh "$R"
    mpi $np "$DFM" index "$R" --index "$fac" --train-sample 3000 2>"$T/log" || { cat "$T/log"; fail "index $fac np=$np"; }
    mpi $np "$DFM" retrieve "$R" $opt --measure-recall 200 >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "retrieve $fac np=$np"; }
    grep -q "recall@16" "$T/out.txt" || fail "--measure-recall printed nothing"
    grep -q '"recall@k"' "$R/manifest.json" || fail "--measure-recall not in the manifest"
    "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --min-recall "$thr" || fail "$fac recall np=$np"
    mkdir -p "$T/ivf/$np"; cp "$R"/retrieve/nbr-*.bin "$T/ivf/$np/"
    if [ $np -gt 1 ]; then
      for f in "$T/ivf/1"/nbr-*.bin; do cmp -s "$f" "$T/ivf/$np/$(basename "$f")" || fail "$fac: $(basename "$f") differs between np=1 and np=$np"; done
    fi
  done
  cat "$T/out.txt"
done
R=$T/tune; fresh "$R"
mpi 2 "$DFM" index "$R" --index IVF32,Flat --train-sample 3000 2>/dev/null
mpi 2 "$DFM" retrieve "$R" --target-recall 0.95 --measure-recall 100 >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "target-recall"; }
grep -q '"tuning"' "$R/manifest.json" || fail "--target-recall not recorded"
"$PY" -c "import json,sys; t=json.load(open('$R/manifest.json'))['stages']['retrieve']['tuning']; print('tuned', t); sys.exit(t['recall'] < 0.95 and t['value'] < 32)" || fail "tuning stopped below the target"

echo "== 3b. recall by default: an IVF index with no --nprobe is tuned to recall@16 >= 0.95"
for R in "$T/np1" "$T/dflt"; do
  fresh "$R"; mpi 2 "$DFM" index "$R" --index IVF64,Flat --train-sample 3000 2>/dev/null
done
R=$T/np1
mpi 2 "$DFM" retrieve "$R" --nprobe 1 >/dev/null 2>"$T/log" || { cat "$T/log"; fail "retrieve --nprobe 1"; }
if "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --min-recall 0.95 >/dev/null; then fail "FAISS's default nprobe 1 already reaches 0.95: the check below proves nothing"; fi
if grep -q '"tuning"' "$R/manifest.json"; then fail "an explicit --nprobe was tuned"; fi
R=$T/dflt
mpi 2 "$DFM" retrieve "$R" >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "retrieve at its defaults"; }
grep -q "nprobe=.* reaches recall@16 = " "$T/out.txt" || fail "the tuned recall was not printed: $(cat "$T/out.txt")"
"$PY" -c "import json,sys; t=json.load(open(sys.argv[1]))['stages']['retrieve']['tuning']; print('default tuning', t); sys.exit(not (t['parameter'] == 'nprobe' and t['target'] == 0.95 and t['recall'] >= 0.95))" "$R/manifest.json" || fail "default tuning not recorded"
"$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --min-recall 0.95 || fail "the default retrieve stays below recall 0.95"
# dfm audit reports the nprobe the run searched with (the synthetic run's chunk stage gets its L and S)
"$PY" - "$R/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["stages"]["chunk"].setdefault("config", {}).update({"chunk-len": 32, "seq-len": 512})
json.dump(m, open(sys.argv[1], "w"))
EOF
"$DFM" audit "$R" --token-level-sample 0 --out "$T/audit" >/dev/null 2>"$T/log" || { cat "$T/log"; fail "audit of the tuned run"; }
"$PY" -c "import json,sys; a=json.load(open(sys.argv[1])); m=json.load(open(sys.argv[2])); sys.exit(a['config']['nprobe'] != m['stages']['retrieve']['tuning']['value'])" \
  "$T/audit/audit.json" "$R/manifest.json" || fail "the audit does not report the tuned nprobe"

echo "== 3c. codes that bound the recall: more lists stall, the tuning widens the margin"
R=$T/pq; fresh "$R"
mpi 2 "$DFM" index "$R" --index IVF16,PQ4np --train-sample 3000 2>"$T/log" || { cat "$T/log"; fail "index IVF16,PQ4np"; }
for np in 1 2; do
  mpi $np "$DFM" retrieve "$R" --max-margin 16 --force >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "retrieve --max-margin 16 np=$np"; }
  grep -q "falls short at recall@16" "$T/out.txt" || fail "a fixed margin on PQ4 codes should fall short of 0.95: $(cat "$T/out.txt")"
  "$PY" - "$R/manifest.json" <<'PY' || fail "the fixed-margin tuning record (np=$np)"
import json, sys
r = json.load(open(sys.argv[1]))["stages"]["retrieve"]; t = r["tuning"]
print("fixed margin:", {k: t[k] for k in ("value", "margin", "recall", "reached")})
assert t["margin"] == 16 == r["margin"] and not t["reached"] and t["recall"] < 0.95, t
assert t["value"] == 16, "every list visited before giving up: %s" % t["value"]
assert all(x["margin"] == 16 for x in t["tries"]), t["tries"]
PY
  mpi $np "$DFM" retrieve "$R" --force >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "retrieve PQ4 at its defaults np=$np"; }
  grep -q "reaches recall@16" "$T/out.txt" || fail "the widened margin did not reach 0.95: $(cat "$T/out.txt")"
  "$PY" - "$R/manifest.json" <<'PY' || fail "the widened-margin tuning record (np=$np)"
import json, sys
r = json.load(open(sys.argv[1]))["stages"]["retrieve"]; t = r["tuning"]
print("tuned margin:", {k: t[k] for k in ("value", "margin", "recall", "reached")}, "tries", len(t["tries"]))
assert t["reached"] and t["recall"] >= 0.95 and 16 < t["margin"] <= 256 and r["margin"] == t["margin"], t
# a widening is tried only after a doubling of the lists stalled, and that doubling is undone
first = next(i for i, x in enumerate(t["tries"]) if x["margin"] > 16)
assert first >= 2 and t["tries"][first - 1]["recall"] - t["tries"][first - 2]["recall"] < 0.0025, t["tries"]
assert t["tries"][first]["value"] == t["tries"][first - 2]["value"], t["tries"]
assert r["counts"]["candidates_fetched"] == r["counts"]["queries"] * (16 + t["margin"]), r["counts"]
PY
  "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$R" --min-recall 0.95 || fail "PQ4 codes with the tuned margin: recall np=$np"
  mkdir -p "$T/pq/$np"; cp "$R"/retrieve/nbr-*.bin "$T/pq/$np/"
done
for f in "$T/pq/1"/nbr-*.bin; do cmp -s "$f" "$T/pq/2/$(basename "$f")" || fail "PQ4 tuned: $(basename "$f") differs between np 1 and 2"; done

echo "== 4. errors"
R=$T/err; fresh "$R"
if "$DFM" index "$R" --index IVF4096,Flat 2>"$T/log"; then fail "IVF4096 on 3000 vectors must fail"; fi
grep -q "training points" "$T/log" || { cat "$T/log"; fail "no training-points message"; }
"$DFM" index "$R" --index Flat --force 2>/dev/null
printf '\x01' | dd of="$R/index/index-00000.faiss" bs=1 seek=100 conv=notrunc 2>/dev/null
if "$DFM" retrieve "$R" 2>"$T/log"; then fail "a corrupted index must fail"; fi
grep -q "index-00000.faiss" "$T/log" && grep -q "checksum" "$T/log" || { cat "$T/log"; fail "corruption message"; }
"$DFM" index "$R" --index Flat --force 2>/dev/null
if "$DFM" retrieve "$R" --metric l2 2>"$T/log"; then fail "a metric mismatch must fail"; fi
grep -q "metric" "$T/log" || { cat "$T/log"; fail "metric message"; }
echo "== 5. resume by block after a SIGKILL"
R=$T/res; fresh "$R"
mpi 2 "$DFM" index "$R" --index IVF16,PQ8 --train-sample 3000 2>"$T/log" || { cat "$T/log"; fail "index for resume"; }
grep -q '"factory": "IVF16,PQ8np"' "$R/manifest.json" || fail "IVF16,PQ8 was not given np (no polysemous training)"
cp -r "$R" "$T/res-ref"
mpi 1 "$DFM" retrieve "$T/res-ref" --nprobe 4 --query-block 100 2>"$T/log" || { cat "$T/log"; fail "uninterrupted retrieve"; }
if DFM_FAULT=retrieve:block-written DFM_FAULT_RANK=1 mpi 2 "$DFM" retrieve "$R" --nprobe 4 --query-block 100 >"$T/log" 2>&1; then
  fail "the run with a rank killed at retrieve:block-written succeeded"
fi
grep -q "fault injection: killing rank 1 at 'retrieve:block-written'" "$T/log" || { cat "$T/log"; fail "the kill was not injected"; }
ls "$R"/retrieve/nbr-*.bin >/dev/null 2>&1 || fail "the killed run left no finished block"
"$PY" -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))['stages']['retrieve']['state'] != 'running')" "$R/manifest.json" || fail "the killed stage is not 'running'"
before=$(cd "$R/retrieve" && ls -i nbr-*.bin | sort -k2)
nkept=$(echo "$before" | wc -l)
mpi 3 "$DFM" retrieve "$R" --nprobe 4 --query-block 100 >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "re-run after the kill"; }
grep -q "resuming: $nkept finished block(s) kept" "$T/log" || { cat "$T/log"; fail "the re-run did not keep the $nkept finished block(s)"; }
while read -r ino f; do
  [ "$(ls -i "$R/retrieve/$f" | cut -d' ' -f1)" = "$ino" ] || fail "$f was rewritten although it was finished"
done <<<"$before"
for f in "$T/res-ref"/retrieve/nbr-*.bin; do cmp -s "$f" "$R/retrieve/$(basename "$f")" || fail "resumed $(basename "$f") differs from the uninterrupted run"; done
"$PY" - "$T/res-ref/manifest.json" "$R/manifest.json" <<'EOF2'
import json, sys
a, b = (json.load(open(p))["stages"]["retrieve"]["counts"] for p in sys.argv[1:])
keys = ["queries", "no_query_rows", "candidates_fetched", "excluded", "items_kept", "padded_slots", "bytes"]
diff = {k: (a[k], b[k]) for k in keys if a[k] != b[k]}
sys.exit(f"resumed counts differ: {diff}" if diff else 0)
EOF2
echo "ok: killed after $nkept block(s); the re-run on 3 ranks kept them and matches the uninterrupted run (files and counts)"
# a damaged finished block is searched again, not kept
if DFM_FAULT=retrieve:block-written DFM_FAULT_RANK=0 mpi 2 "$DFM" retrieve "$R" --nprobe 4 --query-block 100 --force >"$T/log" 2>&1; then fail "second kill"; fi
f=$(cd "$R/retrieve" && ls nbr-*.bin | head -n 1)
printf '\x01' | dd of="$R/retrieve/$f" bs=1 seek=200 conv=notrunc 2>/dev/null
mpi 2 "$DFM" retrieve "$R" --nprobe 4 --query-block 100 >"$T/out.txt" 2>"$T/log" || { cat "$T/log"; fail "re-run with a damaged block"; }
grep -q "$f is damaged" "$T/log" || { cat "$T/log"; fail "the damaged $f was not reported"; }
for g in "$T/res-ref"/retrieve/nbr-*.bin; do cmp -s "$g" "$R/retrieve/$(basename "$g")" || fail "after a damaged block, $(basename "$g") differs"; done
echo "ok: a damaged finished block is searched again"

echo "== 6. a query-only run: queries of one run, neighbours from another run's index (--datastore)"
DS=$T/ds; fresh "$DS"
mpi 2 "$DFM" index "$DS" --index Flat 2>"$T/log" || { cat "$T/log"; fail "index of the datastore"; }
"$ROOT/build/tools/retrieve_mkrun" "$T/qbase" 700 32 16 300 11 >/dev/null
for np in 1 2 3; do
  Q=$T/q$np; rm -rf "$Q"; cp -r "$T/qbase" "$Q"
  mpi $np "$DFM" retrieve "$Q" --datastore "$DS" --exclude none --margin 4 --query-block 128 2>"$T/log" || { cat "$T/log"; fail "retrieve --datastore np=$np"; }
  "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$Q" --check | grep -q "against a datastore of 3000" || fail "np=$np: not checked against the datastore"
  "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$Q" --check >/dev/null || fail "np=$np: --datastore rows differ from the reference"
  [ $np = 1 ] || for f in "$T/q1"/retrieve/nbr-*.bin; do cmp -s "$f" "$Q/retrieve/$(basename "$f")" || fail "--datastore: $(basename "$f") differs between np=1 and np=$np"; done
done
"$PY" - "$T/q1/manifest.json" "$DS" <<'EOF2'
import json, os, sys
st = json.load(open(sys.argv[1]))["stages"]["retrieve"]
want = {"run": os.path.realpath(sys.argv[2]), "chunks": 3000}
sys.exit(0 if st.get("datastore") == want else f"retrieve stage records datastore {st.get('datastore')}, expected {want}")
EOF2
# the ids are the datastore's: some exceed the query run's 700 chunks, and the blocks say so (n_ids)
"$PY" - "$T/q1/retrieve/nbr-000000.bin" <<'EOF2'
import struct, sys
b = open(sys.argv[1], "rb").read()
(n_ids,) = struct.unpack_from("<Q", b, 88)
k, = struct.unpack_from("<I", b, 16); n, = struct.unpack_from("<Q", b, 32); rb, = struct.unpack_from("<Q", b, 40)
top = max(struct.unpack_from("<q", b, 128 + i * rb)[0] for i in range(n))
sys.exit(0 if n_ids == 3000 and top >= 700 else f"n_ids {n_ids}, largest first neighbour {top}")
EOF2
mpi 2 "$DFM" write-targets "$T/q1" --target-shards 3 >"$T/log" 2>&1 || { cat "$T/log"; fail "write-targets of the query-only run"; }
"$DFM" verify "$T/q1" --recompute-records 1 >/dev/null 2>"$T/log" || { cat "$T/log"; fail "the query-only run's records differ from the datastore rows"; }
echo "ok: --datastore exact against the reference on np 1, 2, 3 (identical files), recorded, its targets from the datastore's rows"
Q=$T/qivf; rm -rf "$Q"; cp -r "$T/qbase" "$Q"
mpi 3 "$DFM" index "$DS" --index IVF32,Flat --force 2>"$T/log" || { cat "$T/log"; fail "IVF index of the datastore"; }
mpi 1 "$DFM" retrieve "$Q" --datastore "$DS" --exclude none --nprobe 8 2>"$T/log" || { cat "$T/log"; fail "IVF --datastore np 1"; }
cp -r "$Q/retrieve" "$T/qivf-1"
mpi 3 "$DFM" retrieve "$Q" --datastore "$DS" --exclude none --nprobe 8 --force 2>"$T/log" || { cat "$T/log"; fail "IVF --datastore np 3"; }
for f in "$T/qivf-1"/nbr-*.bin; do cmp -s "$f" "$Q/retrieve/$(basename "$f")" || fail "IVF --datastore: $(basename "$f") differs between np 1 and 3"; done
"$PY" "$ROOT/tests/ref/retrieval_reference.py" "$Q" --min-recall 0.9 >/dev/null || fail "IVF --datastore recall"
echo "ok: IVF --datastore: same files on np 1 and 3, recall >= 0.9"
# refusals: exclusions across runs, another dimension, a datastore without an index
if "$DFM" retrieve "$T/q2" --datastore "$DS" --force 2>"$T/log"; then fail "--datastore with the default --exclude sequence must fail"; fi
grep -q "exclude none" "$T/log" || { cat "$T/log"; fail "--datastore exclusion message"; }
"$ROOT/build/tools/retrieve_mkrun" "$T/q16" 200 16 16 100 3 >/dev/null
if "$DFM" retrieve "$T/q16" --datastore "$DS" --exclude none 2>"$T/log"; then fail "a datastore of another dimension must fail"; fi
grep -q "dim 16 but its datastore run .* of dim 32" "$T/log" || { cat "$T/log"; fail "dimension message"; }
if "$DFM" retrieve "$T/q16" --datastore "$T/qbase" --exclude none 2>"$T/log"; then fail "a datastore without an index must fail"; fi
grep -q "index" "$T/log" || { cat "$T/log"; fail "no-index message"; }
echo "ok: --datastore refusals (exclusions, dimension, no index)"
echo "all retrieval checks passed"
