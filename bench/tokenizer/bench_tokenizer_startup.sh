#!/usr/bin/env bash
# bench_tokenizer_startup.sh — what the tokenizer cache saves at start-up: `dfm chunk` of a ~4 MB corpus at
# np=1 and np=2, with the cache off (every rank parses tokenizer.json) and on (every rank maps the cache
# file; it is made once before the timed runs), in interleaved rounds.
#
#   bash bench/tokenizer/bench_tokenizer_startup.sh        REPS=3, corpus $DFM_CACHE/corpus/gcide.jsonl (4.1 MB)
#
# Env: REPS, CORPUS, TOKENIZER (default Qwen2.5), DFM (default build/dfm), NPS ("1 2"), KEEP=1,
#      BEFORE=PATH a dfm built before the cache existed, timed as a third side "before".
# Each run is timed with /usr/bin/time around mpirun: wall seconds and user+system CPU seconds of
# mpirun and its ranks. Prints a Markdown table of min / median / max per (cache, np).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
DFM=${DFM:-$ROOT/build/dfm}
CORPUS=${CORPUS:-$DFM_CACHE/corpus/gcide.jsonl}
TOKENIZER=${TOKENIZER:-$DFM_CACHE/tokenizers/qwen2.5/tokenizer.json}
REPS=${REPS:-3} NPS=${NPS:-"1 2"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
B=$(mktemp -d /tmp/dfm-bench-startup-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$B"' EXIT
for f in "$DFM" "$CORPUS" "$TOKENIZER"; do [ -e "$f" ] || { echo "missing $f" >&2; exit 1; }; done

# the cache the "on" runs map, made once (the first load of a new tokenizer.json parses and writes it)
DFM_TOKENIZER_CACHE=$B/cache "$DFM" tokenize --tokenizer "$TOKENIZER" "warm" >/dev/null

one() {  # cache(off|on|before) np round
  local dir=$B/run-$1-$2-$3 env=off bin=$DFM
  [ "$1" = on ] && env=$B/cache
  [ "$1" = before ] && bin=$BEFORE
  DFM_TOKENIZER_CACHE=$env /usr/bin/time -f "%e %U %S" -o "$B/t" \
    mpirun -np "$2" "$bin" chunk "$dir" "$CORPUS" --tokenizer "$TOKENIZER" >/dev/null 2>"$B/err" \
    || { cat "$B/err" >&2; exit 1; }
  read -r w u s <"$B/t"
  echo "cache=$1 np=$2 round=$3 wall=$w cpu=$(echo "$u + $s" | bc -l)" | tee -a "$B/times" >&2
  rm -rf "$dir"
}

echo "tokenizer start-up: $(date -u '+%F %T') UTC, $(getconf _NPROCESSORS_ONLN) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "dfm chunk of $(basename "$CORPUS") ($(stat -c %s "$CORPUS") bytes), tokenizer $(basename "$(dirname "$TOKENIZER")"), $REPS interleaved rounds"
read -r -a nps <<<"$NPS"
for ((r = 0; r < REPS; r++)); do
  combos=()
  for np in "${nps[@]}"; do combos+=("off $np" "on $np" ${BEFORE:+"before $np"}); done
  for ((i = 0; i < ${#combos[@]}; i++)); do
    c=${combos[$(((i + r) % ${#combos[@]}))]}
    one ${c% *} ${c#* } "$r"
  done
done
echo
echo "| cache | np | wall s min / med / max | CPU s min / med / max |"
echo "|---|---|---|---|"
for np in "${nps[@]}"; do
  for c in off on ${BEFORE:+before}; do
    for k in wall cpu; do
      sed -n "s/^cache=$c np=$np .* $k=\([^ ]*\).*/\1/p" "$B/times" | sort -g | awk '{v[NR]=$1} END {m = NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "%.2f / %.2f / %.2f\n", v[1], m, v[NR]}' >"$B/$k"
    done
    echo "| $c | $np | $(cat "$B/wall") | $(cat "$B/cpu") |"
  done
done
