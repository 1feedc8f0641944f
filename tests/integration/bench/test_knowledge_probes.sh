#!/usr/bin/env bash
# test_knowledge_probes.sh — the real-LM knowledge probes end to end at test size (bench/memory/bench_real_memory.sh
# runs them at full size): facts about invented entities (bench/memory/knowledge/facts.py) as the corpus and
# datastore, probe questions (bench/memory/knowledge/probe_tokens.py) as a query-only run that retrieves from it
# (`dfm build` with "retrieve": {"datastore": ...}: no index of its own), DFM modules trained a few steps on
# the corpus with the frozen SmolLM2-135M, and `dfm-train eval` of the probe run in every memory mode.
#   1. the query-only run: no index stage, the datastore recorded, neighbour ids beyond its own chunks;
#   2. retrieval finds the facts: chunk 1 (the prompt) as the query, a neighbour of the answer chunk holds
#      the answer in >= 75 % of the probes (the corpus run's chunk texts); the same check on the rows
#      shuffled between probes stays below 50 % (the check can fail);
#   3. the probe run's targets feed dfm-train eval: every mode and both shuffled controls finite, and each
#      memory effect is its control's CE minus the mode's;
#   4. the probe scoring (bench/memory/knowledge/score.py, dfm.torch) on 4 probe sequences: every mode scored,
#      the pasted fact (in-context reference) raises the answer's log-probability over fusion off by > 2
#      nats, retrieval recall as in 2.
# SKIP when the LM is not installed (make lm).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
TRAIN=${DFM_TRAIN:-$ROOT/build/dfm-train}
source "$(dirname "$0")/knowledge_runs.sh"   # SKIP without the LM; T/corpus, T/probes

echo "== 1. the probe run is query-only"
"$PY" - "$T" <<'EOF' || fail "query-only run"
import json, os, struct, sys
t = sys.argv[1]
st = json.load(open(t + "/probes/manifest.json"))["stages"]
cor = json.load(open(t + "/corpus/manifest.json"))["stages"]
assert "index" not in st, "the query-only run built an index of its own"
ds = st["retrieve"].get("datastore")
assert ds == {"run": os.path.realpath(t + "/corpus"), "chunks": cor["chunk"]["counts"]["chunks"]}, ds
assert st["retrieve"]["index_hash"] == cor["retrieve"]["index_hash"], "not the corpus's index"
b = open(t + "/probes/retrieve/nbr-000000.bin", "rb").read()
assert struct.unpack_from("<Q", b, 88)[0] == ds["chunks"], "n_ids"
print("ok: no index of its own; datastore %s (%d chunks) recorded" % (ds["run"], ds["chunks"]))
EOF

echo "== 2. retrieval finds the facts"
"$PY" - "$T" "$TOK" "$ROOT" <<'EOF' || fail "retrieval recall"
import json, sys
t, tok_path, root = sys.argv[1:]
sys.path.insert(0, root + "/python")
import dfm  # the package's readers: the corpus run's tokens, the probe run's target records
from tokenizers import Tokenizer
tok = Tokenizer.from_file(tok_path)
toks, pad, L = dfm.load_tokens(t + "/corpus")
def text(c):
    ids = toks[c * L:(c + 1) * L]
    if pad is not None:
        ids = ids[pad[c * L:(c + 1) * L] == 0]
    return tok.decode(ids.tolist())
run = dfm.open_run(t + "/probes")  # a query-only run: its neighbour ids are the corpus run's chunks
spans = [json.loads(l) for l in open(t + "/pt/spans.jsonl")]
rows = []
for s in spans:
    r = run.get(3 * s["seq"] + 2)
    rows.append([int(i) for i, m in zip(r["ids"], r["mask"]) if m])
def recall(rs):
    return sum(any(s["answer"] in text(c) for c in rs[i]) for i, s in enumerate(spans)) / len(spans)
