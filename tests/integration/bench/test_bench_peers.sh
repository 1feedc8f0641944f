#!/usr/bin/env bash
# The benchmark peers come from one place and are never substituted:
#  1. bench/peers.sh --check refuses a missing peer venv and one whose stamp holds other pins;
#  2. bench/encoder/bench_encoder_cpu.sh fails, naming the cause, when the peer venv is missing, and when a peer
#     does not import from it; it writes no result file either time (no NumPy or other stand-in);
#  3. bench/run_all.sh prints the ratio table from result files that follow bench/README.md's convention,
#     refuses one that lacks a required field, and refuses an unknown stage;
#  4. its headline puts the strongest peer of each case first (the lowest dfm/peer, whatever the file's own
#     headline says), and a goal is met only when every round reaches it;
#  5. BENCHMARKS.md's row per stage and bench/results/report-peers.md's headline are the tables run_all.sh
#     makes from bench/results (no hand edits).
source "$(dirname "$0")/../lib.sh"
cd "$DFM_ROOT"
export RECORD=1 BUILD=0

export PEERS_VENV=$WORK/none
expect_fail "is missing or does not match the pins" bash bench/peers.sh --check
mkdir -p "$WORK/stale/bin" && ln -s "$(command -v python3)" "$WORK/stale/bin/python"
echo "torch==0.0.1" > "$WORK/stale/peers.stamp"
PEERS_VENV=$WORK/stale expect_fail "is missing or does not match the pins" bash bench/peers.sh --check

stamp() { stat -c '%n %Y %s' bench/results/encoder.json bench/results/encoder_cpu.md 2>/dev/null || true; }
before=$(stamp)
expect_fail "the peer venv is missing or stale" bash bench/encoder/bench_encoder_cpu.sh
# a current stamp over a Python without the peers: the benchmark must not fall back to anything
mkdir -p "$WORK/bare/bin" && ln -s "$(command -v python3)" "$WORK/bare/bin/python"
bash bench/peers.sh --pins > "$WORK/bare/peers.stamp"
PEERS_VENV=$WORK/bare bash bench/peers.sh --check || fail "a venv with the current stamp is not taken as current"
PEERS_VENV=$WORK/bare PEERS=st expect_fail "peer st (sentence-transformers on torch) does not import" \
  bash bench/encoder/bench_encoder_cpu.sh
PEERS_VENV=$WORK/bare PEERS=ort expect_fail "peer ort (onnxruntime + onnx export) does not import" \
  bash bench/encoder/bench_encoder_cpu.sh
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

# 4. the strongest peer heads each case: the file's headline is eager (1.23x), torch.compile is stronger
cat > "$WORK/res/train.json" <<'JSON'
{"stage": "train", "setting": "dfm", "threads": 1, "peer": "PyTorch eager", "peer_version": "torch 9.9",
 "dfm_cpu_s": 0.25, "peer_cpu_s": 0.31, "ratio": 1.23, "ratio_min_max": [1.19, 1.31], "agree": {"ok": true},
 "rows": [{"stage": "train", "setting": "dfm", "threads": 1, "peer": "PyTorch eager", "peer_version": "torch 9.9",
           "dfm_cpu_s": 0.25, "peer_cpu_s": 0.31, "ratio": 1.23, "ratio_min_max": [1.19, 1.31], "agree": {"ok": true}},
          {"stage": "train", "setting": "dfm", "threads": 1, "peer": "torch.compile", "peer_version": "torch 9.9",
           "dfm_cpu_s": 0.25, "peer_cpu_s": 0.26, "ratio": 1.04, "ratio_min_max": [0.77, 1.13], "agree": {"ok": true}},
          {"stage": "train", "setting": "pretrain", "threads": 1, "peer": "PyTorch eager", "peer_version": "torch 9.9",
           "dfm_cpu_s": 0.2, "peer_cpu_s": 0.3, "ratio": 1.5, "ratio_min_max": [1.21, 1.6], "agree": {"ok": true}},
          {"stage": "train", "setting": "pretrain", "threads": 1, "peer": "torch.compile", "peer_version": "torch 9.9",
           "dfm_cpu_s": 0.2, "peer_cpu_s": 0.26, "ratio": 1.3, "ratio_min_max": [1.18, 1.4], "agree": {"ok": true}}]}
