#!/usr/bin/env python3
"""train_flops.py — model FLOPs per token of one dfm-train training step, and parameter counts.

One formula shared by both sides of bench/trainer/bench_train_gpu.sh (dfm-train's CUDA path and the PyTorch peer
bench/trainer/train_gpu_torch.py), so their MFU figures are computed the same way. Standard library only.

    python3 tests/ref/train_flops.py --mode pretrain --layers 12 --hidden 768 --heads 12 --kv-heads 12 \
        --ffn 2048 --vocab 50304 --seq-len 1024
    python3 tests/ref/train_flops.py --mode dfm ... --fusion-layers 3,5,8,11      # prints one JSON line

Convention ("model FLOPs", matmuls only; llm.c's train_gpt2.cu `6*N + 6*L*C*T` is the reference):
  - A GEMM of [M,K] x [K,N] is 2*M*N*K FLOPs. Norms, RoPE, softmax, SwiGLU/GELU, sigmoid, residual adds,
    the embedding lookup/scatter, CE's softmax, MSE and the optimizer are not counted.
  - A weight matmul costs 1x its forward FLOPs in the forward, +1x for the activation gradient (dgrad)
    when its input needs a gradient, +1x for the weight gradient (wgrad) when the weight is trainable:
    3x forward when both (pretraining: every matmul, so 6 FLOPs per weight per token = llm.c's 6N
    with tied embeddings, since the tied LM head is the one matmul of the embedding matrix).
  - Attention score (Q K^T) and value (P V) matmuls, causal, are counted at half the square: per token
    and per layer 2*nh*hd*T forward (llm.c and PaLM count 4*nh*hd*T forward without the causal halving:
    PaLM's 12*L*H*Q*T per token for forward + backward is 2x our 6*L*H*Q*T). They have no weights, so
    their backward (dQ, dK from dS; dP, dV from dO) is always 2x their forward whenever anything below
    needs a gradient. FlashAttention's forward recomputation in the backward is not counted (hardware
    FLOPs, not model FLOPs).
  - DFM mode (frozen backbone, lowest fusion block after decoder layer f0, 0-based):
      * decoder layers 0..f0 and the predictor's input pooling run forward only (1x);
      * decoder layers f0+1..NL-1: weight matmuls 2x (forward + dgrad, no wgrad), attention core 3x;
      * LM head (frozen, tied or not): 2x (forward + dgrad of the final hidden state);
      * predictor: in_proj over the NC-1 real chunk means 2x (forward + wgrad; its input is frozen),
        its causal decoder layers over NC chunk positions (attention causal over NC) 3x, out_proj 3x;
      * projector (LayerNorm -> d->H -> GELU -> H->C) over NC*K slots per sequence: 3x;
      * fusion block: q, o and gate projections over every token, k and v projections of the NC*K
        projected slots, cross-attention scores + values of every token against the K slots of its own
        chunk (no causal halving: 4*C*K per token forward); all 3x, except the q and gate projections of
        the lowest block, whose input h needs no gradient (2x: forward + wgrad). Chunk 0 (masked out
        unless --fuse-first-chunk) is counted like the others: both implementations compute it.
  - FLOPs per token = FLOPs of one step over one sequence / T (independent of the batch size).
MFU = FLOPs per token * tokens per second / peak. Peak: --peak-tflops, default $DFM_PEAK_TFLOPS or 989.4
(NVIDIA H200 SXM, dense BF16 tensor-core, no sparsity).
"""
import argparse
import json
import os
import sys

H200_BF16_DENSE_TFLOPS = 989.4


def peak_tflops_default():
    try:
        return float(os.environ.get("DFM_PEAK_TFLOPS", H200_BF16_DENSE_TFLOPS))
    except ValueError:
        return H200_BF16_DENSE_TFLOPS


def default_fusion_layers(n_layers):
    """dfm-train's default (trainer/model/model.c dfm_config_defaults): the paper's 9,16,24,31 of 32 scaled."""
    out = []
    for fr in (0.3125, 0.53125, 0.78125, 1.0):
        x = fr * n_layers
        l = int(x + 0.5) - 1  # lround (half away from zero) for x >= 0
        l = max(l, 0)
        if not out or l > out[-1]:
            out.append(l)
    return out


