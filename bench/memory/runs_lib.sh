# bench/memory/runs_lib.sh — what the real-LM memory benchmarks share (sourced by bench_real_memory.sh,
# bench_reading.sh and bench_information.sh once they have set ROOT): the cache's paths, MPI allowed as root, the
# programs and the LM checked, build(), which uses their L and NP, and timed().
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
DFM=$ROOT/build/dfm TRAIN=$ROOT/build/dfm-train PY=$DFM_PYTHON TOK=$DFM_LM/tokenizer.json
[ -x "$DFM" ] && [ -x "$TRAIN" ] || { echo "$(basename "$0" .sh): build first (make)" >&2; exit 1; }
[ -f "$DFM_LM/config.json" ] || { echo "$(basename "$0" .sh): no LM at $DFM_LM (make lm)" >&2; exit 1; }

# build RUN from a JSON config written here: chunk (doc-aligned, SEQ-token sequences), encode, index, retrieve (K = 16,
# EXCLUDE policy; DATASTORE: a finished run whose index the queries search instead), write-targets
build() { # RUN INPUT SEQ DATASTORE(or "") EXCLUDE
  local run=$1 input=$2 seq=$3 ds=$4 excl=$5 extra=""
  [ -n "$ds" ] && extra=", \"datastore\": \"$ds\""
  cat > "$run.json" <<JSON
{"run": "$run", "inputs": ["$input"], "tokenizer": "$TOK",
 "chunk": {"chunk-len": $L, "seq-len": $seq, "doc-aligned": true},
 "encode": {"model": "$DFM_MODEL", "device": "cpu", "block-chunks": 1024},
 "retrieve": {"k": 16, "exclude": "$excl"$extra},
 "write-targets": {"target-shards": 2, "dtype": "fp16"}}
JSON
  mpirun -np "$NP" "$DFM" build "$run.json" > "$run.log" 2>&1 || { tail -20 "$run.log" >&2; exit 1; }
}

# CMD's wall and CPU seconds (user + system) into FILE as "wall cpu" (FILE.time: bash's own figures); returns CMD's
# exit status, so that `timed F cmd || { ...; exit 1; }` stops on a failed command
timed() { # FILE CMD...
  local f=$1 TIMEFORMAT="%R %U %S" rc=0
  shift
  { time "$@" 2>&3 || rc=$?; } 3>&2 2> "$f.time"
  awk '{printf "%.1f %.1f\n", $1, $2 + $3}' "$f.time" > "$f"
  return $rc
}
