#!/usr/bin/env python3
"""predictor_input.py — the predictor's information rung: how much of a chunk's target memory a linear map can
predict from each candidate predictor input (a vector made from the previous chunk), outside the trainer.

The DFM predictor must emit chunk c's memory from chunk c-1 alone. On the knowledge probes it emits one memory
for every question (bench/results/report-memory.md, "Where predicted memory is lost"). This asks whether the
input it reads tells the questions apart at all, before any predictor is trained: a ridge regression (closed
form, with an intercept) from each input to the mean of chunk c's valid target slots, fitted on the corpus run's
chunks and read on the probes, whose query chunk is mostly a filler every probe shares.

Inputs (of chunk c-1; for a probe, its prompt chunk):
    emb_mean      the mean of the LM's input embeddings over the chunk's tokens (the trainer's default input)
    emb_lastN     the same over its last N tokens (--pred-input-tokens N)
    lmK_mean      the mean of the LM's states after K blocks over the chunk's tokens (--pred-input-layer K); the
                  states are `dfm-train slots --own --pool L --layer K`: the chunk run alone after a constant
                  prefix, each token's state scaled to unit norm (the trainer reads them in context, unscaled)
    lmK_lastN     the same over its last N tokens (lmK_last1: the last token's state)
    query         the chunk's MiniLM embedding: the very key its memory was retrieved with (a ceiling: the
                  predictor has no encoder at inference)

Scored (each input, on the probes and on held-out corpus chunks: the last 10 % of documents, the rest fitted):
    cos_own, cos_partner   cosine of the prediction to its own target and to the partner's (score.py's pairing:
                           the probe n/2 away, of another entity; for corpus chunks, the chunk n/2 away)
    gap                    cos_own - cos_partner: zero when the prediction is the same for every input
    between                the mean cosine of two partners' predictions (1: one memory for every question)
    top1, mrr              the own target ranked among all the scored items' targets by cosine to the prediction
The ridge strength is chosen per input on the fitted chunks' last 10 % (the largest gap).

    python3 bench/memory/predictor_input.py --corpus-run C --probe-run P --spans SPANS.jsonl --backbone LM
        --states C_STATES:P_STATES:K [...] --out R.json [--last 1,12] [--save-arrays A.npz]
    python3 bench/memory/predictor_input.py --arrays A.npz --out R.json     # on saved or planted arrays
C_STATES / P_STATES: `dfm-train slots --own --pool L --layer K` files of the corpus and the probe run.

Arrays (--arrays; what --save-arrays writes): c_ok [n] (chunk has target memory), c_tgt [n, d] (its unit mean target
slot), c_doc [n] (its document, in stream order), seqc (chunks per sequence), p_tgt [np, d] (the probe run's, alike),
p_ans [m] (each probe's answer chunk; the chunk before it is the input), p_ent [m] (its entity, for the pairing), and
per input NAME: in_NAME_corpus [n, C] and in_NAME_probe [np, C] (the input made from each chunk).
"""
import argparse
import json
import os
import sys

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "memory"))
sys.path.insert(0, os.path.join(ROOT, "python"))
from information import chunk_shards, partners  # noqa: E402

ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # times the mean eigenvalue of the Gram matrix


def embedding_table(backbone):
    """The LM's input embedding matrix [V, C] float32 from its safetensors file (bf16, f16 or f32)."""
    path = os.path.join(backbone, "model.safetensors")
    with open(path, "rb") as f:
        n = int(np.frombuffer(f.read(8), "<u8")[0])
        head = json.loads(f.read(n))
        t = head["model.embed_tokens.weight"]
        a, b = t["data_offsets"]
        f.seek(8 + n + a)
        raw = np.frombuffer(f.read(b - a), np.uint8)
    if t["dtype"] == "BF16":
        w = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        w = raw.view({"F16": "<f2", "F32": "<f4"}[t["dtype"]]).astype(np.float32)
    return w.reshape(t["shape"])


def target_means(run):
    """[n] valid and [n, d] unit mean of each chunk's valid target slots (the records of a `dfm` run)."""
    import dfm
    with dfm.open_run(run) as r:
        n, d = r.n_chunks, r.d
        out, ok = np.zeros((n, d), np.float32), np.zeros(n, bool)
        for i, rec in enumerate(r.records()):
            m = np.asarray(rec["mask"], bool)
            if m.any():
                v = np.asarray(rec["emb"], np.float32)[m].mean(0)
                out[i], ok[i] = v / max(np.linalg.norm(v), 1e-12), True
    return ok, out


