#!/usr/bin/env python3
"""predictor_fit.py — the DFM predictor trained alone on its own loss, outside the trainer: does it learn to tell
chunks apart at all, and which change lets it?

The predictor of dfm.torch (the same module dfm-train's modules load into) is trained on the corpus run's
sequences with the trainer's predictor loss only (squared error summed over d, mean over valid slots; chunk 0
has no target), from the trainer's initialisation (matrices N(0, init_std), norms 1, biases and placeholder 0,
the skip path 0, and with it out_proj 0), AdamW without weight decay, 10 warm-up steps and a cosine decay to 0, batches of 16 sequences.
Its input is the mean of the LM's input embeddings over each chunk (the trainer's default, --pred-input-layer 0),
or over the chunk's last N tokens (--tail N). It is scored on the corpus run's last 8 sequences (held out) and on
the knowledge probes (each probe's answer chunk, predicted from its prompt chunk):
    slot cos     the mean cosine of each predicted slot to its target slot (held-out sequences)
    gap          cosine of the mean predicted slot to the probe's own mean target slot, minus to its partner's
                 (score.py's pairing: the probe n/2 away, of another entity); 0 when every question gets one memory
    between      the cosine of two partners' mean predicted slots (1: one memory for every question)
Architectures (--arch):
    pred         the predictor as the trainer builds it: in_proj, a causal Transformer over chunk positions,
                 RMSNorm, out_proj
    skip         the same plus the linear path from the pooled input to the slots (dfm-train --pred-skip)
    linear       that linear path alone (with a bias): what a ridge regression fits in closed form
    python3 bench/memory/predictor_fit.py --work /tmp/dfm-reading/s1 --arch skip --steps 150 [--lr 2e-3] [--tail N]
        [--layers N] [--seed S]
WORK is a bench_reading.sh seed folder: corpus/ and probes/ (runs with targets), pt/spans.jsonl, and scratch/ (whose
exported modules give the predictor's configuration). Prints one line per quarter of the steps; --json appends the
last one to a file.
"""
import argparse
import json
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "memory"))
sys.path.insert(0, os.path.join(ROOT, "python"))
from information import chunk_shards, partners  # noqa: E402
from predictor_input import embedding_table, scores, target_means, unit  # noqa: E402


def tensor(a):
    """A torch tensor of a NumPy array without the NumPy bridge (torch builds for NumPy 1 lack it under NumPy 2)."""
    a = np.ascontiguousarray(a)
    dt = {np.dtype(np.float32): torch.float32, np.dtype(np.int64): torch.int64, np.dtype(bool): torch.bool}[a.dtype]
    return torch.frombuffer(bytearray(a.tobytes()), dtype=dt).view(*a.shape)


