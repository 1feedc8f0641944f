#!/usr/bin/env bash
# bench_targets.sh — target shards: write throughput vs a plain sequential write of the same bytes,
# C and Python reader stream throughput, compression ratio and bytes per chunk per dtype / shuffle /
# store option. Prints a Markdown table block for bench/results/report-targets.md.
#   bash bench/retrieval/bench_targets.sh                  synthetic data (N=8000, K=16, d=384)
#   REAL_RUN=runs/demo bash bench/retrieval/bench_targets.sh   also ratios on a real run's neighbours/embeddings
#   N=.. K=.. D=.. DIR=/path/on/the/disk/to/measure
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DFM=${DFM:-$ROOT/build/dfm}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
N=${N:-8000}; K=${K:-16}; D=${D:-384}
DIR=${DIR:-$(mktemp -d /tmp/dfm-bench-targets-XXXXXX)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DFM_LOG_LEVEL=warn
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR"
# bench/retrieval/bench_targets.c: pre-encode records, then time the shard writer against write()+fsync, and stream
# a run with the C reader
make -s --no-print-directory -C "$ROOT" build/dfm build/bench/bench_targets
BENCH=$ROOT/build/bench/bench_targets

echo "## date $(date -u +%F) host $(hostname) cpus $(nproc) disk of $DIR: $(df -h "$DIR" | tail -1 | awk '{print $1" "$2}')"
echo "### write throughput (synthetic, N=$N, K=$K, d=$D, fp16 without shuffle (its default), zstd 3)"
"$BENCH" write "$DIR" "$N" "$K" "$D"

ratios() {  # label run-args...
  local label=$1; shift
  echo "### bytes per chunk and compression ($label)"
  echo "| dtype | store | shuffle | record bytes/chunk | raw payload bytes/chunk | stored/raw | disk bytes/chunk (data.mdb + table) | write-targets s |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for dt in fp32 fp16 bf16; do
    for st in embeddings ids; do
      for sh in yes no; do
        [ $st = ids ] && [ $sh = no ] && continue
        local out=$DIR/r-$dt-$st-$sh
        "$@" --dtype $dt --store $st --shuffle $sh "$out" >/dev/null
        "$PY" - "$out" "$dt" "$st" "$sh" <<'PYEOF'
import json, sys
run, dt, st, sh = sys.argv[1:]
t = json.load(open(run + "/manifest.json"))["stages"]["targets"]
c = t["counts"]; n = c["records"]
print(f"| {dt} | {st} | {sh if st == 'embeddings' else '-'} | {c['stored_bytes']/n:.0f} | {c['raw_bytes']/n:.0f} | "
      f"{c['stored_bytes']/c['raw_bytes']:.3f} | {(c['lmdb_bytes']+c['table_bytes'])/n:.0f} | {t['timings']['total_s']:.2f} |")
PYEOF
      done
    done
  done
}
synth() { local out=${!#}; "$DFM" write-targets "$out" --synthetic "$N" --k "$K" --d "$D" --seq-chunks 32 --target-shards 2 "${@:1:$#-1}"; }
ratios "synthetic unit vectors, N=$N, K=$K, d=$D" synth

echo "### read throughput (synthetic fp16 embeddings run above, no shuffle = the fp16 default)"
R=$DIR/r-fp16-embeddings-no
"$BENCH" read "$R" 0
"$BENCH" read "$R" -1
"$BENCH" read "$DIR/r-fp16-ids-yes" 0
"$PY" - "$ROOT/python" "$R" <<'PYEOF'
import sys, time
sys.path.insert(0, sys.argv[1])
import dfm_targets
t0 = time.time(); r = dfm_targets.TargetRun(sys.argv[2]); t1 = time.time(); n = 0
for rec in r.records(): n += 1
t2 = time.time()
print(f"python read {n} records: open {t1-t0:.3f}s, stream {t2-t1:.3f}s = {n/(t2-t1):.0f} records/s, "
      f"{n*r.k*(r.d*4+12)/(t2-t1)/1e9:.3f} GB/s decoded fp32")
PYEOF

if [ -n "${REAL_RUN:-}" ]; then
  real() { local out=${!#}; rm -rf "$out"; mkdir -p "$out"; cp -r "$REAL_RUN"/manifest.json "$REAL_RUN"/chunk "$REAL_RUN"/encode "$REAL_RUN"/retrieve "$out"/ 2>/dev/null;
           "$DFM" write-targets "$out" --target-shards 2 "${@:1:$#-1}"; }
  NREAL=$("$PY" -c "import json,sys;print(json.load(open(sys.argv[1]+'/manifest.json'))['stages']['chunk']['counts']['chunks'])" "$REAL_RUN")
  ratios "real run $REAL_RUN: all-MiniLM-L6-v2 embeddings, N=$NREAL" real
fi
