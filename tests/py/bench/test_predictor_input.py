"""The predictor rung's information readout (bench/memory/predictor_input.py, run as a program on planted arrays)
against this test's own computation:
  - arithmetic: for every input, the corpus split (chunks with memory and a previous chunk of their sequence; the
    last 10 % of documents held out), the ridge strength chosen on the fitted rows' last 10 % by the largest gap,
    and every score (cos_own, cos_partner, gap, between, top1, MRR) on the fitted rows, the held-out rows and the
    probes equal an independent computation: a ridge solved as least squares on the explicitly augmented system
    ([X - mean; sqrt(alpha * mean eigenvalue) I] W = [Y - mean; 0]) and scores by loops over the items, with ranks by
    brute force; the ceiling (the probe targets' own-vs-partner cosine) too;
  - an item never outranks itself by a rounding of the matrix product: a planted exact hit ranks first (the script
    once compared each item's product row with a separately rounded diagonal, which cost ranks now and then);
  - planted information is found and only that: an input the targets are a linear function of (plus noise)
    reaches a gap near the ceiling; an input that carries nothing (random) gives a gap near 0;
  - the same arrays give the same bytes.
Exits non-zero on failure. Env: DFM_PYTHON's NumPy (tests/run.sh runs it so).
"""
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, run_arrays, worst_diff  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "memory", "predictor_input.py")
ALPHAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)   # the script's grid, restated (its documented contract)
C, D = 10, 6                                   # input width, target width
NDOC, CPD, SEQC = 60, 8, 4                      # documents, chunks per document, chunks per sequence
NENT, PER = 30, 4                               # probe entities, probes per entity


def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def planted(seed=5):
    rng = np.random.default_rng(seed)
    n = NDOC * CPD
    A = rng.standard_normal((C, D))
    lin_c = rng.standard_normal((n, C)).astype(np.float32)
    # chunk c's target is a function of chunk c-1's "linear" input; the other input is noise
    c_tgt = np.zeros((n, D), np.float32)
    c_tgt[1:] = unit(lin_c[:-1] @ A + 0.2 * rng.standard_normal((n - 1, D)) + 0.5)
    c_ok = np.ones(n, bool)
    c_ok[[7, 50, 51]] = False                    # chunks without memory: not rows
    m = NENT * PER
    n_p = 3 * m                                  # probe sequences of 3 chunks; the answer is chunk 2
    lin_p = rng.standard_normal((n_p, C)).astype(np.float32)
    p_ans = 3 * np.arange(m) + 2
    p_tgt = np.zeros((n_p, D), np.float32)
    p_tgt[p_ans] = unit(lin_p[p_ans - 1] @ A + 0.5 + 1.5 * rng.standard_normal((m, D)))
    p_tgt[p_ans[3]] = 0.0                        # placed below: an exact hit for probe 3 under the "linear" input
    arrays = dict(c_ok=c_ok, c_tgt=c_tgt, c_doc=np.repeat(np.arange(NDOC), CPD), seqc=np.int64(SEQC),
                  p_tgt=p_tgt, p_ans=p_ans, p_ent=np.repeat(np.arange(NENT), PER),
                  in_linear_corpus=lin_c, in_linear_probe=lin_p,
                  in_noise_corpus=rng.standard_normal((n, C)).astype(np.float32),
                  in_noise_probe=rng.standard_normal((n_p, C)).astype(np.float32))
    return arrays


