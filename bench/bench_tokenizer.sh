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

make -s --no-print-directory -j2 build/bench/bench_tokenizer

echo "tokenizer throughput: $(date -u '+%F %T') UTC, $(uname -m), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "texts: first ${MB} MB of $(basename "$CORPUS"); best of $REPS passes after a warm-up; HF tokenizers $("$PY" -c 'import tokenizers; print(tokenizers.__version__)')"
echo "MB/s = wall clock; MB/cpu-s = per second of process CPU time (all threads), which a busy shared machine disturbs less"
printf '%-10s %3s %9s %12s %10s | %9s %12s %10s | %7s %9s\n' tokenizer thr "dfm MB/s" "dfm tok/s" "dfm MB/cpu" \
  "HF MB/s" "HF tok/s" "HF MB/cpu" "wall x" "cpu x"
for name in $TOKENIZERS; do
  tj=$DFM_CACHE/tokenizers/$name/tokenizer.json
  for t in $THREADS; do
    d=$(./build/bench/bench_tokenizer "$tj" "$CORPUS" "$MB" "$t" "$REPS" | tail -1)
    h=$(RAYON_NUM_THREADS=$t TOKENIZERS_PARALLELISM=true "$PY" bench/bench_tokenizer_hf.py "$tj" "$CORPUS" "$MB" "$t" "$REPS" | tail -1)
    get() { sed -n "s|.* $2=\([^ ]*\).*|\1|p" <<<"$1"; }
    if [ -z "$(get "$d" tokens)" ] || [ "$(get "$d" tokens)" != "$(get "$h" tokens)" ]; then
      echo "ERROR: $name: dfm made $(get "$d" tokens) tokens, HF $(get "$h" tokens)" >&2; exit 1
    fi
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1fx", a/b}'; }
    printf '%-10s %3s %9s %12s %10s | %9s %12s %10s | %7s %9s\n' "$name" "$t" "$(get "$d" MB/s)" "$(get "$d" tokens/s)" \
      "$(get "$d" MB/cpu-s)" "$(get "$h" MB/s)" "$(get "$h" tokens/s)" "$(get "$h" MB/cpu-s)" \
      "$(ratio "$(get "$d" MB/s)" "$(get "$h" MB/s)")" "$(ratio "$(get "$d" MB/cpu-s)" "$(get "$h" MB/cpu-s)")"
  done
done
echo "same token count from dfm and HF in every row (checked)"
