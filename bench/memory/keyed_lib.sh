# keyed_lib.sh — sourced by bench_memory.sh and ablations.sh: the keyed synthetic benchmark's steps.
# A corpus (`dfm-train synth --mode keyed|keyed-random`), a backbone pretrained on it, DFM modules
# trained on that frozen backbone; each DFM run's final held-out evaluation is the last "eval" record of
# its log.jsonl. Sizes come from the environment (defaults: the full benchmark on 2 CPU cores):
#   THREADS=2 SEQS=3000 T=128 L=16 PRE_STEPS=600 DFM_STEPS=1500 VAL=64
DFM_TRAIN=${DFM_TRAIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/dfm-train}
THREADS=${THREADS:-2} SEQS=${SEQS:-3000} T=${T:-128} L=${L:-16} PRE_STEPS=${PRE_STEPS:-600}
DFM_STEPS=${DFM_STEPS:-1500} VAL=${VAL:-64}

# keyed_data DIR MODE [synth flags...]: the corpus (chunk length $L unless the flags say otherwise)
keyed_data() {
  local dir=$1 mode=$2; shift 2
  [ -f "$dir/targets.bin" ] && return 0
  "$DFM_TRAIN" synth --out "$dir" --mode "$mode" --seqs "$SEQS" --seq-len "$T" --chunk-len "$L" "$@" >/dev/null
}

# keyed_pretrain DATA_DIR OUT: a 2-layer, 64-wide Qwen3-style backbone on DATA_DIR/tokens.bin
keyed_pretrain() {
  local data=$1 out=$2
  [ -f "$out/model/config.json" ] && return 0
  "$DFM_TRAIN" pretrain --data "$data/tokens.bin" --out "$out" --seq-len "$T" --batch 8 --steps "$PRE_STEPS" \
    --lr 3e-3 --warmup 20 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --val-seqs "$VAL" --threads "$THREADS" \
    --no-ckpt >"$out.log" 2>&1 || { tail -n 5 "$out.log" >&2; return 1; }
}

# keyed_dfm DATA_DIR BACKBONE OUT [train flags...]: DFM modules with the trainer's defaults unless the
# flags say otherwise (the benchmark's own choices: lr 5e-3, batch 8, fusion after both layers); prints the final evaluation as one JSON object, with the wall time in "seconds"
keyed_dfm() {
  local data=$1 backbone=$2 out=$3; shift 3
  local t0; t0=$(date +%s.%N)
  "$DFM_TRAIN" train --backbone "$backbone" --data "$data/tokens.bin" --targets "$data/targets.bin" --out "$out" \
    --seq-len "$T" --chunk-len "$L" --batch 8 --steps "$DFM_STEPS" --lr 5e-3 --warmup 20 --fusion-layers 0,1 \
    --pred-hidden 64 --val-seqs "$VAL" --threads "$THREADS" --no-ckpt "$@" >"$out.log" 2>&1 ||
    { tail -n 5 "$out.log" >&2; return 1; }
  python3 - "$out/log.jsonl" "$t0" <<'PY'
import json, sys, time
ev = [r for r in map(json.loads, open(sys.argv[1])) if "eval" in r][-1]
out = dict(ev["eval"], step=ev["step"], seconds=round(time.time() - float(sys.argv[2]), 1))
print(json.dumps(out))
PY
}

# keyed_ideal DATA_DIR: the corpus's ideal cross-entropies (bench/memory/keyed_ideal.py) as one JSON object
keyed_ideal() {
  "${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}" "$(dirname "${BASH_SOURCE[0]}")/keyed_ideal.py" "$1" \
    --seq-len "$T" --chunk-len "$(python3 -c 'import struct,sys; print(struct.unpack_from("<I", open(sys.argv[1],"rb").read(24), 20)[0])' "$1/targets.bin")" \
    --val-seqs "$VAL"
}
