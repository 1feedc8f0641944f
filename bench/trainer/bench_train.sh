#!/usr/bin/env bash
# bench/trainer/bench_train.sh — dfm-train's CPU training step against PyTorch 2.x, eager and torch.compile, per
# CPU-second, in interleaved rounds; the loss curves of the same steps compared in the same run.
#
#   bash bench/trainer/bench_train.sh
#   ROUNDS=5 STEPS=16 THREADS=1 bash bench/trainer/bench_train.sh
#
# The step (bench/trainer/bench_train_step.c): the engine's forward, backward, gradient norm, clipping and AdamW,
# timed alone (CLOCK_PROCESS_CPUTIME_ID and wall). The peer (bench/trainer/train_torch_peer.py, idiomatic PyTorch:
# nn.Module, SDPA, fused AdamW, clip_grad_norm_) replays the same steps from the same initial weights and
# batches. Two shapes:
#   pretrain  the benchmark shape: B x T = 4 x 256, vocab 4096, Qwen3 decoder of 4 layers, hidden 256,
#             8 heads / 4 KV heads, FFN 768; everything trainable
#   dfm       `dfm-train train` on that decoder, frozen: predictor (2 layers of 256), projector, fusion
#             after layers 1 and 3, K = 16 slots of d = 64, chunks of 32, teacher forcing mixed:0.5
# Round 1 runs LOSS_STEPS steps on every side and compares the losses step by step; later rounds run STEPS
# steps in a rotating order (dfm, eager, compiled). A run's figure is its median step after the first
# SKIP (warm-up, compilation); the table gives min / median / max over the rounds.
#
# Knobs: ROUNDS (3), STEPS (12), LOSS_STEPS (50), SKIP (3), THREADS (1), LOSS_TOL (relative loss
# difference allowed at any step, 1e-3), PEERS_PYTHON (default: bash bench/peers.sh --python), BENCH and
# DFM_TRAIN (the programs; default build/bench/bench_train_step and build/dfm-train).
# Writes bench/results/train.json (bench/README.md) and bench/results/train_step.md; exits non-zero when
# the peer is missing or the losses disagree.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-12} LOSS_STEPS=${LOSS_STEPS:-50} SKIP=${SKIP:-3} THREADS=${THREADS:-1}
LOSS_TOL=${LOSS_TOL:-1e-3}
B=4 T=256 VOCAB=4096 LAYERS=4 HIDDEN=256 HEADS=8 KV=4 L=32 K=16 D=64 FUSION=1,3 PRED=256
BENCH=${BENCH:-$ROOT/build/bench/bench_train_step}
DFM_TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
[ -x "$BENCH" ] && [ -x "$DFM_TRAIN" ] || { echo "bench_train: build first: make build/dfm-train build/bench/bench_train_step" >&2; exit 1; }
PY=${PEERS_PYTHON:-$(bash "$ROOT/bench/peers.sh" --python 2>/dev/null || true)}
[ -n "$PY" ] && [ -x "$PY" ] || { echo "bench_train: no peer venv (bash bench/peers.sh makes it; or set PEERS_PYTHON)" >&2; exit 1; }
TV=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) || { echo "bench_train: torch is missing from $PY" >&2; exit 1; }
case "$TV" in 2.*) ;; *) echo "bench_train: the peer is PyTorch 2.x; $PY has torch $TV" >&2; exit 1 ;; esac
[ "$LOSS_STEPS" -ge "$STEPS" ] || { echo "bench_train: LOSS_STEPS must be >= STEPS" >&2; exit 2; }

