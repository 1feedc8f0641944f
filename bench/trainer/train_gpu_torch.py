#!/usr/bin/env python3
"""train_gpu_torch.py — a timing harness: dfm-train's model in PyTorch (tests/ref/dfm_torch.py, the model the
fp64 parity test checks against dfm-train) trained for a side-by-side speed benchmark.

What the harness chooses: bf16 autocast over fp32 master weights with the frozen backbone stored in bf16
(--dtype), the attention implementation (--attn sdpa|manual), torch.compile (--compile; falls back to
eager with a note when it is missing or fails), fused AdamW over the trainable parameters, gradient
clipping at 1.0 (dfm-train clips too). Random weights and random (learnable: a per-sequence affine token
recurrence) data of the given shapes.

Prints one JSON line (the last line of stdout): impl, mode, params, trainable, tokens_per_step,
ms_per_step (median over the timed steps), tok_per_s, flops_per_token (tests/ref/train_flops.py), mfu,
compiled, torch, gpu, ... ; with --log FILE also one JSON line per step (step, loss, ms).

    python3 bench/trainer/train_gpu_torch.py --mode pretrain --layers 12 --hidden 768 --heads 12 --kv-heads 12 \
        --ffn 2048 --vocab 50304 --seq-len 1024 --batch 16 --steps 12 --warmup-steps 3 --compile
    python3 bench/trainer/train_gpu_torch.py --device cpu --dtype fp32 --layers 2 --hidden 64 --heads 4 \
        --kv-heads 2 --vocab 512 --seq-len 64 --batch 2 --steps 3      # tiny CPU check

--write-backbone DIR writes a random backbone of the given shape as a Hugging Face folder dfm-train can
load (config.json + model.safetensors, bf16), then exits (bench/trainer/bench_train_gpu.sh's fallback backbone).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests", "ref"))
import dfm_torch as DT  # noqa: E402
import train_flops as TF  # noqa: E402

import torch  # noqa: E402


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
            m[:, 0] = 0  # chunk 0 has no target (no preceding context to query with)
            batch["tmask"] = m.to(dev)
        out.append(batch)
    return out


class Model:
    """The parameters (dfm-train's names), which of them train, and the compiled or eager DfmTorch."""

    def __init__(self, c, a, dev):
        self.c, self.dev = c, dev
        self.bf16 = a.dtype == "bf16"
        pre = c["mode"] == "pretrain"
        self.bc, self.dc = DT.configs_from_flops(dict(c, mse_weight=a.mse_weight))
        bb_dt = torch.float32 if (pre or not self.bf16) else torch.bfloat16
        torch.manual_seed(a.seed)
        self.P = DT.random_params(self.bc, self.dc, dev, bb_dt, torch.float32)
        names = [k for k in self.P if pre or k.startswith("dfm.")]
        for k, t in self.P.items():
            t.requires_grad_(k in names)
        self.trainable = [self.P[k] for k in names]
        self.attn, self.compile_mode = a.attn, a.compile_mode

    def counts(self):
        return sum(t.numel() for t in self.P.values()), sum(t.numel() for t in self.trainable)

    def build_fns(self, compile_):
        self.model = DT.DfmTorch(self.bc, self.dc, attn=self.attn, compile=compile_, compile_mode=self.compile_mode)

    def loss(self, batch):
        r = self.model.forward(self.P, batch["tok"], batch["tgt"], batch.get("tmem"), batch.get("tmask"))
        return r["loss"], r["ce"], (r["mse"] if self.c["mode"] == "dfm" else None)


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


def attn_label(a):
    return "sdpa (k/v repeated for GQA)" if a.attn == "sdpa" and DT.HAS_SDPA else "manual"


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
    res["attn"] = attn_label(a)
    if a.attn == "sdpa" and not DT.HAS_SDPA:
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
        else:  # the first step compiles: on failure, eager
            try:
                lo, ce, mse = step(batch)
            except Exception as e:  # noqa: BLE001
                if isinstance(e, torch.cuda.OutOfMemoryError):
                    raise
                msg = ("%s: %s" % (type(e).__name__, e)).strip().splitlines()
                res["note"].append("torch.compile failed (%s): eager" % (msg[0][:300] if msg else "?"))
                print("train_gpu_torch: %s" % res["note"][-1], file=sys.stderr)
                import torch._dynamo as dyn
                dyn.reset()
                m.build_fns(False)
                res["compiled"] = False
                sync()
                t0 = time.perf_counter()
                lo, ce, mse = step(batch)
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
