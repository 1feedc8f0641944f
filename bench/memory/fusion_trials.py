"""Fusion variants dfm-train does not implement, tried in PyTorch on a keyed corpus and its frozen backbone:
can a different fusion block let predicted memory recover what it loses on chunks whose key left the chain?
(trainer/README.md, "What memory can add"; bench/memory/fusion_trials.sh runs the set and writes the table.)

The DFM modules are those of trainer/model/model.h (tests/ref/dfm_torch.py, initialised as dfm-train does) and are
trained here with dfm-train's recipe (AdamW, betas 0.9/0.95, weight decay 0.1 on every tensor, clip 1,
linear warm-up 20 steps, cosine to 10 %, batch 8, mse weight 1, teacher forcing --fusion-memory), so the
"base" variant is the control for the others, not a copy of dfm-train's run (its numbers differ from the
benchmark's by the random streams). Variants, combined with "+":

  base         the fusion block of trainer/model/model.h
  null         each cross-attention also sees a learned key with a zero value per fusion block: a token can
               attend "nothing" where the memory disagrees with what it has read
  corruptN     teacher forcing with wrong memory: each chunk fuses a random other chunk's target with
               probability N % (the predictor's loss still uses the right target)
  ffn          a Flamingo-style feed-forward after each cross-attention: RMSNorm, Linear C->4C, GELU,
               Linear 4C->C, scaled by tanh of a learned scalar that starts at 0 (capacity beside the
               frozen backbone: run it on a keyed-random corpus too, where memory carries nothing)

  python bench/memory/fusion_trials.py --data DIR --backbone MODEL_DIR --variant null+corrupt25 [--layers 0,1]
      [--steps 1500] [--fusion-memory mixed:0.5]

Prints one JSON object: held-out CE per evaluation mode, and for chunks 1.. split by whether their key
followed the chain (keyed_analysis.py's split). Needs torch >= 2 and numpy (bench/peers.sh's venv).
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "ref"))
sys.path.insert(0, HERE)
import dfm_torch as D  # noqa: E402
from keyed_analysis import chain_followed, chain_split, held_out_batch, read_shard, read_targets  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--variant", default="base")
    ap.add_argument("--layers", default="0,1")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--fusion-memory", default="mixed:0.5", help="predicted, target or mixed:P")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--val-seqs", type=int, default=64)
    a = ap.parse_args()
    parts = set(a.variant.split("+"))
    corrupt = 0.0
    for p in list(parts):
        if p.startswith("corrupt"):
            corrupt = float(p[len("corrupt"):]) / 100
            parts.discard(p)
    unknown = parts - {"base", "null", "ffn"}
    assert not unknown, "unknown variant part(s) %s" % sorted(unknown)
    torch.manual_seed(1)
    torch.set_num_threads(1)

    tok = torch.from_numpy(read_shard(os.path.join(a.data, "tokens.bin")))
    keys = read_shard(os.path.join(a.data, "keys.bin"))
    mask, emb, L = read_targets(os.path.join(a.data, "targets.bin"))
    n_chunks, K, d = emb.shape
    T = a.seq_len
    NC, S = T // L, (len(tok) - 1) // T
    n_train = S - a.val_seqs
    P, _ = D.read_safetensors(os.path.join(a.backbone, "model.safetensors"))
    bc = json.load(open(os.path.join(a.backbone, "config.json")))
    dec = D.decoder_config(bc)
    C = bc["hidden_size"]
    fl = [int(x) for x in a.layers.split(",")]
    dc = {"chunk_len": L, "d_mem": d, "enabled": True, "fuse_first_chunk": False, "fusion_layers": fl,
          "gate": "head", "gate_bias": 0.0, "memory_align": "next", "mse_weight": 1.0, "n_slots": K,
          "pred_input_layer": 0, "pred_loss": "mse", "proj_hidden": 2 * C, "xattn_heads": dec["n_heads"],
          "predictor": {"eps": 1e-6, "ffn": 4 * C, "head_dim": C, "hidden": C, "n_heads": 1, "n_kv_heads": 1,
                        "n_layers": 2, "qk_norm": False, "rope_theta": 10000.0}}
    Q = {k: v.clone().requires_grad_(True) for k, v in D.random_params(bc, dc).items() if k.startswith("dfm.")}
    nh, hd = dc["xattn_heads"], C // dc["xattn_heads"]
    for f in range(len(fl)):
        if "null" in parts:
            Q["null.%d" % f] = (torch.randn(C) / math.sqrt(hd)).requires_grad_(True)
        if "ffn" in parts:
            Q["ffn.%d.norm" % f] = torch.ones(C, requires_grad=True)
            Q["ffn.%d.w1" % f] = (torch.randn(4 * C, C) / math.sqrt(C)).requires_grad_(True)
            Q["ffn.%d.w2" % f] = (torch.randn(C, 4 * C) / math.sqrt(4 * C)).requires_grad_(True)
            Q["ffn.%d.scale" % f] = torch.zeros(1, requires_grad=True)

    def fusion(h, M, fmask, f, W):
        """trainer/model/model.h's block, with a null key/value ("null") and a gated feed-forward ("ffn")."""
        if "null" not in parts:
            out = D.fusion_block(h, M, fmask, W, f, dc, dec["eps"], "manual")
        else:
            B = h.shape[0]
            pre = "dfm.fusion.%d." % f
            q = F.linear(D.rmsnorm(h, W[pre + "norm.weight"], dec["eps"]), W[pre + "q_proj.weight"])
            q = F.pad(q, (0, 0, 1, L - 1)).view(B, NC + 1, L, nh, hd)  # token s attends chunk (s + 1) // L
            k = F.pad(F.linear(M, W[pre + "k_proj.weight"]), (0, 0, 0, 0, 0, 1)).view(B, NC + 1, K, nh, hd)
            v = F.pad(F.linear(M, W[pre + "v_proj.weight"]), (0, 0, 0, 0, 0, 1)).view(B, NC + 1, K, nh, hd)
            k = torch.cat([W["null.%d" % f].view(1, 1, 1, nh, hd).expand(B, NC + 1, 1, nh, hd), k], 2)
            v = torch.cat([torch.zeros_like(v[:, :, :1]), v], 2)
            mk = F.pad(fmask, (0, 0, 0, 1))
            allowed = torch.cat([torch.ones_like(mk[..., :1]), mk], -1)[:, :, None, None, :]
            s = torch.einsum("bclhe,bckhe->bchlk", q, k) / math.sqrt(hd)
            att = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1)
            y = torch.einsum("bchlk,bckhe->bclhe", att, v) * mk.any(-1)[:, :, None, None, None]
            o = F.linear(y.reshape(B, (NC + 1) * L, C)[:, 1:1 + T], W[pre + "o_proj.weight"])
            g = torch.sigmoid(F.linear(h, W[pre + "gate.weight"], W[pre + "gate.bias"])).repeat_interleave(hd, -1)
            out = h + g * o
        if "ffn" in parts:
            x = D.rmsnorm(out, W["ffn.%d.norm" % f], dec["eps"])
            out = out + torch.tanh(W["ffn.%d.scale" % f]) * F.linear(F.gelu(F.linear(x, W["ffn.%d.w1" % f])),
                                                                      W["ffn.%d.w2" % f])
        return out

    def forward(seqs, mem, gen=None):
        """Per-row CE [B, T] and the predictor loss; mem: none | predicted | target | mixed:P (training)."""
        W = {**P, **Q}
        x, y, tm, tk = held_out_batch(tok, mask, emb, seqs, T, L)
        fused, src, mode = tm, None, mem
        if mem.startswith("mixed:") or (gen is not None and corrupt > 0):
            p = float(mem.split(":")[1]) if mem.startswith("mixed:") else (1.0 if mem == "target" else 0.0)
            src = torch.rand(len(seqs), NC, generator=gen) < p
            if gen is not None and corrupt > 0:
                bad = torch.rand(len(seqs), NC, generator=gen) < corrupt
                other = torch.randint(0, n_chunks, (len(seqs), NC), generator=gen)
                fused = torch.where(bad[..., None, None], emb[other], tm)
                src = src | bad
            mode = "mixed"
        h = F.embedding(x, P["model.embed_tokens.weight"])
        src_states = h
        M = fm = None
        slots = None
        for l in range(dec["n_layers"]):
            h = D.decoder_layer(h, P, "model.layers.%d." % l, dec, "manual")
            if l in fl and mem != "none":
                if M is None:
                    M, fm, slots, _, _ = D.memory(src_states, W, dc, fused, tk, mode, src, "manual")
                h = fusion(h, M, fm, fl.index(l), W)
        if slots is None:
            _, _, slots, _, _ = D.memory(src_states, W, dc, tm, tk, "none", None, "manual")
        valid = tk.to(slots.dtype)[..., None]
        ploss = (((slots - tm) ** 2) * valid).sum() / valid.sum()  # the right target, whatever was fused
        rows, _ = D.head_ce(h, P["model.norm.weight"], P["model.embed_tokens.weight"], y, dec["eps"])
        return rows.view(len(seqs), T), ploss

    params = list(Q.values())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for step in range(a.steps):
        lr = a.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / a.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        rows, ploss = forward(torch.randint(0, n_train, (8,), generator=gen).tolist(), a.fusion_memory, gen)
        opt.zero_grad()
        (rows.mean() + ploss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    held = list(range(n_train, S))
    followed = chain_followed(keys, held, T, L)
    out = {"corpus": os.path.basename(os.path.normpath(a.data)), "variant": a.variant, "layers": a.layers,
           "fusion_memory": a.fusion_memory, "steps": a.steps}
    with torch.no_grad():
        for mode in ("none", "predicted", "target"):
            rows = torch.cat([forward(held[i:i + 8], mode)[0] for i in range(0, len(held), 8)])
            out[mode] = chain_split(rows, followed, T, L)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
