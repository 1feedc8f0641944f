#!/usr/bin/env python3
"""score.py — the knowledge probes scored in every memory mode, with dfm.torch (held-out CE equal to `dfm-train
eval` within 1e-4, tests/py/pkg/test_pkg_torch_parity.py) on the frozen LM and the trained DFM modules.

For each probe sequence of probe_tokens.py (answer at the start of chunk 2) and each mode:
    none        fusion off: the frozen LM alone (the same filler and prompt)
    predicted   memory predicted from the preceding chunks: DFM at inference, no retrieval
    target      the target memory of the probe run: neighbours retrieved from the corpus with chunk 1 (the
                prompt) as the query
    predicted_shuffled, target_shuffled   the same modules fusing another probe's memory (the probe n/2 away
                in the scored set, always of another entity): the controls for the modules' added capacity
    in_context  the frozen LM with the fact's sentence of the corpus pasted before the prompt (RAG)
it records the answer's log-probability (summed over its tokens) and greedy exact match (every answer token
is the argmax given the gold prefix: what greedy decoding would produce), summarised over all probe sequences
("all"), by form, by fact, and, when the spans carry facts.py's "unseen" flag, over the seen and the unseen
entities' probes ("seen", "unseen": the keys of "all", null for a subset the scored set lacks). Analysis, per
probe: the predictor's cosine to the target slots of chunk 2 (and, its control, to the partner probe's target
slots and to the partner's predicted slots: a predictor that emits one memory whatever the question scores the same
on the first two and 1.0 on the third), whether chunk 2's retrieved neighbours hold the answer
(retrieval recall, with the corpus run's chunk texts), the fusion gates where the answer is predicted, and the
CE of answer tokens against the other tokens of the sequence.

    python3 bench/memory/knowledge/score.py --backbone LM --modules M.safetensors --run PROBE_RUN --spans SPANS.jsonl
        --probes PROBES.jsonl --corpus-run CORPUS_RUN --tokenizer tokenizer.json --out RESULT.json [--threads 2]
        [--limit N]
"""
import argparse
import glob
import json
import os
import struct
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))

MODES = ("none", "predicted", "target", "predicted_shuffled", "target_shuffled", "in_context")


