#!/usr/bin/env bash
# bench_loader.sh — dfm-train's loader threads on a real run's LMDB target shards: how many micro-batches
# per second they deliver (tokens + K x d target memory per chunk), for 1, 2 and 4 threads, to compare
# with a training step's time (the log's `stall` says whether the GPU waited).
#   RUN=runs/demo [SEQ_LEN=256 BATCH=16 N=200] bash bench/bench_loader.sh   (make demo makes runs/demo)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN=${RUN:-$ROOT/runs/demo}
SEQ_LEN=${SEQ_LEN:-256} BATCH=${BATCH:-16} N=${N:-200}
[ -f "$RUN/manifest.json" ] || { echo "bench_loader: no run at $RUN (make demo, or RUN=...)"; exit 1; }
make -s -C "$ROOT" build/libdfm.a build/dfm-train >/dev/null
EXE=$(mktemp /tmp/dfm-bench-loader-XXXXXX)
trap 'rm -f "$EXE"' EXIT
mpicc -std=c11 -O2 -D_GNU_SOURCE -I"$ROOT" -I"$ROOT/pipeline" -pthread -fopenmp "$ROOT/bench/bench_loader.c" \
  "$ROOT/build/obj/trainer/prefetch.o" "$ROOT/build/obj/trainer/data.o" "$ROOT/build/libdfm.a" \
  $(make -s -C "$ROOT" --no-print-directory print-ldlibs) -o "$EXE"
DFM_LOG_LEVEL=warn "$EXE" "$RUN" "$SEQ_LEN" "$BATCH" "$N"
