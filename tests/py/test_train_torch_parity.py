"""PyTorch parity of the CPU reference trainer (dfm-train), in the manner of llm.c's test_gpt2.

`dfm-train debug-state` builds a tiny random model, runs one training forward + backward and dumps
parameters, inputs, loss, every trainable gradient and some activations (safetensors). This file
re-implements the same model independently in PyTorch (float64, autograd), recomputes everything
from the dumped parameters and inputs, and compares tensor by tensor with per-tensor tolerances.
It prints the worst error of each kind and exits non-zero on any mismatch.

Variants: dfm-head (Qwen3 with QK-norm, tied head, per-head gates), dfm-channel (Llama, untied,
per-channel gates), pretrain (backbone trainable: gradients of every backbone weight).
Run: $DFM_PYTHON tests/py/test_train_torch_parity.py   (DFM_TRAIN = path of dfm-train)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
DT = torch.float64

# tolerances: fp32 C vs float64 PyTorch, norm-wise relative error of a tensor
TOL_LOSS = 1e-6
TOL_ACT = 1e-5
TOL_GRAD = 1e-4


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    hdr = json.loads(buf[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    data = buf[8 + n:]
    dt = {"F32": torch.float32, "I32": torch.int32, "U8": torch.uint8}
    out = {}
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        x = torch.frombuffer(bytearray(data[b:e]), dtype=dt[t["dtype"]]).reshape(t["shape"]) if e > b else \
            torch.zeros(t["shape"], dtype=dt[t["dtype"]])
        out[name] = x
    return out, meta


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):
    # x [B, T, H, hd]; Hugging Face rotate_half convention, inv_freq and angles computed in fp32 as HF does
    T, hd = x.shape[1], x.shape[3]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(DT)[None, :, None, :], ang.sin().to(DT)[None, :, None, :]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def decoder_layer(x, P, pre, c):
    B, T, C = x.shape
    nh, nkv, hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
    h = rmsnorm(x, P[pre + "input_layernorm.weight"], c["eps"])
    q = (h @ P[pre + "self_attn.q_proj.weight"].T).view(B, T, nh, hd)
    k = (h @ P[pre + "self_attn.k_proj.weight"].T).view(B, T, nkv, hd)
    v = (h @ P[pre + "self_attn.v_proj.weight"].T).view(B, T, nkv, hd)
    if c["qk_norm"]:
        q = rmsnorm(q, P[pre + "self_attn.q_norm.weight"], c["eps"])
        k = rmsnorm(k, P[pre + "self_attn.k_norm.weight"], c["eps"])
    q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
    k = k.repeat_interleave(nh // nkv, dim=2)
    v = v.repeat_interleave(nh // nkv, dim=2)
    s = torch.einsum("bthd,buhd->bhtu", q, k) / hd ** 0.5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~causal, float("-inf"))
    p = s.softmax(-1)
    y = torch.einsum("bhtu,buhd->bthd", p, v).reshape(B, T, nh * hd)
    x = x + y @ P[pre + "self_attn.o_proj.weight"].T
    h = rmsnorm(x, P[pre + "post_attention_layernorm.weight"], c["eps"])
    g = h @ P[pre + "mlp.gate_proj.weight"].T
    u = h @ P[pre + "mlp.up_proj.weight"].T
    return x + (F.silu(g) * u) @ P[pre + "mlp.down_proj.weight"].T


def fusion_block(h, M, mask, P, f, dc, eps):
    # h [B,T,C], M [B,NC,K,C], mask [B,NC,K] bool: tokens attend to the K slots of their own chunk
    B, T, C = h.shape
    L, nhx = dc["chunk_len"], dc["xattn_heads"]
    hdx = C // nhx
    pre = "dfm.fusion.%d." % f
    xn = rmsnorm(h, P[pre + "norm.weight"], eps)
    q = (xn @ P[pre + "q_proj.weight"].T).view(B, T, nhx, hdx)
    k = (M @ P[pre + "k_proj.weight"].T).view(B, M.shape[1], M.shape[2], nhx, hdx)
    v = (M @ P[pre + "v_proj.weight"].T).view(B, M.shape[1], M.shape[2], nhx, hdx)
    chunk = torch.arange(T) // L
    kt, vt, mt = k[:, chunk], v[:, chunk], mask[:, chunk]  # [B,T,K,nhx,hdx], [B,T,K]
    s = torch.einsum("bthd,btkhd->bthk", q, kt) / hdx ** 0.5
    s = s.masked_fill(~mt[:, :, None, :], -1e30)
    p = s.softmax(-1) * mt.any(-1)[:, :, None, None].to(DT)  # a chunk without memory: no update
    y = torch.einsum("bthk,btkhd->bthd", p, vt).reshape(B, T, C)
    o = y @ P[pre + "o_proj.weight"].T
    g = torch.sigmoid(h @ P[pre + "gate.weight"].T + P[pre + "gate.bias"])
    if g.shape[-1] != C:  # one gate per head
        g = g.repeat_interleave(C // g.shape[-1], dim=-1)
    return h + g * o


def predictor(h, P, bc, dc):
    # h [B,T,C]: the frozen states the predictor pools (input embeddings or a layer's output), no gradient
    B, T = h.shape[0], h.shape[1]
    L, NC = dc["chunk_len"], T // dc["chunk_len"]
    pc = dict(dc["predictor"])
    pool = h.detach().reshape(B, NC, L, -1).mean(2)  # chunk i's mean; chunk i+1 reads it
    u = pool[:, :-1] @ P["dfm.predictor.in_proj.weight"].T + P["dfm.predictor.in_proj.bias"]
    ph = P["dfm.predictor.placeholder"].view(1, 1, -1).expand(B, 1, -1)
    x = torch.cat([ph, u], dim=1)
    for l in range(pc["n_layers"]):
        x = decoder_layer(x, P, "dfm.predictor.layers.%d." % l, pc)
    x = rmsnorm(x, P["dfm.predictor.norm.weight"], pc["eps"])
    out = x @ P["dfm.predictor.out_proj.weight"].T + P["dfm.predictor.out_proj.bias"]
    return out.view(B, NC, dc["n_slots"], dc["d_mem"])


def projector(slots, P):
    d = slots.shape[-1]
    x = F.layer_norm(slots, (d,), P["dfm.projector.norm.weight"], P["dfm.projector.norm.bias"], 1e-5)
    x = F.gelu(x @ P["dfm.projector.fc1.weight"].T + P["dfm.projector.fc1.bias"])
    return x @ P["dfm.projector.fc2.weight"].T + P["dfm.projector.fc2.bias"]


def model_loss(P, inp, bc, dc, tgt_mem=None, tgt_mask=None):
    tokens, targets = inp
    B, T = tokens.shape
    C, NL = bc["hidden_size"], bc["num_hidden_layers"]
    dec = {"n_heads": bc["num_attention_heads"], "n_kv_heads": bc["num_key_value_heads"],
           "head_dim": bc["head_dim"], "eps": bc["rms_norm_eps"], "rope_theta": bc["rope_theta"],
           "qk_norm": bc["architectures"][0] == "Qwen3ForCausalLM"}
    acts = {}
    enabled = dc["enabled"]
    mse = torch.zeros((), dtype=DT)
    x = P["model.embed_tokens.weight"][tokens.long()]
    xs = [x]
    fl = dc["fusion_layers"] if enabled else []
    M = fmask = None

    def memory():
        nonlocal mse
        NC, K = T // dc["chunk_len"], dc["n_slots"]
        slots = predictor(xs[dc.get("pred_input_layer", 0)], P, bc, dc)
        mem = projector(slots, P)
        fm = torch.ones(B, NC, K, dtype=torch.bool)
        if not dc["fuse_first_chunk"]:
            fm[:, 0] = False
        acts["act.slots"] = slots.reshape(-1, dc["d_mem"])
        acts["act.mem"] = mem.reshape(-1, C)
        tm = tgt_mask.view(B, NC, K).bool()
        diff = (slots - tgt_mem.view(B, NC, K, -1)) ** 2 * tm[..., None].to(DT)
        mse = diff.sum() / (tm.sum() * dc["d_mem"])
        return mem, fm

    for l in range(NL):
        x = decoder_layer(x, P, "model.layers.%d." % l, dec)
        if l in fl:
            if M is None:
                M, fmask = memory()
            x = fusion_block(x, M, fmask, P, fl.index(l), dc, dec["eps"])
        xs.append(x)
    acts["act.x_layer_in"] = torch.stack(xs).reshape(NL + 1, B * T, C)
    x = rmsnorm(x, P["model.norm.weight"], dec["eps"])
    acts["act.lnf_out"] = x.reshape(B * T, C)
    head = P["model.embed_tokens.weight"] if bc["tie_word_embeddings"] else P["lm_head.weight"]
    logits = x @ head.T
    tg = targets.view(-1).long()
    rows = F.cross_entropy(logits.view(B * T, -1), tg, reduction="none", ignore_index=-1)  # -1: padding
    acts["act.row_losses"] = rows
    ce = rows.sum() / (tg >= 0).sum()
    loss = ce + (dc["mse_weight"] * mse if enabled else 0.0)
    return loss, ce, mse, acts


def rel_err(a, b):
    a, b = a.to(DT), b.to(DT)
    den = max(a.norm().item(), b.norm().item(), 1e-12)
    return (a - b).norm().item() / den


def check_variant(variant, tmp):
    path = os.path.join(tmp, variant + ".safetensors")
    subprocess.run([DFM_TRAIN, "debug-state", "--out", path, "--variant", variant, "--seed", "3"], check=True)
    T, meta = read_safetensors(path)
    bc = json.loads(meta["backbone_config"])
    dc = json.loads(meta["dfm_config"])
    params = {k: v.to(DT) for k, v in T.items() if k.startswith("model.") or k.startswith("lm_head")
              or k.startswith("dfm.")}
    trainable = [k for k in params if (k.startswith("dfm.") if dc["enabled"] else True)]
    for k in params:
        params[k].requires_grad_(k in trainable)
    tgt_mem = T.get("in.tgt_mem")
    loss, ce, mse, acts = model_loss(params, (T["in.tokens"], T["in.targets"]), bc, dc,
                                     tgt_mem.to(DT) if tgt_mem is not None else None, T.get("in.tgt_mask"))
    loss.backward()
    fails = []
    worst = {"loss": (0, ""), "act": (0, ""), "grad": (0, "")}

    def note(kind, name, err, tol):
        print("  %-8s %-56s rel_err %.3e (tol %.0e)" % (kind, name, err, tol))
        if err > worst[kind][0]:
            worst[kind] = (err, name)
        if not err <= tol:
            fails.append("%s %s %.3e > %.0e" % (variant, name, err, tol))

    print("variant %s: loss C %.7f torch %.7f" % (variant, T["out.loss"].item(), loss.item()))
    for nm, val in (("out.loss", loss), ("out.ce", ce), ("out.mse", mse)):
        note("loss", nm, abs(T[nm].item() - val.item()) / max(abs(val.item()), 1e-12), TOL_LOSS)
    for nm, val in acts.items():
        if nm in T:
            note("act", nm, rel_err(T[nm], val.detach()), TOL_ACT)
    n_grads = 0
    for k in trainable:
        g = params[k].grad
        gk = "grad." + k
        if gk not in T:
            fails.append("%s: C dump lacks %s" % (variant, gk))
            continue
        n_grads += 1
        note("grad", k, rel_err(T[gk], g if g is not None else torch.zeros_like(params[k])), TOL_GRAD)
    extra = [k for k in T if k.startswith("grad.") and k[5:] not in trainable]
    if extra:
        fails.append("%s: C dumped gradients of frozen tensors: %s" % (variant, extra[:3]))
    print("variant %s: %d gradient tensors; worst loss %.2e (%s), activation %.2e (%s), gradient %.2e (%s)"
          % (variant, n_grads, worst["loss"][0], worst["loss"][1], worst["act"][0], worst["act"][1],
             worst["grad"][0], worst["grad"][1]))
    return fails, worst


def main():
    torch.manual_seed(0)
    if not os.path.exists(DFM_TRAIN):
        print("dfm-train not built at %s" % DFM_TRAIN)
        return 1
    all_fails = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("dfm-head", "dfm-channel", "pretrain"):
            fails, _ = check_variant(variant, tmp)
            all_fails += fails
    if all_fails:
        print("FAILED:\n  " + "\n  ".join(all_fails))
        return 1
    print("PASS: C reference trainer matches PyTorch (float64) on every tensor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
