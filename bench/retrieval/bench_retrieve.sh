#!/usr/bin/env bash
# bench_retrieve.sh — dfm retrieve against raw FAISS (the faiss-cpu Python package) on the same index and
# the same queries; np=1 vs np=2 scaling; recall vs time for a few index choices.
#
#   bash bench/retrieval/bench_retrieve.sh             N=200000 vectors of dim 384 (synthetic, N/20 clusters)
#   N=1000000 NLIST=1024 TABLE=0 bash bench/retrieval/bench_retrieve.sh   report-retrieval.md's size, overhead + scaling only
#   N=50000 NLIST=256 MAIN=0 bash bench/retrieval/bench_retrieve.sh       the recall/time table only
#
# Env: N, DIM (384), K (16), MARGIN (16), NLIST (512), PQ (32), NPROBE (16), TABLE=0 skips the recall/time
#      table, KEEP=1 keeps the scratch folder. One thread per process: the 2-core machine is shared, and
#      multi-threaded timings there mostly measure the neighbours' load.
# Prints Markdown tables for bench/results/report-retrieval.md. Needs build/dfm and build/libdfm.a (make), faiss-cpu in the venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
N=${N:-200000} DIM=${DIM:-384} K=${K:-16} MARGIN=${MARGIN:-16} NLIST=${NLIST:-512} PQ=${PQ:-32} NPROBE=${NPROBE:-16}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
B=$(mktemp -d /tmp/dfm-bench-retrieve-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
now() { date +%s.%N; }
field() { "$PY" -c "import json,sys; s=json.load(open('$1/manifest.json'))['stages']['$2']; print(eval('s' + sys.argv[1]))" "$3"; }
calc() { echo "$*" | bc -l; }

make -s --no-print-directory -C "$ROOT" build/dfm build/tools/retrieve_mkrun
t=$(now); "$ROOT/build/tools/retrieve_mkrun" "$B/base" "$N" "$DIM" 32 65536 1 fp32 $((N / 20)) 1; echo "generated in $(calc "$(now) - $t") s"
copy() { rm -rf "$1"; mkdir -p "$1"; cp -r "$B/base/chunk" "$B/base/manifest.json" "$1/"; ln -s "$B/base/encode" "$1/encode"; }

FAC="IVF${NLIST},PQ${PQ}np"
echo "== index $FAC (np=1 and np=2)"
copy "$B/r1"; copy "$B/r2"
t=$(now); "$DFM" index "$B/r1" --index "$FAC" --train-sample $((NLIST * 80)) 2>&1 | grep -E "index:"; TI1=$(calc "$(now) - $t")
if [ "${MAIN:-1}" = 1 ]; then  # overhead and scaling (MAIN=0: only the recall/time table)
t=$(now); mpirun -np 2 "$DFM" index "$B/r2" --index "$FAC" --train-sample $((NLIST * 80)) 2>/dev/null; TI2=$(calc "$(now) - $t")

cat >"$B/peer.py" <<'PYEOF'
import json, os, struct, sys, time
import numpy as np, faiss
run, k, nprobe = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
faiss.omp_set_num_threads(1)
man = json.load(open(os.path.join(run, "manifest.json")))
t0 = time.perf_counter()
xs = []
for o in man["stages"]["encode"]["outputs"]:
    raw = open(os.path.join(run, o["file"]), "rb").read()
    dim = struct.unpack_from("<I", raw, 16)[0]; n = struct.unpack_from("<Q", raw, 32)[0]
    xs.append(np.frombuffer(raw, "<f4", n * dim, 128).reshape(n, dim))
x = np.concatenate(xs)
metas = []
for o in man["stages"]["chunk"]["outputs"]:
    raw = open(os.path.join(run, o["file"]), "rb").read()
    L, S = struct.unpack_from("<II", raw, 16); n = struct.unpack_from("<Q", raw, 40)[0]
    dt = np.dtype([("a", "<u8"), ("b", "<u8"), ("n_valid", "<u2"), ("flags", "<u2"), ("r", "<u4"), ("t", "<u4", (L,))])
    metas.append(np.frombuffer(raw, dt, n, 128))
m = np.concatenate(metas); cps = S // L
i = np.arange(len(x))
has_q = (i % cps != 0) & ((m["flags"] & 1) == 0) & (m["n_valid"] > 0)
has_q[1:] &= m["n_valid"][:-1] > 0
q = np.ascontiguousarray(x[np.nonzero(has_q)[0] - 1])
t1 = time.perf_counter()
index = faiss.read_index(os.path.join(run, "index", "index-00000.faiss"))
faiss.ParameterSpace().set_index_parameter(index, "nprobe", nprobe)
t2 = time.perf_counter()
D, I = index.search(q, k)
t3 = time.perf_counter()
print(f"faiss {faiss.__version__}: {len(q)} queries, k={k}, nprobe={nprobe}, 1 thread: load+queries {t1-t0:.2f}s, "
      f"read index {t2-t1:.2f}s, search {t3-t2:.2f}s")
print(f"PEER_SEARCH_S={t3-t2:.3f}")
PYEOF
echo "== raw FAISS (Python faiss-cpu) on the same index, same queries, k' = K + margin, one process"
out=$("$PY" "$B/peer.py" "$B/r1" $((K + MARGIN)) "$NPROBE"); echo "$out"
eval "$(echo "$out" | grep PEER_SEARCH_S)"
echo "== dfm retrieve np=1, same index and queries"
t=$(now); "$DFM" retrieve "$B/r1" --k "$K" --margin "$MARGIN" --nprobe "$NPROBE" 2>&1 | tail -1; W1=$(calc "$(now) - $t")
S1=$(field "$B/r1" retrieve "['timings']['search_s']"); F1=$(field "$B/r1" retrieve "['timings']['index_search_s_max_rank']")
echo "== dfm retrieve np=2 (2 index shards)"
t=$(now); mpirun -np 2 "$DFM" retrieve "$B/r2" --k "$K" --margin "$MARGIN" --nprobe "$NPROBE" 2>&1 | tail -1; W2=$(calc "$(now) - $t")
S2=$(field "$B/r2" retrieve "['timings']['search_s']"); F2=$(field "$B/r2" retrieve "['timings']['index_search_s_max_rank']")
same=yes; for f in "$B/r1"/retrieve/nbr-*.bin; do cmp -s "$f" "$B/r2/retrieve/$(basename "$f")" || same=no; done
NQ=$(field "$B/r1" retrieve "['counts']['queries']")
FV=$("$PY" -c 'import faiss;print(faiss.__version__)')
{
echo
echo "### dfm retrieve vs raw FAISS — $(date -u +%F), N=$N x $DIM fp32 (synthetic), $FAC, nprobe $NPROBE, K=$K, margin $MARGIN, $NQ queries, 1 thread per process, load average $(cut -d' ' -f1 /proc/loadavg)"
echo
echo "| path | search s | inside FAISS s | wall s | comparison |"
echo "|---|---|---|---|---|"
printf "| faiss-cpu %s: index.search(all queries, k'=%d) | %.2f | %.2f | — | 1.00 |\n" "$FV" $((K + MARGIN)) "$PEER_SEARCH_S" "$PEER_SEARCH_S"
printf "| dfm retrieve np=1 | %.2f | %.2f (FAISS 1.7.3, Debian build) | %.2f | %.2fx faiss-cpu; dfm's own work +%.1f%% over its FAISS calls; wall %.2fx |\n" \
  "$S1" "$F1" "$W1" "$(calc "$S1 / $PEER_SEARCH_S")" "$(calc "100 * ($S1 - $F1) / $F1")" "$(calc "$W1 / $PEER_SEARCH_S")"
printf "| dfm retrieve np=2 (2 shards, 2 processes) | %.2f | %.2f (slowest rank) | %.2f | scaling efficiency %.0f%% (search), %.0f%% (wall); files identical to np=1: %s |\n" \
  "$S2" "$F2" "$W2" "$(calc "100 * $S1 / (2 * $S2)")" "$(calc "100 * $W1 / (2 * $W2)")" "$same"
echo
printf "index build %s: np=1 %.1fs, np=2 %.1fs\n" "$FAC" "$TI1" "$TI2"
} | tee "$B/table1.md"
fi
[ "${TABLE:-1}" = 1 ] || exit 0

echo "== recall vs time (np=1, --measure-recall 500)"
rows=""
for spec in "$FAC:8" "$FAC:32" "IVF${NLIST},Flat:8"; do
  fac=${spec%:*}; np_=${spec##*:}
  R=$B/r1
  if [ "$fac" != "$FAC" ]; then R=$B/rf; [ -d "$R" ] || { copy "$R"; "$DFM" index "$R" --index "$fac" --train-sample $((NLIST * 80)) 2>/dev/null; }; fi
  "$DFM" retrieve "$R" --k "$K" --margin "$MARGIN" --nprobe "$np_" --measure-recall 500 --force 2>/dev/null | tail -1
  rows="$rows| $fac | $np_ | $(field "$R" retrieve "['recall']['recall@k']" | xargs printf '%.4f') | $(field "$R" retrieve "['timings']['search_s']" | xargs printf '%.2f') |\n"
done
echo
NQ=$(field "$B/r1" retrieve "['counts']['queries']")
echo "| index | nprobe | recall@$K (500 queries vs brute force) | dfm search s ($NQ queries, np=1, 1 thread) |"
echo "|---|---|---|---|"
printf "$rows"