def partners(ent):
    """score.py's pairing, restated: the item n/2 away, moved on until it is of another entity."""
    n = len(ent)
    out = []
    for i in range(n):
        j = (i + n // 2) % n
        while ent[j] == ent[i]:
            j = (j + 1) % n
        out.append(j)
    return np.array(out)


def ridge(X, Y, alpha):
    mu, ymu = X.mean(0), Y.mean(0)
    Xc, Yc = X - mu, Y - ymu
    lam = alpha * np.trace(Xc.T @ Xc) / X.shape[1]
    W = np.linalg.lstsq(np.vstack([Xc, np.sqrt(lam) * np.eye(X.shape[1])]),
                        np.vstack([Yc, np.zeros((X.shape[1], Y.shape[1]))]), rcond=None)[0]
    return lambda Z: (Z - mu) @ W + ymu


def scores(pred, tgt, pair):
    m = len(pred)
    p, t = unit(pred.astype(np.float64)), unit(tgt.astype(np.float64))
    cos = lambda a, b: float(np.dot(a, b))
    own = [cos(p[i], t[i]) for i in range(m)]
    ranks = [1 + sum(1 for j in range(m) if j != i and cos(p[i], t[j]) > own[i] + 1e-9) for i in range(m)]
    return dict(cos_own=np.mean(own), cos_partner=np.mean([cos(p[i], t[pair[i]]) for i in range(m)]),
                gap=np.mean([own[i] - cos(p[i], t[pair[i]]) for i in range(m)]),
                between=np.mean([cos(p[i], p[pair[i]]) for i in range(m)]),
                top1=np.mean([r == 1 for r in ranks]), mrr=np.mean([1.0 / r for r in ranks]))


def expected(A):
    rows = np.array([c for c in range(1, len(A["c_ok"])) if c % SEQC != 0 and A["c_ok"][c]])
    docs = sorted(set(A["c_doc"][rows].tolist()))
    cut = docs[int(len(docs) * 0.9)]
    fit = np.array([r for r in rows if A["c_doc"][r] < cut])
    held = np.array([r for r in rows if A["c_doc"][r] >= cut])
    sel = int(len(fit) * 0.9)
    shift = lambda k: (np.arange(k) + k // 2) % k
    out = {"corpus_rows_fitted": len(fit), "corpus_rows_held": len(held), "inputs": {}}
    ppair = partners(A["p_ent"])
    for name in ("linear", "noise"):
        cf, pf = A["in_%s_corpus" % name].astype(np.float64), A["in_%s_probe" % name].astype(np.float64)
        ct, pt = A["c_tgt"].astype(np.float64), A["p_tgt"].astype(np.float64)
        Xf, Yf = cf[fit - 1], ct[fit]
        gaps = [scores(ridge(Xf[:sel], Yf[:sel], al)(Xf[sel:]), Yf[sel:], shift(len(Xf) - sel))["gap"] for al in ALPHAS]
        alpha = ALPHAS[int(np.argmax(gaps))]
        f = ridge(Xf, Yf, alpha)
        out["inputs"][name] = {"alpha": alpha, "fitted": scores(f(Xf), Yf, shift(len(Xf))),
                               "held_out": scores(f(cf[held - 1]), ct[held], shift(len(held))),
                               "probes": scores(f(pf[A["p_ans"] - 1]), pt[A["p_ans"]], ppair)}
    t = unit(A["p_tgt"][A["p_ans"]].astype(np.float64))
    out["probe_targets_cos_partner"] = float(np.mean([t[i] @ t[ppair[i]] for i in range(len(t))]))
    return out


def main():
    with tempfile.TemporaryDirectory(prefix="dfm-predictor-input-") as tmp:
        A = planted()
        # probe 3's target: exactly the direction of the "linear" input's prediction for it, fitted as the script fits
        want0 = expected(A)
        rows = np.array([c for c in range(1, len(A["c_ok"])) if c % SEQC != 0 and A["c_ok"][c]])
        docs = sorted(set(A["c_doc"][rows].tolist()))
        fit = np.array([r for r in rows if A["c_doc"][r] < docs[int(len(docs) * 0.9)]])
        f = ridge(A["in_linear_corpus"][fit - 1].astype(np.float64), A["c_tgt"][fit].astype(np.float64),
                  want0["inputs"]["linear"]["alpha"])
        A["p_tgt"][A["p_ans"][3]] = unit(f(A["in_linear_probe"][A["p_ans"][3] - 1][None].astype(np.float64)))[0]
        got, raw = run_arrays(SCRIPT, A, tmp, "planted")
        want = expected(A)
        check(got["corpus_rows_fitted"] == want["corpus_rows_fitted"] and got["corpus_rows_held"] ==
              want["corpus_rows_held"], "the corpus split: %d fitted, %d held-out rows (expected %d, %d)" %
              (got["corpus_rows_fitted"], got["corpus_rows_held"], want["corpus_rows_fitted"], want["corpus_rows_held"]))
        for name in ("linear", "noise"):
            g, w = got["inputs"][name], want["inputs"][name]
            check(g["alpha"] == w["alpha"], "%s: the ridge strength chosen on the selection rows (%g; expected %g)" %
                  (name, g["alpha"], w["alpha"]))
            keys = [(part, k) for part in ("fitted", "held_out", "probes") for k in w[part]]
            worst = worst_diff((g[part][k] for part, k in keys), (w[part][k] for part, k in keys))
            check(worst < 1e-5, "%s: every score on the fitted, held-out and probe rows equals this test's ridge and "
                  "loops (worst |diff| %.1e)" % (name, worst))
        check(abs(got["probe_targets_cos_partner"] - want["probe_targets_cos_partner"]) < 1e-6,
              "the ceiling: the probe targets' own-vs-partner cosine %.4f" % got["probe_targets_cos_partner"])
        check(got["inputs"]["linear"]["probes"]["top1"] >= want["inputs"]["linear"]["probes"]["top1"] > 0,
              "no item outranks itself by a rounding: top1 %.3f" % got["inputs"]["linear"]["probes"]["top1"])
        lin, noise = got["inputs"]["linear"]["probes"], got["inputs"]["noise"]["probes"]
        ceiling = 1 - got["probe_targets_cos_partner"]
        check(lin["gap"] > 0.7 * ceiling, "an input the targets are a function of: gap %+.3f of a ceiling %.3f" %
              (lin["gap"], ceiling))
        check(abs(noise["gap"]) < 0.1 * ceiling, "an input that carries nothing: gap %+.3f (between %.3f)" %
              (noise["gap"], noise["between"]))
        _, raw2 = run_arrays(SCRIPT, A, tmp, "again")
        check(raw == raw2, "the same arrays give the same bytes")
    finish("the predictor rung's information readout")


if __name__ == "__main__":
    main()
