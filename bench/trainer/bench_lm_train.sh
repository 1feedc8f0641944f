#!/usr/bin/env bash
# bench/trainer/bench_lm_train.sh — dfm-train on SmolLM2-135M (frozen, 30 layers, hidden 576, vocabulary 49152,
# tied head) against PyTorch 2.x, per CPU-second, in interleaved rounds, both sides' outputs checked in the
# same run:
#   step     a DFM training step (bench/trainer/bench_train_step.c: forward, backward, gradient norm, clipping,
#            AdamW) against bench/trainer/train_torch_peer.py replaying the same weights, batches and teacher-forcing
#            draws: PyTorch eager and torch.compile, fp32 and under torch.autocast("cpu", bfloat16). dfm-train
#            has no bf16 path: the bf16 rows set dfm's fp32 step against the peer's bf16 step (the gemm part
#            says why). Fusion depths (DEPTHS):
#              top    fusion after layers 26,29, predictor after layer 15 (--pred-input-layer 16): the demo's
#              paper  fusion after 8,15,22,29 (the paper's 9,16,24,31 of 32 scaled to 30), predictor on the
#                     input embeddings
#   forward  the decoder's forward pass alone (`dfm-train hidden`: final-normed hidden states, no LM head)
#            against transformers' AutoModel (LlamaModel, SDPA) under torch.inference_mode
#            (bench/trainer/lm_forward_peer.py), eager and compiled, fp32 and bf16 autocast, on the same tokens (the
#            first FWD_BATCH + FWD_SEQS sequences the step replayed); the hidden states compared token by token
#   gemm     why there is no bf16 path: the issue rate of vfmadd231ps / vdpbf16ps (build/bench/dot_peak) and
#            PyTorch's fp32 and bf16 matmul at the step's GEMM shapes (B*T rows x 576 x 1536, 1536 x 576,
#            576 x 49152), 1 thread
#
#   bash bench/trainer/bench_lm_train.sh                     # RUN=runs/demo: a run with targets (make demo)
#   ROUNDS=3 STEPS=6 DEPTHS="top paper" FWD_THREADS="1 2" bash bench/trainer/bench_lm_train.sh
#
# B x T = 2 x the run's seq-len (256 for the demo), chunk length the run's, K and d the targets', predictor
# 2 layers of 256 (dfm-train train's defaults). Round 1 runs LOSS_STEPS steps per side (dfm first: it
# writes the batches the peers replay), later rounds STEPS, in a rotating order; a run's figure is its
# median step after the first SKIP (warm-up, compilation). Every peer run's losses are checked step by step
# against dfm's round 1: relative difference of loss and CE within LOSS_TOL (fp32) or BF16_TOL (bf16
# autocast); dfm's later rounds must repeat round 1's losses exactly. Forward: both sides' cost of the
# FWD_SEQS sequences after a first batch of FWD_BATCH (the first pays for first-touch page faults on dfm's
# side, compilation on the peer's): the peer times them after its warm-up batch; dfm-train hidden is run over
# FWD_BATCH and over FWD_BATCH + FWD_SEQS sequences and the difference of its printed loop times (wall and
# CPU-seconds) taken. Hidden states agree when the min cosine per token is >= FWD_COS (fp32) or FWD_BF16_COS.
#
# Knobs: RUN, ROUNDS (3), ROUNDS_PAPER (ROUNDS), STEPS (6), LOSS_STEPS (12), SKIP (2), THREADS (1, the step),
# DEPTHS ("top paper"), FWD_THREADS ("1"), FWD_SEQS (16), FWD_BATCH (8), LOSS_TOL (1e-4), BF16_TOL (2e-2),
# FWD_COS (0.9999), FWD_BF16_COS (0.99), PEERS_PYTHON, BENCH, DFM_TRAIN, DOT_PEAK.
# Writes bench/results/lm.json (bench/README.md) and bench/results/lm_train.md; exits non-zero when a peer
# is missing or fails, or an output check fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
if [ "$(id -u)" = 0 ]; then DFM_CACHE=${DFM_CACHE:-/var/cache/dfm}; else DFM_CACHE=${DFM_CACHE:-$HOME/.cache/dfm}; fi
eval "$(sed -n 's/^\(DFM_LM\) *:\?= *\(.*\)$/export \1="\2"/p' "$DFM_CACHE/paths.mk")"
RUN=${RUN:-$ROOT/runs/demo} ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-6} LOSS_STEPS=${LOSS_STEPS:-12} SKIP=${SKIP:-2}
ROUNDS_PAPER=${ROUNDS_PAPER:-$ROUNDS} THREADS=${THREADS:-1} DEPTHS=${DEPTHS:-"top paper"} FWD_THREADS=${FWD_THREADS:-1}
FWD_SEQS=${FWD_SEQS:-16} FWD_BATCH=${FWD_BATCH:-8} LOSS_TOL=${LOSS_TOL:-1e-4} BF16_TOL=${BF16_TOL:-2e-2}
FWD_COS=${FWD_COS:-0.9999} FWD_BF16_COS=${FWD_BF16_COS:-0.99}
B=2 PRED=256
BENCH=${BENCH:-$ROOT/build/bench/bench_train_step}
DFM_TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
DOT_PEAK=${DOT_PEAK:-$ROOT/build/bench/dot_peak}
[ -x "$BENCH" ] && [ -x "$DFM_TRAIN" ] && [ -x "$DOT_PEAK" ] ||
  { echo "bench_lm_train: build first: make build/dfm-train bench-programs" >&2; exit 1; }
