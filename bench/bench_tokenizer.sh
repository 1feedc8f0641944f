#!/usr/bin/env bash
# bench_tokenizer.sh — tokenizer throughput, dfm vs Hugging Face `tokenizers` (encode_batch), side by side.
#
#   bash bench/bench_tokenizer.sh            # MB=4 THREADS="1 2" REPS=3, both cached tokenizers
#   MB=1 THREADS=1 TOKENIZERS=qwen2.5 bash bench/bench_tokenizer.sh
#
# Same texts (the first MB megabytes of the corpus's "text" fields), same thread count (dfm: pthreads
# over documents; HF: RAYON_NUM_THREADS), add_special_tokens=False, one untimed warm-up pass, best of
# REPS timed passes. Also checks that both produced the same number of tokens.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
PY=${DFM_PYTHON:-$DFM_CACHE/venv/bin/python}
CORPUS=${DFM_CORPUS:-$DFM_CACHE/corpus/gcide.jsonl}
MB=${MB:-4} REPS=${REPS:-3} THREADS=${THREADS:-"1 2"} TOKENIZERS=${TOKENIZERS:-"qwen2.5 llama-3.2"}

make -s -j2 build/libdfm.a >/dev/null
mkdir -p build/bench
# shellcheck disable=SC2046
mpicc -std=c11 -O2 -g -D_GNU_SOURCE -pthread -I. -Ipipeline bench/bench_tokenizer.c build/libdfm.a \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc libxxhash) -o build/bench/bench_tokenizer

echo "tokenizer throughput: $(date -u +%F) $(uname -m), $(nproc) cores, ${MB} MB of $(basename "$CORPUS"), best of $REPS"
echo "HF tokenizers $("$PY" -c 'import tokenizers; print(tokenizers.__version__)')"
printf '%-10s %7s %12s %14s %12s %14s %8s\n' tokenizer threads "dfm MB/s" "dfm tokens/s" "HF MB/s" "HF tokens/s" "dfm/HF"
for name in $TOKENIZERS; do
  tj=$DFM_CACHE/tokenizers/$name/tokenizer.json
  for t in $THREADS; do
    d=$(./build/bench/bench_tokenizer "$tj" "$CORPUS" "$MB" "$t" "$REPS" | tail -1)
    h=$(RAYON_NUM_THREADS=$t TOKENIZERS_PARALLELISM=true "$PY" bench/bench_tokenizer_hf.py "$tj" "$CORPUS" "$MB" "$t" "$REPS" | tail -1)
    get() { sed -n "s|.* $2=\([^ ]*\).*|\1|p" <<<"$1"; }
    if [ -z "$(get "$d" tokens)" ] || [ "$(get "$d" tokens)" != "$(get "$h" tokens)" ]; then
      echo "ERROR: $name: dfm made $(get "$d" tokens) tokens, HF $(get "$h" tokens)" >&2; exit 1
    fi
    printf '%-10s %7s %12s %14s %12s %14s %7.2fx\n' "$name" "$t" "$(get "$d" MB/s)" "$(get "$d" tokens/s)" \
      "$(get "$h" MB/s)" "$(get "$h" tokens/s)" "$(awk -v a="$(get "$d" MB/s)" -v b="$(get "$h" MB/s)" 'BEGIN{print a/b}')"
  done
done
