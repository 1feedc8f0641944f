#!/usr/bin/env bash
# bench/memory/fusion_trials.sh — fusion variants dfm-train does not implement, tried in PyTorch on the keyed
# benchmark's corpus and backbone (bench/memory/fusion_trials.py): can predicted memory stop costing more than
# fusion off on the chunks whose key left the chain?
#
#   bash bench/memory/fusion_trials.sh [WORK_DIR]     # writes bench/results/fusion_trials.md and .jsonl
#
# Needs torch >= 2 (bench/peers.sh makes the venv; ANALYSIS_PYTHON overrides it). Sizes: bench/memory/keyed_lib.sh
# (the benchmark's corpus and backbone; DFM_STEPS steps per variant). About 8 minutes on 2 idle cores.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/keyed_lib.sh"
PY=${ANALYSIS_PYTHON:-/var/cache/dfm/peers-venv/bin/python}
"$PY" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null ||
  { echo "fusion_trials: no torch >= 2 at $PY: run bash bench/peers.sh first" >&2; exit 2; }
if [ $# -ge 1 ]; then W=$1; mkdir -p "$W"; else W=$(mktemp -d /tmp/dfm-fusion-trials-XXXXXX); trap 'rm -rf "$W"' EXIT; fi
RES=${RESULTS:-$HERE/../results}
mkdir -p "$RES"
T0=$(date +%s)
for mode in keyed keyed-random; do
  echo "-- $mode corpus and backbone ($PRE_STEPS steps)"
  keyed_data "$W/$mode" "$mode"
  keyed_pretrain "$W/$mode" "$W/$mode-pre"
done
: >"$W/trials.jsonl"
trial() { # CORPUS VARIANT [fusion_trials.py flags...]
  local c=$1; shift
  "$PY" "$HERE/fusion_trials.py" --data "$W/$c" --backbone "$W/$c-pre/model" --steps "$DFM_STEPS" \
    --seq-len "$T" --val-seqs "$VAL" --variant "$@"
}
# two at a time (each trial is one thread). On keyed-random, predicted memory carries nothing: a variant that
# gains there gains by capacity, not by memory ("fusion off" skips the whole fusion block).
set -- "keyed base" "keyed null" "keyed corrupt10" "keyed null+corrupt25" "keyed null+corrupt50" "keyed ffn" \
  "keyed base --layers 1" "keyed null+corrupt25 --layers 1" "keyed-random base" "keyed-random ffn"
while [ $# -gt 0 ]; do
  a=$1; shift
  b=${1:-}; [ $# -gt 0 ] && shift
  echo "-- $a${b:+ | $b}"
  # shellcheck disable=SC2086
  trial $a >"$W/a.json" &
  pa=$!
  # shellcheck disable=SC2086
  [ -z "$b" ] || trial $b >"$W/b.json"
  wait "$pa"
  cat "$W/a.json" >>"$W/trials.jsonl"
  [ -z "$b" ] || cat "$W/b.json" >>"$W/trials.jsonl"
done
python3 - "$W/trials.jsonl" "$RES/fusion_trials.md" "$(( $(date +%s) - T0 ))" \
  "THREADS=$THREADS SEQS=$SEQS PRE_STEPS=$PRE_STEPS DFM_STEPS=$DFM_STEPS bash bench/memory/fusion_trials.sh" \
  "$("$PY" -c 'import torch; print(torch.__version__)')" <<'PY'
import json, os, sys, time
runs = [json.loads(l) for l in open(sys.argv[1])]
out = ["# Fusion variants on the keyed benchmark (PyTorch trials)", "",
       "Run %s on %s (%d CPUs, load average %.1f at the end), %s s in all." % (
           time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.uname().machine, os.cpu_count(),
           os.getloadavg()[0], sys.argv[3]),
       "Command: `%s` (PyTorch %s, the venv of bench/peers.sh)" % (sys.argv[4], sys.argv[5]), "",
       "Held-out CE (nats). `followed` / `fresh`: chunks 1.. of each sequence whose key followed the chain / was "
       "drawn fresh (predicted memory is confidently wrong there). Δ = predicted memory − fusion off.", "",
       "| corpus | variant | fusion after layers | fusion off | predicted | target | Δ predicted | followed: off / predicted | fresh: off / predicted | fresh: target |",
       "|---|---|---|---:|---:|---:|---:|---|---|---:|"]
for r in runs:
    n, p, t = r["none"], r["predicted"], r["target"]
    out.append("| %s | %s | %s | %.4f | %.4f | %.4f | %+.4f | %.3f / %.3f | %.3f / %.3f | %.3f |" % (
        r["corpus"], r["variant"], r["layers"], n["all"], p["all"], t["all"], p["all"] - n["all"], n["followed"],
        p["followed"], n["fresh"], p["fresh"], t["fresh"]))
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
cp "$W/trials.jsonl" "$RES/fusion_trials.jsonl"
cat "$RES/fusion_trials.md"