[ -f "$DFM_LM/config.json" ] || { echo "bench_lm_train: no LM at $DFM_LM (make lm)" >&2; exit 1; }
[ -f "$RUN/manifest.json" ] && python3 -c 'import json,sys; sys.exit("targets" not in json.load(open(sys.argv[1]))["stages"])' "$RUN/manifest.json" ||
  { echo "bench_lm_train: $RUN is not a run with targets (make demo, or RUN=DIR)" >&2; exit 1; }
read -r T L < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["stages"]["chunk"]["config"]; print(c["seq-len"], c["chunk-len"])' "$RUN/manifest.json")
PY=${PEERS_PYTHON:-$(bash "$ROOT/bench/peers.sh" --python 2>/dev/null || true)}
[ -n "$PY" ] && [ -x "$PY" ] || { echo "bench_lm_train: no peer venv (bash bench/peers.sh makes it; or set PEERS_PYTHON)" >&2; exit 1; }
TV=$("$PY" -c 'import torch, transformers; print(torch.__version__)' 2>/dev/null) ||
  { echo "bench_lm_train: torch or transformers is missing from $PY" >&2; exit 1; }
case "$TV" in 2.*) ;; *) echo "bench_lm_train: the peer is PyTorch 2.x; $PY has torch $TV" >&2; exit 1 ;; esac
[ "$LOSS_STEPS" -ge "$STEPS" ] && [ "$STEPS" -gt "$SKIP" ] || { echo "bench_lm_train: need LOSS_STEPS >= STEPS > SKIP" >&2; exit 2; }
[ $((LOSS_STEPS * B)) -ge $((FWD_SEQS + FWD_BATCH)) ] && [ $((FWD_SEQS % FWD_BATCH)) = 0 ] ||
  { echo "bench_lm_train: FWD_SEQS must be a multiple of FWD_BATCH, FWD_SEQS + FWD_BATCH <= LOSS_STEPS * $B" >&2; exit 2; }
for d in $DEPTHS; do case $d in top|paper) ;; *) echo "bench_lm_train: unknown depth '$d' (top paper)" >&2; exit 2 ;; esac; done

