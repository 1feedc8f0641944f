#!/usr/bin/env bash
# bench_python_loader.sh — the Python package's loader (dfm.Batches) beside dfm-train's C loader
# (bench/loader/bench_loader.sh) on target shards of the demo's shape: fp16, K = 16, d = 384, L = 32, 4 shards.
# Without RUN it builds one in a scratch folder: `dfm chunk` over the first 400 corpus lines (tokens), then
# `dfm write-targets --synthetic` into the same run (targets of that shape; the bytes do not change the
# reader's speed). Results: bench/results/python_loader.md.
#   [RUN=runs/demo] [SEQ_LEN=256 BATCH=16 N=100 REPS=3] bash bench/loader/bench_python_loader.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/\1="\2"/p' "$DFM_CACHE/paths.mk")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DFM_LOG_LEVEL=warn
SEQ_LEN=${SEQ_LEN:-256} BATCH=${BATCH:-16} N=${N:-100} REPS=${REPS:-3}
make -s --no-print-directory -C "$ROOT" all build/bench/bench_loader
if [ -z "${RUN:-}" ]; then
  W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
  head -400 "$DFM_CORPUS" > "$W/docs.jsonl"
  RUN=$W/run
  "$ROOT/build/dfm" chunk "$RUN" "$W/docs.jsonl" --tokenizer "$DFM_TOKENIZER" --seq-len "$SEQ_LEN" >/dev/null
  n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stages']['chunk']['counts']['chunks'])" "$RUN/manifest.json")
  "$ROOT/build/dfm" write-targets "$RUN" --synthetic "$n" --k 16 --d 384 --dtype fp16 --target-shards 4 \
    --seq-chunks $((SEQ_LEN / 32)) >/dev/null
fi
"$DFM_PYTHON" "$ROOT/bench/loader/bench_python_loader.py" "$RUN" "$SEQ_LEN" "$BATCH" "$N" "$REPS" 32
