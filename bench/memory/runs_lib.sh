# bench/memory/runs_lib.sh — what the real-LM memory benchmarks share (sourced by bench_real_memory.sh and
# bench_reading.sh). Uses their DFM, DFM_MODEL, TOK, L and NP.

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