W=$(mktemp -d /tmp/dfm-bench-lm-train-XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMP_WAIT_POLICY=PASSIVE
threads() { export OMP_NUM_THREADS=$1 OPENBLAS_NUM_THREADS=$1; }
note() { echo "[bench_lm_train] $* (load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%T))" >&2; }

# --- gemm: the instruction rates and PyTorch's fp32 / bf16 GEMM at the step's shapes
threads 1
note "gemm: dot_peak and torch matmul fp32 / bf16"
"$DOT_PEAK" > "$W/dot_peak.txt"
"$PY" - "$((B * T))" > "$W/gemm.json" <<'PY'
import json, sys, time
import torch
torch.set_num_threads(1)
n, out = int(sys.argv[1]), []
for k, m in ((576, 1536), (1536, 576), (576, 49152)):
    a, b = torch.randn(n, k), torch.randn(k, m)
    row = {"shape": "%d x %d x %d" % (n, k, m)}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x, y = a.to(dt), b.to(dt)
        x @ y
        best = 1e9
        for _ in range(5):
            c0 = time.process_time()
            x @ y
            best = min(best, time.process_time() - c0)
        row[name + "_gflops"] = 2 * n * k * m / best / 1e9
    out.append(row)
print(json.dumps(out))
PY

# --- step
depth_args() { # DEPTH -> FUSION PRED_INPUT_LAYER
  case $1 in top) echo "26,29 16" ;; paper) echo "8,15,22,29 0" ;; esac
}
run_dfm() { # DEPTH ROUND NSTEPS
  local out=$W/$1/r$2 fl pil
  read -r fl pil < <(depth_args "$1")
  "$BENCH" dfm "$RUN" "$out" "$3" $B "$T" "$DFM_LM" "$RUN" "$L" "$fl" $PRED "$THREADS" "$pil" 2>"$W/dfm.err" ||
    { cat "$W/dfm.err" >&2; echo "bench_lm_train: bench_train_step failed" >&2; exit 1; }
  cp "$out/steps.jsonl" "$W/log.$1.dfm.r$2.jsonl"
}
run_peer() { # DEPTH ROUND NSTEPS SIDE(eager|compile|eager-bf16|compile-bf16)
  local flag=()
  case $4 in compile*) flag+=(--compile) ;; esac
  case $4 in *-bf16) flag+=(--autocast bf16) ;; esac
  "$PY" "$ROOT/bench/trainer/train_torch_peer.py" --run "$W/$1/r1" --log "$W/log.$1.$4.r$2.jsonl" --steps "$3" \
    --threads "$THREADS" "${flag[@]}" >"$W/peer.json" 2>"$W/peer.err" ||
    { tail -30 "$W/peer.err" >&2; echo "bench_lm_train: the PyTorch peer ($4) failed" >&2; exit 1; }
}
SIDES=(dfm eager compile eager-bf16 compile-bf16)
threads "$THREADS"
for depth in $DEPTHS; do
  nr=$ROUNDS
  [ "$depth" = paper ] && nr=$ROUNDS_PAPER
  for r in $(seq 1 "$nr"); do
    n=$STEPS
    [ "$r" = 1 ] && n=$LOSS_STEPS
    for i in 0 1 2 3 4; do
      side=${SIDES[$(((i + r - 1) % 5))]}
      [ "$r" = 1 ] && side=${SIDES[$i]}
      note "step $depth, round $r/$nr, $side, $n steps"
      if [ "$side" = dfm ]; then run_dfm "$depth" "$r" "$n"; else run_peer "$depth" "$r" "$n" "$side"; fi
    done
  done
done

