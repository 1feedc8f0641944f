#!/usr/bin/env bash
# bench/trainer/bench_train_gpu.sh — dfm-train's CUDA path against the same model in PyTorch on one GPU:
# tokens/s, ms/step and MFU for a ~124M and a ~1B backbone, in pretraining and in DFM mode, side by side.
#
#   make CUDA=1 BUILD=build-cuda build-cuda/dfm-train          # first (the caller's script does it)
#   bash bench/trainer/bench_train_gpu.sh                               # on the GPU machine, from the repo root
#   DEVICE=cpu TINY=1 bash bench/trainer/bench_train_gpu.sh             # CPU dry run of the plumbing (tiny shapes)
#
# Writes ${OUT:-build-cuda/bench}/bench_train_gpu.{md,json} (and logs/ with every run's output) and prints
# the Markdown table. A run that fails, runs out of memory or times out is recorded with its error text and
# the others go on; the table is written in any case.
#
# Backbones (qwen3 style: RMSNorm, RoPE, GQA, QK-norm, SwiGLU, tied embeddings), T = 1024:
#   124M: 12 layers, hidden 768, 12 heads, 12 kv heads (MHA, GPT-2-like; KV_124M=4 for GQA), head dim 64,
#         ffn 2048, vocab 50304 (123.6M parameters)
#   1B:   Llama-3.2-1B's shape: 16 layers, hidden 2048, 32 heads, 8 kv heads, head dim 64, ffn 8192,
#         vocab 128256 (1.236B parameters; VOCAB_1B=50304 if memory or time demands)
# DFM mode: dfm-train's defaults: L=32, K=16 slots, d=384, predictor 2 layers x min(C,256), projector
# hidden 2C, fusion after the default layers (124M: 3,5,8,11; 1B: 4,8,12,15), gates per head.
# Each run: WARMUP (3) untimed steps, then STEPS (12) timed; ms/step is the median of the timed steps.
# tok/s = B*T / (ms/step); MFU = tests/ref/train_flops.py's model FLOPs per token x tok/s / PEAK_TFLOPS
# (989.4 = H200 SXM dense BF16), the same formula for both sides; dfm-train's own "mfu" in its log is
# shown beside it when present.
#
# Environment (defaults):
#   DFM_TRAIN (build-cuda/dfm-train; build/dfm-train with DEVICE=cpu)  DEVICE (cuda)  TINY (0)
#   OUT (build-cuda/bench; build/bench_gpu_dryrun with DEVICE=cpu)       PYTHON (first of python3,
#   $DFM_PYTHON, /var/cache/dfm/venv/bin/python that imports torch)       COMPILE (1 on cuda, 0 on cpu)
#   MODELS ("124M 1B")  MODES ("pretrain dfm")  IMPLS ("dfm pytorch")  WARMUP (3)  STEPS (12)
#   B_124M (16)  B_1B (8)  KV_124M (12)  VOCAB_1B (128256)  PEAK_TFLOPS (989.4)
#   BUDGET_S (330): the whole script's time; a run that would start with less than MIN_RUN_S (25) left is
#   skipped and recorded so.  RUN_TIMEOUT (150): the most one run may take (it is killed then; the steps
#   it logged still count).  BACKBONE (auto): the DFM runs' backbone: "auto" = the pretraining run's
#   OUT/model, else a random bf16 one written by train_gpu_torch.py; "python" forces the latter.
#   KEEP_WORK (0): keep the work folder (models, data) instead of deleting it.
#   DFM_EXTRA, TORCH_EXTRA: more flags for every dfm-train / train_gpu_torch.py run (whitespace-separated),
#   e.g. TORCH_EXTRA="--compile-mode max-autotune-no-cudagraphs".
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
START=$SECONDS
DEVICE=${DEVICE:-cuda}
TINY=${TINY:-0}
if [ "$DEVICE" = cpu ]; then
  DFM_TRAIN=${DFM_TRAIN:-build/dfm-train}
  OUT=${OUT:-build/bench_gpu_dryrun}
  COMPILE=${COMPILE:-0}
  DTYPE=fp32
