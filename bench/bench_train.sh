#!/usr/bin/env bash
# bench/bench_train.sh — CPU training step time and peak memory of dfm-train against the same model in
# PyTorch (tests/ref/dfm_torch.py, the parity test's model, run in float32 with autograd and
# torch.optim.AdamW), same shapes, same thread count, side by side.
#
#   bash bench/bench_train.sh                 # defaults below
#   THREADS=2 STEPS=10 HIDDEN=256 bash bench/bench_train.sh
#
# Both run with OMP_WAIT_POLICY=PASSIVE (dfm-train sets it itself: see train_main.c).
# Modes: pretraining (whole backbone trainable) and DFM (frozen backbone, predictor + projector +
# fusion trainable). Step time: best and median over the steps after the first (the machine may be shared:
# the best step is the least disturbed). Prints a Markdown table.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DFM_TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
PY=${DFM_PYTHON:-/var/cache/dfm/venv/bin/python}
THREADS=${THREADS:-2} STEPS=${STEPS:-8} B=${B:-4} T=${T:-256} L=${L:-32}
HIDDEN=${HIDDEN:-256} LAYERS=${LAYERS:-4} HEADS=${HEADS:-8} KV=${KV:-4} VOCAB=${VOCAB:-4096} K=${K:-16} D=${D:-64}
W=$(mktemp -d /tmp/dfm-bench-train-XXXXXX)
trap 'rm -rf "$W"' EXIT
[ -x "$DFM_TRAIN" ] || { echo "build dfm-train first (make build/dfm-train)"; exit 1; }

"$DFM_TRAIN" synth --out "$W/data" --vocab "$VOCAB" --seq-len "$T" --chunk-len "$L" --seqs $((B * (STEPS + 4))) \
  --slots "$K" --d-mem "$D" 2>/dev/null
COMMON=(--data "$W/data/tokens.bin" --seq-len "$T" --batch "$B" --steps "$STEPS" --val-seqs "$B" --eval-batches 1
        --threads "$THREADS")
/usr/bin/time -f %M -o "$W/pre.rss" "$DFM_TRAIN" pretrain --out "$W/pre" "${COMMON[@]}" --layers "$LAYERS" \
  --hidden "$HIDDEN" --heads "$HEADS" --kv-heads "$KV" --vocab "$VOCAB" 2>/dev/null
/usr/bin/time -f %M -o "$W/dfm.rss" "$DFM_TRAIN" train --out "$W/dfm" "${COMMON[@]}" --backbone "$W/pre/model" \
  --targets "$W/data/targets.bin" --chunk-len "$L" --fusion-layers 1,3 --pred-hidden "$HIDDEN" 2>/dev/null

OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} OMP_NUM_THREADS=$THREADS "$PY" - "$W" "$ROOT" "$THREADS" "$STEPS" "$B" "$T" <<'EOF' 2>/dev/null
import json, os, resource, statistics, sys, time
w, root, threads, steps, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
sys.path.insert(0, os.path.join(root, "tests", "ref"))
import torch
import dfm_torch as ref
torch.set_num_threads(threads)

def c_times(run):
    ms = [r["ms"] for r in map(json.loads, open(os.path.join(w, run, "log.jsonl"))) if "ms" in r]
    ms = ms[1:] if len(ms) > 2 else ms
    return min(ms), statistics.median(ms)

def torch_times(mode):
    bb, _ = ref.read_safetensors(os.path.join(w, "pre", "model", "model.safetensors"))
    bc = json.load(open(os.path.join(w, "pre", "model", "config.json")))
    P = {k: v.float().clone() for k, v in bb.items()}
    if mode == "dfm":
        mods, meta = ref.read_safetensors(os.path.join(w, "dfm", "dfm_modules.safetensors"))
        dc = json.loads(meta["dfm_config"])
        P.update({k: v.float().clone() for k, v in mods.items()})
        train = [k for k in P if k.startswith("dfm.")]
    else:
        dc = {"enabled": False}
        train = list(P)
    for k in P:
        P[k].requires_grad_(k in train)
    opt = torch.optim.AdamW([P[k] for k in train], lr=1e-4)
    V = bc["vocab_size"]
    g = torch.Generator().manual_seed(0)
    tok = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)
    tm = tmask = None
    if mode == "dfm":
        S = B * (T // dc["chunk_len"]) * dc["n_slots"]
        tm = torch.randn(S, dc["d_mem"], generator=g)
        tmask = torch.ones(S, dtype=torch.uint8)
    model = ref.DfmTorch(bc, dc, attn="manual")
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model.forward(P, tok, tgt, tm, tmask)["loss"]
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    times = times[1:] if len(times) > 2 else times
    return min(times), statistics.median(times)

rows = []
for mode, run in (("pretrain", "pre"), ("dfm", "dfm")):
    c, cm = c_times(run)
    t, tm_ = torch_times(mode)
    rss = int(open(os.path.join(w, run + ".rss")).read().split()[-1]) / 1024
    rows.append((mode, c, cm, t, tm_, B * T / c * 1e3, B * T / t * 1e3, rss))
peak_py = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("Step time: best (median) over the steps after the first; best is the figure least disturbed by other load.")
print("| mode | dfm-train ms/step | PyTorch %s ms/step | dfm-train tok/s | PyTorch tok/s | speed-up | dfm-train peak RSS MiB |" % torch.__version__)
print("|---|---|---|---|---|---|---|")
for mode, c, cm, t, tm_, ct, tt, rss in rows:
    print("| %s | %.1f (%.1f) | %.1f (%.1f) | %.0f | %.0f | %.2fx | %.0f |" % (mode, c, cm, t, tm_, ct, tt, t / c, rss))
print("\nPyTorch process peak RSS (both modes): %.0f MiB; threads %d, B=%d, T=%d" % (peak_py, threads, B, T))
EOF
