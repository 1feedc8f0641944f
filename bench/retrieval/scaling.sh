#!/usr/bin/env bash
# scaling.sh — how the work and the time of dfm index and dfm retrieve shrink with more ranks, against
# the dfm before it did (OLD: every shard quantised every query again, rank 0 trained the index), and
# the per-rank work `dfm estimate` is fitted on (bench/retrieval/scaling_report.py).
#
#   bash bench/retrieval/scaling.sh                      the committed points (about an hour on the shared 2-core VM)
#   SIZES=100000 DIMS=64 NPS="1 2" FACS=pq bash bench/retrieval/scaling.sh     a short check
#
# Each point is N chunks of dimension d (tests/tools/retrieve_mkrun, the real formats), an index
# (pq: IVF(4 sqrt N),PQ(d/8)np — 8-dimensional sub-quantisers; flat: IVF(4 sqrt N),Flat), np ranks. On
# it, in one round each side: this tree's dfm (index, then retrieve with --nprobe NPROBE --k K, no recall
# tuning) and OLD's, in alternating order; every rank under /usr/bin/time (wall, user + system CPU,
# peak RSS), and this tree's work record from the manifest (counts and CPU seconds outside MPI). At the
# largest np of each (N, d, index) OLD's retrieve also runs on this tree's index: its neighbour blocks
# must be byte-identical to this tree's (outputs agree: recorded, and the benchmark fails otherwise).
# COARSE=1 (default) measures the coarse assignment alone (bench/retrieval/bench_coarse.c) at the points' sizes
# and at a big job's (50,000 lists, d = 384), where it dominates and the small points cannot show it.
# POLY=1 adds the polysemous-training measurement: OLD's index of IVF(N/400),PQ(d/4) without and with
# 'np' (FAISS on rank 0) against this tree's (distributed, 'np' added), np = 1, at the first size.
#
# Env: SIZES ("100000 300000"), DIMS ("64"), D384 (1: also N = first size at d = 384), NPS ("1 2 4"),
#      FACS ("pq flat"), MARGINS ("16": retrieve once per margin on the same index, --margin M: the exact
#      rescorings' rate is fitted only where the margin varies), PQM (the PQ's sub-quantisers; default d/8), MINILM (0; 1: the vectors of
#      bench/retrieval/large_point.sh, retrieve_mkrun --minilm-like with 2000 topics), NPROBE (8), K (16), OLD (the dfm before this change: a path, or a git commit
#      built into the scratch folder; default the commit before the first one of this change, empty to
#      skip), POLY (1), OUT (bench/results), JSONL (OUT/scaling.jsonl), KEEP=1 keeps the scratch folder.
# One thread per process (OMP_NUM_THREADS=1): on 2 shared cores, threads measure the neighbours' load.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
SIZES=${SIZES:-100000 300000} DIMS=${DIMS:-64} D384=${D384:-1} NPS=${NPS:-1 2 4} FACS=${FACS:-pq flat}
NPROBE=${NPROBE:-8} K=${K:-16} MARGINS=${MARGINS:-16} POLY=${POLY:-1} OLD=${OLD-ac82920} PQM=${PQM:-} MINILM=${MINILM:-0}
OUT=${OUT:-$ROOT/bench/results}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 DFM_LOG_LEVEL=warn DFM_PROGRESS=0
B=$(mktemp -d /tmp/dfm-scaling-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
mkdir -p "$OUT" "$B/bin"
JSONL=${JSONL:-$OUT/scaling.jsonl}
: >"$JSONL"
source "$ROOT/bench/retrieval/mpitime.sh"

make -s --no-print-directory -C "$ROOT" build/dfm build/tools/retrieve_mkrun build/bench/bench_coarse
cp "$ROOT/build/dfm" "$B/bin/dfm"; cp "$ROOT/build/tools/retrieve_mkrun" "$ROOT/build/bench/bench_coarse" "$B/bin/"
NEW=$B/bin/dfm
if [ -n "$OLD" ] && [ ! -x "$OLD" ]; then  # a commit: build it in a clean export
  git -C "$ROOT" archive --prefix=old/ "$OLD" | tar -x -C "$B"
  make -s --no-print-directory -C "$B/old" -j2 build/dfm >/dev/null 2>&1 || { echo "scaling: cannot build $OLD"; exit 1; }
  OLD=$B/old/build/dfm
fi
OLD_DESC=${OLD:+$("$OLD" --version 2>&1 | head -1)}
echo "== scaling: $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), $(getconf _NPROCESSORS_ONLN) cpus; minilm $MINILM; new $("$NEW" --version 2>&1 | head -1) ($(git -C "$ROOT" rev-parse --short HEAD)); old ${OLD_DESC:-none}"

copy() { rm -rf "$2"; mkdir -p "$2"; cp -r "$1/chunk" "$1/manifest.json" "$2/"; ln -s "$1/encode" "$2/encode"; }
factory() {  # pq|flat N D
  local nl; nl=$("$PY" -c "print(round(4 * $2 ** 0.5))")
  if [ "$1" = pq ]; then echo "IVF$nl,PQ${PQM:-$(($3 / 8))}np"; else echo "IVF$nl,Flat"; fi
}
work() { "$PY" -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['stages'][sys.argv[2]].get('work')))" "$1/manifest.json" "$2"; }
# record SIDE STAGE N D FAC NP TAG RUN [EXTRA]
record() {
  local w=null; [ "$1" = new ] && w=$(work "$8" "${2%-poly}")
  echo "{\"side\":\"$1\",\"stage\":\"$2\",\"n\":$3,\"dim\":$4,\"factory\":\"$5\",\"nprobe\":$NPROBE,\"k\":$K,\"margin\":${MARGIN:-16},\"np\":$6,\"minilm\":$MINILM,\"wall_s\":$WALL,\"ranks\":$(ranks_json "$7"),\"work\":$w${9:-}}" >>"$JSONL"
  printf '%-4s %-9s n=%-8s d=%-4s %-16s np=%s wall %8.2fs\n' "$1" "$2" "$3" "$4" "$5" "$6" "$WALL"
}
side() {  # SIDE DFM BASE N D FAC NP
  local s=$1 dfm=$2 base=$3 n=$4 d=$5 fac=$6 np=$7 r=$B/run-$1
  copy "$base" "$r"
  mpitime "$np" "$s-index" "$dfm" index "$r" --index "$fac"; record "$s" index "$n" "$d" "$fac" "$np" "$s-index" "$r"
  local m f=()
  for MARGIN in $MARGINS; do  # the old dfm had no --margin: it runs the default (16) once
    if [ "$s" = old ]; then [ "$MARGIN" = 16 ] || continue; m=(); else m=(--margin "$MARGIN"); fi
    mpitime "$np" "$s-retrieve" "$dfm" retrieve "$r" --nprobe "$NPROBE" --k "$K" ${m[@]+"${m[@]}"} --target-recall 0 ${f[@]+"${f[@]}"}
    record "$s" retrieve "$n" "$d" "$fac" "$np" "$s-retrieve" "$r"
    f=(--force)
  done
  MARGIN=16
}

