#!/usr/bin/env bash
# bench/retrieval/large_point.sh — the measured large point: a >= 2e6-chunk synthetic run with MiniLM-like
# embeddings (d = 384), `dfm estimate` before anything is indexed, then `dfm index` (IVF-PQ32) and
# `dfm retrieve` (nprobe 16, recall@16 against exact search on sampled queries) at np 1 and at np 2.
#
#   N=2000000 bash bench/retrieval/large_point.sh      # the large point (about 40 min on 2 free cores)
#   N=50000   bash bench/retrieval/large_point.sh      # an end-to-end check (about 70 s)
#
# Env (defaults): N (2000000), DFM_ROOT (this checkout),
# OUT (/tmp/dfm-large-point/N$N), DTYPE (fp32: dfm encode's default; fp16 halves the disk),
# FACTORY (IVF<round(4 sqrt N)>,PQ32np: what `dfm index` would choose lists by, with PQ32 given),
# NPROBE (16), RECALL_Q (1000 sampled queries), NPS ("1 2"), THREADS (1: one core a rank).
# Disk: N x 384 x 4 bytes of embeddings (3.1 GB at 2e6 fp32) + the index (~80 MB) + neighbours (~0.4 GB).
# Predicted cost at 2e6: k-means ~8 min, adding ~3 min, retrieve ~10 min per np.
# Everything goes to $OUT: the run, estimate-np{1,2}.json, manifest after each np, time-*.txt
# (/usr/bin/time -v: wall, CPU, peak RSS), *.log, and summary.txt (predicted vs measured, recall).
set -euo pipefail
N=${N:-2000000}
ROOT=${DFM_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
OUT=${OUT:-/tmp/dfm-large-point/N$N}
DTYPE=${DTYPE:-fp32}
NPROBE=${NPROBE:-16}
RECALL_Q=${RECALL_Q:-1000}
NPS=${NPS:-"1 2"}
THREADS=${THREADS:-1}
NLIST=$(python3 -c "print(round(4 * $N ** 0.5))")
FACTORY=${FACTORY:-IVF$NLIST,PQ32np}
DFM=$ROOT/build/dfm
MKRUN=$ROOT/build/tools/retrieve_mkrun
RUN=$OUT/run
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
T() { local name=$1; shift; /usr/bin/time -v -o "$OUT/time-$name.txt" "$@" 2>&1 | tee "$OUT/$name.log"; }

# 0. the programs (2 cores shared with other work: -j2 at most)
[ "${MAKE:-1}" = 0 ] || make -s -C "$ROOT" -j2 build/dfm build/tools/retrieve_mkrun  # MAKE=0: use the built ones
rm -rf "$OUT" && mkdir -p "$OUT"
echo "N=$N dim=384 dtype=$DTYPE factory=$FACTORY nprobe=$NPROBE recall queries=$RECALL_Q threads/rank=$THREADS" | tee "$OUT/settings.txt"

# 1. the run: chunk + encode stages in the real formats, MiniLM-like vectors written block by block
#    (blocks of 65,536 chunks as dfm encode writes them; 32 chunks a sequence; 2000 topics; 2 chunk shards)
T mkrun "$MKRUN" "$RUN" "$N" 384 32 65536 39 "$DTYPE" 2000 2 --minilm-like

# 2. the estimate, before any index exists (the prediction the point must confirm within 20 % per stage)
for np in $NPS; do
  "$DFM" estimate "$RUN" --ranks "$np" --index "$FACTORY" --nprobe "$NPROBE" --json > "$OUT/estimate-np$np.json"
  "$DFM" estimate "$RUN" --ranks "$np" --index "$FACTORY" --nprobe "$NPROBE" > "$OUT/estimate-np$np.txt"
done

# 3. index and retrieve at each np (--force: the index stage again, which removes the retrieve stage)
for np in $NPS; do
  T index-np$np mpirun -np "$np" --oversubscribe "$DFM" index "$RUN" --index "$FACTORY" --force
  T retrieve-np$np mpirun -np "$np" --oversubscribe "$DFM" retrieve "$RUN" --nprobe "$NPROBE" --measure-recall "$RECALL_Q"
  cp "$RUN/manifest.json" "$OUT/manifest-np$np.json"
  cat "$RUN"/retrieve/nbr-*.bin | sha256sum | cut -d' ' -f1 > "$OUT/nbr-np$np.sha256"  # must not depend on np
done

# 4. predicted vs measured
python3 - "$OUT" $NPS <<'PY' | tee "$OUT/summary.txt"
import json, re, sys
out, nps = sys.argv[1], sys.argv[2:]
def tv(name):
    t = open("%s/time-%s.txt" % (out, name)).read()
    g = lambda k: re.search(k + r": (.*)", t).group(1)
    w = g(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\)").split(":")
    wall = sum(float(x) * 60 ** i for i, x in enumerate(reversed(w)))
    return wall, float(g("User time \(seconds\)")) + float(g("System time \(seconds\)")), int(g("Maximum resident set size \(kbytes\)")) / 1024
print(open(out + "/settings.txt").read().strip())
w, c, r = tv("mkrun")
print("mkrun: %.1f s wall, %.1f s CPU, %.0f MB peak RSS" % (w, c, r))
for np in nps:
    est = json.load(open("%s/estimate-np%s.json" % (out, np)))
    pred = {s["stage"]: s for s in est.get("stages", [])}
    man = json.load(open("%s/manifest-np%s.json" % (out, np)))["stages"]
    for st in ("index", "retrieve"):
        w, c, r = tv("%s-np%s" % (st, np))
        p = pred.get(st, {})
        ps, pm = p.get("seconds", float("nan")), p.get("memory_per_rank_bytes", float("nan")) / 2 ** 20
        stage_s = man[st].get("timings", {}).get("total_s", float("nan"))
        print("np %s %-8s: stage %.1f s (manifest), %.1f s wall, %.1f s CPU all ranks, peak RSS %.0f MB (of one rank)"
              " | predicted %.1f s (slowest rank, CPU), %.0f MB per rank | measured/predicted %.2f"
              % (np, st, stage_s, w, c, r, ps, pm, stage_s / ps if ps == ps and ps else float("nan")))
    rec = man["retrieve"].get("recall", {})
    tm = man["retrieve"]["timings"]
    print("np %s retrieve: search %.1f s, index search (slowest rank) %.1f s; recall@%s = %.4f on %s queries (%s)"
          % (np, tm.get("search_s", float("nan")), tm.get("index_search_s_max_rank", float("nan")), rec.get("k"),
             rec.get("recall@k", float("nan")), rec.get("queries", "?"), man["index"]["factory"]))
h = {np: open("%s/nbr-np%s.sha256" % (out, np)).read().strip() for np in nps}
print("neighbour blocks: %s" % ("identical for np " + ", ".join(nps) if len(set(h.values())) == 1 else "DIFFER: %s" % h))
PY