W=$(mktemp -d /tmp/dfm-bench-train-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE
"$DFM_TRAIN" synth --out "$W/data" --vocab "$VOCAB" --seq-len "$T" --chunk-len "$L" --seqs $((B * LOSS_STEPS + B)) \
  --slots "$K" --d-mem "$D" >/dev/null 2>&1

run_dfm() { # MODE ROUND NSTEPS
  local out=$W/$1/r$2
  if [ "$1" = pretrain ]; then
    "$BENCH" pretrain "$W/data/tokens.bin" "$out" "$3" $B $T $LAYERS $HIDDEN $HEADS $KV $VOCAB "$THREADS"
  else
    "$BENCH" dfm "$W/data/tokens.bin" "$out" "$3" $B $T "$W/pretrain/r1/init" "$W/data/targets.bin" $L $FUSION $PRED \
      "$THREADS"
  fi
  cp "$out/steps.jsonl" "$W/log.$1.dfm.r$2.jsonl"
}
run_peer() { # MODE ROUND NSTEPS KIND(eager|compile)
  local flag=()
  [ "$4" = compile ] && flag=(--compile)
  "$PY" "$ROOT/bench/trainer/train_torch_peer.py" --run "$W/$1/r1" --log "$W/log.$1.$4.r$2.jsonl" --steps "$3" \
    --threads "$THREADS" "${flag[@]}" >"$W/peer.$4.json" 2>"$W/peer.err" ||
    { cat "$W/peer.err" >&2; echo "bench_train: the PyTorch peer ($4) failed" >&2; exit 1; }
}

SIDES=(dfm eager compile)
for r in $(seq 1 "$ROUNDS"); do
  n=$STEPS
  [ "$r" = 1 ] && n=$LOSS_STEPS
  for mode in pretrain dfm; do
    echo "[bench_train] round $r/$ROUNDS, $mode, $n steps (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    for i in 0 1 2; do
      side=${SIDES[$(((i + r - 1) % 3))]}
      [ "$r" = 1 ] && side=${SIDES[$i]} # round 1: dfm first (it writes the batches the peers replay)
      if [ "$side" = dfm ]; then run_dfm "$mode" "$r" "$n"; else run_peer "$mode" "$r" "$n" "$side"; fi
    done
  done
done

"$PY" - "$W" "$ROUNDS" "$SKIP" "$THREADS" "$LOSS_TOL" "$ROOT/bench/results" <<'PY'
import glob, json, os, platform, statistics as st, subprocess, sys, time
w, rounds, skip, threads, tol, res = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
import torch
peer = {"eager": "PyTorch eager (nn.Module, SDPA, fused AdamW)", "compile": "PyTorch torch.compile (inductor), fused AdamW"}
adamw = json.load(open(os.path.join(w, "peer.eager.json")))["adamw"]
ver = "torch %s (%s AdamW)" % (torch.__version__, adamw)
def log(mode, side, r):
    return [json.loads(l) for l in open(os.path.join(w, "log.%s.%s.r%d.jsonl" % (mode, side, r)))]
def med(rows, key):
    return st.median(x[key] for x in rows[skip:])
rows, md = [], []
for mode in ("pretrain", "dfm"):
    ref = log(mode, "dfm", 1)
    for side in ("eager", "compile"):
        dc, pc, dw, pw, ratios = [], [], [], [], []
        for r in range(1, rounds + 1):
            a, b = log(mode, "dfm", r), log(mode, side, r)
            dc.append(med(a, "cpu_s")); pc.append(med(b, "cpu_s"))
            dw.append(med(a, "wall_s")); pw.append(med(b, "wall_s"))
            ratios.append(pc[-1] / dc[-1])
        p1 = log(mode, side, 1)
        diff = [abs(x["loss"] - y["loss"]) for x, y in zip(ref, p1)]
        rel = [d / max(abs(x["loss"]), 1e-12) for d, x in zip(diff, ref)]
        agree = {"ok": len(p1) == len(ref) and max(rel) <= tol, "steps": len(p1), "loss_diff_max": max(diff),
                 "loss_rel_diff_max": max(rel), "loss_rel_tol": tol, "first_loss": ref[0]["loss"], "last_loss_dfm": ref[-1]["loss"],
                 "last_loss_peer": p1[-1]["loss"]}
        rows.append({"stage": "train", "setting": mode, "peer": peer[side], "peer_version": ver,
                     "dfm_cpu_s": st.median(dc), "peer_cpu_s": st.median(pc), "ratio": st.median(ratios),
                     "ratio_min_max": [min(ratios), max(ratios)], "dfm_cpu_s_min_max": [min(dc), max(dc)],
                     "peer_cpu_s_min_max": [min(pc), max(pc)], "dfm_wall_s": st.median(dw), "peer_wall_s": st.median(pw),
                     "dfm_wall_s_min_max": [min(dw), max(dw)], "peer_wall_s_min_max": [min(pw), max(pw)],
                     "agree": agree, "unit": "CPU-seconds per training step", "threads": threads, "rounds": rounds})
head = min((r for r in rows if r["setting"] == "pretrain"), key=lambda r: r["peer_cpu_s"])
top = dict(head)
top.update({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows,
            "agree": dict(head["agree"], ok=all(r["agree"]["ok"] for r in rows))})
json.dump(top, open(os.path.join(res, "train.json"), "w"), indent=1)
f3 = lambda v: "%.3f" % v
lines = ["dfm-train CPU training step against PyTorch, %d thread(s), %d interleaved rounds; %s; load %s; %s" %
         (threads, rounds, ver, open("/proc/loadavg").read().split()[0], top["date"]), "",
         "CPU-seconds and wall seconds per step: median over the rounds (min-max); dfm/peer above 1: dfm faster.", "",
         "| shape | peer | dfm CPU-s | peer CPU-s | dfm/peer (min-max) | dfm wall s | peer wall s | loss agreement over %d steps |" % len(ref),
         "|---|---|---|---|---|---|---|---|"]
for r in rows:
    a = r["agree"]
    lines.append("| %s | %s | %s (%s-%s) | %s (%s-%s) | **%.2fx** (%.2f-%.2f) | %s | %s | %s: max rel diff %.1e (tol %.0e), last %.4f vs %.4f |" % (
        r["setting"], r["peer"], f3(r["dfm_cpu_s"]), f3(r["dfm_cpu_s_min_max"][0]), f3(r["dfm_cpu_s_min_max"][1]),
        f3(r["peer_cpu_s"]), f3(r["peer_cpu_s_min_max"][0]), f3(r["peer_cpu_s_min_max"][1]), r["ratio"],
        r["ratio_min_max"][0], r["ratio_min_max"][1], f3(r["dfm_wall_s"]), f3(r["peer_wall_s"]),
        "ok" if a["ok"] else "DISAGREE", a["loss_rel_diff_max"], a["loss_rel_tol"], a["last_loss_dfm"], a["last_loss_peer"]))
lines += ["", "pretrain: B x T = 4 x 256, vocab 4096, Qwen3 decoder 4 x 256 (8 heads, 4 KV, FFN 768), all trainable. "
          "dfm: that decoder frozen, predictor 2 x 256, projector, fusion after layers 1 and 3, K = 16, d = 64, L = 32, "
          "teacher forcing mixed:0.5. Command: bash bench/trainer/bench_train.sh"]
txt = "\n".join(lines) + "\n"
open(os.path.join(res, "train_step.md"), "w").write(txt)
print(txt)
sys.exit(0 if top["agree"]["ok"] else 3)
PY
