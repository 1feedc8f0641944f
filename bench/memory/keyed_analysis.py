"""Where the memory gain on a keyed corpus goes (bench/memory/bench_memory.sh, trainer/README.md "What memory can
add"): two measurements of a DFM model that dfm-train trained, made in PyTorch through tests/ref/dfm_torch.py
(the model of trainer/model/model.h, held to dfm-train by the fp64 parity test).

  head ceiling  the best cross-entropy the frozen final RMSNorm + LM head can give for each key's token
                distribution, over every possible final hidden state: what no memory fused into the residual
                stream can beat, against the entropy of that distribution (both on the corpus's empirical
                p(token | key), so they compare with each other, not with held-out figures);
  chain split   held-out CE of chunks 1.. of each sequence in every evaluation mode, split by whether the
                chunk's key followed the chain from the previous chunk's (predicted memory can know it) or
                was drawn fresh (predicted memory is confidently wrong there).

  python bench/memory/keyed_analysis.py --data DIR --backbone MODEL_DIR --modules RUN_DIR --seq-len 128 --val-seqs 64

DIR holds tokens.bin, targets.bin and keys.bin (`dfm-train synth --mode keyed`); RUN_DIR holds the
dfm_modules.safetensors of `dfm-train train`. Needs torch >= 2 and numpy (the peer venv of bench/peers.sh).
Prints one JSON object.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "ref"))
sys.path.insert(0, HERE)
import dfm_torch as D  # noqa: E402
from keyed_ideal import chain_successors, read_shard  # noqa: E402,F401  (fusion_trials.py imports read_shard from here)


def read_targets(path):
    """(mask [N,K] bool, embeddings [N,K,d] float32, chunk_len) of a targets file (schemas/targets_file.md)."""
    b = open(path, "rb").read()
    assert b[:8] == b"DFMTGTS1", "%s: not a targets file" % path
    k, d, L, n = struct.unpack_from("<IIIQ", b, 12)
    mask = np.frombuffer(b, np.uint8, n * k, 64).reshape(n, k).astype(bool)
    emb = np.frombuffer(b, np.float32, n * k * d, 64 + n * k).reshape(n, k, d)
    return torch.from_numpy(mask.copy()), torch.from_numpy(emb.copy()), L


def held_out_batch(tok, mask, emb, seqs, T, L):
    """Tokens, next-token targets [B,T] and target memory [B,NC,K,d] / mask [B,NC,K] of the given sequences,
    as the trainer batches them (sequence i = tokens [iT, iT+T); chunk 0 has no preceding context, hence no
    target)."""
    NC = T // L
    x = torch.stack([tok[s * T:s * T + T] for s in seqs])
    y = torch.stack([tok[s * T + 1:s * T + T + 1] for s in seqs])
    ci = torch.tensor([[s * NC + c for c in range(NC)] for s in seqs])
    tm, tk = emb[ci], mask[ci].clone()
    tk[:, 0] = False
    return x, y, tm, tk


def chain_followed(keys, seqs, T, L):
    """[B, NC-1] bool: whether chunk c >= 1 of each sequence took the chain's successor of chunk c-1's key."""
    NC = T // L
    succ, _ = chain_successors(keys, NC)
    ci = np.array([[s * NC + c for c in range(NC)] for s in seqs])
    return torch.from_numpy(keys[ci[:, 1:]] == succ[keys[ci[:, :-1]]])


def chain_split(rows, followed, T, L, per_position=False):
    """Mean CE of per-row losses rows [B,T] over all rows, and over the tokens of chunks 1.. that followed the
    chain / were drawn fresh (row s predicts token s+1, so chunk c's tokens are rows cL-1 .. cL+L-2)."""
    per = rows[:, L - 1:T - 1].reshape(rows.shape[0], T // L - 1, L)
    out = {"all": round(float(rows.mean()), 4), "followed": round(float(per[followed].mean()), 4),
           "fresh": round(float(per[~followed].mean()), 4)}
    if per_position:
        out["followed_pos"] = [round(v, 3) for v in per[followed].mean(0).tolist()]
        out["fresh_pos"] = [round(v, 3) for v in per[~followed].mean(0).tolist()]
    return out


def head_ceiling(P, bc, probs, steps=2000):
    """Mean over keys of min_u CE(p_key, softmax(W diag(w) u)) with u on the RMSNorm sphere (|u|^2 = C)."""
    W = P["model.embed_tokens.weight"] if bc["tie_word_embeddings"] else P["lm_head.weight"]
    Wn = (W * P["model.norm.weight"][None, :]).double()
    p = torch.from_numpy(probs)
    C = Wn.shape[1]
    g = torch.Generator().manual_seed(1)
    u = torch.randn(p.shape[0], C, dtype=torch.float64, generator=g).requires_grad_(True)
    opt = torch.optim.Adam([u], lr=0.05)
    for _ in range(steps):
        un = u / u.norm(dim=1, keepdim=True) * C ** 0.5
        loss = -(p * torch.log_softmax(un @ Wn.T, dim=1)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ent = -(probs * np.log(np.where(probs > 0, probs, 1))).sum(1).mean()
    return float(loss.detach()), float(ent)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--modules", required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--val-seqs", type=int, required=True)
    a = ap.parse_args()
    torch.manual_seed(1)
    tok = torch.from_numpy(read_shard(os.path.join(a.data, "tokens.bin")))
    keys = read_shard(os.path.join(a.data, "keys.bin"))
    mask, emb, L = read_targets(os.path.join(a.data, "targets.bin"))
    P, _ = D.read_safetensors(os.path.join(a.backbone, "model.safetensors"))
    bc = json.load(open(os.path.join(a.backbone, "config.json")))
    Q, meta = D.read_safetensors(os.path.join(a.modules, "dfm_modules.safetensors"))
    dc = json.loads(meta["dfm_config"])
    assert dc["chunk_len"] == L, "modules trained with chunk length %d, targets made for %d" % (dc["chunk_len"], L)
    P.update(Q)
    P = {k: v.double() if v.is_floating_point() else v for k, v in P.items()}
    model = D.DfmTorch(bc, dc)

    # the corpus: p(token | key)
    nk, V = int(keys.max()) + 1, int(bc["vocab_size"])
    counts = np.zeros((nk, V))
    np.add.at(counts, (np.repeat(keys, L), tok[: len(keys) * L].numpy()), 1)
    ceiling, entropy = head_ceiling(P, bc, counts / counts.sum(1, keepdims=True))

    # held-out sequences: the trainer's split (the last val-seqs sequences)
    T = a.seq_len
    S = (len(tok) - 1) // T
    seqs = list(range(S - a.val_seqs, S))
    x, y, tm, tk = held_out_batch(tok, mask, emb, seqs, T, L)
    followed = chain_followed(keys, seqs, T, L)
    out = {"head_ceiling": round(ceiling, 4), "key_entropy": round(entropy, 4),
           "chunks_followed": int(followed.sum()), "chunks_fresh": int((~followed).sum())}
    with torch.no_grad():
        for mode in ("none", "predicted", "target"):
            rows = model.forward(P, x, y, tm.double(), tk, mem=mode)["rows"].view(len(seqs), T)
            out[mode] = chain_split(rows, followed, T, L, per_position=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
