#!/usr/bin/env bash
# test_retrieve_scaling.sh — the work of dfm index and dfm retrieve shrinks as 1/P and the records do not
# change: a synthetic run of 200,000 chunks (tests/tools/retrieve_mkrun, d = 8, IVF256,PQ2 — the product
# quantiser trained on every rank too), indexed and retrieved at np = 1, 2, 4 and 8 (oversubscribed).
#   1. identical records: every neighbour block byte for byte, and the trained index's hash;
#   2. each rank's work record (manifest "work", retriever/work.h): the total over ranks of every count
#      of work that should not grow with P — index: k-means distances, coarse distances (assigning the
#      added vectors), training points, vectors added; retrieve: coarse distances (each query quantised
#      once), codes scanned, queries — within 10 % of np = 1;
#   3. the largest rank's share of each of those at most 1.2 x total / P, and of the work that grows with
#      P (a query visits the ranks holding its nprobe lists: shard searches, exact rescorings, bytes sent);
#   4. a query visits fewer ranks than there are: shard searches per rank shrink from np = 1.
# Times are the benchmark's business (bench/retrieval/scaling.sh), not a test's.
source "$(dirname "$0")/../lib.sh"
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
export OMP_NUM_THREADS=1 DFM_LOG_LEVEL=warn
make -s --no-print-directory -C "$DFM_ROOT" build/tools/retrieve_mkrun
"$DFM_ROOT/build/tools/retrieve_mkrun" "$WORK/base" 200000 8 32 4096 3 fp32 200 >/dev/null

for np in 1 2 4 8; do
  R=$WORK/np$np
  mkdir -p "$R"; cp -r "$WORK/base/chunk" "$WORK/base/manifest.json" "$R/"; ln -s "$WORK/base/encode" "$R/encode"
  mpirun -np $np "$DFM" index "$R" --index IVF256,PQ2 > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "index np=$np"; }
  mpirun -np $np "$DFM" retrieve "$R" --nprobe 4 --target-recall 0 --k 4 --margin 4 > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "retrieve np=$np"; }
  if [ $np -gt 1 ]; then
    for f in "$WORK/np1"/retrieve/nbr-*.bin; do
      cmp -s "$f" "$R/retrieve/$(basename "$f")" || fail "$(basename "$f") differs between np=1 and np=$np"
    done
  fi
done
ok "np = 2, 4, 8: every neighbour block byte-identical to np = 1"

"$PY" - "$WORK" <<'EOF'
import json, sys
w = sys.argv[1]
checked = {"index": ["kmeans_distances", "coarse_distances", "train_points", "vectors_added"],
           "retrieve": ["coarse_distances", "codes_scanned", "queries"]}
balanced = {"retrieve": ["shard_searches", "exact_scores", "bytes_sent"], "index": ["bytes_sent"]}
man = {np: json.load(open(f"{w}/np{np}/manifest.json"))["stages"] for np in (1, 2, 4, 8)}
h1 = man[1]["index"]["trained_xxh128"]
bad = []
for np in (2, 4, 8):
    if man[np]["index"]["trained_xxh128"] != h1:
        bad.append(f"np={np}: trained index {man[np]['index']['trained_xxh128']} != np=1's {h1}")
    if man[np]["index"]["training"]["mode"] != "distributed":
        bad.append(f"np={np}: the index was not trained on every rank: {man[np]['index']['training']}")
for stage, keys in checked.items():
    for key in keys:
        t1 = man[1][stage]["work"]["total"][key]
        if t1 <= 0:
            bad.append(f"{stage} {key}: np=1 counted nothing")
            continue
        line = []
        for np in (1, 2, 4, 8):
            ranks = man[np][stage]["work"]["ranks"]
            if len(ranks) != np:
                bad.append(f"{stage} np={np}: {len(ranks)} work records")
                continue
            vals = [r[key] for r in ranks]
            tot, top = sum(vals), max(vals)
            if tot != man[np][stage]["work"]["total"][key]:
                bad.append(f"{stage} {key} np={np}: total {man[np][stage]['work']['total'][key]} is not the ranks' sum {tot}")
            share = top / (tot / np) if tot else float("inf")
            line.append(f"np={np} total {tot / t1:.3f}x, largest {share:.3f}x ideal")
            if abs(tot / t1 - 1) > 0.10:
                bad.append(f"{stage} {key} np={np}: total {tot} is {tot / t1:.3f} x np=1's {t1} (allowed 0.9-1.1)")
            if share > 1.2:
                bad.append(f"{stage} {key} np={np}: the largest rank does {share:.3f} x total/P (allowed 1.2): {vals}")
        print(f"{stage:8s} {key:17s} " + "; ".join(line))
for stage, keys in balanced.items():
    for key in keys:
        per = {np: [r[key] for r in man[np][stage]["work"]["ranks"]] for np in (1, 2, 4, 8)}
        for np in (2, 4, 8):
            share = max(per[np]) / (sum(per[np]) / np)
            if share > 1.2:
                bad.append(f"{stage} {key} np={np}: the largest rank does {share:.3f} x total/P (allowed 1.2): {per[np]}")
        print(f"{stage:8s} {key:17s} largest rank: " + ", ".join(f"np={np} {max(v):,}" + (f" ({max(v) / (sum(v) / np):.2f}x its share)" if sum(v) else "")
                                                                  for np, v in per.items()))
visits = {np: max(r["shard_searches"] for r in man[np]["retrieve"]["work"]["ranks"]) for np in (1, 2, 4, 8)}
if not visits[8] < 0.7 * visits[1]:
    bad.append(f"np=8: a rank searched {visits[8]} queries, np=1 {visits[1]}: queries do not go only to the ranks holding their lists")
if any(man[np]["index"].get("sharding") != "lists" for np in (1, 2, 4, 8)):
    bad.append("the IVF index was not sharded by list")
if any(man[np]["index"].get("placement", {}).get("nprobe") != 16 for np in (1, 2, 4, 8)):
    bad.append(f"the manifest does not record how the lists were placed: {man[8]['index'].get('placement')}")
if bad:
    print("\n".join("FAIL: " + b for b in bad), file=sys.stderr)
    sys.exit(1)
EOF
ok "work totals within 10 % of np = 1 and no rank above 1.2 x its share, at np = 2, 4, 8; one trained index for every np"
echo "all scaling checks passed"
