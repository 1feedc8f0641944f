# tests/integration/bench/knowledge_runs.sh — the knowledge probes' runs at test size, sourced by
# test_knowledge_probes.sh and test_information_runs.sh once they have set ROOT: the cache's paths (PY, LM, TOK,
# DFM, DFM_MODEL), MPI as root, a SKIP line and exit 0 without the LM (make lm), fail(), a scratch folder T (removed
# on exit unless KEEP=1), and in it the facts of 16 invented entities and 8 probes (bench/memory/knowledge/) built
# with `dfm build`: T/corpus (retrieve --exclude document) and T/probes (query-only, retrieving from T/corpus).
# KNOWLEDGE_TARGETS: more keys of both configs' write-targets section (e.g. ', "slots-hold": "both"').
DFM=${DFM:-$ROOT/build/dfm}
if [ "$(id -u)" = 0 ]; then CACHE=${DFM_CACHE:-/var/cache/dfm}; else CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/\1="\2"/p' "$CACHE/paths.mk")"
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
LM=${DFM_LM:-$CACHE/models/smollm2-135m}
[ -f "$LM/config.json" ] || { echo "SKIP: no SmolLM2 folder at $LM (make lm)"; exit 0; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_btl_vader_single_copy_mechanism=none DFM_LOG_LEVEL=warn DFM_PROGRESS=0
T=$(mktemp -d /tmp/dfm-test-knowledge-XXXXXX)
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
TOK=$LM/tokenizer.json

"$PY" "$ROOT/bench/memory/knowledge/facts.py" --out "$T" --entities 16 --seed 1 >/dev/null || fail "facts.py"
"$PY" "$ROOT/bench/memory/knowledge/probe_tokens.py" --probes "$T/probes.jsonl" --tokenizer "$TOK" --out "$T/pt" \
  --limit 8 --seed 1 >/dev/null || fail "probe_tokens.py"
knowledge_config() { # RUN INPUT SEQ EXCLUDE EXTRA
  cat > "$1.json" <<JSON
{"run": "$1", "inputs": ["$2"], "tokenizer": "$TOK",
 "chunk": {"chunk-len": 32, "seq-len": $3, "doc-aligned": true},
 "encode": {"model": "$DFM_MODEL", "device": "cpu", "block-chunks": 1024},
 "retrieve": {"k": 16, "exclude": "$4"$5},
 "write-targets": {"target-shards": 2, "dtype": "fp16"${KNOWLEDGE_TARGETS:-}}}
JSON
}
knowledge_config "$T/corpus" "$T/corpus.jsonl" 256 document ""
knowledge_config "$T/probes" "$T/pt/probes.bin" 96 none ", \"datastore\": \"$T/corpus\""
mpirun -np 2 "$DFM" build "$T/corpus.json" >"$T/log" 2>&1 || { tail -20 "$T/log"; fail "build of the fact corpus"; }
mpirun -np 2 "$DFM" build "$T/probes.json" >"$T/log" 2>&1 || { tail -20 "$T/log"; fail "build of the probe run (query-only)"; }
