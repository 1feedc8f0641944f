#!/usr/bin/env bash
# test_targets_slots.sh — `dfm write-targets --slots-hold neighbour|continuation|both` against an independent
# reader (tests/ref/targets_slots_reference.py: its own parsers of the chunk shards, embedding blocks and
# neighbour blocks; the records through python/dfm_targets.py, not libdfm), on a run in the real file formats
# (tests/tools/retrieve_mkrun: documents of 1..6 chunks, boundaries inside chunks, all-padding chunks).
#   1. continuation and both, store embeddings and ids, np 1 and 2: every record exact (ids, scores, mask,
#      embeddings), end-of-document masking exercised, the same data.mdb bytes on np 1 and 2, verify
#      --recompute-records 1 agrees; neighbour (the default) exact too and byte-identical to --slots-hold neighbour.
#   2. the check sees an off-by-one: the reference computing the continuation as the neighbour itself
#      (id + 0) or two chunks on (id + 2) must FAIL on the same records.
#   3. the choice is in the manifest's config and format: a re-run with another choice is refused (naming
#      slots-hold) unless --force; a rank killed mid-shard, re-run on another rank count: the same bytes.
#   4. a query-only run (dfm retrieve --datastore): continuations come from the datastore run; exact.
#   5. refusals: both with 2K > 64, continuation of a run retrieved with --exclude none; inspect labels the
#      continuation slots.
source "$(dirname "$0")/../lib.sh"
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
REF="$DFM_ROOT/tests/ref/targets_slots_reference.py"
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none DFM_LOG_LEVEL=warn OMP_NUM_THREADS=1
mpi() { local np=$1; shift; mpirun -np "$np" --oversubscribe "$@"; }
make -s --no-print-directory -C "$DFM_ROOT" build/tools/retrieve_mkrun
T=$WORK
"$DFM_ROOT/build/tools/retrieve_mkrun" "$T/base" 600 16 8 128 7 >/dev/null
"$DFM" index "$T/base" --index Flat >/dev/null 2>&1 || fail "index"
"$DFM" retrieve "$T/base" --exclude document --k 6 >/dev/null 2>&1 || fail "retrieve"
fresh() { rm -rf "$1"; cp -r "$T/base" "$1"; }
TARGS=(--target-shards 3 --block-queries 50)

echo "== 1. every record exact against the reference; np 1 and 2 the same bytes"
for slots in continuation both; do
  for store in embeddings ids; do
    for np in 1 2; do
      R=$T/$slots-$store-$np; fresh "$R"
      mpi $np "$DFM" write-targets "$R" "${TARGS[@]}" --slots-hold $slots --store $store >"$T/out" 2>&1 || { cat "$T/out"; fail "write-targets $slots $store np $np"; }
      out=$("$PY" "$REF" "$R" --min-cases) || { echo "$out"; fail "$slots $store np $np differs from the reference"; }
      "$DFM" verify "$R" --recompute-records 1 >/dev/null 2>"$T/err" || { cat "$T/err"; fail "verify --recompute-records of $slots $store np $np"; }
    done
    for f in "$T/$slots-$store-1"/targets/shard-*/*; do
      cmp -s "$f" "$T/$slots-$store-2/${f#"$T/$slots-$store-1/"}" || fail "$slots $store: ${f#"$T/"} differs between np 1 and 2"
    done
    ok "$slots, --store $store: exact on np 1 and 2, identical files ($out)"
  done
done
"$DFM" verify "$T/both-ids-2" --compare "$T/both-embeddings-1" >/dev/null || fail "both: store ids and embeddings read differently"
R=$T/neighbour; fresh "$R"
"$DFM" write-targets "$R" "${TARGS[@]}" >/dev/null 2>&1 || fail "write-targets (default)"
"$PY" "$REF" "$R" >/dev/null || fail "the default (neighbour) differs from the reference"
R2=$T/neighbour-explicit; fresh "$R2"
"$DFM" write-targets "$R2" "${TARGS[@]}" --slots-hold neighbour >/dev/null 2>&1 || fail "write-targets --slots-hold neighbour"
for f in "$R"/targets/shard-*/*; do cmp -s "$f" "$R2/${f#"$R/"}" || fail "--slots-hold neighbour differs from the default: ${f#"$T/"}"; done
grep -q '"slots"' "$R"/targets/shard-00000/shard.json && fail "shard.json of the default names slots (it must stay as before)"
ok "neighbour (the default): exact, and the same files as --slots-hold neighbour"

