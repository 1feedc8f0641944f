#!/usr/bin/env bash
# test_information_runs.sh — what the information readout (bench/memory/information.py, rung 2 of the memory
# ladder) reads from real runs, at test size: the fact corpus of 16 invented entities and 8 probes (bench/memory/
# knowledge/), built with `dfm build` (knowledge_runs.sh) with `"slots-hold": "both"` targets; the arrays
# information.py saves (--save-arrays) against this test's own reading of the pipeline's files
# (tests/ref/retrieval_reference.py's parsers, dfm.load_tokens, the tokenizer):
#   1. corpus: each chunk's tokens (padding as -1); its memory: slots 0..K-1 the fp16 embeddings of its
#      neighbours in rank order (the retrieve stage's rows: chunk c's row, retrieved with chunk c-1), slots K..2K-1
#      the embedding of neighbour id + 1 wherever valid, and only where neighbour r is; its query: chunk c-1's
#      embedding;
#   2. probes: the answer chunk's memory (probe run row seq*3 + 2 into the corpus's embeddings), the query
#      (the probe run's chunk seq*3 + 1), the answer's first token (the tokenizer on " " + answer, its first
#      token that is not white space alone) and whether a slot's chunk text holds the answer;
#   3. each comparison fails on a planted misalignment: corpus memory shifted by one chunk, the probes' answers
#      shifted by one probe, the queries shifted by one chunk;
#   4. the readout on the saved arrays (--arrays) gives the results of the readout on the runs;
#   5. --train-corpus-run (here the probe run itself): the corpus arrays are that run's tokens and targets, the
#      probes' arrays (memory, answers, slot recall read from the corpus run) are unchanged.
# SKIP when the LM is not installed (make lm).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
KNOWLEDGE_TARGETS=', "slots-hold": "both"'
source "$(dirname "$0")/knowledge_runs.sh"   # SKIP without the LM; T/corpus, T/probes
"$PY" "$ROOT/bench/memory/information.py" --corpus-run "$T/corpus" --probe-run "$T/probes" --spans "$T/pt/spans.jsonl" \
  --tokenizer "$TOK" --out "$T/runs.json" --save-arrays "$T/arrays.npz" >"$T/log" 2>&1 ||
  { tail -20 "$T/log"; fail "information.py on the runs"; }

echo "== 1-3. the arrays against the pipeline's files; planted misalignments caught"
PYTHONPATH="$ROOT/python:$ROOT/tests/ref" "$PY" - "$T" "$TOK" <<'EOF' || fail "the arrays information.py read"
import json, sys
import numpy as np
import dfm
from retrieval_reference import load_embeddings, load_neighbours
from tokenizers import Tokenizer

t, tokfile = sys.argv[1:]
tok = Tokenizer.from_file(tokfile)
A = dict(np.load(t + "/arrays.npz"))
man = {r: json.load(open("%s/%s/manifest.json" % (t, r))) for r in ("corpus", "probes")}
emb = load_embeddings(t + "/corpus", man["corpus"])
f16 = emb.astype(np.float16).astype(np.float32)          # the targets are stored as fp16
ids, scores, mbits, _ = load_neighbours(t + "/corpus", man["corpus"])
K = ids.shape[1]
nb_mask = ((mbits[:, None].astype(np.uint64) >> np.arange(K, dtype=np.uint64)) & 1).astype(bool)
flat, pad, L = dfm.load_tokens(t + "/corpus")
ctok = flat.reshape(-1, L).astype(np.int64)
if pad is not None:
    ctok[pad.reshape(-1, L) == 1] = -1