else
  DFM_TRAIN=${DFM_TRAIN:-build-cuda/dfm-train}
  OUT=${OUT:-build-cuda/bench}
  COMPILE=${COMPILE:-1}
  DTYPE=bf16
fi
MODELS=${MODELS:-124M 1B}
MODES=${MODES:-pretrain dfm}
IMPLS=${IMPLS:-dfm pytorch}
WARMUP=${WARMUP:-3}
STEPS=${STEPS:-12}
B_124M=${B_124M:-16}
B_1B=${B_1B:-8}
KV_124M=${KV_124M:-12}
VOCAB_1B=${VOCAB_1B:-128256}
PEAK_TFLOPS=${PEAK_TFLOPS:-${DFM_PEAK_TFLOPS:-989.4}}
BUDGET_S=${BUDGET_S:-330}
MIN_RUN_S=${MIN_RUN_S:-25}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
BACKBONE=${BACKBONE:-auto}
KEEP_WORK=${KEEP_WORK:-0}
read -r -a DFM_EXTRA <<<"${DFM_EXTRA:-}"
read -r -a TORCH_EXTRA <<<"${TORCH_EXTRA:-}"
export DFM_PEAK_TFLOPS=$PEAK_TFLOPS

mkdir -p "$OUT/logs"
LOGS=$(cd "$OUT/logs" && pwd)
OUT=$(cd "$OUT" && pwd)
rm -f "$LOGS"/*
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/dfm-bench-train-gpu-XXXXXX")}
mkdir -p "$WORK"
cleanup() { [ "$KEEP_WORK" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT

say() { echo "[bench_train_gpu $((SECONDS - START))s] $*" >&2; }

# ---- interpreters -------------------------------------------------------------------------------------------
PY=""
for c in ${PYTHON:-} python3 ${DFM_PYTHON:-} /var/cache/dfm/venv/bin/python; do
  command -v "$c" >/dev/null 2>&1 || continue
  if "$c" -c "import torch" >/dev/null 2>&1; then PY=$c; break; fi
done
SPY=$(command -v python3 || echo "${PY:-python3}")   # the summary needs the standard library only
[ -n "$PY" ] || say "no Python with torch found: the PyTorch runs will be recorded as failed"

# ---- dfm-train's flags ----------------------------------------------------------------------------------------
DEV_FLAGS=()
DFM_OK=1
DFM_WHY=""
if [ ! -x "$DFM_TRAIN" ]; then
  DFM_OK=0
  DFM_WHY="dfm-train not found at $DFM_TRAIN (make CUDA=1 BUILD=build-cuda build-cuda/dfm-train)"
else
  HELP=$("$DFM_TRAIN" train --help 2>&1; "$DFM_TRAIN" pretrain --help 2>&1)
  if grep -q -- "--device" <<<"$HELP"; then
    DEV_FLAGS+=(--device "$DEVICE")
    if [ "$DEVICE" != cpu ] && grep -q -- "--precision" <<<"$HELP"; then DEV_FLAGS+=(--precision bf16); fi
    # no checkpoints (params + AdamW moments: 15 GB for 1B, written at the end of a timed run)
    if grep -q -- "--no-ckpt" <<<"$HELP"; then DEV_FLAGS+=(--no-ckpt); fi
  elif [ "$DEVICE" != cpu ]; then
    DFM_OK=0
    DFM_WHY="$DFM_TRAIN has no --device flag (a CPU-only dfm-train): not run on the GPU"
  fi
fi
[ "$DFM_OK" = 1 ] || say "$DFM_WHY"
say "dfm-train: $DFM_TRAIN ${DEV_FLAGS[*]:-(no device flags)}; python: ${PY:-none}; out: $OUT"

# ---- shapes ---------------------------------------------------------------------------------------------------
spec() { # sets LAYERS HIDDEN HEADS KV HD FFN VOCAB T B and the DFM shape for backbone $1
  if [ "$TINY" = 1 ]; then
    case "$1" in
      124M) LAYERS=2 HIDDEN=64 HEADS=4 KV=2 HD=16 FFN=128 VOCAB=512 B=2 ;;
      1B) LAYERS=4 HIDDEN=128 HEADS=4 KV=2 HD=32 FFN=256 VOCAB=1024 B=2 ;;
      *) return 1 ;;
    esac
    T=64 L=32 K=4 DMEM=32
  else
    case "$1" in
      124M) LAYERS=12 HIDDEN=768 HEADS=12 KV=$KV_124M HD=64 FFN=2048 VOCAB=50304 B=$B_124M ;;
      1B) LAYERS=16 HIDDEN=2048 HEADS=32 KV=8 HD=64 FFN=8192 VOCAB=$VOCAB_1B B=$B_1B ;;
      *) return 1 ;;
    esac
    T=1024 L=32 K=16 DMEM=384
  fi
  PRED_LAYERS=2
  PRED_HIDDEN=$((HIDDEN < 256 ? HIDDEN : 256))
  PROJ_HIDDEN=$((2 * HIDDEN))
  FUSION=$("$SPY" -c "import sys; sys.path.insert(0, 'tests/ref'); import train_flops as t; \
print(','.join(map(str, t.default_fusion_layers($LAYERS))))")
  SHAPE=(--arch qwen3 --layers "$LAYERS" --hidden "$HIDDEN" --heads "$HEADS" --kv-heads "$KV" --head-dim "$HD"
         --ffn "$FFN" --vocab "$VOCAB" --seq-len "$T" --batch "$B")
  DFMSHAPE=(--chunk-len "$L" --slots "$K" --d-mem "$DMEM" --pred-layers "$PRED_LAYERS" --pred-hidden "$PRED_HIDDEN"
            --proj-hidden "$PROJ_HIDDEN" --fusion-layers "$FUSION")
}

# ---- one run, within the time budget ---------------------------------------------------------------------------
# run_one NAME CMD... : stdout/stderr to logs/NAME.{stdout,stderr}, "rc seconds limit" to logs/NAME.rc
run_one() {
  local name=$1
  shift
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt "$MIN_RUN_S" ]; then
    echo "skipped: the time budget BUDGET_S=$BUDGET_S s was spent" >"$LOGS/$name.skipped"
    say "$name: skipped (time budget)"
    return 1
  fi
  local lim=$((left < RUN_TIMEOUT ? left : RUN_TIMEOUT))
  local t0=$SECONDS
  say "$name: start (limit ${lim}s)"
  timeout -k 10 "$lim" "$@" >"$LOGS/$name.stdout" 2>"$LOGS/$name.stderr"
  local rc=$?
  echo "$rc $((SECONDS - t0)) $lim" >"$LOGS/$name.rc"
  say "$name: rc $rc after $((SECONDS - t0))s"
  return "$rc"
}

# ---- data: dfm-train synth (no Python package needed) ----------------------------------------------------------
MAXB=1
for m in $MODELS; do spec "$m" || { say "unknown model $m"; exit 2; }; [ "$B" -gt "$MAXB" ] && MAXB=$B; done
spec "$(set -- $MODELS; echo "$1")"
SYNTH_VOCAB=$VOCAB
for m in $MODELS; do spec "$m"; [ "$VOCAB" -lt "$SYNTH_VOCAB" ] && SYNTH_VOCAB=$VOCAB; done
DATA=$WORK/data
if [ "$DFM_OK" = 1 ]; then
  # T, L, K, d are the same for every backbone; 3 x the largest batch: B train + B held out (+ spare)
  if ! run_one synth "$DFM_TRAIN" synth --out "$DATA" --vocab "$SYNTH_VOCAB" --seq-len "$T" --chunk-len "$L" \
      --seqs $((3 * MAXB)) --slots "$K" --d-mem "$DMEM"; then
    DFM_OK=0
    DFM_WHY="dfm-train synth failed: $(tail -n 3 "$LOGS/synth.stderr" 2>/dev/null | tr '\n' ' ')"
    say "$DFM_WHY"
  fi
fi

# ---- the runs ---------------------------------------------------------------------------------------------------
echo "$DFM_WHY" >"$LOGS/dfm_unavailable.txt"
for m in $MODELS; do
  spec "$m"
  for mode in $MODES; do
    for impl in $IMPLS; do
      name="$m-$mode-$impl"
      if [ "$impl" = dfm ]; then
        [ "$DFM_OK" = 1 ] || continue
        W=$WORK/$name
        rm -rf "$W"
        COMMON=(--data "$DATA/tokens.bin" --out "$W" --seq-len "$T" --batch "$B" --steps $((WARMUP + STEPS))
                --warmup 1 --eval-batches 1 --val-seqs "$B" "${DEV_FLAGS[@]}" "${DFM_EXTRA[@]}")
        if [ "$mode" = pretrain ]; then
          run_one "$name" "$DFM_TRAIN" pretrain "${COMMON[@]}" --arch qwen3 --layers "$LAYERS" --hidden "$HIDDEN" \
            --heads "$HEADS" --kv-heads "$KV" --head-dim "$HD" --ffn "$FFN" --vocab "$VOCAB"
        else
          BB=$WORK/$m-pretrain-dfm/model
          if [ "$BACKBONE" = python ] || [ ! -f "$BB/config.json" ] || [ ! -f "$BB/model.safetensors" ]; then
            BB=$WORK/$m-backbone
            if [ ! -f "$BB/config.json" ]; then
              if [ -n "$PY" ]; then
                run_one "$m-backbone" "$PY" bench/trainer/train_gpu_torch.py --write-backbone "$BB" "${SHAPE[@]}"
              else
                echo "no backbone: the pretraining run made none and no Python with torch can write one" \
                  >"$LOGS/$name.skipped"
              fi
            fi
            echo "backbone: random bf16 weights written by train_gpu_torch.py --write-backbone" >"$LOGS/$name.note"
          fi
          if [ -f "$BB/config.json" ]; then
            run_one "$name" "$DFM_TRAIN" train "${COMMON[@]}" --backbone "$BB" --targets "$DATA/targets.bin" \
              "${DFMSHAPE[@]}"
          elif [ ! -f "$LOGS/$name.skipped" ]; then
            echo "no backbone: writing one failed ($(tail -n 2 "$LOGS/$m-backbone.stderr" 2>/dev/null | tr '\n' ' '))" \
              >"$LOGS/$name.skipped"
          fi
        fi
        [ -f "$W/log.jsonl" ] && cp "$W/log.jsonl" "$LOGS/$name.log.jsonl"
        rm -f "$W"/ckpt_*.bin   # checkpoints (params + AdamW moments: 15 GB for 1B) are not needed
      else
        if [ -z "$PY" ]; then
          echo "no Python with torch found (tried \$PYTHON, python3, \$DFM_PYTHON, the venv)" >"$LOGS/$name.skipped"
          continue
        fi
        FLAGS=(--mode "$mode" "${SHAPE[@]}" --steps "$STEPS" --warmup-steps "$WARMUP" --device "$DEVICE"
               --dtype "$DTYPE" --log "$LOGS/$name.steps.jsonl" --label "$name")
        [ "$mode" = dfm ] && FLAGS+=("${DFMSHAPE[@]}")
        [ "$COMPILE" = 1 ] && FLAGS+=(--compile)
        FLAGS+=("${TORCH_EXTRA[@]}")
        run_one "$name" "$PY" bench/trainer/train_gpu_torch.py "${FLAGS[@]}"
      fi
    done
  done
  [ "$KEEP_WORK" = 1 ] || rm -rf "${WORK:?}/$m-"*
done

# ---- the table ------------------------------------------------------------------------------------------------------
GIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
export LOGS OUT MODELS MODES IMPLS WARMUP STEPS TINY DEVICE PEAK_TFLOPS GIT GPU COMPILE DFM_TRAIN B_124M B_1B \
  KV_124M VOCAB_1B
SPECS=""
for m in $MODELS; do
  spec "$m"
  SPECS+="$m ${SHAPE[*]} ${DFMSHAPE[*]}"$'\n'
done
export SPECS
"$SPY" - <<'EOF'
import json, os, statistics, sys, time
sys.path.insert(0, "tests/ref")
import train_flops as TF

E = os.environ
logs, out = E["LOGS"], E["OUT"]
warm, peak = int(E["WARMUP"]), float(E["PEAK_TFLOPS"])


def read(path, tail=None):
    try:
        with open(path, errors="replace") as f:
            txt = f.read()
    except OSError:
        return ""
    return "\n".join(txt.splitlines()[-tail:]) if tail else txt


def err_text(name):
    lines = [l for l in read(os.path.join(logs, name + ".stderr")).splitlines() if l.strip()]
    hits = [l for l in lines if "error" in l.lower() or "Error" in l or "out of memory" in l.lower()]
    pick = (hits[-3:] if hits else lines[-3:])
    return " | ".join(l.strip() for l in pick)[:600]


def rc_of(name):
    t = read(os.path.join(logs, name + ".rc")).split()
    return (int(t[0]), int(t[1]), int(t[2])) if len(t) == 3 else None


def med(xs):
    return statistics.median(xs) if xs else None


def timed_steps(recs):
    steps = [r for r in recs if "ms" in r and "step" in r and "ce_pred" not in r]
    t = [r for r in steps if r["step"] > warm] or steps[1:] or steps
    return steps, t


def jsonl(path):
    out = []
    for l in read(path).splitlines():
        try:
            out.append(json.loads(l))
        except ValueError:
            pass
    return out


specs = {}
for line in E["SPECS"].splitlines():
    if line.strip():
        name, *flags = line.split()
        specs[name] = flags

rows, ratios = [], []
for model in E["MODELS"].split():
    for mode in E["MODES"].split():
        a = TF.argparse.ArgumentParser()
        TF.add_model_args(a)
        args = a.parse_args(specs[model] + ["--mode", mode])
        cfg = TF.config_from_args(args)
        rep = TF.report(cfg)
        fpt = rep["flops_per_token"]
        by = {}
        for impl in E["IMPLS"].split():
            name = "%s-%s-%s" % (model, mode, impl)
            r = {"backbone": model, "mode": mode, "impl": "dfm-train" if impl == "dfm" else "pytorch",
                 "params": rep["params"], "trainable": rep["trainable"], "batch": cfg["batch"],
                 "seq_len": cfg["seq_len"], "tokens_per_step": rep["tokens_per_step"], "flops_per_token": fpt,
                 "ms_per_step": None, "tok_per_s": None, "mfu": None, "error": None, "notes": []}
            rc = rc_of(name)
            skipped = read(os.path.join(logs, name + ".skipped")).strip()
            note = read(os.path.join(logs, name + ".note")).strip()
            if note:
                r["notes"].append(note)
            if impl == "dfm":
                unavailable = read(os.path.join(logs, "dfm_unavailable.txt")).strip()
                steps, t = timed_steps(jsonl(os.path.join(logs, name + ".log.jsonl")))
                if t:
                    r["ms_per_step"] = med([s["ms"] for s in t])
                    r["steps_timed"] = len(t)
                    own = [s["mfu"] for s in t if isinstance(s.get("mfu"), (int, float))]
                    if own:
                        r["own_mfu"] = med(own)
                    st = [s["stall"] for s in t if isinstance(s.get("stall"), (int, float))]
                    if st:
                        r["stall"] = med(st)
                    r["loss_first"], r["loss_last"] = steps[0].get("loss"), steps[-1].get("loss")
                if skipped or (unavailable and rc is None):
                    r["error"] = skipped or unavailable
                elif rc is None:
                    r["error"] = "not run"
                elif rc[0] in (124, 137):
                    r["error"] = "timed out after %d s (limit %d s)%s" % (rc[1], rc[2], "; %d steps logged" % len(steps)
                                                                          if steps else "")
                elif rc[0] != 0:
                    r["error"] = "exit %d: %s" % (rc[0], err_text(name))
                elif not t:
                    r["error"] = "no step in log.jsonl"
            else:
                res = None
                for l in reversed(read(os.path.join(logs, name + ".stdout")).splitlines()):
                    if l.startswith("{"):
                        try:
                            res = json.loads(l)
                            break
                        except ValueError:
                            pass
                if res and res.get("ms_per_step"):
                    r["ms_per_step"] = res["ms_per_step"]
                    for k in ("compiled", "torch", "gpu", "attn", "max_mem_gib", "loss_first", "loss_last",
                              "optimizer", "triton", "cc", "python_h"):
                        if k in res:
                            r[k] = res[k]
                    r["steps_timed"] = res.get("steps")
                    if res.get("params") != rep["params"]:
                        r["notes"].append("PyTorch counted %s parameters" % res.get("params"))
                    if res.get("note"):
                        r["notes"].append(res["note"])
                    r["own_mfu"] = res.get("mfu")
                else:
                    steps, t = timed_steps([s for s in jsonl(os.path.join(logs, name + ".steps.jsonl"))])
                    t = [s for s in t if s.get("timed")]
                    if t:  # partial (timed out): the steps logged
                        r["ms_per_step"] = med([s["ms"] for s in t])
                        r["steps_timed"] = len(t)
                if skipped:
                    r["error"] = skipped
                elif rc is None:
                    r["error"] = "not run"
                elif rc[0] in (124, 137):
                    r["error"] = "timed out after %d s (limit %d s)" % (rc[1], rc[2])
                elif res and res.get("error"):
                    r["error"] = res["error"][:600]
                elif rc[0] != 0 or not res:
                    r["error"] = "exit %d: %s" % (rc[0], err_text(name))
            if r["ms_per_step"]:
                r["tok_per_s"] = r["tokens_per_step"] / (r["ms_per_step"] / 1e3)
                r["mfu"] = TF.mfu(fpt, r["tok_per_s"], peak)
            r["notes"] = "; ".join(r["notes"])
            rows.append(r)
            by[impl] = r
        d, p = by.get("dfm"), by.get("pytorch")
        if d and p:
            ratios.append({"backbone": model, "mode": mode, "dfm_tok_per_s": d["tok_per_s"],
                           "pytorch_tok_per_s": p["tok_per_s"],
                           "dfm_over_pytorch": d["tok_per_s"] / p["tok_per_s"] if d["tok_per_s"] and p["tok_per_s"]
                           else None})

gpu = E.get("GPU") or next((r["gpu"] for r in rows if r.get("gpu")), None) or \
    ("CPU (dry run)" if E["DEVICE"] == "cpu" else "unknown")
torchv = next((r["torch"] for r in rows if r.get("torch")), None)
meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpu, "device": E["DEVICE"], "tiny": E["TINY"] == "1",
        "git": E["GIT"], "dfm_train": E["DFM_TRAIN"], "torch": torchv, "compile": E["COMPILE"] == "1",
        "peak_tflops": peak, "warmup_steps": warm, "timed_steps": int(E["STEPS"]),
        "shapes": {k: " ".join(v) for k, v in specs.items()},
        "flops": "tests/ref/train_flops.py: matmul FLOPs only, causal attention at half, 3x forward for trainable "
                 "matmuls, 2x (forward + dgrad) for frozen ones above the lowest fusion block, 1x below it"}
with open(os.path.join(out, "bench_train_gpu.json"), "w") as f:
    json.dump({"meta": meta, "rows": rows, "ratios": ratios}, f, indent=1)


def fmt(x, spec, none="-"):
    return none if x is None else spec % x


def pct(x):  # a fraction as a percentage; tiny values (CPU dry runs) keep their digits
    return "-" if x is None else ("%.1f%%" % (100 * x) if x >= 1e-3 else "%.2g%%" % (100 * x))


md = ["# dfm-train vs PyTorch: training throughput (%s)" % gpu, "",
      "%s; dfm-train %s (git %s); PyTorch %s%s; %d warm-up + %d timed steps, median ms/step."
      % (meta["date"], E["DFM_TRAIN"], E["GIT"], torchv or "-", " + torch.compile" if meta["compile"] else "",
         warm, int(E["STEPS"])),
      "MFU = model FLOPs per token (tests/ref/train_flops.py, the same for both) x tok/s / %.1f TFLOP/s%s; "
      "'own MFU' is what each side reported itself." % (peak, " (H200 SXM dense BF16)" if abs(peak - 989.4) < 1e-6
                                                      else ""), ""]
if meta["tiny"]:
    md += ["**Dry run with tiny shapes on %s: the plumbing, not a benchmark.**" % E["DEVICE"], ""]
md += ["| backbone | mode | impl | params | trainable | B x T | GFLOP/tok | ms/step | tok/s | MFU | own MFU | notes |",
       "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    notes = r["notes"]
    if r.get("stall") is not None:
        notes = "stall %.1f%%" % (100 * r["stall"]) + ("; " + notes if notes else "")
    if r["error"]:
        notes = ("**%s**: " % ("PARTIAL" if r["ms_per_step"] else "FAILED") + r["error"].replace("|", "/")
                 + ("; " + notes if notes else ""))
    if r.get("max_mem_gib") is not None:
        notes = "peak %.1f GiB" % r["max_mem_gib"] + ("; " + notes if notes else "")
    if r.get("attn"):
        notes = r["attn"] + ("; " + notes if notes else "")
    if r["impl"] == "pytorch" and "compiled" in r:
        notes = ("compiled" if r["compiled"] else "eager") + ("; " + notes if notes else "")
    md.append("| %s | %s | %s | %.1fM | %.1fM | %dx%d | %.3g | %s | %s | %s | %s | %s |" % (
        r["backbone"], r["mode"], r["impl"], r["params"] / 1e6, r["trainable"] / 1e6, r["batch"], r["seq_len"],
        r["flops_per_token"] / 1e9, fmt(r["ms_per_step"], "%.1f"), fmt(r["tok_per_s"], "%.0f"), pct(r["mfu"]),
        pct(r.get("own_mfu")), notes.replace("\n", " ")))
md += ["", "| backbone | mode | dfm-train tok/s | PyTorch tok/s | dfm-train / PyTorch |", "|---|---|---|---|---|"]
for q in ratios:
    md.append("| %s | %s | %s | %s | %s |" % (q["backbone"], q["mode"], fmt(q["dfm_tok_per_s"], "%.0f"),
                                            fmt(q["pytorch_tok_per_s"], "%.0f"), fmt(q["dfm_over_pytorch"], "%.2fx")))
md += ["", "Shapes (flags as dfm-train's):", ""] + ["- %s: `%s`" % (k, v) for k, v in meta["shapes"].items()]
md += ["", "Logs: %s" % logs, ""]
with open(os.path.join(out, "bench_train_gpu.md"), "w") as f:
    f.write("\n".join(md))
print("\n".join(md))
EOF
say "wrote $OUT/bench_train_gpu.md and $OUT/bench_train_gpu.json"
