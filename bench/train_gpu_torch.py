#!/usr/bin/env python3
"""train_gpu_torch.py — dfm-train's model in PyTorch, for a side-by-side speed benchmark (issue 8).

The same computation as trainer/model.h and trainer/stack.h, written independently of the parity test:
  - backbone (Qwen3 style): embedding -> N x [RMSNorm -> q,k,v (GQA, no bias) -> per-head q/k RMSNorm
    (--arch qwen3) -> RoPE (rotate_half) -> causal softmax attention -> o_proj -> residual; RMSNorm ->
    SwiGLU -> residual] -> RMSNorm -> tied LM head -> mean next-token CE;
  - DFM mode: the backbone frozen (bf16 weights, requires_grad False); predictor over chunk means of the
    frozen input embeddings (chunk i gets chunk i-1's mean through Linear C->P, chunk 0 a learned
    placeholder; causal decoder layers over chunks, RMSNorm, Linear P->K*d), shared projector
    (LayerNorm(d) -> Linear d->H -> GELU(erf) -> Linear H->C), gated cross-attention fusion blocks after
    the given layers (RMSNorm, q from tokens, k/v from the K projected slots of the token's own chunk,
    o_proj, sigmoid gate per head (or channel) from the block's input; chunk 0 gets no update unless
    --fuse-first-chunk), loss = CE + mse_weight * MSE(predicted slots, target slots of chunks >= 1).
Implementation choices a PyTorch user would make: q/k/v and gate/up weights stored fused (one GEMM
each, same arithmetic), F.scaled_dot_product_attention (causal; cross-attention batched per chunk),
bf16 autocast over fp32 master weights, fused AdamW over the trainable parameters, gradient clipping
at 1.0 (dfm-train clips too), torch.compile per decoder layer / fusion block / memory path / LM head
(--compile; falls back to eager with a note when it is missing or fails).
Random weights and random (learnable: a per-sequence affine token recurrence) data of the given shapes.

Prints one JSON line (the last line of stdout): impl, mode, params, trainable, tokens_per_step,
ms_per_step (median over the timed steps), tok_per_s, flops_per_token (tests/ref/train_flops.py), mfu,
compiled, torch, gpu, ... ; with --log FILE also one JSON line per step (step, loss, ms).

    python3 bench/train_gpu_torch.py --mode pretrain --layers 12 --hidden 768 --heads 12 --kv-heads 12 \
        --ffn 2048 --vocab 50304 --seq-len 1024 --batch 16 --steps 12 --warmup-steps 3 --compile
    python3 bench/train_gpu_torch.py --device cpu --dtype fp32 --layers 2 --hidden 64 --heads 4 \
        --kv-heads 2 --vocab 512 --seq-len 64 --batch 2 --steps 3      # tiny CPU check

--write-backbone DIR writes a random backbone of the given shape as a Hugging Face folder dfm-train can
load (config.json + model.safetensors, bf16), then exits (bench/bench_train_gpu.sh's fallback backbone).
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import struct
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_flops as TF  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---- the model's pieces (plain functions; compiled wrappers are made in build_fns) ------------------------
def rmsnorm(x, w, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype)


def rope_tables(T, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float32, device=device), inv)
    ang = torch.cat([ang, ang], dim=-1)  # [T, hd], HF layout
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    # x [B, T, H, hd]; Hugging Face rotate_half
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos + rot * sin


def attention(q, k, v, causal, mode, gqa_ok):
    """q [B, nh, Tq, hd], k/v [B, nkv, Tk, hd] -> [B, nh, Tq, hd]."""
    nh, nkv = q.shape[1], k.shape[1]
    if mode == "sdpa" and HAS_SDPA:
        if nh != nkv and gqa_ok:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        if nh != nkv:
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if nh != nkv:
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        m = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~m, float("-inf"))
    p = s.float().softmax(-1).to(v.dtype)
    return p @ v


def make_layer_fn(nh, nkv, hd, eps, qk_norm, attn_mode, gqa_ok):
    def layer(x, w, cos, sin):
        B, T, _ = x.shape
        h = rmsnorm(x, w["ln1"], eps)
        qkv = F.linear(h, w["wqkv"])
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q, k, v = q.view(B, T, nh, hd), k.view(B, T, nkv, hd), v.view(B, T, nkv, hd)
        if qk_norm:
            q, k = rmsnorm(q, w["qn"], eps), rmsnorm(k, w["kn"], eps)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, attn_mode, gqa_ok)
        y = y.transpose(1, 2).reshape(B, T, nh * hd)
        x = x + F.linear(y, w["wo"])
        h = rmsnorm(x, w["ln2"], eps)
        g, u = F.linear(h, w["wgu"]).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, w["wdown"])
    return layer


def make_fusion_fn(nhx, L, G, eps, attn_mode):
    def fusion(h, M, w, tmask):
        # h [B,T,C]; M [B,NC,K,C]; tmask [T,1]: 0 for tokens of chunks without memory (chunk 0)
        B, T, C = h.shape
        NC, K, hdx = T // L, M.shape[2], C // nhx
        xn = rmsnorm(h, w["ln"], eps)
        q = F.linear(xn, w["wq"]).view(B, NC, L, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * NC, nhx, L, hdx)
        k = F.linear(M, w["wk"]).view(B, NC, K, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * NC, nhx, K, hdx)
        v = F.linear(M, w["wv"]).view(B, NC, K, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * NC, nhx, K, hdx)
        y = attention(q, k, v, False, attn_mode, True)
        y = y.view(B, NC, nhx, L, hdx).permute(0, 1, 3, 2, 4).reshape(B, T, C)
        o = F.linear(y, w["wo"])
        g = torch.sigmoid(F.linear(h, w["wg"], w["bg"]))  # [B,T,G]
        upd = (o.view(B, T, G, C // G) * g.unsqueeze(-1)).view(B, T, C) * tmask.to(o.dtype)
        return h + upd.to(h.dtype)
    return fusion


def make_memory_fn(c, pred_layer):
    L, K, d, P = c["chunk_len"], c["slots"], c["d_mem"], c["pred_hidden"]
    eps = 1e-6

    def memory(src, tgt, tgt_mask, w, pcos, psin):
        # src [B,T,C] frozen states; tgt [B,NC,K,d] fp32; tgt_mask [B,NC,K] fp32 (1 = valid target)
        B, T, C = src.shape
        NC = T // L
        pool = src.detach().float().view(B, NC, L, C).mean(2)
        u = F.linear(pool[:, :-1], w["win"], w["bin"])
        x = torch.cat([w["ph"].to(u.dtype).view(1, 1, P).expand(B, 1, P), u], dim=1)
        for lw in w["layers"]:
            x = pred_layer(x, lw, pcos, psin)
        x = rmsnorm(x, w["lnf"], eps)
        slots = F.linear(x, w["wout"], w["bout"]).view(B, NC, K, d)
        m = F.layer_norm(slots.float(), (d,), w["plnw"], w["plnb"], 1e-5)
        m = F.gelu(F.linear(m, w["w1"], w["b1"]))
        M = F.linear(m, w["w2"], w["b2"])
        diff = (slots.float() - tgt).pow(2) * tgt_mask.unsqueeze(-1)
        mse = diff.sum() / (tgt_mask.sum() * d)
        return M, mse
    return memory


def make_head_fn(eps):
    def head_ce(x, lnf, wh, targets):
        h = rmsnorm(x, lnf, eps)
        logits = F.linear(h, wh)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)
    return head_ce


# ---- parameters ----------------------------------------------------------------------------------------------
def _normal(shape, std, dev, dt):
    return (torch.randn(*shape, device=dev, dtype=torch.float32) * std).to(dt)


def init_backbone(c, dev, dt):
    C, V, hd, nh, nkv, Fh = c["hidden"], c["vocab"], c["head_dim"], c["heads"], c["kv_heads"], c["ffn"]
    ones = lambda n: torch.ones(n, device=dev, dtype=dt)  # noqa: E731
    bb = {"wte": _normal((V, C), 0.02, dev, dt), "lnf": ones(C), "layers": []}
    for _ in range(c["layers"]):
        bb["layers"].append({
            "ln1": ones(C), "wqkv": _normal(((nh + 2 * nkv) * hd, C), 0.02, dev, dt),
            "qn": ones(hd) if c["qk_norm"] else None, "kn": ones(hd) if c["qk_norm"] else None,
            "wo": _normal((C, nh * hd), 0.02, dev, dt), "ln2": ones(C),
            "wgu": _normal((2 * Fh, C), 0.02, dev, dt), "wdown": _normal((C, Fh), 0.02, dev, dt)})
    bb["head"] = bb["wte"] if c["tied"] else _normal((V, C), 0.02, dev, dt)
    return bb


def init_dfm(c, dev):
    C, P, K, d, H, G = c["hidden"], c["pred_hidden"], c["slots"], c["d_mem"], c["proj_hidden"], c["gates"]
    ph, phd = c["pred_heads"], c["pred_head_dim"]
    f32 = torch.float32
    z = lambda *s: torch.zeros(*s, device=dev, dtype=f32)  # noqa: E731
    o = lambda *s: torch.ones(*s, device=dev, dtype=f32)  # noqa: E731
    n = lambda *s: _normal(s, 0.02, dev, f32)  # noqa: E731
    w = {"win": n(P, C), "bin": z(P), "ph": n(P), "layers": [], "lnf": o(P), "wout": n(K * d, P), "bout": z(K * d),
         "plnw": o(d), "plnb": z(d), "w1": n(H, d), "b1": z(H), "w2": n(C, H), "b2": z(C), "fusion": []}
    for _ in range(c["pred_layers"]):
        w["layers"].append({"ln1": o(P), "wqkv": n(3 * ph * phd, P), "qn": None, "kn": None, "wo": n(P, ph * phd),
                            "ln2": o(P), "wgu": n(2 * c["pred_ffn"], P), "wdown": n(P, c["pred_ffn"])})
    for _ in c["fusion_layers"]:
        w["fusion"].append({"ln": o(C), "wq": n(C, C), "wk": n(C, C), "wv": n(C, C), "wo": n(C, C),
                            "wg": z(G, C), "bg": z(G)})
    return w


def tensors_of(tree):
    """Every tensor of a nested dict/list, each once (tied weights)."""
    out, seen = [], set()

    def walk(t):
        if isinstance(t, dict):
            for k in sorted(t):
                walk(t[k])
        elif isinstance(t, list):
            for x in t:
                walk(x)
        elif isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    walk(tree)
    return out


def _bf16_bytes(t):
    """The little-endian BF16 bytes of t (a copy of the CPU buffer: needs no numpy)."""
    import ctypes
    bits = t.detach().to("cpu", torch.bfloat16).contiguous()
    return ctypes.string_at(bits.data_ptr(), bits.numel() * 2)


# ---- the HF backbone writer (fallback backbone for dfm-train) ------------------------------------------------
def write_backbone(c, out_dir, seed):
    """config.json + model.safetensors (BF16) with dfm-train's / Hugging Face's tensor names."""
    torch.manual_seed(seed)
    if sys.byteorder != "little":
        raise RuntimeError("safetensors are little-endian; this machine is not")
    gen_dev = "cuda" if torch.cuda.is_available() else "cpu"  # randn of 1.2B values: seconds on a GPU
    os.makedirs(out_dir, exist_ok=True)
    C, V, hd, nh, nkv, Fh = c["hidden"], c["vocab"], c["head_dim"], c["heads"], c["kv_heads"], c["ffn"]
    names = [("model.embed_tokens.weight", (V, C), 0.02)]
    for l in range(c["layers"]):
        p = "model.layers.%d." % l
        names += [(p + "input_layernorm.weight", (C,), None), (p + "self_attn.q_proj.weight", (nh * hd, C), 0.02),
                  (p + "self_attn.k_proj.weight", (nkv * hd, C), 0.02),
                  (p + "self_attn.v_proj.weight", (nkv * hd, C), 0.02)]
        if c["qk_norm"]:
            names += [(p + "self_attn.q_norm.weight", (hd,), None), (p + "self_attn.k_norm.weight", (hd,), None)]
        names += [(p + "self_attn.o_proj.weight", (C, nh * hd), 0.02), (p + "post_attention_layernorm.weight", (C,), None),
                  (p + "mlp.gate_proj.weight", (Fh, C), 0.02), (p + "mlp.up_proj.weight", (Fh, C), 0.02),
                  (p + "mlp.down_proj.weight", (C, Fh), 0.02)]
    names.append(("model.norm.weight", (C,), None))
    if not c["tied"]:
        names.append(("lm_head.weight", (V, C), 0.02))
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for nm, shape, _ in names:
        nb = 2 * math.prod(shape)
        hdr[nm] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    hj = json.dumps(hdr).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    path = os.path.join(out_dir, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for nm, shape, std in names:
            t = torch.ones(shape) if std is None else torch.randn(shape, device=gen_dev) * std
            f.write(_bf16_bytes(t))
    os.replace(path + ".tmp", path)
    cfg = {"architectures": ["Qwen3ForCausalLM" if c["qk_norm"] else "LlamaForCausalLM"],
           "model_type": "qwen3" if c["qk_norm"] else "llama", "vocab_size": V, "hidden_size": C,
           "intermediate_size": Fh, "num_hidden_layers": c["layers"], "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": c["seq_len"], "tie_word_embeddings": c["tied"], "hidden_act": "silu",
           "attention_bias": False, "rope_scaling": None, "torch_dtype": "bfloat16"}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return off


# ---- benchmark ---------------------------------------------------------------------------------------------------
def sdpa_gqa_ok(dev, dt):
    if not HAS_SDPA:
        return False
    try:
        q = torch.zeros(1, 4, 8, 16, device=dev, dtype=dt)
        k = torch.zeros(1, 2, 8, 16, device=dev, dtype=dt)
        F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return True
    except Exception:  # TypeError (no enable_gqa) or a backend refusal
        return False


def make_data(c, n, dev, seed):
    """n batches of tokens [B,T] and targets [B,T] (a per-sequence affine recurrence mod V: learnable) and,
    in DFM mode, target slots [B,NC,K,d] that depend on the chunk (learnable through the predictor)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B, T, V = c["batch"], c["seq_len"], c["vocab"]
    out = []
    if c["mode"] == "dfm":
        base = torch.randn(c["slots"], c["d_mem"], generator=g)
        table = torch.randn(16, c["slots"], c["d_mem"], generator=g)
    for _ in range(n):
        a = torch.randint(1, 8, (B, 1), generator=g)
        b = torch.randint(0, V, (B, 1), generator=g)
        x0 = torch.randint(0, V, (B, 1), generator=g)
        pos = torch.arange(T + 1).view(1, -1)
        seq = (x0 + a * pos + b * (pos // 7)) % V
        batch = {"tok": seq[:, :T].contiguous().to(dev), "tgt": seq[:, 1:].contiguous().to(dev)}
        if c["mode"] == "dfm":  # target slots: a shared part + a part chosen by the chunk's first token
            NC, K, d, L = T // c["chunk_len"], c["slots"], c["d_mem"], c["chunk_len"]
            first = seq[:, :T:L] % table.shape[0]  # [B, NC]
            batch["tmem"] = (base + 0.3 * table[first]).to(dev)
            m = torch.ones(B, NC, K)
            m[:, 0] = 0  # chunk 0 has no target (design §1)
            batch["tmask"] = m.to(dev)
        out.append(batch)
    return out


class Model:
    def __init__(self, c, a, dev):
        self.c, self.dev = c, dev
        self.bf16 = a.dtype == "bf16"
        pre = c["mode"] == "pretrain"
        bb_dt = torch.float32 if (pre or not self.bf16) else torch.bfloat16
        torch.manual_seed(a.seed)
        self.bb = init_backbone(c, dev, bb_dt)
        self.dp = init_dfm(c, dev) if not pre else None
        self.trainable = tensors_of(self.bb) if pre else tensors_of(self.dp)
        for t in tensors_of(self.bb):
            t.requires_grad_(pre)
        if not pre:
            for t in self.trainable:
                t.requires_grad_(True)
        self.cos, self.sin = rope_tables(c["seq_len"], c["head_dim"], 10000.0, dev)
        if not pre:
            NC = c["seq_len"] // c["chunk_len"]
            self.pcos, self.psin = rope_tables(NC, c["pred_head_dim"], 10000.0, dev)
            tm = torch.ones(c["seq_len"], 1, device=dev)
            if not c["fuse_first_chunk"]:
                tm[:c["chunk_len"]] = 0
            self.tmask = tm
        self.attn = a.attn
        self.gqa_ok = a.attn == "sdpa" and sdpa_gqa_ok(dev, torch.bfloat16 if self.bf16 else torch.float32)
        self.mse_weight = a.mse_weight
        self.compile_mode = a.compile_mode

    def counts(self):
        n_bb = sum(t.numel() for t in tensors_of(self.bb))
        n_dp = sum(t.numel() for t in tensors_of(self.dp)) if self.dp else 0
        return n_bb + n_dp, sum(t.numel() for t in self.trainable)

    def build_fns(self, compile_):
        c = self.c
        fns = {"layer": make_layer_fn(c["heads"], c["kv_heads"], c["head_dim"], 1e-6, c["qk_norm"], self.attn,
                                      self.gqa_ok),
               "head": make_head_fn(1e-6)}
        if c["mode"] == "dfm":
            pl = make_layer_fn(c["pred_heads"], c["pred_heads"], c["pred_head_dim"], 1e-6, False, self.attn, True)
            fns["memory"] = make_memory_fn(c, pl)
            fns["fusion"] = make_fusion_fn(c["xattn_heads"], c["chunk_len"], c["gates"], 1e-6, self.attn)
        if compile_:
            kw = {"dynamic": False}
            if self.compile_mode and self.compile_mode != "default":
                kw["mode"] = self.compile_mode
            fns = {k: torch.compile(f, **kw) for k, f in fns.items()}
        self.fns = fns

    def loss(self, batch):
        c, f, bb = self.c, self.fns, self.bb
        x = F.embedding(batch["tok"], bb["wte"])
        if c["mode"] == "pretrain":
            for w in bb["layers"]:
                x = f["layer"](x, w, self.cos, self.sin)
            ce = f["head"](x, bb["lnf"], bb["head"], batch["tgt"])
            return ce, ce, None
        fl, pil = c["fusion_layers"], c["pred_input_layer"]
        src = x if pil == 0 else None
        M = mse = None
        for l, w in enumerate(bb["layers"]):
            x = f["layer"](x, w, self.cos, self.sin)
            if l + 1 == pil:
                src = x
            if l in fl:
                if M is None:
                    M, mse = f["memory"](src, batch["tmem"], batch["tmask"], self.dp, self.pcos, self.psin)
                x = f["fusion"](x, M, self.dp["fusion"][fl.index(l)], self.tmask)
        ce = f["head"](x, bb["lnf"], bb["head"], batch["tgt"])
        return ce + self.mse_weight * mse, ce, mse


def make_optimizer(params, lr, dev):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    kw = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8}
    if dev.type == "cuda":
        try:
            return torch.optim.AdamW(groups, fused=True, **kw), "fused"
        except (TypeError, RuntimeError):
            pass
    return torch.optim.AdamW(groups, **kw), "default"


def clip(params, max_norm):
    try:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    except TypeError:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def attn_label(a, c, m):
    if a.attn != "sdpa" or not HAS_SDPA:
        return "manual"
    if c["kv_heads"] == c["heads"]:
        return "sdpa"
    return "sdpa enable_gqa" if m.gqa_ok else "sdpa (k/v repeated)"


def run(a, c, res):
    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
        res["gpu"] = torch.cuda.get_device_name(dev)
    else:
        res["gpu"] = None
        if a.threads > 0:
            torch.set_num_threads(a.threads)
    m = Model(c, a, dev)
    n_all, n_train = m.counts()
    pc = TF.param_counts(c)
    res["params"], res["trainable"] = n_all, n_train
    if (n_all, n_train) != (pc["params"], pc["trainable"]):
        res["note"].append("parameter count %d/%d differs from train_flops.py's %d/%d"
                           % (n_all, n_train, pc["params"], pc["trainable"]))
    res["attn"] = attn_label(a, c, m)
    if a.attn == "sdpa" and not HAS_SDPA:
        res["note"].append("torch %s has no scaled_dot_product_attention: manual attention" % torch.__version__)
    use_compile = bool(a.compile)
    if use_compile and not hasattr(torch, "compile"):
        res["note"].append("torch %s has no torch.compile: eager" % torch.__version__)
        use_compile = False
    if use_compile:  # what Inductor needs on a GPU: triton, a C compiler, Python.h (triton's launcher)
        import shutil
        import sysconfig
        try:
            import triton
            res["triton"] = triton.__version__
        except Exception:  # noqa: BLE001
            res["triton"] = None
        res["cc"] = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
        res["python_h"] = os.path.exists(os.path.join(sysconfig.get_paths().get("include", ""), "Python.h"))
        import torch._dynamo as dyn
        for k in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                  "accumulated_recompile_limit"):
            if hasattr(dyn.config, k):
                setattr(dyn.config, k, max(getattr(dyn.config, k), 64 if "accumulated" not in k else 256))
    m.build_fns(use_compile)
    opt, kind = make_optimizer(m.trainable, a.lr, dev)
    res["optimizer"] = "AdamW (%s)" % kind
    data = make_data(c, a.data_batches, dev, a.seed + 1)
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if m.bf16 else contextlib.nullcontext()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    logf = open(a.log, "w") if a.log else None

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with amp:
            loss, ce, mse = m.loss(batch)
        loss.backward()
        clip(m.trainable, 1.0)
        opt.step()
        return loss.item(), ce.item(), (mse.item() if mse is not None else None)

    times, losses = [], []
    total = a.warmup_steps + a.steps
    res["compiled"] = use_compile
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    for i in range(total):
        batch = data[i % len(data)]
        sync()
        t0 = time.perf_counter()
        if i > 0 or not res["compiled"]:
            lo, ce, mse = step(batch)
        else:  # the first step compiles: on failure retry without enable_gqa, then eager
            fallbacks = ([(True, False)] if m.gqa_ok else []) + [(False, m.gqa_ok)]
            while True:
                try:
                    lo, ce, mse = step(batch)
                    break
                except Exception as e:  # noqa: BLE001
                    if not fallbacks or isinstance(e, torch.cuda.OutOfMemoryError):
                        raise
                    comp, gqa = fallbacks.pop(0)
                    msg = ("%s: %s" % (type(e).__name__, e)).strip().splitlines()
                    res["note"].append("torch.compile%s failed (%s): %s" % (
                        " with enable_gqa" if m.gqa_ok else "", msg[0][:300] if msg else "?",
                        "compiled with k/v repeated instead" if comp else "eager"))
                    print("train_gpu_torch: %s" % res["note"][-1], file=sys.stderr)
                    import torch._dynamo as dyn
                    dyn.reset()
                    m.gqa_ok = gqa
                    m.build_fns(comp)
                    res["compiled"] = comp
                    res["attn"] = attn_label(a, c, m)
                    sync()
                    t0 = time.perf_counter()
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        times.append(ms)
        losses.append(lo)
        rec = {"step": i + 1, "loss": lo, "ce": ce, "mse": mse, "ms": ms, "timed": i >= a.warmup_steps}
        if logf:
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
        if a.verbose:
            print("step %d/%d loss %.4f ms %.1f" % (i + 1, total, lo, ms), file=sys.stderr)
        if not math.isfinite(lo):
            raise RuntimeError("loss is %s at step %d" % (lo, i + 1))
    if logf:
        logf.close()
    timed = times[a.warmup_steps:] or times
    ms = statistics.median(timed)
    tps = c["batch"] * c["seq_len"] / (ms / 1e3)
    res.update({"ms_per_step": ms, "ms_min": min(timed), "tok_per_s": tps,
                "mfu": TF.mfu(res["flops_per_token"], tps, a.peak_tflops),
                "loss_first": losses[0], "loss_last": losses[-1], "warmup_ms": times[:a.warmup_steps]})
    if dev.type == "cuda":
        res["max_mem_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    TF.add_model_args(p)
    p.add_argument("--steps", type=int, default=12, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (compilation)")
    p.add_argument("--compile", action="store_true", help="torch.compile (eager with a note if it fails)")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode (default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: autocast over fp32 master weights, frozen backbone stored in bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--attn", choices=("sdpa", "manual"), default="sdpa")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--mse-weight", type=float, default=1.0)
    p.add_argument("--data-batches", type=int, default=4, help="distinct batches cycled through")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    p.add_argument("--log", default="", help="JSONL, one line per step")
    p.add_argument("--label", default="", help="copied into the JSON")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--write-backbone", default="", metavar="DIR",
                   help="write a random backbone folder for dfm-train and exit")
    a = p.parse_args(argv)
    res = {"impl": "pytorch", "mode": a.mode, "label": a.label, "torch": torch.__version__, "note": []}
    try:
        c = TF.config_from_args(a)
    except ValueError as e:
        res["error"] = str(e)
        print(json.dumps(res))
        return 2
    if a.write_backbone:
        nb = write_backbone(c, a.write_backbone, a.seed)
        print(json.dumps({"wrote": a.write_backbone, "bytes": nb}))
        return 0
    rep = TF.report(c)
    res.update({"batch": c["batch"], "seq_len": c["seq_len"], "tokens_per_step": rep["tokens_per_step"],
                "flops_per_token": rep["flops_per_token"], "peak_tflops": a.peak_tflops, "dtype": a.dtype,
                "device": a.device, "steps": a.steps, "warmup_steps": a.warmup_steps})
    rc = 0
    try:
        run(a, c, res)
    except Exception as e:  # noqa: BLE001 — the bench records the error and goes on
        tb = traceback.format_exc()
        print(tb, file=sys.stderr)
        res["error"] = ("%s: %s" % (type(e).__name__, e))[:2000]
        rc = 1
    res["note"] = "; ".join(res["note"])
    print(json.dumps(res))
    return rc


if __name__ == "__main__":
    sys.exit(main())
