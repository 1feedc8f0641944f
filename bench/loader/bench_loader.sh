#!/usr/bin/env bash
# bench_loader.sh — dfm-train's loader threads on a real run's LMDB target shards: how many micro-batches
# per second they deliver (tokens + K x d target memory per chunk), for 1, 2 and 4 threads, to compare
# with a training step's time (the log's `stall` says whether the GPU waited).
#   RUN=runs/demo [SEQ_LEN=256 BATCH=16 N=200] bash bench/loader/bench_loader.sh   (make demo makes runs/demo)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUN=${RUN:-$ROOT/runs/demo}
SEQ_LEN=${SEQ_LEN:-256} BATCH=${BATCH:-16} N=${N:-200}
[ -f "$RUN/manifest.json" ] || { echo "bench_loader: no run at $RUN (make demo, or RUN=...)"; exit 1; }
make -s --no-print-directory -C "$ROOT" build/bench/bench_loader
DFM_LOG_LEVEL=warn "$ROOT/build/bench/bench_loader" "$RUN" "$SEQ_LEN" "$BATCH" "$N"
