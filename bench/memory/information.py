#!/usr/bin/env python3
"""information.py — rung 2 of the memory ladder: how much of what follows is decodable from a chunk's target
memory at all, outside the LM (NumPy only, deterministic, closed form).

The readouts map chunk c's target memory (the K slots of its record: retrieved with chunk c-1 as the query) to
the bag of tokens of chunk c (multi-hot over the tokens seen in training), by ridge regression with an intercept:
    mean      features: the mean of the valid slots; with `--slots-hold both` the neighbours' mean and the
              continuations' mean side by side (2d features). One vector per chunk.
    slotmax   the same ridge map fitted on single slots (every valid slot of chunk c is a row with chunk c's
              bag; with `both`, neighbour and continuation slots get separate blocks of weights) and read as the
              maximum over the valid slots of their scores: a slot that holds the answer is not averaged away
              among 15 that do not, as an attention read would pick it. A chunk with no valid slot scores the
              prior (the training base rate of each token).
    selfread  not trained on what follows: a ridge map from each corpus chunk's own embedding (the encode
              stage's) to its own bag, read as slotmax over the memory's slots: what the slots say, as far as a
              linear map can read it from a MiniLM vector (the ceiling a slot holding the answer's text gives).
    query     no memory at all: the same ridge from the embedding of chunk c-1, the query the memory was
              retrieved with (for a probe, its prompt chunk), to chunk c's bag. Memory must beat it to add
              anything the prompt does not already say.
Fitting: the corpus run's chunks with a valid slot, documents in stream order: the first 80 % fit, the next 10 %
choose the ridge strength (mean average precision of their bags), then the first 90 % are fitted again with it
and the last 10 % are the held-out corpus chunks. --train-corpus-run fits on another corpus run instead (with
targets of the same kind): for the knowledge probes, another seed's corpus, whose invented entities are others,
so that a readout cannot learn the probed facts themselves from its training chunks and give them back from the
entity's name alone (the query readout measures how much that does when it is fitted on the probes' own corpus).

Scored:
    probes    the answer's first token (its first token that is not white space alone: a number's first token
              is " "; in chunk 2 of each probe sequence, whose memory was retrieved with the prompt as the query)
              ranked among the candidates: the first tokens of every scored probe's answer, deduplicated. Own
              memory against the shuffled control: the same readout on the memory of the probe n/2 away in the
              scored set, moved on until it is of another entity (as bench/memory/knowledge/score.py pairs
              them). Top-1 accuracy and mean reciprocal rank, ties counted against the answer; chance (uniform
              over the candidates) and the prior (ranked by training base rate alone, no memory) beside them.
              Two scorings: raw (the readout's score, the token's predicted presence) and lift (the score minus
              the token's base rate, over its training standard deviation, so that frequent tokens do not win
              by frequency alone). Also split: answers that are names and answers that are numbers (whose first
              token is a digit), and the probes whose answer token does not occur in the query chunk
              (not_in_query: a readout cannot have found it among the prompt's own words that the memory echoes).
    held-out  each held-out corpus chunk's bag: average precision and AUC over the tokens seen in training,
              own memory against the memory of the chunk n/2 away among the held-out chunks.
    recall    no readout: the share of probes with a valid slot whose chunk text holds the answer string, and
              whose chunk tokens hold the answer's first token (a ceiling for a bag readout); per slot group.

    python3 bench/memory/information.py --corpus-run C --probe-run P --spans SPANS.jsonl --tokenizer TOK
        --out R.json [--train-corpus-run C2] [--save-arrays A.npz]
    python3 bench/memory/information.py --arrays A.npz --out R.json    # the readouts on saved or planted arrays
    python3 bench/memory/information.py --report information.jsonl     # bench_information.sh's markdown page
Arrays (--arrays; what --save-arrays writes):
    c_emb [n, K, d] float32, c_mask [n, K] bool    each corpus chunk's target memory
    c_tok [n, L] int (-1 = padding), c_doc [n] int  its tokens and the document of its first valid token
    groups                                          1, or 2 for `both` (slots [0, K/2) and [K/2, K))
    p_emb [m, K, d], p_mask [m, K]                  each probe's memory (its answer chunk's record)
    p_answer [m], p_entity [m] int                  the answer's first token; the entity (for the pairing)
  optional:
    c_self [n, d], c_query [n, d]                   each chunk's own embedding; chunk c-1's (selfread, query)
    p_query [m, d], p_in_query [m] bool             the probe's query chunk embedding; its tokens hold the answer's
    p_number [m] bool                               the answer is a number
    p_slot_text_hit, p_slot_token_hit [m, K] bool   a slot's chunk text holds the answer / its first token
"""
import argparse
import glob
import json
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")  # deterministic sums and a modest share of a busy machine
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ALPHAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # ridge strength, times the mean eigenvalue of the Gram matrix
READOUTS = ("mean", "slotmax", "selfread", "query")


