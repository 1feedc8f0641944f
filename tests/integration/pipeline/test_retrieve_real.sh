#!/usr/bin/env bash
# test_retrieve_real.sh — the real pipeline on a small corpus: dfm chunk -> dfm encode (CPU MiniLM) ->
# dfm index (Flat) -> dfm retrieve at np 1 and 2, for the sequence and document policies; every row equals
# the independent NumPy brute force (tests/ref/retrieval_reference.py) and the neighbour blocks are
# byte-identical at np 1 and 2; the manifest records the counts; `dfm estimate` reads the run.
source "$(dirname "$0")/../lib.sh"
export OMP_NUM_THREADS=1
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
M=${DFM_MODEL:-/var/cache/dfm/models/all-MiniLM-L6-v2}
head -8 "$DFM_CORPUS" > "$WORK/small.jsonl"
"$DFM" chunk "$WORK/run" "$WORK/small.jsonl" --tokenizer "$DFM_TOKENIZER" --seq-len 128 --doc-aligned >/dev/null
"$DFM" encode "$WORK/run" --device cpu --model "$M" --block-chunks 64 >/dev/null 2>"$WORK/enc.log" || { cat "$WORK/enc.log"; fail "encode"; }
N=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stages']['chunk']['counts']['chunks'])" "$WORK/run/manifest.json")
ok "chunked and encoded: $N chunks"
"$DFM" estimate "$WORK/run" --ranks 2 > "$WORK/est.txt" || fail "estimate"
grep -q "memory/rank" "$WORK/est.txt" && grep -q "IDMap,Flat" "$WORK/est.txt" || { cat "$WORK/est.txt"; fail "estimate output"; }
ok "estimate: $(grep index "$WORK/est.txt" | head -1)"
for np in 1 2; do
  cp -r "$WORK/run" "$WORK/np$np"
  mpirun -np $np "$DFM" index "$WORK/np$np" 2>"$WORK/log" || { cat "$WORK/log"; fail "index np $np"; }
  grep -q "Flat (exact)" "$WORK/log" || { cat "$WORK/log"; fail "auto choice not printed"; }
  for ex in sequence document; do
    mpirun -np $np "$DFM" retrieve "$WORK/np$np" --exclude $ex --k 8 --force 2>"$WORK/log" || { cat "$WORK/log"; fail "retrieve np $np $ex"; }
    "$PY" "$ROOT/tests/ref/retrieval_reference.py" "$WORK/np$np" --check || fail "np $np $ex differs from the NumPy reference"
    mkdir -p "$WORK/out$np/$ex"; cp "$WORK/np$np"/retrieve/nbr-*.bin "$WORK/out$np/$ex/"
  done
done
for ex in sequence document; do
  for f in "$WORK/out1/$ex"/nbr-*.bin; do cmp "$f" "$WORK/out2/$ex/$(basename "$f")" || fail "$(basename "$f") differs between np 1 and 2"; done
done
ok "neighbour blocks identical at np 1 and 2"
python3 - "$WORK/np2/manifest.json" "$N" <<'EOF' || fail "manifest retrieve stage"
import json, sys
m = json.load(open(sys.argv[1]))["stages"]; n = int(sys.argv[2])
r = m["retrieve"]
assert m["index"]["state"] == "complete" and r["state"] == "complete"
c = r["counts"]
assert c["queries"] + c["no_query_rows"] == n, c
assert c["items_kept"] + c["padded_slots"] == 8 * c["queries"], c
assert sum(o["n_rows"] for o in r["outputs"]) == n
print("ok: manifest counts", c)
EOF
