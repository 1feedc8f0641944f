#!/usr/bin/env bash
# bench/trainer/bench_lm_cost.sh — what the frozen SmolLM2-135M costs dfm-train on this machine's CPU: tokens per
# second (wall and per CPU-second) and peak memory of
#   hidden      the decoder's forward pass alone, no LM head (`dfm-train hidden`: the audit's token keys)
#   eval        held-out evaluation: three forward passes per token with the LM head and CE (fusion off,
#               predicted memory, target memory) plus the predictor (--memory-control none: the shuffled
#               controls would add two more)
#   step-paper  a DFM training step with fusion at the paper's depths (9,16,24,31 of 32 scaled to 30
#               layers: 8,15,22,29; predictor on the input embeddings): backward down to layer 8
#   step-top    a DFM training step with fusion in the top layers only (26,29; predictor after layer 15, as
#               the demo trains): backward down to layer 26
# Each is run ROUNDS times in a rotating order at each thread count; the table gives min / median / max.
# A training run's figure is its median step after the first (warm-up); eval and hidden are timed whole.
#
#   RUN=runs/demo bash bench/trainer/bench_lm_cost.sh            # a finished run with targets (make demo makes one)
#   ROUNDS=3 THREADS_LIST="1 2" STEPS=6 bash bench/trainer/bench_lm_cost.sh
# Writes bench/results/lm_cost.md (and .jsonl, one line per measurement).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\(DFM_LM\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
RUN=${RUN:-$ROOT/runs/demo} ROUNDS=${ROUNDS:-3} THREADS_LIST=${THREADS_LIST:-"1 2"} STEPS=${STEPS:-6}
HIDDEN_TOKENS=${HIDDEN_TOKENS:-4096} VAL=${VAL:-4} B=2
TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
[ -x "$TRAIN" ] || { echo "bench_lm_cost: build first (make)" >&2; exit 1; }
[ -f "$DFM_LM/config.json" ] || { echo "bench_lm_cost: no LM at $DFM_LM (make lm)" >&2; exit 1; }
[ -f "$RUN/manifest.json" ] && python3 -c 'import json,sys; sys.exit("targets" not in json.load(open(sys.argv[1]))["stages"])' "$RUN/manifest.json" ||
  { echo "bench_lm_cost: $RUN is not a run with targets (make demo, or RUN=DIR)" >&2; exit 1; }
T=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"]["chunk"]["config"]["seq-len"])' "$RUN/manifest.json")
W=$(mktemp -d /tmp/dfm-bench-lm-XXXXXX)
trap 'rm -rf "$W"' EXIT
OUT=bench/results/lm_cost.jsonl
: > "$W/rows.jsonl"

# one measurement: NAME THREADS ROUND; appends a JSON line
measure() {
  local name=$1 th=$2 r=$3 log=$W/$1.$2.$3.log tokens
  local common=(--data "$RUN" --seq-len "$T" --threads "$th")
  case $name in
    hidden) tokens=$HIDDEN_TOKENS
            cmd=("$TRAIN" hidden --backbone "$DFM_LM" "${common[@]}" --batch 8 --max-tokens "$HIDDEN_TOKENS" --out "$W/h.bin") ;;
    eval)   tokens=$(( VAL * T ))
            cmd=("$TRAIN" eval --backbone "$DFM_LM" --modules "$W/mods/dfm_modules.safetensors" --targets "$RUN" "${common[@]}"
                 --batch $B --val-seqs "$VAL" --memory-control none) ;;
    step-paper|step-top)
            local fl=8,15,22,29 pil=0
            [ "$name" = step-top ] && fl=26,29 pil=16
            tokens=$(( B * T ))
            cmd=("$TRAIN" train --backbone "$DFM_LM" --targets "$RUN" "${common[@]}" --batch $B --steps "$STEPS" --warmup 1
                 --fusion-layers "$fl" --pred-input-layer "$pil" --val-seqs 1 --eval-batches 1 --no-ckpt --out "$W/t") ;;
  esac
  /usr/bin/time -f "%e %U %S %M" -o "$W/time" "${cmd[@]}" > "$log" 2>&1 || { tail -20 "$log" >&2; exit 1; }
  read -r wall user sys rss < "$W/time"
  python3 - "$name" "$th" "$r" "$tokens" "$wall" "$user" "$sys" "$rss" "$log" >> "$W/rows.jsonl" <<'PY'
