#!/usr/bin/env bash
# growth.sh — how each stage's cost grows with the corpus: wall time, CPU time, peak RSS per rank and disk
# at np = 1 and 2, for synthetic runs of growing size in the real formats (no encoder), and for the
# chunk stage on the real corpus concatenated to growing sizes. bench/retrieval/growth_report.py then fits each
# stage's growth, predicts a large job and draws the chart.
#
#   bash bench/retrieval/growth.sh                       sizes 1e5 3e5 1e6 chunks, d = 64 (about 15 CPU-minutes; an hour of
#                                              wall time on the shared 2-core VM at load 15-20)
#   SIZES="100000 300000" PARTS=synth bash bench/retrieval/growth.sh
#
# Env: SIZES (chunks), DIM (64: d = 384 costs 6x the time and disk on a shared 2-core machine), NPS ("1 2"),
#      K (16), NPROBE (8), MULTS (corpus copies for the chunk stage: "1 4 16" = 4, 16, 64 MB of GCIDE),
#      DCHECK (1: one extra point at N = 1e5 with d = 384, np = 1, to measure the cost of d),
#      PARTS ("chunk synth"), OUT (bench/results), JSONL (OUT/growth-PARTS.jsonl), DFM (build/dfm; a copy is used),
#      SUFFIX (added to the chunk stage's name, e.g. "-before" for another build), REPORT=0 skips the report,
#      KEEP=1 keeps the scratch folder. The committed results were made in parts (PARTS=chunk, then synth at np 1,
#      then np 2 and d = 384 separately) with REPORT=0, then growth_report.py once.
# Index: IVF(4*sqrt(N)),Flat — the rule `--index auto` uses above 1e5 vectors — with --nprobe NPROBE fixed
# (not tuned) so every point does the same kind of work. One thread per process.
# Writes JSONL (one line per stage, size and rank count) and calls growth_report.py on OUT/growth-*.jsonl, which writes
# OUT/growth.md and OUT/growth.svg.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
SIZES=${SIZES:-100000 300000 1000000} DIM=${DIM:-64} NPS=${NPS:-1 2} K=${K:-16} NPROBE=${NPROBE:-8}
MULTS=${MULTS:-1 4 16} PARTS=${PARTS:-chunk synth} DCHECK=${DCHECK:-1}
OUT=${OUT:-$ROOT/bench/results}
CORPUS=${CORPUS:-/var/cache/dfm/corpus/gcide.jsonl}
TOKENIZER=${DFM_TOKENIZER:-/var/cache/dfm/tokenizers/qwen2.5/tokenizer.json}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 DFM_LOG_LEVEL=warn DFM_PROGRESS=0
B=$(mktemp -d /tmp/dfm-growth-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
mkdir -p "$OUT"
JSONL=${JSONL:-$OUT/growth-$(echo $PARTS | tr " " -).jsonl}
: >"$JSONL"

make -s --no-print-directory -C "$ROOT" build/dfm build/tools/retrieve_mkrun build/bench/bench_targets
# private copies (the tree is shared and may be relinked while this runs; a copy taken mid-link is retried)
mkdir -p "$B/bin"
for _ in 1 2 3 4 5; do
  cp "${DFM:-$ROOT/build/dfm}" "$B/bin/dfm" && cp "$ROOT/build/tools/retrieve_mkrun" "$ROOT/build/bench/bench_targets" "$B/bin/" &&
    "$B/bin/dfm" --version >/dev/null 2>&1 && break
  sleep 10
done
DFM=$B/bin/dfm
"$DFM" --version >/dev/null
source "$ROOT/bench/retrieval/mpitime.sh"
disk() { du -sb "$@" 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'; }
run() { mpitime "$@"; }

# record STAGE N NP TAG DISK_BYTES [EXTRA_JSON]: one JSON line from the rank files of TAG
record() {
  local stage=$1 n=$2 np=$3 tag=$4 dbytes=$5 extra=${6:-}
  echo "{\"stage\":\"$stage\",\"n\":$n,\"np\":$np,\"dim\":${DIMNOW:-$DIM},\"wall_s\":$WALL,\"ranks\":$(ranks_json "$tag"),\"disk_bytes\":$dbytes$extra}" >>"$JSONL"
  printf '%-14s n=%-9s np=%s wall %7.2fs  disk %s\n' "$stage" "$n" "$np" "$WALL" "$dbytes"
}

echo "== growth: $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg), $(getconf _NPROCESSORS_ONLN) cpus, scratch $B"

if [[ " $PARTS " == *" chunk "* ]]; then
  for m in $MULTS; do
    c=$B/corpus-$m.jsonl
    for _ in $(seq "$m"); do cat "$CORPUS"; done >"$c"
    for np in $NPS; do
      r=$B/chunk-$m-$np
      run "$np" "chunk-$m-$np" "$DFM" chunk "$r" "$c" --tokenizer "$TOKENIZER"
      toks=$("$PY" -c "import json; print(json.load(open('$r/manifest.json'))['stages']['chunk']['counts']['stream_tokens'])")
      record "chunk${SUFFIX:-}" "$toks" "$np" "chunk-$m-$np" "$(disk "$r/chunk")" ",\"input_bytes\":$(stat -c %s "$c")"
      rm -rf "$r"
    done
    rm -f "$c"
  done
fi

# one synthetic point: N chunks of dimension DIMNOW at NP ranks (the base run is made once per N and d)
synth() {
  local n=$1 np=$2 base=$B/base-$1-$DIMNOW
  local nlist; nlist=$("$PY" -c "print(round(4 * $n ** 0.5))")
  if [ ! -d "$base" ]; then
    "$B/bin/retrieve_mkrun" "$base" "$n" "$DIMNOW" 32 65536 1 fp32 $((n / 20)) 1 >/dev/null
    # write-targets reads L and S from the chunk stage's config (retrieve_mkrun writes L = 4, 32 chunks per sequence)
    "$PY" -c "
import json; p = '$base/manifest.json'; m = json.load(open(p))
m['stages']['chunk']['config'].update({'chunk-len': 4, 'seq-len': 128}); json.dump(m, open(p, 'w'), indent=1)"
  fi
  local r=$B/run-$n-$DIMNOW-$np tag=$n-$DIMNOW-$np
  rm -rf "$r"; mkdir -p "$r"; cp -r "$base/chunk" "$base/manifest.json" "$r/"; ln -s "$base/encode" "$r/encode"
  run "$np" "index-$tag" "$DFM" index "$r" --index "IVF$nlist,Flat"
  record index "$n" "$np" "index-$tag" "$(disk "$r/index")" ",\"factory\":\"IVF$nlist,Flat\""
  run "$np" "retrieve-$tag" "$DFM" retrieve "$r" --k "$K" --nprobe "$NPROBE"
  record retrieve "$n" "$np" "retrieve-$tag" "$(disk "$r/retrieve")" ",\"nprobe\":$NPROBE,\"k\":$K"
  for store in embeddings ids; do
    run "$np" "targets-$store-$tag" "$DFM" write-targets "$r" --store "$store" --force
    local db; db=$(disk "$r/targets")
    # what a trainer pays: records/s through the C reader (one process, warm page cache: the run was just written)
    local rd; rd=$("$B/bin/bench_targets" read "$r" | sed -n 's/.*open \([0-9.]*\)s, stream \([0-9.]*\)s = \([0-9]*\) records.*/\1 \2 \3/p')
    set -- $rd
    record "targets-$store" "$n" "$np" "targets-$store-$tag" "$db" ",\"read_open_s\":$1,\"read_stream_s\":$2,\"read_records_s\":$3"
  done
  rm -rf "$r"
}

if [[ " $PARTS " == *" synth "* ]]; then
  # every size at the first rank count before the next rank count, so a cut-short run still has a whole curve
  first=1
  for np in $NPS; do
    DIMNOW=$DIM
    for n in $SIZES; do synth "$n" "$np"; done
    if [ "$DCHECK" = 1 ] && [ $first = 1 ]; then DIMNOW=384; synth "$(echo $SIZES | awk '{print $1}')" "$np"; rm -rf "$B"/base-*-384; fi
    first=0
  done
  rm -rf "$B"/base-*
fi
echo "== done $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
[ "${REPORT:-1}" = 1 ] && "$PY" "$ROOT/bench/retrieval/growth_report.py" --out "$OUT" --dfm "$DFM" "$OUT"/growth-*.jsonl
