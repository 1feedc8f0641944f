"""dfm_torch.py — the DFM model of trainer/model/model.h in PyTorch: one implementation for the fp64 parity test
(tests/py/train/test_train_torch_parity.py) and for the CPU and GPU speed benchmarks (bench/trainer/bench_train.sh,
bench/trainer/train_gpu_torch.py), which only time it.

Parameters are a dict of tensors under dfm-train's names (Hugging Face names for the backbone,
"dfm.*" for the modules: trainer/model/model.c model_backbone_tensors / model_dfm_tensors); configurations
are dfm-train's JSON: the backbone's Hugging Face config.json and the DFM config (trainer/model/model_config.c
dfm_config_to_json; {"enabled": False} for pretraining). What varies between the users is a parameter:
  - dtype: whatever the parameters are stored in (float64 for parity; fp32 master weights, a bf16 frozen
    backbone and autocast for the GPU benchmark); norms and softmaxes of bf16/fp16 inputs run in fp32;
  - attn: "manual" (explicit scores and masks) or "sdpa" (F.scaled_dot_product_attention);
  - compile: torch.compile of the decoder layer, fusion block, memory path and LM head + CE.

The model (what trainer/model/model.h computes):
  backbone: embedding -> N x [RMSNorm -> q,k,v (GQA, no bias) -> per-head q/k RMSNorm (Qwen3) -> RoPE
  (rotate_half) -> causal softmax attention -> o_proj -> residual; RMSNorm -> SwiGLU -> residual] ->
  RMSNorm -> LM head (tied or not) -> next-token CE over positions whose target is >= 0.
  DFM: predictor over chunk means of frozen states (input embeddings or layer pred_input_layer-1's output;
  chunk i reads chunk i-1's mean through Linear C->P, chunk 0 a learned placeholder; causal decoder
  layers over chunks; RMSNorm; Linear P->K*d); shared projector LayerNorm(d) -> Linear d->H -> GELU(erf)
  -> Linear H->C; fusion blocks after the given decoder layers: token s attends the K projected slots of
  chunk (s + 1) // L ("memory_align": "next"; the last token attends nothing) or s // L ("same"), gated
  residual (sigmoid gate per head or per channel). A chunk whose slots are all masked gets no update.
  Memory fused: predicted, target, none, or per chunk (teacher forcing: mem_src[b, c] = 1 takes the
  target; no gradient reaches the predictor through a target chunk). Loss = CE + mse_weight * predictor
  loss, where the predictor loss is the slot MSE summed over d and averaged over valid slots
  ("pred_loss": "mse") or averaged over all K*d elements of valid slots ("mse_elem", configurations
  written before the choice existed). The reported "mse" is always the per-element mean.
"""
import json
import struct

import torch
import torch.nn.functional as F

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