real = recall(rows)
# the control: every probe gets the rows of the probe half the list away (another entity)
shuf = recall([rows[(i + len(rows) // 2) % len(rows)] for i in range(len(rows))])
print("retrieval recall %.3f on %d probe sequences; rows of another probe %.3f" % (real, len(spans), shuf))
assert real >= 0.75, "retrieval misses the facts"
assert shuf < 0.5, "the recall check passes on another probe's neighbours"
EOF

echo "== 3. DFM modules on the frozen LM, evaluated on the probe run's targets"
"$TRAIN" train --backbone "$LM" --data "$T/corpus" --targets "$T/corpus" --out "$T/dfm" --seq-len 256 --chunk-len 32 --batch 2 \
  --steps 3 --lr 2e-3 --warmup 1 --fusion-layers 26,29 --pred-input-layer 16 --val-seqs 2 --eval-batches 1 --seed 1 --threads 2 \
  --no-ckpt --cache-frozen >"$T/train.log" 2>&1 || { tail -20 "$T/train.log"; fail "dfm-train train on the fact corpus"; }
"$TRAIN" eval --backbone "$LM" --modules "$T/dfm/dfm_modules.safetensors" --data "$T/probes" --targets "$T/probes" --seq-len 96 \
  --batch 4 --val-seqs 8 --threads 2 >"$T/eval.json" 2>"$T/eval.log" || { tail -20 "$T/eval.log"; fail "dfm-train eval on the probe run"; }
"$PY" - "$T/eval.json" <<'EOF' || fail "eval modes"
import json, math, sys
e = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
keys = ["ce_none", "ce_pred", "ce_target", "ce_pred_shuffled", "ce_target_shuffled"]
bad = [k for k in keys if not (isinstance(e.get(k), float) and math.isfinite(e[k]))]
assert not bad, "not finite: %s" % bad
for m in ("pred", "target"):  # the effect is control minus real (both rounded to 1e-6 in the JSON)
    d = e["ce_%s_shuffled" % m] - e["ce_" + m]
    assert abs(e["memory_effect_" + m] - d) <= 3e-6, "memory_effect_%s %g, shuffled - real %g" % (m, e["memory_effect_" + m], d)
print("eval on the probe run: " + ", ".join("%s %.4f" % (k, e[k]) for k in keys) +
      "; memory effect pred %+.4f, target %+.4f" % (e["memory_effect_pred"], e["memory_effect_target"]))
EOF

echo "== 4. the probe scoring on 4 sequences"
"$PY" "$ROOT/bench/memory/knowledge/score.py" --backbone "$LM" --modules "$T/dfm/dfm_modules.safetensors" --run "$T/probes" \
  --spans "$T/pt/spans.jsonl" --probes "$T/probes.jsonl" --corpus-run "$T/corpus" --tokenizer "$TOK" --out "$T/score.json" \
  --threads 2 --limit 4 >"$T/score.log" 2>&1 || { tail -20 "$T/score.log"; fail "score.py"; }
"$PY" - "$T/score.json" <<'EOF' || fail "probe scores"
import json, math, sys
r = json.load(open(sys.argv[1]))
al = r["all"]
modes = ["none", "predicted", "target", "predicted_shuffled", "target_shuffled", "in_context"]
assert r["sequences"] == 4 and all(al[m]["n"] == 4 and math.isfinite(al[m]["logprob"]) for m in modes), al
gain = al["in_context"]["logprob"] - al["none"]["logprob"]
assert gain > 2, "the pasted fact raises the answer log-prob by only %.2f nats" % gain
assert r["analysis"]["retrieval_recall"] >= 0.75, r["analysis"]["retrieval_recall"]
print("probe scores (answer log-prob): " + ", ".join("%s %.2f" % (m, al[m]["logprob"]) for m in modes) +
      "; in-context gain %.2f nats; retrieval recall %.2f" % (gain, r["analysis"]["retrieval_recall"]))
EOF
echo "all knowledge-probe checks passed"
