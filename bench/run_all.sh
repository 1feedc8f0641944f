#!/usr/bin/env bash
# run_all.sh [NAME...] — run the benchmarks (all, or those named: tokenizer encoder_cpu retrieve targets
# train). Each prints dfm and its peer side by side with the ratio; record results in BENCHMARKS.md with
# the date. They take minutes to tens of minutes each on 2 cores (retrieve at 1M vectors is the longest).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ALL=(tokenizer encoder_cpu targets train retrieve)
[ $# -gt 0 ] && ALL=("$@")
for b in "${ALL[@]}"; do
  f=$HERE/bench_$b.sh
  [ -f "$f" ] || { echo "no benchmark $b ($f)" >&2; exit 2; }
  echo "=== bench_$b ($(date -u +%FT%TZ))"
  bash "$f"
done