# --- forward: the first FWD_BATCH + FWD_SEQS sequences the step replayed, as an llm.c u32 shard (+1 token: the last target)
first=${DEPTHS%% *}
python3 - "$W/$first/r1/batches.bin" "$W/$first/r1/bench.json" "$((FWD_SEQS + FWD_BATCH))" "$W/tokens.bin" <<'PY'
import json, struct, sys
src, cfg, nseq, out = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
B, T = cfg["B"], cfg["T"]
S = B * (T // cfg["chunk_len"]) * cfg["K"]
rec = 8 * B * T + S * cfg["d"] * 4 + S + B * (T // cfg["chunk_len"])
raw, toks = open(src, "rb").read(), []
for s in range((nseq + B - 1) // B):
    inp = struct.unpack_from("<%di" % (B * T), raw, s * rec)
    tgt = struct.unpack_from("<%di" % (B * T), raw, s * rec + 4 * B * T)
    toks += inp
    last = tgt[-1]
toks = toks[:nseq * T] + [last if nseq % B == 0 else toks[nseq * T]]
with open(out, "wb") as f:
    f.write(struct.pack("<3i", 20240801, 7, len(toks)) + bytes(1012) + struct.pack("<%dI" % len(toks), *toks))
PY
FSIDES=(dfm eager compile eager-bf16 compile-bf16)
for th in $FWD_THREADS; do
  threads "$th"
  for r in $(seq 1 "$ROUNDS"); do
    for i in 0 1 2 3 4; do
      side=${FSIDES[$(((i + r - 1) % 5))]}
      [ "$r" = 1 ] && side=${FSIDES[$i]} # round 1: dfm first (its hidden states are the reference)
      note "forward, $th thread(s), round $r/$ROUNDS, $side"
      if [ "$side" = dfm ]; then
        for n in $FWD_BATCH $((FWD_BATCH + FWD_SEQS)); do
          "$DFM_TRAIN" hidden --backbone "$DFM_LM" --data "$W/tokens.bin" --seq-len "$T" --batch "$FWD_BATCH" \
            --max-tokens $((n * T)) --threads "$th" --out "$W/keys.$th.r$r.bin" >"$W/hidden.$n.out" 2>"$W/hidden.err" ||
            { cat "$W/hidden.err" >&2; echo "bench_lm_train: dfm-train hidden failed" >&2; exit 1; }
        done
        python3 - "$W/hidden.$FWD_BATCH.out" "$W/hidden.$((FWD_BATCH + FWD_SEQS)).out" "$((FWD_SEQS * T))" "$th" \
          > "$W/fwd.$th.dfm.r$r.json" <<'PY'
import json, re, sys
def t(path):
    m = re.search(r"in ([0-9.]+) s \(([0-9.]+) CPU-s\)", open(path).read())
    if not m:
        sys.exit("bench_lm_train: no timing in dfm-train hidden's output %s" % path)
    return float(m.group(1)), float(m.group(2))
(w1, c1), (w2, c2) = t(sys.argv[1]), t(sys.argv[2])
print(json.dumps({"tokens": int(sys.argv[3]), "wall_s": w2 - w1, "cpu_s": c2 - c1, "threads": int(sys.argv[4])}))
PY
        [ "$r" = 1 ] || cmp -s "$W/keys.$th.r1.bin" "$W/keys.$th.r$r.bin" ||
          { echo "bench_lm_train: dfm-train hidden wrote other bytes in round $r than in round 1" >&2; exit 1; }
      else
        flag=()
        case $side in compile*) flag+=(--compile) ;; esac
        case $side in *-bf16) flag+=(--autocast bf16) ;; esac
        "$PY" "$ROOT/bench/trainer/lm_forward_peer.py" --backbone "$DFM_LM" --tokens "$W/tokens.bin" --keys "$W/keys.$th.r1.bin" \
          --seqs "$FWD_SEQS" --seq-len "$T" --batch "$FWD_BATCH" --threads "$th" "${flag[@]}" \
          > "$W/fwd.$th.$side.r$r.json" 2>"$W/peer.err" ||
          { tail -30 "$W/peer.err" >&2; echo "bench_lm_train: the forward peer ($side) failed" >&2; exit 1; }
      fi
    done
  done
done

# --- report
"$PY" - "$W" "$ROUNDS" "$ROUNDS_PAPER" "$SKIP" "$THREADS" "$LOSS_TOL" "$BF16_TOL" "$FWD_COS" "$FWD_BF16_COS" \
  "$DEPTHS" "$FWD_THREADS" "$ROOT/bench/results" "$T" "$L" "$B" "$FWD_BATCH" "$(lscpu | sed -n 's/^Model name: *//p')" \
  "$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" status --porcelain -- trainer common bench | head -1 | sed 's/.*/ (uncommitted changes)/')" <<'PY'
import json, os, statistics as st, sys, time
(w, rounds, rounds_paper, skip, threads, tol, btol, fcos, fbcos, depths, fthreads, res, T, L, B, FB, cpu,
 commit) = sys.argv[1:]
rounds, rounds_paper, skip, threads, T, L, B, FB = map(int, (rounds, rounds_paper, skip, threads, T, L, B, FB))
tol, btol, fcos, fbcos = map(float, (tol, btol, fcos, fbcos))
import torch, transformers
ver = "torch %s, transformers %s" % (torch.__version__, transformers.__version__)
peer = {"eager": "PyTorch eager (nn.Module, SDPA, fused AdamW)", "compile": "PyTorch torch.compile (inductor), fused AdamW",
        "eager-bf16": "PyTorch eager, bf16 autocast", "compile-bf16": "PyTorch torch.compile, bf16 autocast"}
fpeer = {"eager": "transformers LlamaModel, inference_mode", "compile": "transformers LlamaModel, torch.compile",
         "eager-bf16": "transformers LlamaModel, bf16 autocast", "compile-bf16": "transformers LlamaModel, torch.compile + bf16 autocast"}
dname = {"top": "fusion 26,29, predictor after layer 15", "paper": "fusion 8,15,22,29, predictor on embeddings"}
def log(d, side, r):
    return [json.loads(l) for l in open(os.path.join(w, "log.%s.%s.r%d.jsonl" % (d, side, r)))]
def med(rows, key):
    return st.median(x[key] for x in rows[skip:])
def mm(v):
    return [min(v), max(v)]