points=()
for n in $SIZES; do for d in $DIMS; do points+=("$n:$d"); done; done
[ "$D384" = 1 ] && points+=("$(echo $SIZES | awk '{print $1}'):384")
round=0
for pt in "${points[@]}"; do
  IFS=: read -r n d <<<"$pt"
  base=$B/base-$n-$d
  if [ "$MINILM" = 1 ]; then "$B/bin/retrieve_mkrun" "$base" "$n" "$d" 32 4096 1 fp32 2000 2 --minilm-like >/dev/null
  else "$B/bin/retrieve_mkrun" "$base" "$n" "$d" 32 4096 1 fp32 $((n / 20)) >/dev/null; fi
  for f in $FACS; do
    fac=$(factory "$f" "$n" "$d")
    for np in $NPS; do
      round=$((round + 1))
      if [ -z "$OLD" ]; then side new "$NEW" "$base" "$n" "$d" "$fac" "$np"
      elif [ $((round % 2)) = 1 ]; then side new "$NEW" "$base" "$n" "$d" "$fac" "$np"; side old "$OLD" "$base" "$n" "$d" "$fac" "$np"
      else side old "$OLD" "$base" "$n" "$d" "$fac" "$np"; side new "$NEW" "$base" "$n" "$d" "$fac" "$np"; fi
    done
    if [ -n "$OLD" ]; then  # the old retrieve on the new index: the same neighbour blocks
      np=$(echo $NPS | awk '{print $NF}')
      rm -rf "$B/run-x"; cp -r "$B/run-new" "$B/run-x"
      mpitime "$np" old-on-new "$OLD" retrieve "$B/run-x" --nprobe "$NPROBE" --k "$K" --target-recall 0 --force
      agree=true
      for b in "$B/run-new"/retrieve/nbr-*.bin; do cmp -s "$b" "$B/run-x/retrieve/$(basename "$b")" || agree=false; done
      record old-on-new retrieve "$n" "$d" "$fac" "$np" old-on-new "$B/run-x" ",\"agree\":$agree"
      [ $agree = true ] || { echo "scaling: the old retrieve on the new index wrote other neighbour blocks ($fac, np=$np)"; exit 1; }
    fi
  done
  rm -rf "$base"
done

if [ "${COARSE:-1}" = 1 ]; then  # the coarse assignment alone: "nlist dim queries" x nprobe 1 (add) and NPROBE..32 (search)
  for c in "1265 64 4096" "2191 64 4096" "1265 384 4096" "8000 384 2048" "50000 384 1024"; do
    for p in 1 "$NPROBE" 16 32; do
      set -- $c
      echo "{\"side\":\"coarse\",\"stage\":\"coarse\",$("$B/bin/bench_coarse" $1 $2 $3 "$p" 3 | sed 's/^{//')" >>"$JSONL"
      tail -1 "$JSONL"
    done
  done
fi

if [ "$POLY" = 1 ] && [ -n "$OLD" ]; then  # FAISS's polysemous training: what 'np' saves
  n=$(echo $SIZES | awk '{print $1}'); d=$(echo $DIMS | awk '{print $1}')
  base=$B/base-poly; "$B/bin/retrieve_mkrun" "$base" "$n" "$d" 32 4096 1 fp32 $((n / 20)) >/dev/null
  nl=$((n / 400)) m=$((d / 4))
  for v in "old:IVF$nl,PQ$m" "old:IVF$nl,PQ${m}np" "new:IVF$nl,PQ$m"; do
    IFS=: read -r s fac <<<"$v"; dfm=$NEW; [ "$s" = old ] && dfm=$OLD
    copy "$base" "$B/run-poly"
    mpitime 1 "poly-$s" "$dfm" index "$B/run-poly" --index "$fac"
    record "$s" index-poly "$n" "$d" "$fac" 1 "poly-$s" "$B/run-poly"
  done
fi
echo "== done $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ "${REPORT:-1}" = 1 ] && "$PY" "$ROOT/bench/retrieval/scaling_report.py" --out "$OUT" "$JSONL"