def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def pooled(tok, per_token, last):
    """[n, C] mean over each chunk's last `last` valid tokens (0: all) of per_token(chunk rows) [L, C]."""
    out = []
    for i in range(len(tok)):
        v = np.nonzero(tok[i] >= 0)[0]
        v = v[-last:] if last else v
        out.append(per_token(i)[v].mean(0) if len(v) else None)
    C = next(o for o in out if o is not None).shape[0]
    return np.stack([o if o is not None else np.zeros(C, np.float32) for o in out])


class Ridge:
    def __init__(self, X, Y):
        self.mu, self.ymu = X.mean(0), Y.mean(0)
        Xc = X - self.mu
        self.G, self.XtY = Xc.T @ Xc, Xc.T @ (Y - self.ymu)
        self.scale = np.trace(self.G) / len(self.G)

    def predict(self, X, alpha):
        W = np.linalg.solve(self.G + alpha * self.scale * np.eye(len(self.G)), self.XtY)
        return (X - self.mu) @ W + self.ymu


def scores(pred, tgt, pair):
    """cos_own, cos_partner, gap, between, top1, mrr of predictions [m, d] against their targets [m, d]."""
    p, t = unit(pred), unit(tgt)
    own = (p * t).sum(1)
    other = (p * t[pair]).sum(1)
    S = p @ t.T
    rank = (S > np.diag(S)[:, None]).sum(1) + 1  # against S's own diagonal: never the item itself by a rounding
    return dict(cos_own=float(own.mean()), cos_partner=float(other.mean()), gap=float((own - other).mean()),
                between=float((p * p[pair]).sum(1).mean()), top1=float((rank == 1).mean()),
                mrr=float((1.0 / rank).mean()))