def read_safetensors(path):
    """(tensors by name, metadata) of a safetensors file (F32, I32, U8, BF16)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    data = buf[8 + n:]
    dt = {"F32": torch.float32, "I32": torch.int32, "U8": torch.uint8, "BF16": torch.bfloat16}
    out = {}
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:e]), dtype=dt[t["dtype"]]).reshape(t["shape"]) if e > b \
            else torch.zeros(t["shape"], dtype=dt[t["dtype"]])
    return out, meta


def decoder_config(bc):
    """The stack configuration of a Hugging Face config.json (as trainer/model/model_config.c reads it)."""
    nh = bc["num_attention_heads"]
    return {"n_layers": bc["num_hidden_layers"], "hidden": bc["hidden_size"], "n_heads": nh,
            "n_kv_heads": bc.get("num_key_value_heads", nh), "head_dim": bc.get("head_dim", bc["hidden_size"] // nh),
            "ffn": bc["intermediate_size"], "eps": bc.get("rms_norm_eps", 1e-6),
            "rope_theta": bc.get("rope_theta", 10000.0), "qk_norm": bc["architectures"][0] == "Qwen3ForCausalLM"}


def _low(x):
    return x.dtype in (torch.bfloat16, torch.float16)


def rmsnorm(x, w, eps):
    xf = x.float() if _low(x) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.to(xf.dtype))
    return y.to(x.dtype)


def rope(x, theta):
    """x [B, T, H, hd]; Hugging Face rotate_half; angles in fp32 as HF computes them."""
    T, hd = x.shape[1], x.shape[3]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float32, device=x.device), inv)
    cos, sin = ang.cos().to(x.dtype)[None, :, None, :], ang.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, causal, impl, mask=None):
    """q [B, nh, Tq, hd], k/v [B, nkv, Tk, hd] (GQA: k/v repeated), mask [B|1, 1, Tq|1, Tk] bool (True =
    attend; every row must keep one) -> [B, nh, Tq, hd]."""
    nh, nkv = q.shape[1], k.shape[1]
    if nh != nkv:
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    if impl == "sdpa" and HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril(),
                          float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = (s.float() if _low(s) else s).softmax(-1).to(v.dtype)
    return p @ v


def decoder_layer(x, P, pre, c, impl):
    B, T, _ = x.shape
    nh, nkv, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    h = rmsnorm(x, P[pre + "input_layernorm.weight"], c["eps"])
    q = F.linear(h, P[pre + "self_attn.q_proj.weight"]).view(B, T, nh, hd)
    k = F.linear(h, P[pre + "self_attn.k_proj.weight"]).view(B, T, nkv, hd)
    v = F.linear(h, P[pre + "self_attn.v_proj.weight"]).view(B, T, nkv, hd)
    if c["qk_norm"]:
        q = rmsnorm(q, P[pre + "self_attn.q_norm.weight"], c["eps"])
        k = rmsnorm(k, P[pre + "self_attn.k_norm.weight"], c["eps"])
    q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
    y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True, impl)
    x = x + F.linear(y.transpose(1, 2).reshape(B, T, nh * hd), P[pre + "self_attn.o_proj.weight"])
    h = rmsnorm(x, P[pre + "post_attention_layernorm.weight"], c["eps"])
    g = F.linear(h, P[pre + "mlp.gate_proj.weight"])
    u = F.linear(h, P[pre + "mlp.up_proj.weight"])
    return x + F.linear(F.silu(g) * u, P[pre + "mlp.down_proj.weight"])


def memory_shift(dc):
    """Rows a token is moved by before its chunk is taken: 1 for "next", 0 for "same" (the default of
    configurations without the field)."""
    return 1 if dc.get("memory_align", "same") == "next" else 0


def fusion_block(h, M, mask, P, f, dc, eps, impl):
    """h [B,T,C]; M [B,NC,K,C]; mask [B,NC,K] bool. Token s attends chunk (s + shift) // L; the queries are
    shifted right by `shift` rows and padded to NC+1 chunks of L, so each chunk's L rows attend its K slots
    in one batched product; the extra chunk NC (after the sequence) has no memory."""
    B, T, C = h.shape
    L, nhx, shift = dc["chunk_len"], dc["xattn_heads"], memory_shift(dc)
    NC, K, hdx = M.shape[1], M.shape[2], C // nhx
    pre = "dfm.fusion.%d." % f
    xn = rmsnorm(h, P[pre + "norm.weight"], eps)
    q = F.linear(xn, P[pre + "q_proj.weight"])
    q = F.pad(q, (0, 0, shift, L - shift))  # [B, (NC+1)*L, C]
    q = q.view(B, NC + 1, L, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * (NC + 1), nhx, L, hdx)
    k = F.pad(F.linear(M, P[pre + "k_proj.weight"]), (0, 0, 0, 0, 0, 1))  # [B, NC+1, K, C]
    v = F.pad(F.linear(M, P[pre + "v_proj.weight"]), (0, 0, 0, 0, 0, 1))
    k = k.view(B, NC + 1, K, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * (NC + 1), nhx, K, hdx)
    v = v.view(B, NC + 1, K, nhx, hdx).permute(0, 1, 3, 2, 4).reshape(B * (NC + 1), nhx, K, hdx)
    mk = F.pad(mask, (0, 0, 0, 1))  # [B, NC+1, K]
    has = mk.any(-1)  # chunks with memory; the others attend everything and are zeroed (no update)
    am = (mk | ~has[..., None]).reshape(B * (NC + 1), 1, 1, K)
    y = attention(q, k, v, False, impl, am) * has.reshape(-1, 1, 1, 1).to(q.dtype)
    y = y.view(B, NC + 1, nhx, L, hdx).permute(0, 1, 3, 2, 4).reshape(B, (NC + 1) * L, C)[:, shift:shift + T]
    o = F.linear(y, P[pre + "o_proj.weight"])
    g = torch.sigmoid(F.linear(h, P[pre + "gate.weight"], P[pre + "gate.bias"]))
    if g.shape[-1] != C:  # one gate per head
        g = g.repeat_interleave(C // g.shape[-1], dim=-1)
    return h + (g * o).to(h.dtype)


def memory(src, P, dc, tgt_mem, tgt_mask, mem, mem_src, impl):
    """Predictor, the memory fed to the projector, the projector. src [B,T,C] frozen states; tgt_mem
    [B,NC,K,d] and tgt_mask [B,NC,K] bool or None. Returns (M [B,NC,K,C] or None, slot mask [B,NC,K],
    slots [B,NC,K,d], mse per element, predictor loss) (the last two 0 without targets)."""
    B, T = src.shape[0], src.shape[1]
    L, K, d = dc["chunk_len"], dc["n_slots"], dc["d_mem"]
    NC = T // L
    pc = dict(dc["predictor"])
    wdt = P["dfm.predictor.in_proj.weight"].dtype
    tail = dc.get("pred_input_tokens", 0) or L  # the last `tail` tokens of chunk i; chunk i+1 reads their mean
    pool = src.detach().to(wdt).reshape(B, NC, L, -1)[:, :, L - tail:].mean(2)
    u = F.linear(pool[:, :-1], P["dfm.predictor.in_proj.weight"], P["dfm.predictor.in_proj.bias"])
    x = torch.cat([P["dfm.predictor.placeholder"].to(u.dtype).view(1, 1, -1).expand(B, 1, -1), u], dim=1)
    for l in range(pc["n_layers"]):
        x = decoder_layer(x, P, "dfm.predictor.layers.%d." % l, pc, impl)
    x = rmsnorm(x, P["dfm.predictor.norm.weight"], pc["eps"])
    slots = F.linear(x, P["dfm.predictor.out_proj.weight"], P["dfm.predictor.out_proj.bias"])
    if "dfm.predictor.skip.weight" in P:  # the linear path from the pooled input; chunk 0 has no input
        skip = F.linear(pool[:, :-1], P["dfm.predictor.skip.weight"].to(wdt))
        slots = slots + torch.cat([torch.zeros_like(skip[:, :1]), skip], dim=1)
    slots = slots.view(B, NC, K, d)
    zero = torch.zeros((), dtype=slots.dtype, device=slots.device)
    mse = ploss = zero
    if tgt_mem is not None:
        tm = tgt_mask.to(slots.dtype)[..., None]
        se = (slots.float() if _low(slots) else slots) - tgt_mem
        sq = (se * se * tm).sum()
        nv = tm.sum()
        mse = sq / (nv * d)
        ploss = mse if dc.get("pred_loss", "mse_elem") == "mse_elem" else sq / nv
    if mem == "none":
        return None, None, slots, mse, ploss
    pm = torch.ones(B, NC, K, dtype=torch.bool, device=slots.device)
    if not dc["fuse_first_chunk"]:
        pm[:, 0] = False
    if mem == "predicted":
        fed, fm = slots, pm
    else:
        src_t = torch.ones(B, NC, dtype=torch.bool, device=slots.device) if mem == "target" else mem_src.bool()
        w = src_t[..., None, None]
        fed = torch.where(w, tgt_mem.to(slots.dtype), slots)  # a target chunk passes no gradient to the slots
        fm = torch.where(src_t[..., None], tgt_mask.bool(), pm)
    y = F.layer_norm(fed.float() if _low(fed) else fed, (d,), P["dfm.projector.norm.weight"],
                     P["dfm.projector.norm.bias"], 1e-5)
    y = F.gelu(F.linear(y, P["dfm.projector.fc1.weight"], P["dfm.projector.fc1.bias"]))
    M = F.linear(y, P["dfm.projector.fc2.weight"], P["dfm.projector.fc2.bias"])
    return M, fm, slots, mse, ploss


def head_ce(x, lnf, head, targets, eps):
    """Per-row CE (0 where the target is -1) of the final norm + LM head."""
    h = rmsnorm(x, lnf, eps)
    logits = F.linear(h, head)
    lg = logits.float() if _low(logits) else logits
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1).long(), reduction="none",
                           ignore_index=-1), h


class DfmTorch:
    """The model over a parameter dict. forward(...) returns a dict: loss, ce, mse, pred_loss (tensors),
    rows (per-row CE), acts (named activations for the parity test: act.x_layer_in, act.lnf_out,
    act.row_losses, act.slots, act.mem)."""

    def __init__(self, bc, dc, attn="manual", compile=False, compile_mode="default"):
        self.bc, self.dc, self.dec, self.attn = bc, dc, decoder_config(bc), attn
        fns = {"layer": decoder_layer, "fusion": fusion_block, "memory": memory, "head": head_ce}
        if compile:
            kw = {"dynamic": False}
            if compile_mode and compile_mode != "default":
                kw["mode"] = compile_mode
            fns = {k: torch.compile(f, **kw) for k, f in fns.items()}
        self.fns = fns

    def forward(self, P, tokens, targets, tgt_mem=None, tgt_mask=None, mem="predicted", mem_src=None,
                keep_acts=False):
        """tokens, targets [B,T] (targets -1: no target); tgt_mem [B*NC*K, d] or [B,NC,K,d], tgt_mask likewise
        (bool/uint8); mem: predicted | target | none | mixed (mem_src [B,NC], 1 = target)."""
        f, dc, dec, bc = self.fns, self.dc, self.dec, self.bc
        B, T = tokens.shape
        enabled = dc.get("enabled", False)
        x = F.embedding(tokens.long(), P["model.embed_tokens.weight"])
        xs = [x]
        acts = {}
        fl = dc["fusion_layers"] if enabled else []
        zero = torch.zeros((), dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
        mse = ploss = zero
        M = fm = None
        done = False
        if enabled and tgt_mem is not None:
            NC, K = T // dc["chunk_len"], dc["n_slots"]
            tgt_mem = tgt_mem.reshape(B, NC, K, dc["d_mem"]).to(P["dfm.predictor.in_proj.weight"].dtype)
            tgt_mask = tgt_mask.reshape(B, NC, K).bool()
        for l in range(dec["n_layers"]):
            x = f["layer"](x, P, "model.layers.%d." % l, dec, self.attn)
            if l in fl:
                if not done:
                    src = xs[dc.get("pred_input_layer", 0)]
                    M, fm, slots, mse, ploss = f["memory"](src, P, dc, tgt_mem, tgt_mask, mem, mem_src, self.attn)
                    done = True
                    if keep_acts:
                        acts["act.slots"] = slots.reshape(-1, dc["d_mem"])
                        if M is not None:
                            acts["act.mem"] = M.reshape(-1, M.shape[-1])
                if M is not None:
                    x = f["fusion"](x, M, fm, P, fl.index(l), dc, dec["eps"], self.attn)
            xs.append(x)
        head = P["model.embed_tokens.weight"] if bc["tie_word_embeddings"] else P["lm_head.weight"]
        rows, h = f["head"](x, P["model.norm.weight"], head, targets, dec["eps"])
        ce = rows.sum() / (targets >= 0).sum()
        loss = ce + (dc["mse_weight"] * ploss if enabled and tgt_mem is not None else 0.0)
        if keep_acts:
            acts["act.x_layer_in"] = torch.stack(xs).reshape(dec["n_layers"] + 1, B * T, -1)
            acts["act.lnf_out"] = h.reshape(B * T, -1)
            acts["act.row_losses"] = rows
        return {"loss": loss, "ce": ce, "mse": mse, "pred_loss": ploss, "rows": rows, "acts": acts}


def random_params(bc, dc, device="cpu", backbone_dtype=torch.float32, dfm_dtype=torch.float32, std=0.02):
    """Parameters of the given shapes initialised as dfm-train does (normal(0, std) matrices, the projector's
    and fusion's of std 1/sqrt(fan_in), unit norms, zero biases, gate weight 0 and bias gate_bias): every
    tensor under its dfm-train name."""
    dec = decoder_config(bc)
    C, V = dec["hidden"], bc["vocab_size"]

    def n(shape, dt):
        return (torch.randn(*shape, device=device, dtype=torch.float32) * std).to(dt)

    def fan_in(shape, dt):  # projector and fusion matrices: std 1/sqrt(fan_in)
        return (torch.randn(*shape, device=device, dtype=torch.float32) / shape[1] ** 0.5).to(dt)

    def one(k, dt):
        return torch.ones(k, device=device, dtype=dt)

    def zer(k, dt):
        return torch.zeros(k, device=device, dtype=dt)

    def stack(pre, c, dt):
        out, nh, nkv, hd = {}, c["n_heads"], c["n_kv_heads"], c["head_dim"]
        for l in range(c["n_layers"]):
            p = "%s.layers.%d." % (pre, l)
            out[p + "input_layernorm.weight"] = one(c["hidden"], dt)
            out[p + "self_attn.q_proj.weight"] = n((nh * hd, c["hidden"]), dt)
            out[p + "self_attn.k_proj.weight"] = n((nkv * hd, c["hidden"]), dt)
            out[p + "self_attn.v_proj.weight"] = n((nkv * hd, c["hidden"]), dt)
            if c["qk_norm"]:
                out[p + "self_attn.q_norm.weight"] = one(hd, dt)
                out[p + "self_attn.k_norm.weight"] = one(hd, dt)
            out[p + "self_attn.o_proj.weight"] = n((c["hidden"], nh * hd), dt)
            out[p + "post_attention_layernorm.weight"] = one(c["hidden"], dt)
            out[p + "mlp.gate_proj.weight"] = n((c["ffn"], c["hidden"]), dt)
            out[p + "mlp.up_proj.weight"] = n((c["ffn"], c["hidden"]), dt)
            out[p + "mlp.down_proj.weight"] = n((c["hidden"], c["ffn"]), dt)
        return out

    bdt = backbone_dtype
    P = {"model.embed_tokens.weight": n((V, C), bdt)}
    P.update(stack("model", dec, bdt))
    P["model.norm.weight"] = one(C, bdt)
    if not bc["tie_word_embeddings"]:
        P["lm_head.weight"] = n((V, C), bdt)
    if not dc.get("enabled", False):
        return P
    t = dfm_dtype
    pc = dict(dc["predictor"])
    Pp, K, d, H = pc["hidden"], dc["n_slots"], dc["d_mem"], dc["proj_hidden"]
    G = C if dc["gate"] == "channel" else dc["xattn_heads"]
    P.update({"dfm.predictor.in_proj.weight": n((Pp, C), t), "dfm.predictor.in_proj.bias": zer(Pp, t),
              "dfm.predictor.placeholder": n((Pp,), t)})
    P.update(stack("dfm.predictor", pc, t))
    P.update({"dfm.predictor.norm.weight": one(Pp, t), "dfm.predictor.out_proj.weight": n((K * d, Pp), t),
              "dfm.predictor.out_proj.bias": zer(K * d, t), "dfm.projector.norm.weight": one(d, t),
              "dfm.projector.norm.bias": zer(d, t), "dfm.projector.fc1.weight": fan_in((H, d), t),
              "dfm.projector.fc1.bias": zer(H, t), "dfm.projector.fc2.weight": fan_in((C, H), t),
              "dfm.projector.fc2.bias": zer(C, t)})
    for f in range(len(dc["fusion_layers"])):
        p = "dfm.fusion.%d." % f
        P.update({p + "norm.weight": one(C, t), p + "q_proj.weight": fan_in((C, C), t),
                  p + "k_proj.weight": fan_in((C, C), t), p + "v_proj.weight": fan_in((C, C), t),
                  p + "o_proj.weight": fan_in((C, C), t),
                  p + "gate.weight": zer((G, C), t), p + "gate.bias": torch.full((G,), float(dc["gate_bias"]),
                                                                                device=device, dtype=t)})
    return P


def configs_from_flops(c):
    """(Hugging Face config, DFM config) of a tests/ref/train_flops.py configuration c."""
    bc = {"architectures": ["Qwen3ForCausalLM" if c["qk_norm"] else "LlamaForCausalLM"], "vocab_size": c["vocab"],
          "hidden_size": c["hidden"], "intermediate_size": c["ffn"], "num_hidden_layers": c["layers"],
          "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"],
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": c["seq_len"],
          "tie_word_embeddings": c["tied"]}
    if c["mode"] != "dfm":
        return bc, {"enabled": False}
    dc = {"enabled": True, "chunk_len": c["chunk_len"], "n_slots": c["slots"], "d_mem": c["d_mem"],
          "predictor": {"n_layers": c["pred_layers"], "hidden": c["pred_hidden"], "n_heads": c["pred_heads"],
                        "n_kv_heads": c["pred_heads"], "head_dim": c["pred_head_dim"], "ffn": c["pred_ffn"],
                        "qk_norm": False, "eps": 1e-6, "rope_theta": 10000.0},
          "proj_hidden": c["proj_hidden"], "fusion_layers": list(c["fusion_layers"]),
          "xattn_heads": c["xattn_heads"], "gate": "channel" if c["gates"] == c["hidden"] and
          c["gates"] != c["xattn_heads"] else "head", "gate_bias": 0.0, "mse_weight": c.get("mse_weight", 1.0),
          "fuse_first_chunk": bool(c["fuse_first_chunk"]), "init_std": 0.02,
          "pred_input_layer": c["pred_input_layer"], "memory_align": c.get("memory_align", "next"),
          "pred_loss": c.get("pred_loss", "mse")}
    return bc, dc
