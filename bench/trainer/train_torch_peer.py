"""train_torch_peer.py — the PyTorch peer of dfm-train's CPU training step, written as PyTorch users write it.

nn.Module layers (nn.Linear, nn.RMSNorm, nn.LayerNorm), F.scaled_dot_product_attention (causal, grouped-query
heads), F.cross_entropy, torch.nn.utils.clip_grad_norm_, torch.optim.AdamW (fused where this torch has it,
else foreach); optionally torch.compile of the model. It runs the steps bench/trainer/bench_train_step.c ran, from
its output folder: the same initial weights (OUT/init or the frozen backbone + OUT/init_modules.safetensors),
the same batches (OUT/batches.bin, with the teacher-forcing draws) and optimiser settings (OUT/bench.json),
and writes one JSON line a step (loss, ce, mse, grad_norm, cpu_s, wall_s) like the C program.

  python bench/trainer/train_torch_peer.py --run OUT --log peer.jsonl [--compile] [--autocast bf16] [--threads 1]

The model is trainer/model/model.h's: a Qwen3/Llama decoder (RMSNorm, RoPE rotate_half, per-head QK-norm for Qwen3
only, SwiGLU, tied or untied head; RoPE theta and RMS eps from config.json); in DFM mode the frozen decoder plus
the memory predictor (a small causal Transformer over chunk means of the input embeddings or, with the modules'
pred_input_layer k > 0, of the hidden states after layer k-1), the projector (LayerNorm, Linear, GELU, Linear) and the fusion blocks
(cross-attention of each token to its chunk's K memory slots, a sigmoid gate per head), loss = CE +
mse_weight * predictor loss.
"""
import argparse
import json
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_safetensors(path):
    """F32 tensors and the metadata of a safetensors file (no extra package)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        blob = bytearray(f.read())
    meta = head.pop("__metadata__", {})
    out = {}
    for name, t in head.items():
        if t["dtype"] != "F32":
            sys.exit("train_torch_peer: %s is %s; the benchmark writes F32" % (name, t["dtype"]))
        a, b = t["data_offsets"]
        out[name] = torch.frombuffer(blob[a:b], dtype=torch.float32).reshape(t["shape"]).clone()
    return out, meta


def rope_tables(T, hd, theta):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()  # [T, hd/2]


def apply_rope(x, cos, sin):
    """x [B, H, T, hd], rotate_half convention."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, self.nh, self.nkv, self.hd = c["hidden"], c["n_heads"], c["n_kv_heads"], c["head_dim"]
        self.q_proj = nn.Linear(C, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(C, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(C, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, C, bias=False)
        self.qk_norm = c["qk_norm"]
        if self.qk_norm:
            self.q_norm = nn.RMSNorm(self.hd, eps=c["eps"])
            self.k_norm = nn.RMSNorm(self.hd, eps=c["eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True, enable_gqa=self.nh != self.nkv)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.up_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], c["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(c["hidden"], eps=c["eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = nn.RMSNorm(c["hidden"], eps=c["eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, c, V, T):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, c["hidden"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["n_layers"]))
        self.norm = nn.RMSNorm(c["hidden"], eps=c["eps"])
        cos, sin = rope_tables(T, c["head_dim"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)


class Predictor(nn.Module):
    def __init__(self, C, pc, K, d, NC):
        super().__init__()
        P = pc["hidden"]
        self.in_proj = nn.Linear(C, P)
        self.placeholder = nn.Parameter(torch.zeros(P))
        self.layers = nn.ModuleList(DecoderLayer(pc) for _ in range(pc["n_layers"]))
        self.norm = nn.RMSNorm(P, eps=pc["eps"])
        self.out_proj = nn.Linear(P, K * d)
        cos, sin = rope_tables(NC, pc["head_dim"], pc["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, pool):
        """pool [B, NC, C]: chunk i's mean; chunk i+1 reads it, chunk 0 the placeholder."""
        u = self.in_proj(pool[:, :-1])
        x = torch.cat([self.placeholder.expand(u.shape[0], 1, -1), u], dim=1)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.out_proj(self.norm(x))


class Projector(nn.Module):
    def __init__(self, d, H, C):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, H)
        self.fc2 = nn.Linear(H, C)

    def forward(self, m):
        return self.fc2(F.gelu(self.fc1(self.norm(m))))


class Fusion(nn.Module):
    """h + sigmoid(gate(h)) * o_proj(cross-attention of token s to the K slots of chunk (s + shift) // L)."""

    def __init__(self, C, nhx, G, eps, L, shift):
        super().__init__()
        self.norm = nn.RMSNorm(C, eps=eps)
        self.q_proj, self.k_proj = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)
        self.v_proj, self.o_proj = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)
        self.gate = nn.Linear(C, G)
        self.nhx, self.G, self.L, self.shift = nhx, G, L, shift

    def forward(self, h, M, mask):
        """h [B, T, C]; M [B, NC, K, C]; mask [B, NC, K] bool. The queries are shifted by `shift` rows and padded
        to NC + 1 chunks, so each chunk's L rows attend its K slots in one batched SDPA; a chunk without any
        slot (chunk 0, the one after the sequence) attends everything and is zeroed (no update)."""
        B, T, C = h.shape
        NC, K, L, s, nh = M.shape[1], M.shape[2], self.L, self.shift, self.nhx
        hd = C // nh
        q = F.pad(self.q_proj(self.norm(h)), (0, 0, s, L - s))
        q = q.view(B, NC + 1, L, nh, hd).transpose(2, 3)
        kv = F.pad(M, (0, 0, 0, 0, 0, 1))
        k = self.k_proj(kv).view(B, NC + 1, K, nh, hd).transpose(2, 3)
        v = self.v_proj(kv).view(B, NC + 1, K, nh, hd).transpose(2, 3)
        mk = F.pad(mask, (0, 0, 0, 1))
        has = mk.any(-1)
        am = (mk | ~has[..., None])[:, :, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=am) * has[:, :, None, None, None]
        y = y.transpose(2, 3).reshape(B, (NC + 1) * L, C)[:, s:s + T]
        g = torch.sigmoid(self.gate(h))
        if self.G != C:
            g = g.repeat_interleave(C // self.G, dim=-1)
        return h + g * self.o_proj(y)


class DfmModules(nn.Module):
    def __init__(self, C, dc, T, eps):
        super().__init__()
        K, d, L = dc["n_slots"], dc["d_mem"], dc["chunk_len"]
        G = C if dc["gate"] == "channel" else dc["xattn_heads"]
        shift = 1 if dc["memory_align"] == "next" else 0
        self.predictor = Predictor(C, dc["predictor"], K, d, T // L)
        self.projector = Projector(d, dc["proj_hidden"], C)
        self.fusion = nn.ModuleList(Fusion(C, dc["xattn_heads"], G, eps, L, shift) for _ in dc["fusion_layers"])


class Model(nn.Module):
    """loss = CE (+ mse_weight * predictor loss in DFM mode); forward returns (loss, ce, mse)."""

    def __init__(self, bc, dc, T):
        super().__init__()
        nh = bc["num_attention_heads"]
        self.c = {"n_layers": bc["num_hidden_layers"], "hidden": bc["hidden_size"], "n_heads": nh,
                  "n_kv_heads": bc.get("num_key_value_heads", nh), "head_dim": bc.get("head_dim", bc["hidden_size"] // nh),
                  "ffn": bc["intermediate_size"], "eps": bc.get("rms_norm_eps", 1e-6),
                  "rope_theta": bc.get("rope_theta", 10000.0), "qk_norm": bc["architectures"][0] == "Qwen3ForCausalLM"}
        self.model = Backbone(self.c, bc["vocab_size"], T)
        self.tied = bc.get("tie_word_embeddings", True)
        if not self.tied:
            self.lm_head = nn.Linear(self.c["hidden"], bc["vocab_size"], bias=False)
        self.dc = dc
        if dc:
            self.dfm = DfmModules(self.c["hidden"], dc, T, self.c["eps"])
            self.fuse_after = {l: i for i, l in enumerate(dc["fusion_layers"])}

    def memory(self, src, tmem, tmask, msrc):
        dc, B, T = self.dc, src.shape[0], src.shape[1]
        L, K, d = dc["chunk_len"], dc["n_slots"], dc["d_mem"]
        NC = T // L
        slots = self.dfm.predictor(src.detach().view(B, NC, L, -1).mean(2)).view(B, NC, K, d)
        tm = tmask[..., None].to(slots.dtype)
        err = (slots - tmem) ** 2 * tm
        nv = tm.sum()
        mse = err.sum() / (nv * d)
        ploss = err.sum() / nv if dc["pred_loss"] == "mse" else mse
        pm = torch.ones(B, NC, K, dtype=torch.bool)
        if not dc["fuse_first_chunk"]:
            pm[:, 0] = False
        fed = torch.where(msrc[..., None, None], tmem, slots)  # a target chunk passes no gradient to the slots
        mask = torch.where(msrc[..., None], tmask, pm)
        return self.dfm.projector(fed), mask, mse, ploss

    def forward(self, tokens, targets, tmem=None, tmask=None, msrc=None):
        bb = self.model
        x = bb.embed_tokens(tokens)
        src = x
        pil = self.dc.get("pred_input_layer", 0) if self.dc else 0
        mse = ploss = torch.zeros(())
        M = mask = None
        for l, layer in enumerate(bb.layers):
            if l == pil:  # the predictor reads the input embeddings (0) or the hidden states after layer pil-1
                src = x
            x = layer(x, bb.cos, bb.sin)
            if self.dc and l in self.fuse_after:
                if M is None:
                    M, mask, mse, ploss = self.memory(src, tmem, tmask, msrc)
                x = self.dfm.fusion[self.fuse_after[l]](x, M, mask)
        head = bb.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = F.linear(bb.norm(x), head)
        ce = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
        loss = ce + self.dc["mse_weight"] * ploss if self.dc else ce
        return loss, ce, mse


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="bench_train_step's output folder")
    ap.add_argument("--log", required=True, help="JSONL, one line a step")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    ap.add_argument("--autocast", choices=("none", "bf16"), default="none",
                    help="bf16: the forward under torch.autocast(\"cpu\", dtype=torch.bfloat16); weights, gradients and "
                         "AdamW stay fp32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0, help="0: all the run's steps")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(a.run, "bench.json")))
    B, T, dfm = cfg["B"], cfg["T"], cfg["mode"] == "dfm"
    bdir = cfg["backbone"] if dfm else os.path.join(a.run, "init")
    bc = json.load(open(os.path.join(bdir, "config.json")))
    weights, _ = read_safetensors(os.path.join(bdir, "model.safetensors"))
    dc = None
    if dfm:
        mods, meta = read_safetensors(os.path.join(a.run, "init_modules.safetensors"))
        dc = json.loads(meta["dfm_config"])
        weights.update(mods)
    model = Model(bc, dc, T)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        sys.exit("train_torch_peer: weights do not fit the model: missing %s, unexpected %s" % (missing, unexpected))
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("dfm.") if dfm else True)
    train = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in train if p.ndim == 2 and not n.endswith("placeholder")],
               "weight_decay": cfg["weight_decay"]},
              {"params": [p for n, p in train if not (p.ndim == 2 and not n.endswith("placeholder"))],
               "weight_decay": 0.0}]
    kw = dict(lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    try:
        opt, kind = torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError):
        opt, kind = torch.optim.AdamW(groups, foreach=True, **kw), "foreach"
    params = [p for _, p in train]
    step_fn = torch.compile(model, dynamic=False) if a.compile else model

    S = B * (T // cfg["chunk_len"]) * cfg["K"] if dfm else 0
    NCB = B * (T // cfg["chunk_len"]) if dfm else 0
    rec = 8 * B * T + (S * cfg["d"] * 4 + S + NCB if dfm else 0)
    steps = a.steps or cfg["steps"]
    raw = open(os.path.join(a.run, "batches.bin"), "rb").read()
    if len(raw) < rec * steps:
        sys.exit("train_torch_peer: batches.bin holds %d steps, %d asked" % (len(raw) // rec, steps))
    out = open(a.log, "w")
    for s in range(steps):
        buf = bytearray(raw[s * rec:(s + 1) * rec])
        tok = torch.frombuffer(buf, dtype=torch.int32, count=B * T).view(B, T).long()
        tgt = torch.frombuffer(buf, dtype=torch.int32, count=B * T, offset=4 * B * T).view(B, T).long()
        extra = ()
        if dfm:
            o = 8 * B * T
            NC, K, d = T // cfg["chunk_len"], cfg["K"], cfg["d"]
            tmem = torch.frombuffer(buf, dtype=torch.float32, count=S * d, offset=o).view(B, NC, K, d)
            tmask = torch.frombuffer(buf, dtype=torch.uint8, count=S, offset=o + 4 * S * d).view(B, NC, K).bool()
            msrc = torch.frombuffer(buf, dtype=torch.uint8, count=NCB, offset=o + 4 * S * d + S).view(B, NC).bool()
            extra = (tmem, tmask, msrc)
        c0, w0 = time.process_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss, ce, mse = step_fn(tok, tgt, *extra)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, cfg["clip"], foreach=True)
        opt.step()
        c1, w1 = time.process_time(), time.perf_counter()
        out.write(json.dumps({"step": s + 1, "loss": loss.item(), "ce": ce.item(), "mse": float(mse.detach()),
                              "grad_norm": gn.item(), "cpu_s": c1 - c0, "wall_s": w1 - w0}) + "\n")
        out.flush()
    print(json.dumps({"torch": torch.__version__, "adamw": kind, "compile": a.compile, "autocast": a.autocast,
                      "threads": a.threads}))


if __name__ == "__main__":
    main()