rows, ok_all = [], True
for d in depths.split():
    nr = rounds_paper if d == "paper" else rounds
    ref = log(d, "dfm", 1)
    det = all(x["loss"] == y["loss"] for r in range(2, nr + 1) for x, y in zip(ref, log(d, "dfm", r)))
    for side in ("eager", "compile", "eager-bf16", "compile-bf16"):
        bf = side.endswith("bf16")
        t = btol if bf else tol
        dc, pc, dw, pw, ratios, rel, rel_ce = [], [], [], [], [], [], []
        for r in range(1, nr + 1):
            a, b = log(d, "dfm", r), log(d, side, r)
            dc.append(med(a, "cpu_s")); pc.append(med(b, "cpu_s")); dw.append(med(a, "wall_s")); pw.append(med(b, "wall_s"))
            ratios.append(pc[-1] / dc[-1])
            rel += [abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(ref, b)]
            rel_ce += [abs(x["ce"] - y["ce"]) / abs(x["ce"]) for x, y in zip(ref, b)]
        p1 = log(d, side, 1)
        agree = {"ok": det and len(p1) == len(ref) and max(rel) <= t and max(rel_ce) <= t, "steps": len(ref),
                 "loss_rel_diff_max": max(rel), "ce_rel_diff_max": max(rel_ce), "loss_rel_tol": t,
                 "dfm_rounds_identical": det, "last_loss_dfm": ref[-1]["loss"], "last_loss_peer": p1[-1]["loss"]}
        ok_all &= agree["ok"]
        prec = "bf16 autocast (dfm fp32)" if bf else "fp32"
        rows.append({"stage": "lm", "case": "DFM step, SmolLM2-135M, %s, %s" % (dname[d], prec),
                     "setting": "step %s, %s, B x T = %d x %d" % (d, prec, B, T), "peer": peer[side], "peer_version": ver,
                     "dfm_cpu_s": st.median(dc), "peer_cpu_s": st.median(pc), "ratio": st.median(ratios),
                     "ratio_min_max": mm(ratios), "dfm_cpu_s_min_max": mm(dc), "peer_cpu_s_min_max": mm(pc),
                     "dfm_wall_s": st.median(dw), "peer_wall_s": st.median(pw), "agree": agree,
                     "unit": "CPU-seconds per training step", "threads": threads, "rounds": nr, "goal": 1.2})
for th in map(int, fthreads.split()):
    for side in ("eager", "compile", "eager-bf16", "compile-bf16"):
        bf = side.endswith("bf16")
        dc, pc, dw, pw, ratios, cmin, mabs = [], [], [], [], [], [], []
        for r in range(1, rounds + 1):
            a = json.load(open(os.path.join(w, "fwd.%d.dfm.r%d.json" % (th, r))))
            b = json.load(open(os.path.join(w, "fwd.%d.%s.r%d.json" % (th, side, r))))
            dc.append(a["cpu_s"]); pc.append(b["cpu_s"]); dw.append(a["wall_s"]); pw.append(b["wall_s"])
            ratios.append(b["cpu_s"] / a["cpu_s"]); cmin.append(b["cos_min"]); mabs.append(b["max_abs"])
            ntok = a["tokens"]
        c = fbcos if bf else fcos
        agree = {"ok": min(cmin) >= c, "cos_min": min(cmin), "cos_min_tol": c, "max_abs": max(mabs)}
        ok_all &= agree["ok"]
        prec = "bf16 autocast (dfm fp32)" if bf else "fp32"
        rows.append({"stage": "lm", "case": "forward pass (hidden), SmolLM2-135M, %s, %d thread(s)" % (prec, th),
                     "setting": "forward, %s, %d tokens in batches of %d x %d" % (prec, ntok, FB, T), "peer": fpeer[side],
                     "peer_version": ver, "dfm_cpu_s": st.median(dc), "peer_cpu_s": st.median(pc), "ratio": st.median(ratios),
                     "ratio_min_max": mm(ratios), "dfm_cpu_s_min_max": mm(dc), "peer_cpu_s_min_max": mm(pc),
                     "dfm_wall_s": st.median(dw), "peer_wall_s": st.median(pw), "tokens": ntok,
                     "dfm_tok_per_cpu_s": ntok / st.median(dc), "peer_tok_per_cpu_s": ntok / st.median(pc),
                     "dfm_tok_per_wall_s": ntok / st.median(dw), "peer_tok_per_wall_s": ntok / st.median(pw),
                     "agree": agree, "unit": "CPU-seconds per %d tokens" % ntok, "threads": th, "rounds": rounds, "goal": 1.2})