def chunk_texts(run, tok):
    """chunk id -> decoded text of a run's chunk shards (schemas/chunk_shard.md)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run, "chunk", "chunks-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMCHNK1", path
        L = struct.unpack_from("<I", b, 16)[0]
        first, n = struct.unpack_from("<QQ", b, 32)
        rec = 24 + 4 * L
        for i in range(n):
            off = 128 + i * rec
            nv = struct.unpack_from("<H", b, off + 16)[0]
            out[first + i] = tok.decode(list(struct.unpack_from("<%dI" % L, b, off + 24)[:nv]))
    return out


def neighbours(run):
    """chunk id -> neighbour chunk ids (valid slots) of a run's retrieve stage (schemas/neighbor_shard.md)."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(run, "retrieve", "nbr-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMNBRS1", path
        K = struct.unpack_from("<I", b, 16)[0]
        first, n, row_bytes = struct.unpack_from("<QQQ", b, 24)
        K2 = K + (K & 1)
        for i in range(n):
            off = 128 + i * row_bytes
            ids = struct.unpack_from("<%dq" % K, b, off)
            mask = struct.unpack_from("<Q", b, off + 8 * K + 4 * K2)[0]
            rows[first + i] = [ids[j] for j in range(K) if mask >> j & 1]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k in ("backbone", "modules", "run", "spans", "probes", "corpus-run", "tokenizer", "out"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--limit", type=int, default=0, help="score only the first N probe sequences (0: all)")
    ap.add_argument("--targets", help="the probe run's target memory from this targets file (`dfm-train slots` over "
                    "the probe run: slots in the LM's own space) instead of the run's targets stage")
    a = ap.parse_args()
    import torch
    import dfm
    import dfm.torch as dt
    from dfm.data import to_torch
    from tokenizers import Tokenizer
    torch.set_num_threads(a.threads)
    t0 = time.time()
    tok = Tokenizer.from_file(a.tokenizer)
    spans = [json.loads(l) for l in open(a.spans)]
    if a.limit:
        spans = spans[:a.limit]
    if len({s["entity"] for s in spans}) < 2:
        sys.exit("score: the shuffled controls need probes of at least two entities (raise --limit)")
    probes = {p["id"]: p for p in (json.loads(l) for l in open(a.probes))}
    backbone = dt.load_backbone(a.backbone)
    mods = dt.DFMModules.from_safetensors(a.modules)
    model = dt.DFMModel(backbone, mods).eval()
    L = mods.config["chunk_len"]
    T = 3 * L
    gates = {}

    def gate_hook(i):
        def h(mod, inp, out):
            gates[i] = torch.sigmoid(out).detach()
        return h
    for i, fb in enumerate(mods.fusion):
        fb.gate.register_forward_hook(gate_hook(i))

    with open(os.path.join(a.run, "manifest.json")) as f:
        staged = json.load(f)["stages"]
    if a.targets:
        bt = dfm.Batches(None, T, 1, data=a.run, targets=a.targets, val_seqs=1, format="torch")
    elif "targets" in staged and staged["targets"].get("state") == "complete":
        bt = dfm.Batches(a.run, T, 1, val_seqs=1, format="torch")
    else:  # tokens only: the target modes are not scored
        bt = dfm.Batches(None, T, 1, data=a.run, val_seqs=1, format="torch")
    n = len(spans)
    # each read is copied out: the reader fills the same buffers again (torch.frombuffer: no NumPy bridge,
    # which torch builds for NumPy 1 lack under NumPy 2)
    rows = []
    for s in spans:
        r = to_torch(bt.read(np.array([s["seq"]])))
        rows.append([None if x is None else x.clone() for x in (r.tokens, r.labels, r.memory, r.mask)])
    toks = torch.cat([r[0] for r in rows]).long()
    labels = torch.cat([r[1] for r in rows]).long()
    have_t = rows[0][2] is not None
    if have_t:
        memory = torch.cat([r[2] for r in rows])
        mask = torch.cat([r[3] for r in rows]).bool()
    else:  # a probe run without targets: the target modes are not scored
        memory = mask = None
        print("score: %s has no targets: target memory and its control are not scored" % a.run)
    # the control's partner: n/2 away in the scored set, moved on until it is another entity
    partner = []
    for i in range(n):
        j = (i + n // 2) % n
        while spans[j]["entity"] == spans[i]["entity"]:
            j = (j + 1) % n
        partner.append(j)
    partner = torch.tensor(partner)

    def score(logits, lab, start, end):
        """answer log-probability and exact match of rows start-1 .. end-2 predicting tokens start .. end-1"""
        lg = logits[start - 1:end - 1].double().log_softmax(-1)
        gold = lab[start - 1:end - 1]
        return float(lg.gather(1, gold[:, None]).sum()), bool((lg.argmax(-1) == gold).all())

    modes = [m for m in MODES if have_t or not m.startswith("target")]
    res = {m: [] for m in modes}
    other_ce = {m: [0.0, 0] for m in modes if m != "in_context"}
    gate_mean = {m: [] for m in ("predicted", "target")}
    cos = []
    with torch.no_grad():
        slots_all, prefixes = [], {}
        for b0 in range(0, n, a.batch):
            sl = slice(b0, min(n, b0 + a.batch))
            # the frozen blocks below the first fusion layer, run once for all five memory modes of the batch (the
            # same numbers bit for bit: tests/py/pkg/test_pkg_torch_parity.py); about 40 MB for 240 sequences
            prefixes[b0] = pre = model.prefix(toks[sl])
            for mode in [m for m in ("none", "predicted", "target") if m in res]:
                gates.clear()
                r = model(toks[sl], labels[sl], memory[sl] if have_t else None, mask[sl] if have_t else None, mode=mode,
                          prefix=pre)
                if mode == "predicted":
                    slots_all.append(r["slots"])
                for k, i in enumerate(range(sl.start, sl.stop)):
                    s = spans[i]
                    lp, em = score(r["logits"][k], labels[i], s["start"], s["end"])
                    res[mode].append({"logprob": lp, "exact": em})
                    ce = torch.nn.functional.cross_entropy(r["logits"][k].float(), labels[i].clamp(min=0),
                                                           reduction="none")
                    keep = (labels[i] >= 0).clone()
                    keep[s["start"] - 1:s["end"] - 1] = False
                    other_ce[mode][0] += float(ce[keep].sum())
                    other_ce[mode][1] += int(keep.sum())
                    if mode in gate_mean and gates:
                        gate_mean[mode].append([float(g[k, s["start"] - 1:s["end"] - 1].mean()) for _, g in sorted(gates.items())])
                    if mode == "predicted" and have_t:
                        p, t, m = r["slots"][k, 2], memory[i, 2], mask[i, 2]
                        c = torch.nn.functional.cosine_similarity(p[m].double(), t[m].double(), dim=-1)
                        cos.append(float(c.mean()) if m.any() else float("nan"))
        slots_all = torch.cat(slots_all)
        # the predictor's control: its answer-chunk slots against the partner probe's target slots (what a predictor
        # that ignores the question scores), and against the partner's own predicted slots (1.0: it emits one memory
        # whatever the question)
        cos_partner, cos_between = [], []
        if have_t:
            for i in range(n):
                j, m = int(partner[i]), mask[i, 2] & mask[int(partner[i]), 2]
                if m.any():
                    p = slots_all[i, 2][m].double()
                    cos_partner.append(float(torch.nn.functional.cosine_similarity(p, memory[j, 2][m].double(), dim=-1).mean()))
                    cos_between.append(float(torch.nn.functional.cosine_similarity(p, slots_all[j, 2][m].double(), dim=-1).mean()))
        for b0 in range(0, n, a.batch):
            sl = slice(b0, min(n, b0 + a.batch))
            pi = partner[sl]
            pm = torch.ones(pi.shape[0], 3, slots_all.shape[2], dtype=torch.bool)
            if not mods.config.get("fuse_first_chunk", False):
                pm[:, 0] = False
            for mode, mem, msk in (("predicted_shuffled", slots_all[pi], pm),
                                   ("target_shuffled", memory[pi] if have_t else None, mask[pi] if have_t else None)):
                if mode not in res:
                    continue
                r = model(toks[sl], labels[sl], mem, msk, mode="target", prefix=prefixes[b0])
                for k, i in enumerate(range(sl.start, sl.stop)):
                    s = spans[i]
                    lp, em = score(r["logits"][k], labels[i], s["start"], s["end"])
                    res[mode].append({"logprob": lp, "exact": em})
                    ce = torch.nn.functional.cross_entropy(r["logits"][k].float(), labels[i].clamp(min=0),
                                                           reduction="none")
                    keep = (labels[i] >= 0).clone()
                    keep[s["start"] - 1:s["end"] - 1] = False
                    other_ce[mode][0] += float(ce[keep].sum())
                    other_ce[mode][1] += int(keep.sum())
        # the in-context reference: the fact's corpus sentence, then the prompt, then the answer (the LM alone)
        for i, s in enumerate(spans):
            p = probes[s["probe"]]
            ctx = tok.encode(p["evidence"] + " " + p[s["form"]], add_special_tokens=False).ids
            ans = tok.encode(" " + p["answer"], add_special_tokens=False).ids
            ids = torch.tensor([ctx + ans])
            out = backbone(ids)
            logits = out.logits if hasattr(out, "logits") else out
            lab = torch.tensor(ctx[1:] + ans + [0])
            lp, em = score(logits[0], lab, len(ctx), len(ctx) + len(ans))
            res["in_context"].append({"logprob": lp, "exact": em})
    # retrieval recall: does a neighbour of chunk 2 hold the answer?
    corpus_text = chunk_texts(a.corpus_run, tok)
    nb = neighbours(a.run) if have_t else {}
    recall = []
    for s in spans:
        ids = nb.get(s["seq"] * 3 + 2, [])
        recall.append(any(s["answer"] in corpus_text.get(c, "") for c in ids))

    def summary(sel):
        out = {}
        for m in modes:
            v = [res[m][i] for i in sel]
            out[m] = {"logprob": float(np.mean([x["logprob"] for x in v])), "exact": float(np.mean([x["exact"] for x in v])),
                      "n": len(v)}
        return out
    forms = {f: [i for i, s in enumerate(spans) if s["form"] == f] for f in ("question", "cloze")}
    facts = sorted({s["fact"] for s in spans})
    ans_tokens = sum(s["end"] - s["start"] for s in spans)
    # spans of facts.py --unseen carry the flag: "all"'s summary over the probes of entities the training read and
    # over those it never read (null when the scored set has none)
    subsets = {}
    if any("unseen" in s for s in spans):
        for name, flag in (("seen", False), ("unseen", True)):
            sel = [i for i, s in enumerate(spans) if s.get("unseen", False) == flag]
            subsets[name] = summary(sel) if sel else None
    result = {
        "probes": len({s["probe"] for s in spans}), "sequences": n,
        "by_form": {f: summary(ix) for f, ix in forms.items()},
        "all": summary(range(n)),
        **subsets,
        "by_fact": {f: summary([i for i, s in enumerate(spans) if s["fact"] == f]) for f in facts},
        "analysis": {
            "predictor_cosine_answer_chunk": float(np.nanmean(cos)) if cos else None,
            "predictor_cosine_partner_target": float(np.mean(cos_partner)) if cos_partner else None,
            "predictor_cosine_between_probes": float(np.mean(cos_between)) if cos_between else None,
            "retrieval_recall": float(np.mean(recall)) if have_t else None,
            "gate_mean_answer_rows": {m: np.mean(gate_mean[m], 0).tolist() if gate_mean[m] else None for m in gate_mean},
            "ce_answer_tokens": {m: -float(np.sum([x["logprob"] for x in res[m]])) / ans_tokens for m in modes},
            "ce_other_tokens": {m: other_ce[m][0] / max(other_ce[m][1], 1) for m in other_ce},
            "exact_by_recall": {
                "retrieved": summary([i for i in range(n) if recall[i]])["target"] if have_t and any(recall) else None,
                "missed": summary([i for i in range(n) if not recall[i]])["target"] if have_t and not all(recall) else None},
        },
        "seconds": round(time.time() - t0, 1),
    }
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    line = lambda sm: ", ".join("%s %.2f / %.1f%%" % (m, sm[m]["logprob"], 100 * sm[m]["exact"]) for m in modes)
    an = result["analysis"]
    print("score: %d sequences in %.0f s; answer log-prob / exact match: %s; retrieval recall %s, predictor cosine %s "
          "(to the partner's target %s; between probes %s)"
          % (n, result["seconds"], line(result["all"]), an["retrieval_recall"], an["predictor_cosine_answer_chunk"],
             an["predictor_cosine_partner_target"], an["predictor_cosine_between_probes"]))
    for name, sm in subsets.items():
        print("score: %s entities: %s" % (name, "no probe" if sm is None else "%d sequences, %s" % (sm["none"]["n"], line(sm))))


if __name__ == "__main__":
    main()
