"""The information readout of the memory ladder (bench/memory/information.py, run as a program on planted arrays):
its arithmetic against an independent implementation, and that it finds planted information and only that.

Planted arrays (the --arrays format of information.py): documents of corpus chunks, each with a bag of tokens;
each chunk's target memory holds, in one slot of the second half of its K slots (a `both` record: neighbours,
then continuations), the sum of fixed random codes of its own tokens plus noise; the other slots hold other bags'
codes at 0.3 of that scale. The probes' memory holds the answer token's code (with codes of three non-candidate
tokens) in one slot; their queries hold codes of non-candidate tokens. Checks:
  - arithmetic: for every readout (mean, slotmax, selfread, query) and scoring (raw, lift), the ridge strength
    chosen on the selection documents, the probes' top-1 and MRR for own and shuffled memory (all probes, and
    those whose answer token is not in the query chunk), the held-out chunks' average precision and AUC, the
    chance, majority and prior baselines equal this test's own computation (np.linalg.solve on explicitly
    expanded rows, brute-force ranks), for 2 slot groups and for 1; the slot recall equals the planted one;
  - planted information is found: own memory decodes the answer (top-1 >= 0.9) where the shuffled control
    stays near chance, and so does the query readout (the planted prompts say nothing of the answer); held-out
    chunks' bags are read far better from their own memory than another's;
  - broken inputs are caught: labels misaligned by one chunk (each chunk's memory paired with the next chunk's
    tokens) and probe memory shifted by one probe leave own memory at the level of the shuffled control, so
    the checks above would fail on them; the arithmetic comparison reports differences on those results;
  - the same arrays give the same results (deterministic).
Exits non-zero on failure. Env: DFM_PYTHON's NumPy (tests/run.sh runs it so).
"""
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, finite, run_arrays  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "memory", "information.py")
ALPHAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)   # the script's grid, restated (its documented contract)
READOUTS = ("mean", "slotmax", "selfread", "query")
V, D, L, K = 60, 96, 8, 8                       # tokens, embedding width, chunk length, slots
NDOC, CPD, NPROBE, NCAND = 100, 6, 80, 20       # documents, chunks per document, probes, candidate answers


def planted(seed=7, groups=2):
    rng = np.random.default_rng(seed)
    vocab = 1000 + 3 * np.arange(V)              # token ids with gaps: the readout maps ids to columns
    code = rng.standard_normal((V, D)) / np.sqrt(D)
    n = NDOC * CPD
    c_doc = np.repeat(np.arange(NDOC), CPD)
    c_tok = np.full((n, L), -1, np.int64)
    bag_idx = []
    for c in range(n):
        b = rng.choice(V, size=5, replace=False)
        bag_idx.append(b)
        c_tok[c, :5] = vocab[b]
    c_tok[5, :] = -1                            # an all-padding chunk: not an example
    c_emb = np.zeros((n, K, D), np.float32)
    c_mask = np.ones((n, K), bool)
    info_slot = K // 2 + 1 if groups == 2 else 1
    for c in range(n):
        for k in range(K):
            other = bag_idx[rng.integers(n)]
            c_emb[c, k] = 0.3 * code[other].sum(0) + 0.1 * rng.standard_normal(D)
        c_emb[c, info_slot] = code[bag_idx[c]].sum(0) + 0.1 * rng.standard_normal(D)
        c_mask[c, K - 1 - c % 3:] = False         # some slots masked
    c_mask[c_doc % 10 == 0] = c_mask[c_doc % 10 == 0] & (np.arange(n)[c_doc % 10 == 0, None] % CPD != 0)
    c_self = np.stack([code[b].sum(0) + 0.1 * rng.standard_normal(D) for b in bag_idx]).astype(np.float32)
    c_query = np.zeros_like(c_self)
    c_query[1:] = c_self[:-1]                    # chunk c-1's embedding: it says nothing of chunk c's bag
    cand = np.arange(NCAND)                      # candidate answers: the first NCAND tokens
    p_ans_idx = rng.integers(NCAND, size=NPROBE)
    p_emb = np.zeros((NPROBE, K, D), np.float32)
    p_mask = np.ones((NPROBE, K), bool)
    for i in range(NPROBE):
        for k in range(K):
            p_emb[i, k] = 0.3 * code[rng.choice(np.arange(NCAND, V), size=4, replace=False)].sum(0)
        rest = rng.choice(np.arange(NCAND, V), size=3, replace=False)
        p_emb[i, info_slot] = code[p_ans_idx[i]] + code[rest].sum(0) + 0.1 * rng.standard_normal(D)
        p_mask[i, K - 1 - i % 2:] = False
    p_query = np.stack([code[rng.choice(np.arange(NCAND, V), size=5, replace=False)].sum(0)
                        for _ in range(NPROBE)]).astype(np.float32)
    hit = np.zeros((NPROBE, K), bool)
    hit[np.arange(NPROBE) % 4 != 0, info_slot] = True    # 3 in 4 probes: the answer's text in a slot
    return dict(c_emb=c_emb, c_mask=c_mask, c_tok=c_tok, c_doc=c_doc, c_self=c_self, c_query=c_query,
                groups=np.array(groups), p_query=p_query, p_in_query=np.arange(NPROBE) % 3 == 0,
                p_emb=p_emb, p_mask=p_mask, p_answer=vocab[cand][p_ans_idx], p_entity=np.arange(NPROBE) // 2,
                p_number=np.arange(NPROBE) % 5 == 0, p_slot_text_hit=hit, p_slot_token_hit=hit)


