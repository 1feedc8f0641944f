#!/usr/bin/env bash
# The benchmark peers come from one place and are never substituted:
#  1. bench/peers.sh --check refuses a missing peer venv and one whose stamp holds other pins;
#  2. bench/bench_encoder_cpu.sh fails, naming the cause, when the peer venv is missing, and when a peer
#     does not import from it; it writes no result file either time (no NumPy or other stand-in);
#  3. bench/run_all.sh prints the ratio table from result files that follow bench/README.md's convention,
#     refuses one that lacks a required field, and refuses an unknown stage.
source "$(dirname "$0")/lib.sh"
cd "$DFM_ROOT"
export RECORD=1 BUILD=0

export PEERS_VENV=$WORK/none
expect_fail "is missing or does not match the pins" bash bench/peers.sh --check
mkdir -p "$WORK/stale/bin" && ln -s "$(command -v python3)" "$WORK/stale/bin/python"
echo "torch==0.0.1" > "$WORK/stale/peers.stamp"
PEERS_VENV=$WORK/stale expect_fail "is missing or does not match the pins" bash bench/peers.sh --check

stamp() { stat -c '%n %Y %s' bench/results/encoder.json bench/results/encoder_cpu.md 2>/dev/null || true; }
before=$(stamp)
expect_fail "the peer venv is missing or stale" bash bench/bench_encoder_cpu.sh
# a current stamp over a Python without the peers: the benchmark must not fall back to anything
mkdir -p "$WORK/bare/bin" && ln -s "$(command -v python3)" "$WORK/bare/bin/python"
bash bench/peers.sh --pins > "$WORK/bare/peers.stamp"
PEERS_VENV=$WORK/bare bash bench/peers.sh --check || fail "a venv with the current stamp is not taken as current"
PEERS_VENV=$WORK/bare PEERS=st expect_fail "peer st (sentence-transformers on torch) does not import" \
  bash bench/bench_encoder_cpu.sh
PEERS_VENV=$WORK/bare PEERS=ort expect_fail "peer ort (onnxruntime + onnx export) does not import" \
  bash bench/bench_encoder_cpu.sh
[ "$(stamp)" = "$before" ] ||
  fail "a refused benchmark touched bench/results"
ok "no result file written by a refused benchmark"

mkdir -p "$WORK/res"
cat > "$WORK/res/encoder.json" <<'JSON'
{"stage": "encoder", "peer": "ONNX Runtime, fused graph", "peer_version": "onnxruntime 9.9", "dfm_cpu_s": 2.0,
 "peer_cpu_s": 2.5, "ratio": 1.25, "agree": {"ok": true, "max_abs_err": 2e-07}, "threads": 1,
 "rows": [{"stage": "encoder", "peer": "ONNX Runtime, fused graph", "peer_version": "onnxruntime 9.9",
           "dfm_cpu_s": 2.0, "peer_cpu_s": 2.5, "ratio": 1.25, "agree": {"ok": true}, "threads": 1},
          {"stage": "encoder", "peer": "sentence-transformers", "peer_version": "st 9.9", "dfm_cpu_s": 4.0,
           "peer_cpu_s": 3.0, "ratio": 0.75, "agree": {"ok": false, "max_abs_err": 0.5}, "threads": 2}]}
JSON
out=$(TABLE_ONLY=1 BENCH_RESULTS=$WORK/res bash bench/run_all.sh encoder) || fail "run_all refused a good result file: $out"
grep -qF "| encoder | ONNX Runtime, fused graph | onnxruntime 9.9 | 1 thr | 2 | 2.5 | **1.25×** | yes" <<<"$out" ||
  fail "run_all's table lacks the headline row: $out"
grep -qF "| **0.75×** | NO (max_abs_err 0.5)" <<<"$out" || fail "run_all's table lacks the second row: $out"
cmp -s <(echo "$out") "$WORK/res/run_all.md" || fail "run_all.md differs from the printed table"
ok "run_all prints every row with its ratio and agreement"
"$DFM_PYTHON" -c 'import json,sys; d=json.load(open(sys.argv[1])); del d["ratio"]; del d["rows"]; json.dump(d, open(sys.argv[1], "w"))' \
  "$WORK/res/encoder.json"
TABLE_ONLY=1 BENCH_RESULTS=$WORK/res expect_fail "missing fields ['ratio']" bash bench/run_all.sh encoder
TABLE_ONLY=1 BENCH_RESULTS=$WORK/res expect_fail "(no result:" bash bench/run_all.sh faiss
expect_fail "unknown stage 'bogus'" bash bench/run_all.sh bogus
