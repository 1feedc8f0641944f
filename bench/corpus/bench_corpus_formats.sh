#!/usr/bin/env bash
# bench_corpus_formats.sh — reading and chunking the same texts as .jsonl, .jsonl.zst, .jsonl.gz and Parquet
# (snappy, zstd), dfm's reader against pyarrow.parquet reading the same column (bench_corpus_formats.py
# says how; bench_corpus_read.c and corpus_read_peer.py are the two sides).
#
#   bash bench/corpus/bench_corpus_formats.sh          COPIES=8 (x 4 MB of gcide.jsonl) ROUNDS=3 CHUNK_ROUNDS=2
#
# Env: COPIES, ROUNDS, CHUNK_ROUNDS, ROWS_PER_GROUP (1000), PEERS_PYTHON (default: bench/peers.sh --python;
#      its pyarrow is the peer). Writes bench/results/corpus_formats.md and corpus_formats.json.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
PY=${PEERS_PYTHON:-$(bash bench/peers.sh --python)} || { echo "bench_corpus_formats: no peer venv (bash bench/peers.sh)" >&2; exit 1; }
"$PY" -c 'import pyarrow' || { echo "bench_corpus_formats: the peer venv has no pyarrow" >&2; exit 1; }
make -s --no-print-directory -j2 build/dfm build/bench/bench_corpus_read >/dev/null
W=$(mktemp -d /tmp/dfm-bench-formats-XXXXXX)
trap 'rm -rf "$W"' EXIT
mkdir -p bench/results
"$PY" bench/corpus/bench_corpus_formats.py --corpus "$DFM_CACHE/corpus/gcide.jsonl" --tokenizer "$DFM_CACHE/tokenizers/qwen2.5/tokenizer.json" \
  --copies "${COPIES:-8}" --rounds "${ROUNDS:-3}" --chunk-rounds "${CHUNK_ROUNDS:-2}" --rows-per-group "${ROWS_PER_GROUP:-1000}" \
  --work "$W" --out bench/results/corpus_formats