def add_model_args(p):
    """The model flags shared by train_flops.py and train_gpu_torch.py (names as dfm-train's)."""
    p.add_argument("--mode", choices=("pretrain", "dfm"), default="pretrain")
    p.add_argument("--arch", choices=("qwen3", "llama"), default="qwen3", help="qwen3: per-head QK RMSNorm")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=0, help="0 = hidden / heads")
    p.add_argument("--ffn", type=int, default=0, help="SwiGLU width (0 = 3 * hidden, as dfm-train)")
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--untied", action="store_true", help="separate LM head (default tied)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--chunk-len", type=int, default=32)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--d-mem", type=int, default=384)
    p.add_argument("--pred-layers", type=int, default=2)
    p.add_argument("--pred-hidden", type=int, default=0, help="0 = min(hidden, 256)")
    p.add_argument("--pred-heads", type=int, default=0, help="0 = pred_hidden / 64, at least 1")
    p.add_argument("--proj-hidden", type=int, default=0, help="0 = 2 * hidden")
    p.add_argument("--fusion-layers", default="", help="comma list of 0-based layers (default: dfm-train's)")
    p.add_argument("--xattn-heads", type=int, default=0, help="0 = heads")
    p.add_argument("--gate", choices=("head", "channel"), default="head")
    p.add_argument("--pred-input-layer", type=int, default=0)
    p.add_argument("--fuse-first-chunk", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=peak_tflops_default(),
                   help="MFU denominator (default $DFM_PEAK_TFLOPS or 989.4 = H200 SXM dense BF16)")