JSON
out=$(TABLE_ONLY=1 BENCH_RESULTS=$WORK/res bash bench/run_all.sh train) || fail "run_all refused the train file: $out"
head=$(sed -n '/^Headline/,/^Every comparison/p' <<<"$out")
grep -qF "| train | dfm, 1 thread(s) | torch.compile (torch 9.9) | **1.04×** (0.77–1.13) | ≥ 1.2×: not met | yes | PyTorch eager 1.23× |" <<<"$head" ||
  fail "the headline does not put torch.compile (1.04x) first for DFM mode: $head"
grep -qF "| train | pretrain, 1 thread(s) | torch.compile (torch 9.9) | **1.30×** (1.18–1.40) | ≥ 1.2×: not met (median only) |" <<<"$head" ||
  fail "a goal met on the median but not in every round counts as met: $head"
[ "$(grep -c '^| train |' <<<"$head")" = 2 ] || fail "the headline should hold one row per case (2): $head"
ok "the headline puts the strongest peer of each case first; a goal needs every round"
# the row per stage is headed by the case where dfm/peer is lowest, with the range of every case beside it
printf '%s\n' '<!-- run_all.sh: the rows below are generated by `TABLE_ONLY=1 bash bench/run_all.sh`; do not edit -->' \
  'hand text' '<!-- run_all.sh: end -->' > "$WORK/stage.md"
TABLE_ONLY=1 BENCH_RESULTS=$WORK/res BENCH_DOC=$WORK/stage.md bash bench/run_all.sh train >/dev/null 2>&1 ||
  fail "run_all refused to write the row per stage"
grep -qF "| train | torch.compile | **1.04×** (0.77–1.13) | dfm, 1 thread(s) | 1.04–1.30× over 2 case(s) | 0 of 2 cases | 2 of 2 |" "$WORK/stage.md" ||
  fail "the row per stage is not headed by the lowest case's strongest peer: $(cat "$WORK/stage.md")"
! grep -q 'hand text' "$WORK/stage.md" || fail "run_all kept a hand-written line inside the generated block"
ok "the row per stage is headed by the strongest peer of the stage's lowest case"

# 5. BENCHMARKS.md's row per stage and report-peers.md's headline are what run_all.sh makes from bench/results
mkdir -p "$WORK/cur"
cp bench/results/*.json "$WORK/cur/"
cp BENCHMARKS.md "$WORK/doc.md"
cp bench/results/report-peers.md "$WORK/page.md"
TABLE_ONLY=1 BENCH_RESULTS=$WORK/cur BENCH_DOC=$WORK/doc.md BENCH_PAGE=$WORK/page.md bash bench/run_all.sh \
  > "$WORK/cur.log" 2>&1 || { cat "$WORK/cur.log"; fail "run_all on bench/results"; }
diff -u BENCHMARKS.md "$WORK/doc.md" ||
  fail "BENCHMARKS.md's rows per stage are not what bench/results gives: run TABLE_ONLY=1 bash bench/run_all.sh and commit it"
diff -u bench/results/report-peers.md "$WORK/page.md" ||
  fail "report-peers.md's headline is not what bench/results gives: run TABLE_ONLY=1 bash bench/run_all.sh and commit it"
# the check can fail: a hand edit of a generated row is found
sed -i 's/^| encoder | \(.*\)\*\*[0-9.]*×\*\*/| encoder | \1**9.99×**/' "$WORK/doc.md"
grep -qF '**9.99×**' "$WORK/doc.md" || fail "could not plant a hand edit in the copy of BENCHMARKS.md"
TABLE_ONLY=1 BENCH_RESULTS=$WORK/cur BENCH_DOC=$WORK/doc.md bash bench/run_all.sh > "$WORK/cur.log" 2>&1 ||
  { cat "$WORK/cur.log"; fail "run_all on bench/results (planted edit)"; }
cmp -s BENCHMARKS.md "$WORK/doc.md" || fail "run_all did not restore the hand-edited row of BENCHMARKS.md"
# every stage has its row, each linking to a results page that exists
for s in tokenizer encoder train lm faiss; do
  l=$(grep "^| $s | " BENCHMARKS.md) || fail "BENCHMARKS.md has no row for $s"
  pg=$(grep -o 'bench/results/report-[a-z]*\.md' <<<"$l") && [ -f "$pg" ] || fail "the $s row links to no results page: $l"
done
ok "BENCHMARKS.md's rows per stage and report-peers.md's headline are run_all.sh's, from bench/results"
