#!/usr/bin/env bash
# demo.sh — the README's main job: the pipeline end to end on the embedded corpus, 2 MPI ranks.
#   RUN=DIR scripts/demo.sh    (default: runs/demo)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\([A-Z_]*\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
DFM=$ROOT/build/dfm
RUN=${RUN:-$ROOT/runs/demo}
NP=${NP:-2}
T0=$(date +%s)
echo "== dfm demo: corpus $DFM_CORPUS, $NP ranks, run directory $RUN"
has() { "$DFM" --help | grep -q "^  $1 "; }

echo "== chunk (LM tokenizer: $DFM_TOKENIZER)"
mpirun -np "$NP" "$DFM" chunk "$RUN" "$DFM_CORPUS" --tokenizer "$DFM_TOKENIZER"
"$DFM" chunk-dump "$RUN" --text --first 1 --count 1

if has encode; then
  echo "== encode (model: $DFM_MODEL)"
  mpirun -np "$NP" "$DFM" encode "$RUN" --model "$DFM_MODEL" --device cpu
fi
if has index; then
  echo "== index"
  mpirun -np "$NP" "$DFM" index "$RUN"
fi
if has retrieve; then
  echo "== retrieve"
  mpirun -np "$NP" "$DFM" retrieve "$RUN" --measure-recall 200
fi
if has write-targets; then
  echo "== write targets"
  mpirun -np "$NP" "$DFM" write-targets "$RUN"
fi
if has verify; then
  echo "== verify"
  "$DFM" verify "$RUN"
fi
echo "== done in $(( $(date +%s) - T0 ))s; outputs under $RUN (manifest: $RUN/manifest.json)"