gemm = json.load(open(os.path.join(w, "gemm.json")))
dot = open(os.path.join(w, "dot_peak.txt")).read().strip().splitlines()
head = min((r for r in rows if r["case"].startswith("DFM step") and r["case"].endswith("fp32")), key=lambda r: r["ratio"])
top = dict(head)
top.update({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows, "gemm": gemm, "dot_peak": dot,
            "agree": dict(head["agree"], ok=ok_all)})
json.dump(top, open(os.path.join(res, "lm.json"), "w"), indent=1)
f3 = lambda v: "%.3f" % v
met = lambda r: "met" if r["ratio_min_max"][0] >= 1.2 and r["agree"]["ok"] else "not met"
L_ = ["# dfm-train on SmolLM2-135M against PyTorch (`bash bench/trainer/bench_lm_train.sh`)", "",
      "dfm at %s; %s; %s; load at the end %s; %s. CPU-seconds per step / per forward, median over the rounds "
      "(min-max); dfm/peer above 1: dfm faster; goal 1.2x in every round." % (
          commit, cpu, ver, open("/proc/loadavg").read().split()[0], top["date"]), "",
      "## Training step (%d thread(s); B x T = %d x %d, chunks of %d)" % (threads, B, T, L), "",
      "| fusion | precision | peer | dfm CPU-s | peer CPU-s | dfm/peer (min-max) | goal 1.2x | dfm / peer wall s | losses agree |",
      "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    if not r["case"].startswith("DFM step"):
        continue
    a = r["agree"]
    L_.append("| %s | %s | %s | %s (%s-%s) | %s (%s-%s) | **%.2fx** (%.2f-%.2f) | %s | %s / %s | %s: loss %.1e, CE %.1e (tol %.0e), %d rounds x %d+ steps |" % (
        r["case"].split(", ")[2], r["setting"].split(", ")[1], r["peer"], f3(r["dfm_cpu_s"]), *map(f3, r["dfm_cpu_s_min_max"]),
        f3(r["peer_cpu_s"]), *map(f3, r["peer_cpu_s_min_max"]), r["ratio"], *r["ratio_min_max"], met(r),
        f3(r["dfm_wall_s"]), f3(r["peer_wall_s"]), "ok" if a["ok"] else "DISAGREE", a["loss_rel_diff_max"],
        a["ce_rel_diff_max"], a["loss_rel_tol"], r["rounds"], a["steps"]))
L_ += ["", "The bf16 rows set dfm's fp32 step (dfm-train has no bf16 path) against PyTorch's step under "
       "torch.autocast(\"cpu\", dtype=torch.bfloat16); their losses are checked against dfm's fp32 losses.", "",
       "## Forward pass alone (`dfm-train hidden`, no LM head)", "",
       "| threads | precision | peer | dfm tokens/CPU-s | peer tokens/CPU-s | dfm/peer (min-max) | goal 1.2x | dfm / peer tokens/s wall | hidden states agree |",
       "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    if not r["case"].startswith("forward"):
        continue
    a = r["agree"]
    L_.append("| %d | %s | %s | %.0f | %.0f | **%.2fx** (%.2f-%.2f) | %s | %.0f / %.0f | %s: min cosine %.6f (tol %g), max abs %.1e |" % (
        r["threads"], r["setting"].split(", ")[1], r["peer"], r["dfm_tok_per_cpu_s"], r["peer_tok_per_cpu_s"], r["ratio"],
        *r["ratio_min_max"], met(r), r["dfm_tok_per_wall_s"], r["peer_tok_per_wall_s"], "ok" if a["ok"] else "DISAGREE",
        a["cos_min"], a["cos_min_tol"], a["max_abs"]))
L_ += ["", "## Why no bf16 path: the instruction rates and PyTorch's GEMM at the step's shapes (1 thread)", "",
       "`build/bench/dot_peak`:", "", *["    " + x for x in dot], "",
       "| GEMM (rows x k x n) | fp32 GFLOP/s | bf16 GFLOP/s | bf16 / fp32 |", "|---|---|---|---|"]
for g in gemm:
    L_.append("| %s | %.1f | %.1f | %.2f |" % (g["shape"], g["fp32_gflops"], g["bf16_gflops"], g["bf16_gflops"] / g["fp32_gflops"]))
txt = "\n".join(L_) + "\n"
open(os.path.join(res, "lm_train.md"), "w").write(txt)
print(txt)
sys.exit(0 if ok_all else 3)
PY