def run(arrays, w, name):
    return run_arrays(SCRIPT, arrays, w, name)[0]


# ------------------------------------------------------------------ the independent computation
def ridge(Xr, Yr, alpha):
    """Ridge with an intercept on explicit rows; lambda = alpha * mean eigenvalue of the centred Gram matrix.
    Returns (predict(X), ybar, ysd)."""
    xm, ym = Xr.mean(0), Yr.mean(0)
    Xc, Yc = Xr - xm, Yr - ym
    G = Xc.T @ Xc
    lam = alpha * max(np.trace(G) / len(G), 1e-12)
    W = np.linalg.solve(G + lam * np.eye(len(G)), Xc.T @ Yc)
    sd = np.sqrt(np.maximum((Yc ** 2).mean(0), 1e-12))
    return (lambda X: ym + (X - xm) @ W), ym, sd


def features(emb, mask, groups, how):
    """mean: [n, G*D]; slots: a list over slots of ([n, G*D] block features, valid [n])."""
    n = len(emb)
    if how == "mean":
        out = np.zeros((n, groups * D))
        for g in range(groups):
            s = slice(g * K // groups, (g + 1) * K // groups)
            for i in range(n):
                v = mask[i, s]
                if v.any():
                    out[i, g * D:(g + 1) * D] = emb[i, s][v].astype(np.float64).mean(0)
        return out
    slots = []
    for k in range(K):
        g = k * groups // K
        f = np.zeros((n, groups * D))
        f[:, g * D:(g + 1) * D] = emb[:, k]
        slots.append((f, mask[:, k]))
    return slots


def ap_auc(S, Y):
    """Mean over rows of (average precision, AUC) of the positives, ties ordered against the positives (a
    positive ranks below the negatives it ties with, and below the tied positives before it)."""
    aps, aucs = [], []
    for s, y in zip(S, Y):
        pos, neg = np.nonzero(y)[0], np.nonzero(~y)[0]
        if len(pos) == 0 or len(neg) == 0:
            continue
        prec = []
        for p in pos:
            pos_above = int((s[pos] > s[p]).sum()) + int(((s[pos] == s[p]) & (pos < p)).sum())
            neg_above = int((s[neg] >= s[p]).sum())
            prec.append((pos_above + 1) / (pos_above + neg_above + 1))
        aps.append(np.mean(prec))
        aucs.append(np.mean([(s[neg] < s[p]).mean() for p in pos]))
    return float(np.mean(aps)), float(np.mean(aucs))


def independent(A):
    groups = int(A["groups"])
    emb, mask, tok, doc = A["c_emb"], A["c_mask"], A["c_tok"], A["c_doc"]
    ok = mask.any(1) & (tok >= 0).any(1)
    docs = np.unique(doc[ok])
    cf, cv = docs[int(0.8 * len(docs))], docs[int(0.9 * len(docs))]
    sets = {"fit": ok & (doc < cf), "val": ok & (doc >= cf) & (doc < cv), "train": ok & (doc < cv),
            "test": ok & (doc >= cv)}
    vocab = sorted(set(tok[sets["train"]][tok[sets["train"]] >= 0].tolist()))
    Y = np.array([[t in set(row.tolist()) for t in vocab] for row in tok], float)
    cands = sorted(set(A["p_answer"].tolist()))
    ccol = [vocab.index(c) for c in cands]
    ans = np.array([cands.index(a) for a in A["p_answer"]])
    n = len(ans)
    ent = A["p_entity"]
    partner = []
    for i in range(n):
        j = (i + n // 2) % n
        while ent[j] == ent[i]:
            j = (j + 1) % n
        partner.append(j)
    partner = np.array(partner)
    res = {"candidates": len(cands), "chance_top1": 1 / len(cands),
           "chance_mrr": float(np.mean([1 / r for r in range(1, len(cands) + 1)])),
           "majority": float(np.bincount(ans).max() / n)}

    def fit_and_score(ro, rows, alpha):
        """(score function over (emb, mask) -> [n, V], ybar, ysd) of a readout fitted on rows."""
        if ro == "selfread":
            has = (tok >= 0).any(1)
            pred, ym, sd = ridge(A["c_self"][rows].astype(np.float64), Y[rows], alpha)

            def score(e, m):
                out = np.full((len(e), len(vocab)), -np.inf)
                for k in range(e.shape[1]):
                    out = np.where(m[:, k, None], np.maximum(out, pred(e[:, k].astype(np.float64))), out)
                out[~m.any(1)] = ym
                return out
            return score, ym, sd
        if ro == "query":
            pred, ym, sd = ridge(A["c_query"][rows].astype(np.float64), Y[rows], alpha)

            def score(e, m):   # e: the query embeddings [n, D]
                return pred(e.astype(np.float64))
            return score, ym, sd
        if ro == "mean":
            pred, ym, sd = ridge(features(emb[rows], mask[rows], groups, "mean"), Y[rows], alpha)

            def score(e, m):
                out = pred(features(e, m, groups, "mean"))
                out[~m.any(1)] = ym
                return out
            return score, ym, sd
        fs = features(emb[rows], mask[rows], groups, "slots")
        Xr = np.concatenate([f[v] for f, v in fs])       # every valid slot a row, with its chunk's bag
        Yr = np.concatenate([Y[rows][v] for _, v in fs])
        pred, ym, sd = ridge(Xr, Yr, alpha)

        def score(e, m):
            out = np.full((len(e), len(vocab)), -np.inf)
            for f, v in features(e, m, groups, "slots"):
                out = np.where(v[:, None], np.maximum(out, pred(f)), out)
            out[~m.any(1)] = ym
            return out
        return score, ym, sd

    has = (tok >= 0).any(1)
    for ro in READOUTS:
        val = sets["val"] if ro != "selfread" else has & (doc >= cf) & (doc < cv)
        fitr = sets["fit"] if ro != "selfread" else has & (doc < cf)
        trainr = sets["train"] if ro != "selfread" else has & (doc < cv)
        curve = {}
        for a in ALPHAS:
            sc, _, _ = fit_and_score(ro, fitr, a)
            curve[a] = ap_auc(_self_or_mem(ro, sc, A, val, emb, mask), Y[val] > 0)[0]
        best = max(ALPHAS, key=lambda a: (curve[a], -a))
        sc, ym, sd = fit_and_score(ro, trainr, best)
        t = sets["test"]
        St = sc(A["c_query"][t], None) if ro == "query" else sc(emb[t], mask[t])
        m = int(t.sum())
        hp = (np.arange(m) + m // 2) % m
        own, shuf = ap_auc(St, Y[t] > 0), ap_auc(St[hp], Y[t] > 0)
        prior = ap_auc(np.tile(ym, (m, 1)), Y[t] > 0)
        Sp = sc(A["p_query"], None) if ro == "query" else sc(A["p_emb"], A["p_mask"])
        sub = ~A["p_in_query"]
        r = {"alpha": best, "ap": (own[0], shuf[0], prior[0]), "auc": (own[1], shuf[1])}
        for scoring in ("raw", "lift"):
            T = Sp if scoring == "raw" else (Sp - ym) / sd
            C = T[:, ccol]

            def ranks(C):
                return np.array([int((C[i] >= C[i, ans[i]]).sum()) for i in range(n)])
            ro_, rs_ = ranks(C), ranks(C[partner])
            r[scoring] = (np.mean(ro_ == 1), np.mean(1 / ro_), np.mean(rs_ == 1), np.mean(1 / rs_))
            r[scoring + "_not_in_query"] = (np.mean(ro_[sub] == 1), np.mean(1 / ro_[sub]), np.mean(rs_[sub] == 1),
                                            np.mean(1 / rs_[sub]))
            if scoring == "raw":
                pr = ranks(np.tile(ym[ccol], (n, 1)))
                r["prior"] = (np.mean(pr == 1), np.mean(1 / pr))
        res[ro] = r
    return res


def _self_or_mem(ro, sc, A, rows, emb, mask):
    """Selection scores: selfread reads each chunk's own embedding as its one slot; the others its memory."""
    if ro == "selfread":
        return sc(A["c_self"][rows][:, None, :], np.ones((int(rows.sum()), 1), bool))
    if ro == "query":
        return sc(A["c_query"][rows], None)
    return sc(emb[rows], mask[rows])


def compare(got, want, what):
    bad = mismatches(got, want)
    check(not bad, "%s: every number equals the independent computation%s" % (what, "" if not bad else
                                                                             ": " + "; ".join(bad[:6])))


def mismatches(got, want):
    """What differs between the script's results and the independent computation (empty: nothing)."""
    bad = []

    def eq(a, b, name, tol=1e-8):
        if not (finite(a) and abs(a - b) <= tol):
            bad.append("%s: script %r, independent %r" % (name, a, b))
    eq(got["probes"]["candidates"], want["candidates"], "candidates")
    eq(got["probes"]["chance"]["top1"], want["chance_top1"], "chance top-1")
    eq(got["probes"]["chance"]["mrr"], want["chance_mrr"], "chance MRR")
    eq(got["probes"]["majority_top1"], want["majority"], "majority top-1")
    for ro in READOUTS:
        g, w = got[ro], want[ro]
        eq(g["alpha"], w["alpha"], ro + " ridge strength chosen")
        for k, v in zip(("own", "shuffled", "prior"), w["ap"]):
            eq(g["heldout"][k]["ap"], v, "%s held-out AP %s" % (ro, k), 1e-6)
        for k, v in zip(("own", "shuffled"), w["auc"]):
            eq(g["heldout"][k]["auc"], v, "%s held-out AUC %s" % (ro, k), 1e-6)
        for scoring in ("raw", "lift"):
            p = g["probes_" + scoring]
            for name, x, y in zip(("top-1 own", "MRR own", "top-1 shuffled", "MRR shuffled"),
                                  (p["own"]["top1"], p["own"]["mrr"], p["shuffled"]["top1"], p["shuffled"]["mrr"]),
                                  w[scoring]):
                eq(x, y, "%s %s %s" % (ro, scoring, name))
            q = p["not_in_query"]
            for name, x, y in zip(("top-1 own", "MRR own", "top-1 shuffled", "MRR shuffled"),
                                  (q["own"]["top1"], q["own"]["mrr"], q["shuffled"]["top1"], q["shuffled"]["mrr"]),
                                  w[scoring + "_not_in_query"]):
                eq(x, y, "%s %s answer not in the query: %s" % (ro, scoring, name))
        eq(g["probes_raw"]["prior"]["top1"], w["prior"][0], ro + " prior top-1")
        eq(g["probes_raw"]["prior"]["mrr"], w["prior"][1], ro + " prior MRR")
    return bad


def main():
    with tempfile.TemporaryDirectory() as w:
        A = planted()
        r = run(A, w, "planted")
        compare(r, independent(A), "planted, 2 slot groups")
        A1 = planted(seed=8, groups=1)
        compare(run(A1, w, "planted1"), independent(A1), "planted, 1 slot group")
        hit = A["p_slot_text_hit"]
        check(abs(r["recall"]["all"]["text"] - hit.any(1).mean()) < 1e-12 and
              abs(r["recall"]["continuation_slots"]["text"] - hit[:, K // 2:].any(1).mean()) < 1e-12 and
              r["recall"]["neighbour_slots"]["text"] == 0.0,
              "slot recall: %r (planted: %.3f, all in the continuation half)" % (r["recall"], hit.any(1).mean()))
        chance = r["probes"]["chance"]["top1"]
        for ro in ("mean", "slotmax", "selfread"):
            for scoring in ("raw", "lift"):
                p = r[ro]["probes_" + scoring]
                check(p["own"]["top1"] >= 0.9 and p["shuffled"]["top1"] <= 3 * chance + 0.05,
                      "planted, %s, %s: own memory decodes the answer (top-1 %.3f >= 0.9), the shuffled control "
                      "does not (%.3f, chance %.3f)" % (ro, scoring, p["own"]["top1"], p["shuffled"]["top1"], chance))
        for scoring in ("raw", "lift"):
            p = r["query"]["probes_" + scoring]
            check(p["own"]["top1"] <= 3 * chance + 0.05,
                  "planted, query (no memory), %s: the prompt alone does not give the answer (top-1 %.3f, chance "
                  "%.3f)" % (scoring, p["own"]["top1"], chance))
        for ro in ("mean", "slotmax"):
            h = r[ro]["heldout"]
            check(h["own"]["ap"] > h["shuffled"]["ap"] + 0.2,
                  "planted, %s: held-out bags read from their own memory (AP %.3f) far above another's (%.3f)"
                  % (ro, h["own"]["ap"], h["shuffled"]["ap"]))
        # broken: labels one chunk late (chunk c's memory trained and scored against chunk c+1's tokens)
        B = dict(A, c_tok=np.roll(A["c_tok"], -1, axis=0))
        rb = run(B, w, "labels_shifted")
        for ro in ("mean", "slotmax"):
            p, h = rb[ro]["probes_lift"], rb[ro]["heldout"]
            check(p["own"]["top1"] <= 3 * chance + 0.05 and abs(h["own"]["ap"] - h["shuffled"]["ap"]) < 0.1,
                  "labels misaligned by one chunk, %s: caught, own memory at chance (probes top-1 %.3f, chance %.3f; "
                  "held-out AP own %.3f vs shuffled %.3f)" % (ro, p["own"]["top1"], chance, h["own"]["ap"],
                                                              h["shuffled"]["ap"]))
        bad = mismatches(rb, independent(A))
        check(len(bad) > 0, "the arithmetic comparison can fail: the script on misaligned labels against the "
              "independent computation on the planted ones: %d differences (first: %s)" % (len(bad), bad[:1]))
        # broken: each probe read with the previous probe's memory
        C = dict(A, p_emb=np.roll(A["p_emb"], 1, axis=0), p_mask=np.roll(A["p_mask"], 1, axis=0))
        rc = run(C, w, "probes_shifted")
        for ro in ("mean", "slotmax", "selfread"):
            p = rc[ro]["probes_lift"]
            check(p["own"]["top1"] <= 3 * chance + 0.05,
                  "probe memory shifted by one probe, %s: own memory at chance (top-1 %.3f, chance %.3f)"
                  % (ro, p["own"]["top1"], chance))
        # deterministic: the same arrays give the same bytes
        again = run(A, w, "planted_again")
        same = json.dumps({k: v for k, v in again.items() if k != "cpu_s"}, sort_keys=True) == \
            json.dumps({k: v for k, v in r.items() if k != "cpu_s"}, sort_keys=True)
        check(same, "the same arrays give the same results (CPU time aside)")
    finish("the information readout's arithmetic, planted information found, misalignment caught")


if __name__ == "__main__":
    main()