class Linear(torch.nn.Module):
    """Slots of chunk i = W · pool(chunk i-1) + b; chunk 0: zeros."""

    def __init__(self, C, K, d, L, tail):
        super().__init__()
        self.l, self.K, self.d, self.L, self.tail = torch.nn.Linear(C, K * d), K, d, L, tail

    def forward(self, src):
        B, T, C = src.shape
        NC = T // self.L
        pool = src.reshape(B, NC, self.L, C)[:, :, self.L - self.tail:].mean(2)
        y = self.l(pool[:, :-1]).view(B, NC - 1, self.K, self.d)
        return torch.cat([torch.zeros(B, 1, self.K, self.d), y], 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--backbone", default=os.path.join(os.environ.get("DFM_CACHE", "/var/cache/dfm"), "models",
                                                       "smollm2-135m"))
    ap.add_argument("--arch", choices=("pred", "skip", "linear"), default="pred")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--tail", type=int, default=0, help="pool the chunk's last N tokens only (0: all)")
    ap.add_argument("--layers", type=int, default=-1, help="predictor Transformer layers (-1: the modules')")
    ap.add_argument("--out-std", type=float, default=-1, help="std of out_proj's initial weights (-1: the trainer's: init_std, or 0 with the skip path)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="append the final line's numbers to this file")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    import dfm
    from dfm.torch import Predictor, load_safetensors
    W = a.work
    _, meta = load_safetensors(os.path.join(W, "scratch", "dfm_modules.safetensors"))
    dc = json.loads(meta["dfm_config"])
    if a.layers >= 0:
        dc["predictor"]["n_layers"] = a.layers
    L, std = dc["chunk_len"], dc.get("init_std", 0.02)
    tail = a.tail or L
    dc["pred_input_tokens"], dc["pred_skip"] = tail, a.arch == "skip"
    tok, _ = chunk_shards(os.path.join(W, "corpus"))
    wte = tensor(embedding_table(a.backbone))
    with dfm.open_run(os.path.join(W, "corpus")) as r:
        K, d = r.k, r.d
        E, M = np.zeros((r.n_chunks, K, d), np.float32), np.zeros((r.n_chunks, K), bool)
        for i, rec in enumerate(r.records()):
            E[i], M[i] = rec["emb"], rec["mask"]
    man = json.load(open(os.path.join(W, "corpus", "manifest.json")))
    seqc = man["stages"]["chunk"]["config"]["seq-len"] // L
    ns = len(tok) // seqc
    toks = tensor(np.maximum(tok[:ns * seqc], 0).astype(np.int64)).view(ns, seqc * L)
    tgt, msk = tensor(E[:ns * seqc]).view(ns, seqc, K, d), tensor(M[:ns * seqc]).view(ns, seqc, K).clone()
    msk[:, 0] = False  # the first chunk of a sequence has no target (the loader clears it)
    train, held = torch.arange(ns - 8), torch.arange(ns - 8, ns)
    ptok, _ = chunk_shards(os.path.join(W, "probes"))
    spans = [json.loads(line) for line in open(os.path.join(W, "pt", "spans.jsonl"))]
    _, pmean = target_means(os.path.join(W, "probes"))
    pseq = np.array([s["seq"] for s in spans], np.int64)
    ptoks = tensor(np.maximum(ptok, 0).astype(np.int64)).view(-1, 3 * L)[tensor(pseq)]
    ptgt = unit(pmean.reshape(-1, 3, d)[pseq, 2])
    ents = [s["entity"] for s in spans]
    pair = partners(np.array([sorted(set(ents)).index(e) for e in ents]))

    net = Linear(wte.shape[1], K, d, L, tail) if a.arch == "linear" else Predictor(dc, wte.shape[1])
    with torch.no_grad():  # the trainer's initialisation (trainer/model/model.c model_init_dfm_random)
        for n, p in net.named_parameters():
            if n.startswith("skip.") or (a.arch == "linear"):
                p.zero_()
            elif p.dim() == 2:
                out_std = a.out_std if a.out_std >= 0 else 0.0 if a.arch == "skip" else std
                p.normal_(0, out_std if n == "out_proj.weight" else std)
            elif "norm" in n:
                p.fill_(1)
            elif n == "placeholder":
                p.normal_(0, std)
            else:
                p.zero_()
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(a.seed)

    def evaluate():
        with torch.no_grad():
            s, m = net(wte[toks[held]]), msk[held]
            slot_cos = torch.nn.functional.cosine_similarity(s[m], tgt[held][m], -1).mean().item()
            sc = scores(np.array(net(wte[ptoks])[:, 2].mean(1).tolist(), np.float32), ptgt, pair)
            return dict(slot_cos=slot_cos, gap=sc["gap"], between=sc["between"])

    t0, res = time.time(), {}
    for step in range(1, a.steps + 1):
        b = train[torch.randint(len(train), (16,), generator=g)]
        s, m = net(wte[toks[b]]), msk[b]
        loss = ((s - tgt[b]) ** 2).sum(-1)[m].mean()
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / 10) * 0.5 * (1 + np.cos(np.pi * step / a.steps))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % max(1, a.steps // 4) == 0 or step == a.steps:
            res = dict(arch=a.arch, tail=tail, steps=step, lr=a.lr, seed=a.seed, out_std=a.out_std,
                       layers=dc["predictor"]["n_layers"], loss=float(loss),
                       **evaluate())
            print("%s tail %d lr %g step %d: loss %.4f | held-out slot cos %.3f | probes: gap %+.4f between %.4f "
                  "(%.0f s)" % (a.arch, tail, a.lr, step, res["loss"], res["slot_cos"], res["gap"], res["between"],
                                time.time() - t0), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