def config_from_args(a):
    """A plain dict with every size resolved the way dfm-train resolves its defaults."""
    C = a.hidden
    hd = a.head_dim if a.head_dim > 0 else C // a.heads
    c = {
        "mode": a.mode, "arch": a.arch, "qk_norm": a.arch == "qwen3",
        "layers": a.layers, "hidden": C, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": hd,
        "ffn": a.ffn if a.ffn > 0 else 3 * C, "vocab": a.vocab, "tied": not a.untied,
        "seq_len": a.seq_len, "batch": a.batch,
    }
    if a.mode == "dfm":
        P = a.pred_hidden if a.pred_hidden > 0 else min(C, 256)
        ph = a.pred_heads if a.pred_heads > 0 else (P // 64 if P >= 64 else 1)
        fl = [int(x) for x in a.fusion_layers.split(",") if x.strip()] if a.fusion_layers else \
            default_fusion_layers(a.layers)
        xh = a.xattn_heads if a.xattn_heads > 0 else a.heads
        c.update({
            "chunk_len": a.chunk_len, "slots": a.slots, "d_mem": a.d_mem,
            "pred_layers": a.pred_layers, "pred_hidden": P, "pred_heads": ph, "pred_head_dim": P // ph,
            "pred_ffn": 4 * P, "proj_hidden": a.proj_hidden if a.proj_hidden > 0 else 2 * C,
            "fusion_layers": fl, "xattn_heads": xh, "gates": xh if a.gate == "head" else C,
            "pred_input_layer": a.pred_input_layer, "fuse_first_chunk": bool(a.fuse_first_chunk),
        })
    check_config(c)
    return c


def check_config(c):
    errs = []
    if c["heads"] % c["kv_heads"]:
        errs.append("heads %d is not a multiple of kv heads %d" % (c["heads"], c["kv_heads"]))
    if c["head_dim"] % 2:
        errs.append("head dim %d must be even (RoPE)" % c["head_dim"])
    if c["mode"] == "dfm":
        if c["seq_len"] % c["chunk_len"]:
            errs.append("seq-len %d is not a multiple of chunk-len %d" % (c["seq_len"], c["chunk_len"]))
        fl = c["fusion_layers"]
        if not fl or fl != sorted(set(fl)) or fl[0] < 0 or fl[-1] >= c["layers"]:
            errs.append("fusion layers %s must be ascending, distinct, in [0, %d)" % (fl, c["layers"]))
        if c["hidden"] % c["xattn_heads"] or c["hidden"] % c["gates"]:
            errs.append("hidden %d must be a multiple of xattn heads %d" % (c["hidden"], c["xattn_heads"]))
        if c["pred_hidden"] % c["pred_heads"]:
            errs.append("pred heads %d must divide pred hidden %d" % (c["pred_heads"], c["pred_hidden"]))
        if fl and c["pred_input_layer"] > fl[0]:
            errs.append("pred-input-layer %d > first fusion layer %d" % (c["pred_input_layer"], fl[0]))
    if errs:
        raise ValueError("; ".join(errs))


def _stack_params(n_layers, C, nh, nkv, hd, F, qk_norm):
    per = C + C * nh * hd + 2 * C * nkv * hd + (2 * hd if qk_norm else 0) + nh * hd * C + C + 3 * C * F
    return n_layers * per


def param_counts(c):
    """Parameters as dfm-train allocates them (every tensor of trainer/model/model.h)."""
    C, V = c["hidden"], c["vocab"]
    bb = V * C * (1 if c["tied"] else 2) + C + _stack_params(
        c["layers"], C, c["heads"], c["kv_heads"], c["head_dim"], c["ffn"], c["qk_norm"])
    out = {"backbone": bb, "dfm": 0}
    if c["mode"] == "dfm":
        P, K, d, H = c["pred_hidden"], c["slots"], c["d_mem"], c["proj_hidden"]
        G, NF = c["gates"], len(c["fusion_layers"])
        pred = P * C + 2 * P + _stack_params(c["pred_layers"], P, c["pred_heads"], c["pred_heads"],
                                             c["pred_head_dim"], c["pred_ffn"], False) + P + K * d * P + K * d
        proj = 2 * d + H * d + H + C * H + C
        fus = NF * (C + 4 * C * C + G * C + G)
        out["dfm"] = pred + proj + fus
        out["dfm_parts"] = {"predictor": pred, "projector": proj, "fusion": fus}
    out["params"] = out["backbone"] + out["dfm"]
    out["trainable"] = out["dfm"] if c["mode"] == "dfm" else out["backbone"]
    return out


def _layer_fwd(T, C, nh, nkv, hd, F):
    """Forward FLOPs of one decoder layer over a sequence of T: (weight matmuls, causal attention core)."""
    w = 2 * T * (C * (nh + 2 * nkv) * hd + nh * hd * C + 3 * C * F)
    att = 2 * nh * hd * T * T  # (QK^T + PV) = 2 * (2 * nh*hd * T*T/2)
    return w, att


def step_flops(c):
    """FLOPs of one training step (forward + backward) over ONE sequence of seq_len tokens, by part."""
    T, C, V, NL = c["seq_len"], c["hidden"], c["vocab"], c["layers"]
    w, att = _layer_fwd(T, C, c["heads"], c["kv_heads"], c["head_dim"], c["ffn"])
    head = 2 * T * C * V
    parts = {}
    if c["mode"] == "pretrain":
        parts["backbone_matmuls"] = 3 * NL * w
        parts["backbone_attention"] = 3 * NL * att
        parts["lm_head"] = 3 * head
        return parts
    f0 = c["fusion_layers"][0]
    below, above = f0 + 1, NL - f0 - 1
    parts["backbone_matmuls"] = below * w + above * 2 * w
    parts["backbone_attention"] = below * att + above * 3 * att
    parts["lm_head"] = 2 * head
    L, K, d, H = c["chunk_len"], c["slots"], c["d_mem"], c["proj_hidden"]
    NC = T // L
    P = c["pred_hidden"]
    pw, patt = _layer_fwd(NC, P, c["pred_heads"], c["pred_heads"], c["pred_head_dim"], c["pred_ffn"])
    parts["predictor"] = 2 * (2 * (NC - 1) * C * P) + 3 * c["pred_layers"] * (pw + patt) + 3 * (2 * NC * P * K * d)
    parts["projector"] = 3 * (2 * NC * K * (d * H + H * C))
    G = c["gates"]
    fus = 0
    for i, _ in enumerate(c["fusion_layers"]):
        qg = 2 * T * C * C + 2 * T * C * G          # q and gate projections
        kv = 2 * (2 * NC * K * C * C)               # k and v of the projected slots
        o = 2 * T * C * C
        xatt = 2 * (2 * T * K * C)                  # scores + values, K slots per token
        fus += (2 if i == 0 else 3) * qg + 3 * (kv + o + xatt)
    parts["fusion"] = fus
    return parts


def flops_per_token(c):
    """Model FLOPs per token of one training step (forward + backward); see the module docstring."""
    return sum(step_flops(c).values()) / c["seq_len"]


def flops_6n(c):
    """The llm.c estimate 6*N + 6*L*(nh*hd)*T for comparison (N without a separate untied embedding)."""
    pc = param_counts(c)
    n = pc["backbone"] - (c["vocab"] * c["hidden"] if not c["tied"] else 0)
    return 6 * n + 6 * c["layers"] * c["heads"] * c["head_dim"] * c["seq_len"]


def report(c):
    parts = step_flops(c)
    T = c["seq_len"]
    pc = param_counts(c)
    return {
        "mode": c["mode"], "flops_per_token": sum(parts.values()) / T,
        "flops_per_token_parts": {k: v / T for k, v in parts.items()},
        "flops_per_token_llmc_6n": flops_6n(c) if c["mode"] == "pretrain" else None,
        "params": pc["params"], "trainable": pc["trainable"], "backbone_params": pc["backbone"],
        "dfm_params": pc["dfm"], "tokens_per_step": c["batch"] * T, "config": c,
    }


def mfu(fpt, tok_per_s, peak_tflops):
    return fpt * tok_per_s / (peak_tflops * 1e12)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--tok-per-s", type=float, default=0, help="also print the MFU at this throughput")
    a = p.parse_args(argv)
    try:
        c = config_from_args(a)
    except ValueError as e:
        print("train_flops.py: %s" % e, file=sys.stderr)
        return 2
    r = report(c)
    r["peak_tflops"] = a.peak_tflops
    if a.tok_per_s > 0:
        r["mfu"] = mfu(r["flops_per_token"], a.tok_per_s, a.peak_tflops)
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