def load_arrays(a):
    """The arrays the rung reads (the docstring's --arrays format) from the runs, the spans, the LM and the states."""
    from dfm.data import TargetsFile
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    from retrieval_reference import load_embeddings

    c_tok, c_doc = chunk_shards(a.corpus_run)
    p_tok, _ = chunk_shards(a.probe_run)
    L = c_tok.shape[1]
    c_ok, c_tgt = target_means(a.corpus_run)
    p_ok, p_tgt = target_means(a.probe_run)
    man = json.load(open(os.path.join(a.corpus_run, "manifest.json")))
    pman = json.load(open(os.path.join(a.probe_run, "manifest.json")))
    spans = [json.loads(line) for line in open(a.spans)]
    pseqc = pman["stages"]["chunk"]["config"]["seq-len"] // L
    p_ans = np.array([s["seq"] * pseqc + s["start"] // L for s in spans])   # the answer chunk: its memory
    ent = [s["entity"] for s in spans]
    A = dict(c_ok=c_ok, c_tgt=c_tgt, c_doc=c_doc, seqc=man["stages"]["chunk"]["config"]["seq-len"] // L,
             p_tgt=p_tgt, p_ans=p_ans, p_ent=np.array([sorted(set(ent)).index(e) for e in ent]))
    assert p_ok[p_ans].all(), "a probe's answer chunk without target memory"

    wte = embedding_table(a.backbone)
    tails = [0] + [int(x) for x in a.last.split(",") if x]
    for n_last in tails:
        name = "emb_" + ("mean" if not n_last else "last%d" % n_last)
        A["in_%s_corpus" % name], A["in_%s_probe" % name] = (pooled(t, lambda i, t=t: wte[np.maximum(t[i], 0)], n_last)
                                                            for t in (c_tok, p_tok))
    for spec in a.states:
        cs, ps, layer = spec.rsplit(":", 2)
        cst, pst = TargetsFile(cs), TargetsFile(ps)
        assert cst.n_chunks == len(c_tok) and pst.n_chunks == len(p_tok) and cst.k == L, spec
        for n_last in tails:
            name = "lm%s_" % layer + ("mean" if not n_last else "last%d" % n_last)
            A["in_%s_corpus" % name], A["in_%s_probe" % name] = (pooled(t, lambda i, s=s: s.emb[i], n_last)
                                                                for t, s in ((c_tok, cst), (p_tok, pst)))
    A["in_query_corpus"], A["in_query_probe"] = load_embeddings(a.corpus_run, man), load_embeddings(a.probe_run, pman)
    return A


def rung(A):
    """The ridge fit and its scores for every input of the arrays A: the result JSON of the docstring."""
    c_ok, c_tgt, c_doc, seqc = A["c_ok"], A["c_tgt"], A["c_doc"], int(A["seqc"])
    p_tgt, p_ans = A["p_tgt"], A["p_ans"]
    p_qry = p_ans - 1                                                     # the prompt chunk: the input
    # corpus rows: chunk c with memory and a previous chunk in the same sequence; documents in stream order
    rows = np.array([c for c in range(1, len(c_ok)) if c % seqc and c_ok[c]])
    docs = np.unique(c_doc[rows])
    cut = docs[int(len(docs) * 0.9)]
    fit_rows, held_rows = rows[c_doc[rows] < cut], rows[c_doc[rows] >= cut]
    sel_cut = int(len(fit_rows) * 0.9)
    names = [k[3:-7] for k in A if k.startswith("in_") and k.endswith("_corpus")]

    held_pair = (np.arange(len(held_rows)) + len(held_rows) // 2) % len(held_rows)
    probe_pair = partners(A["p_ent"])
    res = {"corpus_rows_fitted": int(len(fit_rows)), "corpus_rows_held": int(len(held_rows)), "probes": len(p_ans),
           "inputs": {}}
    for name in names:
        cf, pf = A["in_%s_corpus" % name], A["in_%s_probe" % name]
        Xf, Yf = cf[fit_rows - 1], c_tgt[fit_rows]
        sel = Ridge(Xf[:sel_cut], Yf[:sel_cut])
        vX, vY = Xf[sel_cut:], Yf[sel_cut:]
        vpair = (np.arange(len(vX)) + len(vX) // 2) % len(vX)
        alpha = max(ALPHAS, key=lambda al: scores(sel.predict(vX, al), vY, vpair)["gap"])
        model = Ridge(Xf, Yf)
        r = {"alpha": alpha,
             "fitted": scores(model.predict(Xf, alpha), Yf, (np.arange(len(Xf)) + len(Xf) // 2) % len(Xf)),
             "held_out": scores(model.predict(cf[held_rows - 1], alpha), c_tgt[held_rows], held_pair),
             "probes": scores(model.predict(pf[p_qry], alpha), p_tgt[p_ans], probe_pair)}
        res["inputs"][name] = r
        print("%-12s alpha %-7g probes: own %.3f partner %.3f gap %+.4f between %.4f top1 %.3f mrr %.3f | held-out gap "
              "%+.4f top1 %.3f | fitted gap %+.4f" % (name, alpha, r["probes"]["cos_own"], r["probes"]["cos_partner"],
                                                    r["probes"]["gap"], r["probes"]["between"], r["probes"]["top1"],
                                                    r["probes"]["mrr"], r["held_out"]["gap"], r["held_out"]["top1"],
                                                    r["fitted"]["gap"]), flush=True)
    # the targets' own spread: how far apart two probes' targets are at all (the gap's ceiling)
    t = unit(p_tgt[p_ans])
    res["probe_targets_cos_partner"] = float((t * t[probe_pair]).sum(1).mean())
    print("probe targets: own-vs-partner cosine %.3f (a perfect prediction's gap: %.3f)" %
          (res["probe_targets_cos_partner"], 1 - res["probe_targets_cos_partner"]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus-run")
    ap.add_argument("--probe-run")
    ap.add_argument("--spans")
    ap.add_argument("--backbone")
    ap.add_argument("--states", action="append", default=[], help="CORPUS_STATES:PROBE_STATES:LAYER")
    ap.add_argument("--last", default="1,12", help="the tail lengths N to try besides the whole chunk")
    ap.add_argument("--arrays", help="read the arrays from this .npz instead of runs")
    ap.add_argument("--save-arrays", help="write the arrays read from the runs here")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.arrays:
        with np.load(a.arrays) as z:
            A = {k: z[k] for k in z.files}
    else:
        if not (a.corpus_run and a.probe_run and a.spans and a.backbone):
            sys.exit("predictor_input: --corpus-run, --probe-run, --spans and --backbone are required (or --arrays)")
        A = load_arrays(a)
        if a.save_arrays:
            np.savez_compressed(a.save_arrays, **A)
    json.dump(rung(A), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