# ---------------------------------------------------------------- reading runs
def chunk_shards(run):
    """(tokens [N, L] int32 with -1 at padding, doc_first [N] int64) of a run's chunk shards
    (schemas/chunk_shard.md)."""
    parts = []
    for path in sorted(glob.glob(os.path.join(run, "chunk", "chunks-*.bin"))):
        b = np.fromfile(path, np.uint8)
        assert b[:8].tobytes() == b"DFMCHNK1", path
        L = int(b[16:20].view("<u4")[0])
        first, n = (int(x) for x in b[32:48].view("<u8"))
        rec = b[128:128 + n * (24 + 4 * L)].reshape(n, 24 + 4 * L)
        doc = rec[:, 0:8].copy().view("<u8")[:, 0].astype(np.int64)
        nv = rec[:, 16:18].copy().view("<u2")[:, 0].astype(np.int64)
        tok = rec[:, 24:].copy().view("<u4").astype(np.int64)
        tok[np.arange(L)[None, :] >= nv[:, None]] = -1
        parts.append((first, tok.astype(np.int32), doc))
    parts.sort(key=lambda p: p[0])
    assert parts and all(p[0] == sum(len(q[1]) for q in parts[:i]) for i, p in enumerate(parts)), run + ": chunk ids"
    return np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def read_run(corpus_run, probe_run, spans_path, tokenizer, train_run=None):
    """The arrays of the module docstring from a corpus run, a probe run retrieving from it and the spans; the
    corpus arrays (c_*: what the readouts are fitted on) from train_run where given (another corpus run)."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import dfm
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    train_run = train_run or corpus_run
    c_tok, c_doc = chunk_shards(train_run)
    d_tok = c_tok if train_run == corpus_run else chunk_shards(corpus_run)[0]   # what the probes' slot ids index
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    from retrieval_reference import load_embeddings
    c_self = load_embeddings(train_run, json.load(open(os.path.join(train_run, "manifest.json"))))
    assert len(c_self) == len(c_tok), "embeddings and chunks of %s differ in length" % train_run
    with dfm.open_run(train_run) as r:
        assert r.n_chunks == len(c_tok), "targets and chunks of %s differ in length" % train_run
        K, d, slots = r.k, r.d, r.slots
        c_emb = np.zeros((r.n_chunks, K, d), np.float32)
        c_mask = np.zeros((r.n_chunks, K), bool)
        c_ids = np.full((r.n_chunks, K), -1, np.int64)
        for i, rec in enumerate(r.records()):
            assert rec["chunk_id"] == i
            c_emb[i], c_mask[i], c_ids[i] = rec["emb"], rec["mask"], rec["ids"]
    c_query = np.zeros_like(c_self)
    c_query[1:] = c_self[:-1]               # chunk c's query: chunk c-1 (a chunk with memory never starts a sequence)
    p_tok, _ = chunk_shards(probe_run)
    p_self = load_embeddings(probe_run, json.load(open(os.path.join(probe_run, "manifest.json"))))
    spans = [json.loads(line) for line in open(spans_path)]
    L = p_tok.shape[1]
    with dfm.open_run(probe_run) as r:
        assert (r.k, r.d, r.slots) == (K, d, slots), "probe and training targets differ in shape or slots"
        man = json.load(open(os.path.join(probe_run, "manifest.json")))
        seqc = man["stages"]["chunk"]["config"]["seq-len"] // L   # chunks per probe sequence
        recs = [r.get(s["seq"] * seqc + s["start"] // L) for s in spans]
    # the answer's first token that is more than white space: SmolLM2 writes " 1834" as " ", "1", "8", ...,
    # so every number would share the first token " "
    flat = p_tok.reshape(-1)
    p_answer = []
    for s in spans:
        pos = next(p for p in range(s["start"], s["end"]) if tok.decode([int(flat[s["seq"] * seqc * L + p])]).strip())
        a = int(flat[s["seq"] * seqc * L + pos])
        assert s["answer"].startswith(tok.decode([a]).strip()), (s, a)  # it begins the answer's text
        assert pos // L == s["start"] // L, s                             # in the chunk whose memory is read
        p_answer.append(a)
    p_answer = np.array(p_answer, np.int64)
    ents = sorted({s["entity"] for s in spans})
    texts = {}

    def text(j):
        if j not in texts:
            texts[j] = tok.decode([int(t) for t in d_tok[j] if t >= 0])
        return texts[j]
    qc = np.array([s["seq"] * seqc + s["start"] // L - 1 for s in spans])   # the query chunk of each probe
    p_in_query = np.array([bool((p_tok[c] == a).any()) for c, a in zip(qc, p_answer)])
    hit_text = np.zeros((len(spans), K), bool)
    hit_tok = np.zeros((len(spans), K), bool)
    for i, (s, rec) in enumerate(zip(spans, recs)):
        for k in np.nonzero(rec["mask"])[0]:
            j = int(rec["ids"][k])
            hit_text[i, k] = s["answer"] in text(j)
            hit_tok[i, k] = bool((d_tok[j] == p_answer[i]).any())
    return dict(c_emb=c_emb, c_mask=c_mask, c_tok=c_tok, c_doc=c_doc, c_self=c_self,
                groups=np.array(2 if slots == "both" else 1),
                slots=np.array(slots), p_emb=np.stack([rec["emb"] for rec in recs]),
                p_mask=np.stack([rec["mask"] for rec in recs]), p_answer=p_answer,
                p_entity=np.array([ents.index(s["entity"]) for s in spans]),
                p_number=np.array([s["answer"][:1].isdigit() for s in spans]), p_query=p_self[qc],
                p_in_query=p_in_query, c_query=c_query, p_slot_text_hit=hit_text,
                p_slot_token_hit=hit_tok)


# ---------------------------------------------------------------- features and ridge
def group_blocks(emb, mask, groups):
    """Per slot: its embedding placed in its group's block of a [.., K, G*d] array (zero elsewhere)."""
    n, K, d = emb.shape
    out = np.zeros((n, K, groups * d), np.float64)
    for g in range(groups):
        sl = slice(g * K // groups, (g + 1) * K // groups)
        out[:, sl, g * d:(g + 1) * d] = emb[:, sl] * mask[:, sl, None]
    return out


def mean_features(emb, mask, groups):
    """[n, G*d]: the mean of each group's valid slots (zeros where a group has none)."""
    n, K, d = emb.shape
    out = np.zeros((n, groups * d), np.float64)
    for g in range(groups):
        sl = slice(g * K // groups, (g + 1) * K // groups)
        m = mask[:, sl].astype(np.float64)
        out[:, g * d:(g + 1) * d] = (emb[:, sl] * m[..., None]).sum(1) / np.maximum(m.sum(1), 1)[:, None]
    return out


class Ridge:
    """Multi-output ridge with an intercept over weighted rows, solved for several strengths from one
    eigendecomposition. Rows are given per chunk: X [n, R, D] (R rows per chunk, rows with w = 0 ignored),
    w [n, R] row weights (0/1), Y [n, V] the chunk's targets, shared by its rows."""

    def __init__(self, X, w, Y):
        w = w.astype(np.float64)
        nrow = w.sum()
        S = np.einsum("nr,nrd->nd", w, X)               # per chunk: the sum of its rows
        self.xbar = S.sum(0) / nrow
        cnt = w.sum(1)
        self.ybar = (cnt[:, None] * Y).sum(0) / nrow
        D = X.shape[2]
        X2 = X.reshape(-1, D)
        G = (X2 * w.reshape(-1, 1)).T @ X2 - nrow * np.outer(self.xbar, self.xbar)
        C = S.T @ Y - nrow * np.outer(self.xbar, self.ybar)
        self.s, self.U = np.linalg.eigh(G)
        self.s = np.maximum(self.s, 0)
        self.Z = self.U.T @ C                           # [D, V]
        self.scale = max(float(self.s.mean()), 1e-12)
        self.ysd = np.sqrt(np.maximum((cnt[:, None] * (Y - self.ybar) ** 2).sum(0) / nrow, 1e-12))

    def predict(self, X, alpha):
        """Scores [.., V] of rows X [.., D] at strength alpha (times the mean eigenvalue)."""
        P = (X - self.xbar) @ self.U
        return self.ybar + (P / (self.s + alpha * self.scale)) @ self.Z


def readout_scores(model, readout, emb, mask, groups, alpha):
    """[n, V] scores of chunks (emb [n, K, d], mask [n, K]) under a fitted readout; a chunk with no valid slot
    scores the prior."""
    valid = mask.any(1)
    if readout == "mean":
        out = model.predict(mean_features(emb, mask, groups), alpha)
    else:
        X = group_blocks(emb, mask, groups)
        out = np.full((len(emb), len(model.ybar)), -np.inf)
        for k in range(emb.shape[1]):
            sk = model.predict(X[:, k], alpha)
            out = np.where(mask[:, k, None], np.maximum(out, sk), out)
    out[~valid] = model.ybar
    return out


def fit(readout, emb, mask, groups, Y):
    """A Ridge fitted to chunks' bags Y from their slots: one row of mean features per chunk ("mean"), or
    each valid slot a row in its group's block ("slotmax")."""
    if readout == "mean":
        X = mean_features(emb, mask, groups)[:, None, :]
        return Ridge(X, mask.any(1)[:, None], Y)
    return Ridge(group_blocks(emb, mask, groups), mask, Y)


# ---------------------------------------------------------------- metrics
def ranking_metrics(scores, positive):
    """(mean average precision, mean AUC, rows counted) over the rows with both positives and negatives: each
    row's positives ranked among all its columns, ties ordered against the positives (a positive is ranked
    below every negative it ties with). NaN for both means when no row counts."""
    aps, aucs = [], []
    for s, p in zip(scores, positive):
        P = int(p.sum())
        N = len(p) - P
        if P == 0 or N == 0:
            continue
        order = np.lexsort((p.astype(np.int8), -s))   # by score down, negatives first among equal scores
        hits = p[order]
        ranks = np.nonzero(hits)[0] + 1                # 1-based ranks of the positives
        aps.append(float(np.mean(np.arange(1, P + 1) / ranks)))
        neg_above = ranks - np.arange(1, P + 1)        # negatives ranked above each positive
        aucs.append(float(1 - neg_above.sum() / (P * N)))
    if not aps:
        return float("nan"), float("nan"), 0
    return float(np.mean(aps)), float(np.mean(aucs)), len(aps)


def partners(entity):
    """score.py's control pairing: the item n/2 away, moved on until it is of another entity."""
    n = len(entity)
    out = []
    for i in range(n):
        j = (i + n // 2) % n
        for _ in range(n):
            if entity[j] != entity[i]:
                break
            j = (j + 1) % n
        out.append(j)
    return np.array(out)


def candidate_ranks(scores, answer_col):
    """1-based rank of each row's answer column, ties counted against it."""
    a = scores[np.arange(len(scores)), answer_col]
    return (scores >= a[:, None]).sum(1)


def summarise_ranks(r):
    return {"top1": float(np.mean(r == 1)), "mrr": float(np.mean(1.0 / r))}


# ---------------------------------------------------------------- the measurement
def measure(A, alphas=ALPHAS):
    t0 = time.process_time()
    groups = int(A["groups"])
    c_emb, c_mask, c_tok, c_doc = A["c_emb"].astype(np.float32), A["c_mask"].astype(bool), A["c_tok"], A["c_doc"]
    ok = c_mask.any(1) & (c_tok >= 0).any(1)           # chunks with memory and tokens
    docs = np.unique(c_doc[ok])
    cut_fit, cut_val = docs[int(0.8 * len(docs))], docs[int(0.9 * len(docs))]
    fit_rows = ok & (c_doc < cut_fit)
    val_rows = ok & (c_doc >= cut_fit) & (c_doc < cut_val)
    train_rows = ok & (c_doc < cut_val)
    test_rows = ok & (c_doc >= cut_val)
    vocab = np.unique(c_tok[train_rows][c_tok[train_rows] >= 0])   # tokens seen in training
    col = {int(t): i for i, t in enumerate(vocab)}

    def bags(rows):
        Y = np.zeros((int(rows.sum()), len(vocab)), np.float64)
        for r, t in enumerate(c_tok[rows]):
            for x in t[t >= 0]:
                if int(x) in col:
                    Y[r, col[int(x)]] = 1
        return Y
    Y_fit, Y_val, Y_train, Y_test = bags(fit_rows), bags(val_rows), bags(train_rows), bags(test_rows)

    p_emb, p_mask = A["p_emb"].astype(np.float32), A["p_mask"].astype(bool)
    p_answer, p_entity = A["p_answer"].astype(np.int64), A["p_entity"]
    cands = np.unique(p_answer)
    pc = np.array([col.get(int(t), -1) for t in cands])    # candidate -> vocab column (-1: unseen, scores 0)
    ans_idx = np.searchsorted(cands, p_answer)
    part = partners(p_entity)
    m = len(p_answer)
    nc = len(cands)
    counts = np.bincount(ans_idx, minlength=nc)
    out = {"chunks": {"fit": int(fit_rows.sum()), "select": int(val_rows.sum()), "train": int(train_rows.sum()),
                      "heldout": int(test_rows.sum())},
           "documents": int(len(docs)), "vocab": int(len(vocab)), "groups": groups, "K": int(c_emb.shape[1]),
           "probes": {"n": int(m), "candidates": int(nc), "candidates_unseen_in_training": int((pc < 0).sum()),
                      "no_valid_slot": int((~p_mask.any(1)).sum()),
                      "chance": {"top1": 1.0 / nc, "mrr": float(np.mean(1.0 / np.arange(1, nc + 1)))},
                      "majority_top1": float(counts.max() / m)}}
    if "p_slot_text_hit" in A:
        th, kh = A["p_slot_text_hit"].astype(bool), A["p_slot_token_hit"].astype(bool)
        K = th.shape[1]
        rec = {"all": {"text": float(th.any(1).mean()), "first_token": float(kh.any(1).mean())}}
        if groups == 2:
            for g, name in enumerate(("neighbour_slots", "continuation_slots")):
                sl = slice(g * K // 2, (g + 1) * K // 2)
                rec[name] = {"text": float(th[:, sl].any(1).mean()), "first_token": float(kh[:, sl].any(1).mean())}
        rec["top1_slot_text"] = float(th[:, 0].mean())
        out["recall"] = rec
    # the pairing of held-out chunks for their control: n/2 away
    nt = int(test_rows.sum())
    hpart = (np.arange(nt) + nt // 2) % nt
    subsets = []   # probe subsets reported beside all probes
    if "p_number" in A:
        subsets += [("names", ~A["p_number"].astype(bool)), ("numbers", A["p_number"].astype(bool))]
    if "p_in_query" in A:  # the answer's first token is not among the query chunk's tokens: it cannot come from there
        subsets += [("not_in_query", ~A["p_in_query"].astype(bool))]
        out["probes"]["answer_token_in_query"] = float(A["p_in_query"].astype(bool).mean())

    def cand_scores(S):
        full = np.zeros((len(S), nc))
        seen = pc >= 0
        full[:, seen] = S[:, pc[seen]]
        return full

    has = (c_tok >= 0).any(1)
    one = lambda X: (X[:, None, :].astype(np.float32), np.ones((len(X), 1), bool), 1)   # a vector as one slot
    for ro in [r for r in READOUTS if r in ("mean", "slotmax") or "c_" + {"selfread": "self"}.get(r, r) in A]:
        if ro == "selfread":  # trained on each chunk with tokens, read from its own embedding; scored on memory
            rows = {"fit": has & (c_doc < cut_fit), "val": has & (c_doc >= cut_fit) & (c_doc < cut_val),
                    "train": has & (c_doc < cut_val)}
            train_in = lambda r: one(A["c_self"][r])
            Ys = {k: bags(r) for k, r in rows.items()}
            how = "slotmax"
            eval_in, probe_in = (lambda r: (c_emb[r], c_mask[r], 1)), (p_emb, p_mask, 1)
        else:
            rows = {"fit": fit_rows, "val": val_rows, "train": train_rows}
            Ys = {"fit": Y_fit, "val": Y_val, "train": Y_train}
            if ro == "query":  # no memory: chunk c-1's own embedding, the query the memory was retrieved with
                train_in = eval_in = lambda r: one(A["c_query"][r])
                probe_in = one(A["p_query"])
                how = "slotmax"
            else:
                train_in = eval_in = lambda r: (c_emb[r], c_mask[r], groups)
                probe_in = (p_emb, p_mask, groups)
                how = ro
        sel = fit(how, *train_in(rows["fit"]), Ys["fit"])
        curve = {a: ranking_metrics(readout_scores(sel, how, *train_in(rows["val"]), a), Ys["val"] > 0)[0]
                 for a in alphas}
        model = fit(how, *train_in(rows["train"]), Ys["train"])
        # the highest selection AP (a NaN, no row to select on, counts as the lowest); the smaller strength on a tie
        best = max(alphas, key=lambda a: (curve[a] if curve[a] == curve[a] else -np.inf, -a))
        res = {"alpha": best, "select_ap": {str(a): curve[a] for a in alphas}}
        if ro == "selfread":  # how well a chunk's own embedding gives its own tokens (held-out chunks)
            r = has & (c_doc >= cut_val)
            res["heldout_self_ap"] = ranking_metrics(readout_scores(model, how, *train_in(r), best), bags(r) > 0)[0]
        S_test = readout_scores(model, how, *eval_in(test_rows), best)
        own = ranking_metrics(S_test, Y_test > 0)
        shuf = ranking_metrics(S_test[hpart], Y_test > 0)
        prior = ranking_metrics(np.broadcast_to(model.ybar, S_test.shape), Y_test > 0)
        res["heldout"] = {"own": {"ap": own[0], "auc": own[1]}, "shuffled": {"ap": shuf[0], "auc": shuf[1]},
                          "prior": {"ap": prior[0], "auc": prior[1]}, "n": own[2]}
        S_p = readout_scores(model, how, *probe_in, best)
        for scoring in ("raw", "lift"):
            T = S_p if scoring == "raw" else (S_p - model.ybar) / model.ysd
            C = cand_scores(T)
            r_own = candidate_ranks(C, ans_idx)
            r_shuf = candidate_ranks(C[part], ans_idx)
            d = {"own": summarise_ranks(r_own), "shuffled": summarise_ranks(r_shuf),
                 "own_better": int((r_own < r_shuf).sum()), "shuffled_better": int((r_own > r_shuf).sum())}
            for name, sub in subsets:
                if sub.any():
                    d[name] = {"n": int(sub.sum()), "own": summarise_ranks(r_own[sub]),
                               "shuffled": summarise_ranks(r_shuf[sub])}
            if scoring == "raw":
                prior_s = cand_scores(np.broadcast_to(model.ybar, S_p.shape))
                d["prior"] = summarise_ranks(candidate_ranks(prior_s, ans_idx))
            res["probes_" + scoring] = d
        out[ro] = res
    out["cpu_s"] = round(time.process_time() - t0, 1)
    return out


# ---------------------------------------------------------------- the report
def fmt(vals, pct=True):
    v = np.array(vals, float)
    f = (lambda x: "%.1f" % (100 * x)) if pct else (lambda x: "%.3f" % x)
    return f(v.mean()) if len(v) == 1 else "%s [%s–%s]" % (f(v.mean()), f(v.min()), f(v.max()))


def report(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    seeds = sorted({r["seed"] for r in rows})
    variants = [v for v in ("neighbour", "continuation", "both") if any(r["variant"] == v for r in rows)]
    trains = [t for t in ("other", "own") if any(r.get("train", "own") == t for r in rows)]
    by = {(r.get("train", "own"), r["variant"], r["seed"]): r for r in rows}
    base = [r for r in rows if r["variant"] == variants[0] and r.get("train", "own") == trains[0]]
    o = ["# Rung 2: information in the target memory, outside the LM", "",
         "`bash bench/memory/bench_information.sh` (`bench/memory/information.py`). Closed-form ridge readouts from "
         "a chunk's target memory (K = %d slots; 2K with `both`) to the bag of tokens of that chunk, fitted on a "
         "knowledge corpus's chunks, then scored on the probes: the answer's first token among the first tokens of "
         "all %d scored probe answers (%s candidates), from the probe's own memory against another entity's "
         "probe's memory (shuffled). Readouts: `mean` (the mean of the valid slots; per half with `both`), "
         "`slotmax` (one map for single slots, the best slot's score), `selfread` (a map from a chunk's own "
         "embedding to its own tokens, read over the slots: what the slots say), `query` (no memory: the embedding "
         "of the chunk the memory was retrieved with, the probe's prompt). Seeds: %s; each cell is the mean over "
         "seeds with [min–max]; top-1 in per cent, MRR and AP as fractions." % (
             rows[0]["K"], rows[0]["probes"]["n"],
             fmt([r["probes"]["candidates"] for r in base], pct=False).replace(".000", ""),
             " ".join(map(str, seeds))), "",
         "Baselines, the same for every variant: chance (uniform over the candidates) top-1 %s, MRR %s; the most "
         "frequent answer token top-1 %s." % (fmt([r["probes"]["chance"]["top1"] for r in base]),
                                             fmt([r["probes"]["chance"]["mrr"] for r in base], pct=False),
                                             fmt([r["probes"]["majority_top1"] for r in base]))]
    if all("names" in r["mean"]["probes_raw"] and "not_in_query" in r["mean"]["probes_raw"] for r in base):
        o[-1] += (" Probes per seed: %s with a name for answer, %s with a number; the answer's first token occurs in "
                  "the query chunk (the prompt) for %s %% of them." % (
                      fmt([r["mean"]["probes_raw"]["names"]["n"] for r in base], pct=False).replace(".000", ""),
                      fmt([r["mean"]["probes_raw"]["numbers"]["n"] for r in base], pct=False).replace(".000", ""),
                      fmt([r["probes"]["answer_token_in_query"] for r in base])))
    o.append("")
    title = {"other": "fitted on another seed's corpus (other invented entities: the clean measure)",
             "own": "fitted on the probes' own corpus (the readout may learn the facts itself)"}
    for train in trains:
        tr = [r for r in rows if r["variant"] == variants[0] and r.get("train", "own") == train]
        unseen = "Candidates that never occur in the training corpus (a readout scores them 0): %s of %s per seed." % (
            fmt([r["probes"]["candidates_unseen_in_training"] for r in tr], pct=False).replace(".000", ""),
            fmt([r["probes"]["candidates"] for r in tr], pct=False).replace(".000", ""))
        for scoring, what in (
                ("lift", "lift scoring: (score − the token's base rate) / its training std. dev."),
                ("raw", "raw scoring: the readout's score (the token's predicted presence in the chunk)")):
            o += ["## Probes, readouts %s; %s" % (title[train], what), "",
                  "| slots hold | readout | top-1 own | top-1 shuffled | MRR own | MRR shuffled | names: MRR own / "
                  "shuffled | numbers: MRR own / shuffled | answer not in the query: MRR own / shuffled | own > "
                  "shuffled (MRR), seeds | probes own better / worse |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
            for v in variants:
                for ro in READOUTS:
                    rs = [by[(train, v, s)] for s in seeds if (train, v, s) in by and ro in by[(train, v, s)]]
                    if not rs:
                        continue
                    p = [r[ro]["probes_" + scoring] for r in rs]
                    wins = sum(x["own"]["mrr"] > x["shuffled"]["mrr"] for x in p)
                    sub = {k: "%s / %s" % (fmt([x[k]["own"]["mrr"] for x in p], pct=False),
                                           fmt([x[k]["shuffled"]["mrr"] for x in p], pct=False))
                           if all(k in x for x in p) else "–" for k in ("names", "numbers", "not_in_query")}
                    o.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d of %d | %d / %d |" % (
                        v, ro, fmt([x["own"]["top1"] for x in p]), fmt([x["shuffled"]["top1"] for x in p]),
                        fmt([x["own"]["mrr"] for x in p], pct=False), fmt([x["shuffled"]["mrr"] for x in p], pct=False),
                        sub["names"], sub["numbers"], sub["not_in_query"], wins, len(p),
                        sum(x["own_better"] for x in p), sum(x["shuffled_better"] for x in p)))
            if scoring == "raw":
                pr = [r["mean"]["probes_raw"]["prior"] for r in tr]
                o += ["", "The prior (candidates ranked by the training base rate alone, no memory): top-1 %s, MRR %s."
                      % (fmt([x["top1"] for x in pr]), fmt([x["mrr"] for x in pr], pct=False))]
            else:
                o += ["", unseen]
            o.append("")
    for train in [t for t in ("own", "other") if t in trains][:1]:  # the same fits either way: shown once
        o += ["## Held-out corpus chunks", "",
              "Average precision (AP) and AUC of each held-out chunk's tokens among the tokens seen in training (%s), "
              "read from its own memory against another held-out chunk's; the prior ranks by base rate alone. A "
              "corpus's readouts on its own last 10 %% of documents: the same numbers whichever seed's probes they "
              "are then scored on." % fmt([r["vocab"] for r in rows if r.get("train", "own") == train],
                                          pct=False).replace(".000", ""), "",
              "| slots hold | readout | AP own | AP shuffled | AP prior | AUC own | AUC shuffled | ridge α (per seed) |",
              "|---|---|---|---|---|---|---|---|"]
        for v in variants:
            for ro in READOUTS:
                h = [by[(train, v, s)][ro] for s in seeds if (train, v, s) in by and ro in by[(train, v, s)]]
                if not h:
                    continue
                o.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                    v, ro, *(fmt(x, pct=False) for x in ([y["heldout"]["own"]["ap"] for y in h],
                                                          [y["heldout"]["shuffled"]["ap"] for y in h],
                                                          [y["heldout"]["prior"]["ap"] for y in h],
                                                          [y["heldout"]["own"]["auc"] for y in h],
                                                          [y["heldout"]["shuffled"]["auc"] for y in h])),
                    ", ".join("%g" % x["alpha"] for x in h)))
        selfap = [r["selfread"]["heldout_self_ap"] for r in rows if "selfread" in r and r["variant"] == variants[0]
                  and r.get("train", "own") == train]
        if selfap:
            o += ["", "selfread's map itself on the held-out chunks (each chunk's own embedding to its own bag): AP "
                  "%s. Its rows above read the next chunk's bag through it, so they sit below the prior." %
                  fmt(selfap, pct=False)]
        o.append("")
    o += ["## Is the answer in the slots at all? (no readout)", "",
          "Share of probes with a valid slot whose chunk text holds the answer string / whose tokens hold the "
          "answer's first token; the top-ranked slot alone; for `both`, each half.", "",
          "| slots hold | answer text in a slot | first token in a slot | answer text in slot 0 | detail |",
          "|---|---|---|---|---|"]
    for v in variants:
        rs = [by[(trains[0], v, s)]["recall"] for s in seeds
              if (trains[0], v, s) in by and "recall" in by[(trains[0], v, s)]]
        if not rs:
            continue
        detail = ""
        if "neighbour_slots" in rs[0]:
            detail = "neighbour half %s, continuation half %s (text)" % (
                fmt([x["neighbour_slots"]["text"] for x in rs]), fmt([x["continuation_slots"]["text"] for x in rs]))
        o.append("| %s | %s | %s | %s | %s |" % (v, fmt([x["all"]["text"] for x in rs]),
                                                 fmt([x["all"]["first_token"] for x in rs]),
                                                 fmt([x["top1_slot_text"] for x in rs]), detail))
    cpu = {}
    for r in rows:  # each cost is on one line: the data, runs and targets on the own-corpus line
        for k, c in r.get("cost", {}).items():
            cpu[k] = cpu.get(k, 0) + c["cpu_s"]
    o += ["", "Cost: %s CPU-seconds in all (%s; bash's `time` of each step, MPI ranks included)." % (
        "%.0f" % sum(cpu.values()), ", ".join("%s %.0f" % kv for kv in sorted(cpu.items())))]
    print("\n".join(o))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus-run", help="the corpus run the probe run retrieved from")
    ap.add_argument("--train-corpus-run", help="fit the readouts on this corpus run (default: --corpus-run)")
    ap.add_argument("--probe-run")
    ap.add_argument("--spans")
    ap.add_argument("--tokenizer", default=os.path.join(os.environ.get("DFM_LM", ""), "tokenizer.json"))
    ap.add_argument("--arrays", help="read the arrays from this .npz instead of runs")
    ap.add_argument("--save-arrays", help="write the arrays read from the runs here")
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--report", help="print the markdown table of a results JSONL")
    a = ap.parse_args()
    if a.report:
        report(a.report)
        return
    if not a.out:
        sys.exit("information: --out is required")
    if a.arrays:
        with np.load(a.arrays) as z:
            A = {k: z[k] for k in z.files}
    else:
        if not (a.corpus_run and a.probe_run and a.spans):
            sys.exit("information: --corpus-run, --probe-run and --spans are required (or --arrays)")
        A = read_run(a.corpus_run, a.probe_run, a.spans, a.tokenizer, a.train_corpus_run)
        if a.save_arrays:
            np.savez_compressed(a.save_arrays, **A)
    r = measure(A)
    if "slots" in A:
        r["slots"] = str(A["slots"])
    with open(a.out, "w") as f:
        json.dump(r, f, indent=1, sort_keys=True)
    p = r["probes"]
    print("information: %d probes, %d candidates (chance %.1f%%); " % (p["n"], p["candidates"],
                                                                      100 * p["chance"]["top1"])
          + "; ".join("%s: probes (lift) top-1 own %.1f%% / shuffled %.1f%%, MRR %.3f / %.3f; held-out AP own %.3f / "
                      "shuffled %.3f" % (ro, 100 * r[ro]["probes_lift"]["own"]["top1"],
                                         100 * r[ro]["probes_lift"]["shuffled"]["top1"], r[ro]["probes_lift"]["own"]["mrr"],
                                         r[ro]["probes_lift"]["shuffled"]["mrr"], r[ro]["heldout"]["own"]["ap"],
                                         r[ro]["heldout"]["shuffled"]["ap"]) for ro in READOUTS if ro in r)
          + ("; answer text in a slot %.1f%%" % (100 * r["recall"]["all"]["text"]) if "recall" in r else ""))


if __name__ == "__main__":
    main()