echo "== 2. the reference sees an off-by-one in the continuation"
for off in 0 2; do
  if out=$("$PY" "$REF" "$T/continuation-embeddings-1" --plant-offset $off); then fail "a continuation of id + $off passed: $out"; fi
  grep -q "^FAIL" <<<"$out" || fail "no FAIL line for offset $off: $out"
  if out=$("$PY" "$REF" "$T/both-ids-2" --plant-offset $off); then fail "both with continuation id + $off passed: $out"; fi
done
ok "continuations taken as the neighbour itself or two chunks on are caught"

echo "== 3. recorded in the manifest; changes refused without --force; resumable"
R=$T/continuation-embeddings-1
"$PY" - "$R/manifest.json" <<'EOF' || fail "the manifest does not record the choice"
import json, sys
st = json.load(open(sys.argv[1]))["stages"]["targets"]
sys.exit(0 if st["config"]["slots-hold"] == "continuation" and st["format"]["slots"] == "continuation" else f"{st['config']} {st['format']}")
EOF
expect_fail "'slots-hold' was" mpi 2 "$DFM" write-targets "$R" "${TARGS[@]}" --slots-hold both
mpi 2 "$DFM" write-targets "$R" "${TARGS[@]}" --slots-hold both --force >/dev/null 2>&1 || fail "--force to both"
"$DFM" verify "$R" --compare "$T/both-embeddings-1" >/dev/null || fail "--force to both differs from a fresh both"
R=$T/killed; fresh "$R"
if DFM_FAULT=write-targets:mid-shard DFM_FAULT_RANK=1 mpi 2 "$DFM" write-targets "$R" "${TARGS[@]}" --slots-hold continuation >/dev/null 2>&1; then
  fail "the run with a rank killed mid-shard succeeded"
fi
mpi 1 "$DFM" write-targets "$R" "${TARGS[@]}" --slots-hold continuation >"$T/out" 2>&1 || { cat "$T/out"; fail "re-run after the kill"; }
for f in "$T/continuation-embeddings-2"/targets/shard-*/data.mdb; do  # -1 was rebuilt as both above
  cmp -s "$f" "$R/${f#"$T/continuation-embeddings-2/"}" || fail "after a kill and a re-run, ${f#"$T/"} differs"
done
ok "config and format record slots-hold; another choice refused, --force rebuilds; a killed run resumes to the same bytes"

echo "== 4. a query-only run: continuations from the datastore run"
"$DFM_ROOT/build/tools/retrieve_mkrun" "$T/q" 200 16 8 64 11 >/dev/null
"$DFM" retrieve "$T/q" --datastore "$T/base" --exclude none --k 5 >/dev/null 2>&1 || fail "retrieve --datastore"
mpi 2 "$DFM" write-targets "$T/q" --target-shards 2 --slots-hold both --dtype fp32 >"$T/out" 2>&1 || { cat "$T/out"; fail "write-targets of the query-only run"; }
out=$("$PY" "$REF" "$T/q" --min-cases) || { echo "$out"; fail "the query-only run differs from the reference"; }
grep -q "against a datastore of 600" <<<"$out" || fail "not checked against the datastore: $out"
"$DFM" verify "$T/q" --recompute-records 1 >/dev/null 2>"$T/err" || { cat "$T/err"; fail "verify of the query-only run"; }
ok "query-only, both, fp32: $out"

echo "== 5. refusals and inspect"
expect_fail "HINT: retrieve at most 32" "$DFM" write-targets "$T/syn" --synthetic 50 --k 40 --d 4 --slots-hold both
R=$T/none; fresh "$R"
"$DFM" retrieve "$R" --exclude none --k 6 --force >/dev/null 2>&1 || fail "retrieve --exclude none"
expect_fail "would be the chunk it is meant to predict" "$DFM" write-targets "$R" --slots-hold continuation
out=$("$DFM" inspect "$T/both-embeddings-1" --chunk 3 --values 2) || fail "inspect"
grep -q "slots both" <<<"$out" || fail "inspect does not say what the slots hold: $out"
grep -Eq "^  cont  0 " <<<"$out" || fail "inspect does not label the continuation slots: $out"
for be in c python; do
  pout=$(PYTHONPATH="$DFM_ROOT/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m dfm inspect "$T/both-embeddings-1" --chunk 3 --values 2 --backend $be) || fail "python -m dfm inspect ($be)"
  [ "$pout" = "$out" ] || fail "python -m dfm inspect --backend $be prints otherwise: $pout"
done
ok "inspect labels the continuation slots; python -m dfm inspect prints the same"
echo "test_targets_slots: all ok"