import json, re, statistics, sys
name, th, r, tokens, wall, user, sys_, rss, log = sys.argv[1:]
row = {"what": name, "threads": int(th), "round": int(r), "wall_s": float(wall), "cpu_s": float(user) + float(sys_),
       "peak_rss_mib": round(int(rss) / 1024, 1)}
text = open(log).read()
if name.startswith("step"):  # per-step wall from the step lines, after the first
    ms = [float(m) for m in re.findall(r"\| (\d+) ms$", text, re.M)][1:]
    step = statistics.median(ms) / 1000
    row.update(step_s=step, tok_per_s=int(tokens) / step)
    # the whole run's CPU time includes loading and the final evaluation: the step's CPU share is estimated
    # from the run's CPU/wall ratio (both threads busy or not)
    row["tok_per_cpu_s"] = row["tok_per_s"] / max(row["cpu_s"] / row["wall_s"], 1e-9)
else:
    n = int(tokens) * (3 if name == "eval" else 1)  # eval: three forward passes per held-out token
    row.update(tokens=n, tok_per_s=n / row["wall_s"], tok_per_cpu_s=n / row["cpu_s"])
print(json.dumps(row))
PY
}

echo "bench_lm_cost: SmolLM2-135M from $DFM_LM, run $RUN (T = $T), $ROUNDS rounds at threads: $THREADS_LIST"
# modules to evaluate: a short training of the demo's shape
"$TRAIN" train --backbone "$DFM_LM" --data "$RUN" --targets "$RUN" --seq-len "$T" --batch $B --steps 2 --warmup 1 \
  --fusion-layers 26,29 --pred-input-layer 16 --val-seqs 1 --eval-batches 1 --threads 2 --out "$W/mods" > "$W/mods.log" 2>&1 ||
  { tail -20 "$W/mods.log" >&2; exit 1; }
ORDER=(hidden eval step-top step-paper)
for r in $(seq 1 "$ROUNDS"); do
  for th in $THREADS_LIST; do
    for i in 0 1 2 3; do  # rotate the order each round: no job always runs first or last
      name=${ORDER[$(( (i + r) % 4 ))]}
      measure "$name" "$th" "$r"
      tail -1 "$W/rows.jsonl"
    done
  done
done
cp "$W/rows.jsonl" "$OUT"
python3 - "$OUT" "$(uptime)" "$(lscpu | sed -n 's/^Model name: *//p')" "$(git -C "$ROOT" rev-parse --short HEAD)" \
  "$(git -C "$ROOT" status --porcelain -- trainer common schemas | head -1)" > bench/results/lm_cost.md <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
load, cpu, commit, dirty = sys.argv[2:]
what = {"hidden": "forward pass, no head (`hidden`)", "eval": "evaluation: 3 forward passes + head + CE (`eval`)",
        "step-top": "DFM step, fusion 26,29 (demo)", "step-paper": "DFM step, fusion 8,15,22,29 (paper)"}
print("# The frozen SmolLM2-135M on this CPU (`bash bench/trainer/bench_lm_cost.sh`)\n")
print(f"dfm-train at {commit}{' (uncommitted changes)' if dirty else ''}; {cpu}; {len(set(r['round'] for r in rows))} "
      f"rounds in rotating order; load at the end: {load.split('load average:')[-1].strip()}. Tokens of 256 per sequence, "
      "batch 2 for training steps. min / median / max over the rounds.\n")
print("| what | threads | tokens/s (wall) | tokens per CPU-s | peak RSS (MiB) |")
print("|---|---:|---:|---:|---:|")
for w in ("hidden", "eval", "step-top", "step-paper"):
    for th in sorted(set(r["threads"] for r in rows)):
        rs = [r for r in rows if r["what"] == w and r["threads"] == th]
        if not rs:
            continue
        f = lambda k, d=0: " / ".join(f"{v:.{d}f}" for v in (min(r[k] for r in rs), statistics.median(r[k] for r in rs),
                                                            max(r[k] for r in rs)))
        print(f"| {what[w]} | {th} | {f('tok_per_s')} | {f('tok_per_cpu_s')} | {max(r['peak_rss_mib'] for r in rs):.0f} |")
PY
cat bench/results/lm_cost.md