spans = [json.loads(l) for l in open(t + "/pt/spans.jsonl")]
p_ids, _, p_bits, _ = load_neighbours(t + "/probes", man["probes"])
p_nb = ((p_bits[:, None].astype(np.uint64) >> np.arange(K, dtype=np.uint64)) & 1).astype(bool)
p_embs = load_embeddings(t + "/probes", man["probes"])
q = np.array([s["seq"] * 3 + s["start"] // L for s in spans])


def memory_errors(c_emb, c_mask):
    bad = []
    n = len(ids)
    if c_emb.shape != (n, 2 * K, emb.shape[1]):
        return ["shape %s, expected %s" % (c_emb.shape, (n, 2 * K, emb.shape[1]))]
    for c in range(n):
        if not np.array_equal(c_mask[c, :K], nb_mask[c]):
            bad.append("chunk %d: neighbour mask differs" % c)
            continue
        for r in np.nonzero(nb_mask[c])[0]:
            if not np.array_equal(c_emb[c, r], f16[ids[c, r]]):
                bad.append("chunk %d slot %d: not neighbour %d's embedding" % (c, r, ids[c, r]))
            if c_mask[c, K + r] and not np.array_equal(c_emb[c, K + r], f16[ids[c, r] + 1]):
                bad.append("chunk %d slot %d: not the continuation %d's embedding" % (c, K + r, ids[c, r] + 1))
        if (c_mask[c, K:] & ~nb_mask[c]).any():
            bad.append("chunk %d: a continuation slot valid without its neighbour" % c)
    return bad


def answer_errors(p_answer):
    bad = []
    for i, s in enumerate(spans):
        want = next(x for x in tok.encode(" " + s["answer"], add_special_tokens=False).ids if tok.decode([x]).strip())
        if p_answer[i] != want:
            bad.append("probe %d: answer token %d, the tokenizer says %d" % (i, p_answer[i], want))
    return bad


def query_errors(c_query, p_query):
    bad = ["chunk %d: query is not chunk %d's embedding" % (c, c - 1)
           for c in range(1, len(emb)) if nb_mask[c].any() and not np.array_equal(c_query[c], emb[c - 1])]
    bad += ["probe %d: query is not its prompt chunk's embedding" % i
            for i in range(len(spans)) if not np.array_equal(p_query[i], p_embs[q[i] - 1])]
    return bad


fails = []
def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        fails.append(what)


check(np.array_equal(A["c_tok"], ctok), "corpus tokens (%d chunks, padding -1) equal dfm.load_tokens'" % len(ctok))
e = memory_errors(A["c_emb"], A["c_mask"])
nc = int(A["c_mask"][:, K:].sum())
check(not e and nc > 0 and int(A["groups"]) == 2,
      "corpus memory: %d neighbour slots, %d continuation slots equal the retrieve rows' embeddings (fp16)%s"
      % (int(A["c_mask"][:, :K].sum()), nc, "" if not e else ": " + "; ".join(e[:3])))
pe = [i for i in range(len(spans)) if not np.array_equal(A["p_mask"][i, :K], p_nb[q[i]]) or
      (A["p_mask"][i, K:] & ~p_nb[q[i]]).any() or
      any(not np.array_equal(A["p_emb"][i, r], f16[p_ids[q[i], r % K] + r // K])
          for r in np.nonzero(A["p_mask"][i])[0])]
check(not pe and A["p_mask"][:, K:].any(),
      "probe memory: the probe run's neighbours of each answer chunk (seq*3 + 2) and their continuations, %d probes%s"
      % (len(spans), "" if not pe else ": probes %s differ" % pe[:5]))
e = answer_errors(A["p_answer"])
check(not e, "answer tokens: the tokenizer's first non-blank token of each answer%s" % ("" if not e else ": " + e[0]))
e = query_errors(A["c_query"], A["p_query"])
check(not e, "queries: chunk c-1's embedding, the probe's prompt chunk%s" % ("" if not e else ": " + e[0]))
texts = {}
hit = np.zeros_like(A["p_slot_text_hit"])
for i, s in enumerate(spans):
    for r in np.nonzero(A["p_mask"][i])[0]:
        j = int(p_ids[q[i], r % K]) + (1 if r >= K else 0)
        hit[i, r] = s["answer"] in tok.decode([int(x) for x in ctok[j] if x >= 0])
check(np.array_equal(hit, A["p_slot_text_hit"]) and hit.any(),
      "slot recall: the answer found in %d of %d probes' slot texts, as decoded here" % (hit.any(1).sum(), len(spans)))
# 3. planted misalignments
e = memory_errors(np.roll(A["c_emb"], 1, axis=0), np.roll(A["c_mask"], 1, axis=0))
check(len(e) > 0, "planted: corpus memory one chunk late is caught (%d mismatches)" % len(e))
e = answer_errors(np.roll(A["p_answer"], 1))
check(len(e) > 0, "planted: answers shifted by one probe are caught (%d mismatches)" % len(e))
e = query_errors(np.roll(A["c_query"], 1, axis=0), A["p_query"])
check(len(e) > 0, "planted: queries one chunk late are caught (%d mismatches)" % len(e))
sys.exit(1 if fails else 0)
EOF

echo "== 4. the readout on the saved arrays equals the readout on the runs"
"$PY" "$ROOT/bench/memory/information.py" --arrays "$T/arrays.npz" --out "$T/arrays.json" >"$T/log" 2>&1 ||
  { tail -20 "$T/log"; fail "information.py --arrays"; }
"$PY" - "$T" <<'EOF' || fail "results from the arrays differ from results from the runs"
import json, sys
t = sys.argv[1]
a, b = (json.load(open("%s/%s.json" % (t, x))) for x in ("runs", "arrays"))
for r in (a, b):
    r.pop("cpu_s", None)
    r.pop("slots", None)
assert a == b, "differ: %s" % sorted(k for k in a if a[k] != b.get(k))
print("ok: the same results from the runs and from the saved arrays (%d keys)" % len(a))
EOF
echo "== 5. --train-corpus-run: the corpus arrays from that run, the probes' unchanged"
"$PY" "$ROOT/bench/memory/information.py" --corpus-run "$T/corpus" --probe-run "$T/probes" --spans "$T/pt/spans.jsonl" \
  --tokenizer "$TOK" --train-corpus-run "$T/probes" --out "$T/train.json" --save-arrays "$T/train.npz" >"$T/log" 2>&1 ||
  { tail -20 "$T/log"; fail "information.py --train-corpus-run"; }
PYTHONPATH="$ROOT/python" "$PY" - "$T" <<'EOF' || fail "--train-corpus-run's arrays"
import sys
import numpy as np
import dfm
t = sys.argv[1]
A, B = dict(np.load(t + "/arrays.npz")), dict(np.load(t + "/train.npz"))
flat, pad, L = dfm.load_tokens(t + "/probes")
tok = flat.reshape(-1, L).astype(np.int64)
if pad is not None:
    tok[pad.reshape(-1, L) == 1] = -1
with dfm.open_run(t + "/probes") as r:
    recs = list(r.records())
emb = np.stack([x["emb"] for x in recs])
mask = np.stack([x["mask"] for x in recs])
assert np.array_equal(B["c_tok"], tok), "c_tok is not the training run's tokens"
assert np.array_equal(B["c_mask"], mask) and np.array_equal(B["c_emb"], emb), "c_emb/c_mask are not its targets"
for k in A:
    if k.startswith("p_"):
        assert np.array_equal(A[k], B[k]), "%s changed with the training run" % k
print("ok: --train-corpus-run: %d corpus chunks of the training run (tokens, targets); %d probe arrays unchanged, "
      "slot recall still from the corpus run" % (len(tok), sum(k.startswith("p_") for k in A)))
EOF
echo "all checks passed"
