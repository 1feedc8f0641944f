"""dfm.torch — trained DFM modules (dfm_modules.safetensors of `dfm-train train`) as PyTorch modules, run
on a frozen Llama/Qwen3 backbone for evaluation, generation and training.

    import dfm, dfm.torch as dt
    backbone = dt.load_backbone("PRE/model")                      # a Hugging Face folder
    mods = dt.DFMModules.from_safetensors("OUT/dfm_modules.safetensors")
    model = dt.DFMModel(backbone, mods).eval()
    out = model(tokens, labels, memory, mask, mode="predicted")  # dict: logits, ce, mse, cos, slots
    print(dt.evaluate(model, dfm.Batches(..., split="heldout", format="torch")))  # = dfm-train eval

The model is trainer/model/model.h's: fusion blocks hook the outputs of the configured decoder layers; the
predictor reads the chunk means of the frozen input embeddings (or of layer pred_input_layer-1's output),
chunk i from chunk i-1 (chunk 0 a learned placeholder); the projector maps its K slots of width d to the
backbone width; token s attends the slots of chunk (s + 1) // L (memory_align "next"; the sequence's
last token attends nothing) or s // L ("same"); a chunk whose slots are all masked gets no update.

Backbones: load_backbone() uses `transformers` (AutoModelForCausalLM, eager attention) when it is
installed (an ImportError is the only reason to fall back; any other failure of transformers is raised),
else the plain PyTorch decoder here (Backbone: the same Hugging Face tensor names and math, read from the
same safetensors files). Backbone refuses exactly the config.json that dfm-train refuses
(check_hf_config: trainer/model/model_config.c's rules, among them rope_scaling, attention_bias and a sliding
window shorter than the sequence), so that it never runs a model with other positions or attention than
its config asks for. The hooks need only `backbone.model.embed_tokens`, `backbone.model.layers[i]` and
logits from `backbone(input_ids)`.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import struct
from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
              "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}


# ---- files ---------------------------------------------------------------------------------------------
def load_safetensors(path: str) -> Tuple[Dict[str, Tensor], Dict[str, str]]:
    """(tensors by name, metadata) of a safetensors file; a folder's model.safetensors or its sharded
    model.safetensors.index.json. The header is bounded by the file's size before it is parsed."""
    if os.path.isdir(path):
        idx = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(idx):
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            out: Dict[str, Tensor] = {}
            for fn in files:
                out.update(load_safetensors(os.path.join(path, fn))[0])
            return out, {}
        path = os.path.join(path, "model.safetensors")
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: {len(buf)} bytes is not a safetensors file")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > len(buf) - 8:
        raise ValueError(f"{path}: header of {n} bytes in a file of {len(buf)}")
    hdr = json.loads(buf[8:8 + n])
    meta = hdr.pop("__metadata__", {}) or {}
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, t in hdr.items():
        dt = _ST_DTYPES.get(t["dtype"])
        b, e = t["data_offsets"]
        if dt is None or not 0 <= b <= e <= len(data):
            raise ValueError(f"{path}: tensor {name}: dtype {t['dtype']} or offsets {b}..{e} invalid")
        out[name] = (torch.frombuffer(bytearray(data[b:e]), dtype=dt).reshape(t["shape"]) if e > b
                     else torch.zeros(t["shape"], dtype=dt))
    return out, meta


# ---- config.json: what dfm-train accepts (trainer/model/model_config.c, backbone_config_from_hf) ----------------
ARCHITECTURES = ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


def _cfg_int(cfg: dict, key: str, required: bool, default: int, lo: int, hi: int) -> int:
    v = cfg.get(key)
    if v is None:
        if required:
            raise ValueError(f'config.json: missing integer "{key}"')
        return default  # as dfm-train: a default is not range-checked
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f'config.json: "{key}" is not an integer')
    if not lo <= v <= hi:
        raise ValueError(f'config.json: "{key}" is {v}, outside {lo}..{hi}. HINT: the file is corrupt or not a '
                         "decoder's config")
    return v


def _cfg_num(cfg: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f'config: "{key}" is not a number')
    f32 = struct.unpack("<f", struct.pack("<f", v))[0] if lo < v < hi else 0.0  # dfm-train keeps it as a float
    if not (lo < v < hi) or not math.isfinite(f32) or f32 == 0.0:
        raise ValueError(f'config: "{key}" is {v:g}, outside ({lo:g}, {hi:g})')
    return float(v)


def check_hf_config(cfg: dict, max_seq: Optional[int] = None) -> int:
    """Refuse a Hugging Face config.json exactly where dfm-train refuses it (trainer/model/model_config.c): an
    architecture other than Qwen3, Llama and Mistral, integers outside dfm-train's bounds, heads that do
    not group, an odd head_dim, rms_norm_eps or rope_theta out of range, attention_bias, rope_scaling, a
    hidden_act other than silu, and a sliding_window shorter than the sequence (max_seq: the sequence
    length a caller runs; None as dfm-train without --seq-len: max_position_embeddings, at most 4096).
    Raises ValueError naming the field; returns the sliding window that still applies to longer sequences
    (None: no window), which Backbone enforces at every forward."""
    if not isinstance(cfg, dict):
        raise ValueError("config.json is not a JSON object")
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        raise ValueError('config.json: no "architectures" list')
    if arch not in ARCHITECTURES:
        raise ValueError(f"backbone architecture {arch} is not supported. HINT: dfm-train loads "
                         "Qwen3ForCausalLM, LlamaForCausalLM and MistralForCausalLM")
    _cfg_int(cfg, "vocab_size", True, 0, 1, 1 << 24)
    hidden = _cfg_int(cfg, "hidden_size", True, 0, 1, 1 << 20)
    _cfg_int(cfg, "intermediate_size", True, 0, 1, 1 << 22)
    _cfg_int(cfg, "num_hidden_layers", True, 0, 1, 4096)
    nh = _cfg_int(cfg, "num_attention_heads", True, 0, 1, 4096)
    nkv = _cfg_int(cfg, "num_key_value_heads", False, nh, 1, nh)
    if nh % nkv:
        raise ValueError(f"config.json: num_attention_heads {nh} is not a multiple of num_key_value_heads {nkv}")
    hd = _cfg_int(cfg, "head_dim", False, hidden // nh, 2, 1 << 16)
    if hd % 2:
        raise ValueError(f"config.json: head_dim {hd} is odd (RoPE rotates pairs)")
    _cfg_num(cfg, "rms_norm_eps", 1e-6, 0, 1)
    _cfg_num(cfg, "rope_theta", 10000.0, 0, 1e12)
    if cfg.get("attention_bias") is True:
        raise ValueError("config.json: attention_bias = true is not supported")
    if cfg.get("rope_scaling") is not None:
        raise ValueError("config.json: rope_scaling is not supported")
    act = cfg.get("hidden_act")
    if isinstance(act, str) and act != "silu":
        raise ValueError(f"config.json: hidden_act {act} is not supported (silu only)")
    mpe = _cfg_int(cfg, "max_position_embeddings", False, 4096, 1, 0x7FFFFFFF)
    seq = max_seq if max_seq is not None and max_seq > 0 else min(mpe, 4096)
    sw = cfg.get("sliding_window")
    window = sw if isinstance(sw, int) and not isinstance(sw, bool) and cfg.get("use_sliding_window") is not False \
        else None
    if window is not None and window < seq:
        raise ValueError(f"config.json: sliding_window {sw} < sequence length {seq} is not supported")
    return window


def stack_config(bc: dict) -> dict:
    """A decoder stack's shape from a Hugging Face config.json (as trainer/model/model_config.c reads it)."""
    nh = bc["num_attention_heads"]
    return {"n_layers": bc["num_hidden_layers"], "hidden": bc["hidden_size"], "n_heads": nh,
            "n_kv_heads": bc.get("num_key_value_heads") or nh, "head_dim": bc.get("head_dim") or bc["hidden_size"] // nh,
            "ffn": bc["intermediate_size"], "eps": bc.get("rms_norm_eps", 1e-6), "rope_theta": bc.get("rope_theta", 10000.0),
            "qk_norm": bc["architectures"][0] == "Qwen3ForCausalLM"}


# ---- the decoder pieces (Llama / Qwen3; the predictor is the same stack over chunk positions) -----------
class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last axis (computed in fp32)."""

    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def rope_tables(T: int, hd: int, theta: float, device) -> Tuple[Tensor, Tensor]:
    """cos, sin [T, hd/2] (fp32 angles) of rotary embeddings over positions 0..T-1."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=device) / hd))
    ang = torch.arange(T, dtype=torch.float32, device=device)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B, T, H, hd] rotated by halves (Hugging Face rotate_half)."""
    h = x.shape[-1] // 2
    c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


class SelfAttention(nn.Module):
    """Causal GQA self-attention, no biases, optional per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        C, nh, nkv, hd = c["hidden"], c["n_heads"], c["n_kv_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj, self.k_proj = nn.Linear(C, nh * hd, bias=False), nn.Linear(C, nkv * hd, bias=False)
        self.v_proj, self.o_proj = nn.Linear(C, nkv * hd, bias=False), nn.Linear(nh * hd, C, bias=False)
        if c["qk_norm"]:
            self.q_norm, self.k_norm = RMSNorm(hd, c["eps"]), RMSNorm(hd, c["eps"])

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.transpose(1, 2).repeat_interleave(rep, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.hd)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        y = s.float().softmax(-1).to(v.dtype) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate x) * up x)."""

    def __init__(self, C: int, F_: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(C, F_, bias=False), nn.Linear(C, F_, bias=False)
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: x + attn(norm x), then x + mlp(norm x)."""

    def __init__(self, c: dict) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = RMSNorm(c["hidden"], c["eps"]), SelfAttention(c)
        self.post_attention_layernorm, self.mlp = RMSNorm(c["hidden"], c["eps"]), MLP(c["hidden"], c["ffn"])

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Stack(nn.Module):
    def __init__(self, c: dict, vocab: int) -> None:
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(vocab, c["hidden"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])


class Backbone(nn.Module):
    """A Llama/Qwen3/Mistral causal LM in plain PyTorch under Hugging Face tensor names (model.embed_tokens,
    model.layers.N.*, model.norm, lm_head). forward(input_ids [B, T] int) -> logits [B, T, V] float. A
    config.json that dfm-train refuses is refused (check_hf_config), and so is a forward longer than the
    config's sliding window (attention here is plain causal)."""

    def __init__(self, config: dict, max_seq: Optional[int] = None) -> None:
        super().__init__()
        self.window = check_hf_config(config, max_seq)
        self.config_dict, self.c = config, stack_config(config)
        self.model = _Stack(self.c, config["vocab_size"])
        self.tied = bool(config.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(self.c["hidden"], config["vocab_size"], bias=False)

    def forward(self, input_ids: Tensor, start: int = 0, x: Optional[Tensor] = None,
                stop: Optional[int] = None) -> Tensor:
        """logits [B, T, V] of input_ids [B, T]. A part of the stack: x [B, T, C], the states entering block
        `start` (from an earlier call with stop=start), skips the embedding and the blocks below it; stop returns
        the states entering block `stop` instead of the logits (DFMModel.prefix)."""
        if self.window is not None and input_ids.shape[-1] > self.window:
            raise ValueError(f"{input_ids.shape[-1]} tokens in a sequence: the config's sliding_window "
                             f"{self.window} is shorter, and sliding-window attention is not supported")
        if x is None:
            if start:
                raise ValueError(f"start {start} needs the states entering that block (x)")
            x = self.model.embed_tokens(input_ids.long())
        elif tuple(x.shape[:2]) != tuple(input_ids.shape):
            raise ValueError(f"states {tuple(x.shape)} for tokens {tuple(input_ids.shape)}")
        cos, sin = rope_tables(x.shape[1], self.c["head_dim"], self.c["rope_theta"], x.device)
        for layer in self.model.layers[start:stop]:
            x = layer(x, cos, sin)
        if stop is not None:
            return x
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight if self.tied else self.lm_head.weight)

    @classmethod
    def from_pretrained(cls, folder: str, dtype: torch.dtype = torch.float32,
                        max_seq: Optional[int] = None) -> "Backbone":
        """A Hugging Face folder (config.json + model.safetensors) written by `dfm-train pretrain` or HF.
        max_seq: the longest sequence it will run (as dfm-train's --seq-len; None: dfm-train's default)."""
        path = os.path.join(folder, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        try:
            m = cls(cfg, max_seq)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        tensors, _ = load_safetensors(folder)
        if m.tied:
            tensors.pop("lm_head.weight", None)
        missing, unexpected = m.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise ValueError(f"{folder}: tensors missing {missing[:4]} / unexpected {unexpected[:4]}")
        return m.to(dtype)


def load_backbone(folder: str, use_transformers: Optional[bool] = None, dtype: torch.dtype = torch.float32,
                  max_seq: Optional[int] = None) -> nn.Module:
    """A frozen backbone from a Hugging Face folder: transformers' model when use_transformers (None: when
    `transformers` is installed; only an ImportError falls back, any other error of transformers is
    raised), else Backbone (which refuses what dfm-train refuses; max_seq as Backbone.from_pretrained).
    Parameters are frozen, the module in eval mode."""
    m = None
    if use_transformers is not False:
        try:
            from transformers import AutoModelForCausalLM
        except ImportError:
            if use_transformers:
                raise
        else:
            m = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=dtype, attn_implementation="eager")
    if m is None:
        m = Backbone.from_pretrained(folder, dtype, max_seq)
    for p in m.parameters():
        p.requires_grad_(False)
    return m.eval()


# ---- the DFM modules ------------------------------------------------------------------------------------
class Predictor(nn.Module):
    """Chunk means of the frozen states [B, NC, C] (chunk i reads chunk i-1's; chunk 0 a placeholder) ->
    causal decoder over chunk positions -> RMSNorm -> slots [B, NC, K, d]."""

    def __init__(self, dc: dict, C: int) -> None:
        super().__init__()
        pc = dict(dc["predictor"])
        self.pc, self.K, self.d, self.L = pc, dc["n_slots"], dc["d_mem"], dc["chunk_len"]
        self.tail = dc.get("pred_input_tokens", 0) or self.L  # the previous chunk's last tokens the input averages
        P = pc["hidden"]
        self.in_proj, self.placeholder = nn.Linear(C, P), nn.Parameter(torch.zeros(P))
        self.layers = nn.ModuleList(DecoderLayer(pc) for _ in range(pc["n_layers"]))
        self.norm, self.out_proj = RMSNorm(P, pc["eps"]), nn.Linear(P, self.K * self.d)
        # pred_skip: a linear path from the pooled input straight to the slots (chunk 0, with no input, gets none)
        self.skip = nn.Linear(C, self.K * self.d, bias=False) if dc.get("pred_skip") else None

    def forward(self, src: Tensor) -> Tensor:
        B, T, C = src.shape
        NC = T // self.L
        pool = src.detach().reshape(B, NC, self.L, C)[:, :, self.L - self.tail:].mean(2).to(self.in_proj.weight.dtype)
        x = torch.cat([self.placeholder.view(1, 1, -1).expand(B, 1, -1), self.in_proj(pool[:, :-1])], 1)
        cos, sin = rope_tables(NC, self.pc["head_dim"], self.pc["rope_theta"], x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        y = self.out_proj(self.norm(x))
        if self.skip is not None:
            s = self.skip(pool[:, :-1])
            y = y + torch.cat([torch.zeros_like(s[:, :1]), s], 1)
        return y.view(B, NC, self.K, self.d)


class Projector(nn.Module):
    """Slots [.., d] (minus the memory centre when the modules were trained with --centre-memory) -> LayerNorm ->
    Linear d->H -> GELU (erf) -> Linear H->C. (--content-only-fusion keeps the three biases at 0 in the file.)"""

    def __init__(self, d: int, H: int, C: int, centre: Optional[list] = None) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d, eps=1e-5), nn.Linear(d, H), nn.Linear(H, C)
        self.register_buffer("centre", torch.tensor(centre, dtype=torch.float32) if centre else None, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.centre is not None:
            x = x - self.centre.to(x.dtype)
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


class FusionBlock(nn.Module):
    """h + gate(h) * o_proj(cross-attention of RMSNorm(h) to its chunk's K projected slots)."""

    def __init__(self, C: int, heads: int, gates: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm = RMSNorm(C, eps)
        self.q_proj, self.k_proj = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)
        self.v_proj, self.o_proj = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)
        self.gate = nn.Linear(C, gates)

    def forward(self, h: Tensor, M: Tensor, mask: Tensor, L: int, shift: int) -> Tensor:
        """h [B, T, C]; M [B, NC, K, C] projected slots; mask [B, NC, K] bool; token s attends chunk
        (s + shift) // L (none when that is past the last chunk)."""
        B, T, C = h.shape
        NC, K, nh = M.shape[1], M.shape[2], self.heads
        hd = C // nh
        chunk = (torch.arange(T, device=h.device) + shift) // L
        inside = chunk < NC
        chunk = chunk.clamp(max=NC - 1)
        q = self.q_proj(self.norm(h)).view(B, T, nh, hd)
        k = self.k_proj(M)[:, chunk].view(B, T, K, nh, hd)
        v = self.v_proj(M)[:, chunk].view(B, T, K, nh, hd)
        ok = mask[:, chunk] & inside[None, :, None]                      # [B, T, K]
        has = ok.any(-1)                                                  # tokens with memory
        s = torch.einsum("btnh,btknh->btnk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~(ok | ~has[..., None])[:, :, None, :], float("-inf"))
        p = s.float().softmax(-1).to(v.dtype)
        y = torch.einsum("btnk,btknh->btnh", p, v) * has[:, :, None, None].to(v.dtype)
        g = torch.sigmoid(self.gate(h))
        if g.shape[-1] != C:  # one gate per head
            g = g.repeat_interleave(C // g.shape[-1], dim=-1)
        return h + g * self.o_proj(y.reshape(B, T, C))


class DFMModules(nn.Module):
    """Predictor, projector and fusion blocks of one dfm_modules.safetensors (state-dict names are
    dfm-train's without the "dfm." prefix). config: the DFM config (trainer/model/model_config.c JSON);
    backbone_config: the Hugging Face config they were trained on."""

    def __init__(self, config: dict, backbone_config: dict) -> None:
        super().__init__()
        self.config, self.backbone_config = config, backbone_config
        self.metadata: Dict[str, str] = {}
        sc = stack_config(backbone_config)
        C = sc["hidden"]
        self.predictor = Predictor(config, C)
        self.projector = Projector(config["d_mem"], config["proj_hidden"], C, config.get("memory_centre"))
        G = C if config.get("gate") == "channel" else config["xattn_heads"]
        self.fusion = nn.ModuleList(FusionBlock(C, config["xattn_heads"], G, sc["eps"])
                                    for _ in config["fusion_layers"])

    @classmethod
    def from_safetensors(cls, path: str, dtype: torch.dtype = torch.float32) -> "DFMModules":
        """The modules `dfm-train train` exported (OUT/dfm_modules.safetensors; its metadata carries both
        configurations)."""
        tensors, meta = load_safetensors(path)
        if meta.get("format") != "dfm" or "dfm_config" not in meta:
            raise ValueError(f"{path}: not a dfm_modules.safetensors (metadata format {meta.get('format')!r})")
        m = cls(json.loads(meta["dfm_config"]), json.loads(meta["backbone_config"]))
        m.metadata = dict(meta)  # kept for save_safetensors (backbone_hash: dfm-train checks the backbone)
        sd = {k[4:]: v for k, v in tensors.items() if k.startswith("dfm.")}
        missing, unexpected = m.load_state_dict(sd, strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}: tensors missing {missing[:4]} / unexpected {unexpected[:4]}")
        return m.to(dtype)

    def state_dict_dfm(self) -> Dict[str, Tensor]:
        """The parameters under dfm-train's names ("dfm.*")."""
        return {"dfm." + k: v for k, v in self.state_dict().items()}

    def save_safetensors(self, path: str) -> None:
        """Write the modules as dfm-train exports them (F32 tensors, both configurations in the metadata),
        so `dfm-train eval --modules PATH` reads them."""
        sd = {k: v.detach().float().contiguous() for k, v in self.state_dict_dfm().items()}
        hdr, off, blobs = {}, 0, []
        for k, v in sd.items():
            b = ctypes.string_at(v.data_ptr(), v.numel() * 4) if v.numel() else b""
            hdr[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        hdr["__metadata__"] = dict(self.metadata, format="dfm", dfm_config=json.dumps(self.config),
                                   backbone_config=json.dumps(self.backbone_config))
        h = json.dumps(hdr).encode()
        h += b" " * (-len(h) % 8)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        os.replace(tmp, path)


def slot_stats(slots: Tensor, memory: Tensor, mask: Tensor) -> Tuple[Tensor, float, float]:
    """(predictor loss as configured below, mse per element, mean cosine) of predicted vs target slots over
    the valid ones; slots, memory [B, NC, K, d], mask [B, NC, K] bool."""
    m = mask.to(slots.dtype)[..., None]
    err = ((slots - memory) ** 2 * m).sum()
    nv = m.sum().clamp(min=1)
    d = slots.shape[-1]
    with torch.no_grad():
        a, t = slots.double()[mask], memory.double()[mask]
        cos = ((a * t).sum(-1) / ((a * a).sum(-1) * (t * t).sum(-1)).sqrt().add(1e-12)).mean() if a.numel() else a.new_zeros(())
    return err, float(err / (nv * d)), float(cos)


class DFMModel(nn.Module):
    """A frozen backbone with DFM modules hooked after its fusion layers.

    forward(tokens [B, T] int, labels [B, T] int (-1 = none) or None, memory [B, NC, K, d] float32 or
    None, mask [B, NC, K] bool/uint8 or None, mode "predicted" | "target" | "none" | "mixed" (mem_src
    [B, NC] bool: True = that chunk fuses its target, as dfm-train's teacher forcing), slots: fixed
    predicted slots [B, NC, K, d] (generation)) -> dict: logits [B, T, V], ce (mean over labels >= 0), loss (ce +
    mse_weight * predictor loss when memory is given), mse and cos (floats, per element / mean over
    valid slots), slots [B, NC, K, d]. T must be a multiple of the chunk length. prefix: prefix(tokens) of the
    same tokens, computed once and shared by several modes (the same numbers, fewer blocks run).
    """

    def __init__(self, backbone: nn.Module, modules: DFMModules) -> None:
        super().__init__()
        self.backbone, self.dfm = backbone, modules
        c = modules.config
        self.L, self.fl = c["chunk_len"], list(c["fusion_layers"])
        self.shift = 1 if c.get("memory_align", "same") == "next" else 0
        self.src_layer = c.get("pred_input_layer", 0)
        layers = backbone.model.layers
        self._st: dict = {}
        hooks = [(backbone.model.embed_tokens if self.src_layer == 0 else layers[self.src_layer - 1], self._grab)]
        hooks += [(layers[f], self._fuse_hook(i)) for i, f in enumerate(self.fl)]
        self._handles = [mod.register_forward_hook(fn) for mod, fn in hooks]

    @staticmethod
    def _hidden(out):
        return out[0] if isinstance(out, tuple) else out

    def _grab(self, mod, inp, out) -> None:
        self._st["src"] = self._hidden(out)

    def _fuse_hook(self, i: int):
        def hook(mod, inp, out):
            st = self._st
            if st.get("mode", "none") == "none":
                return None
            h = self._hidden(out)
            if "M" not in st:
                st["M"], st["fm"] = self._memory(st)
            y = self.dfm.fusion[i](h, st["M"], st["fm"], self.L, self.shift)
            return (y,) + tuple(out[1:]) if isinstance(out, tuple) else y
        return hook

    def _memory(self, st: dict) -> Tuple[Tensor, Tensor]:
        c, mode = self.dfm.config, st["mode"]
        slots = st.get("slots")
        if slots is None:
            slots = self.dfm.predictor(st["src"])
        st["slots"] = slots
        B, NC, K, _ = slots.shape
        if mode == "target":
            fed, fm = st["memory"], st["mask"]
        elif mode == "mixed":  # teacher forcing per chunk: mem_src[b, c] takes the target (no gradient to slots)
            src = st["mem_src"].bool()
            pm = torch.ones(B, NC, K, dtype=torch.bool, device=slots.device)
            if not c.get("fuse_first_chunk", False):
                pm[:, 0] = False
            fed = torch.where(src[..., None, None], st["memory"].to(slots.dtype), slots)
            fm = torch.where(src[..., None], st["mask"], pm)
        else:
            fed = slots
            fm = torch.ones(B, NC, K, dtype=torch.bool, device=slots.device)
            if not c.get("fuse_first_chunk", False):
                fm[:, 0] = False
        return self.dfm.projector(fed), fm

    @torch.no_grad()
    def prefix(self, tokens: Tensor) -> Optional[dict]:
        """The frozen states below the first fusion block, which every memory mode of the same tokens shares (what
        dfm-train's --cache-frozen caches): forward(..., prefix=) then runs only the blocks from the first fusion
        layer up, with the same numbers bit for bit. None for a backbone other than Backbone (transformers')."""
        if not isinstance(self.backbone, Backbone):
            return None
        first = min(self.fl)
        self._st = {"mode": "none"}
        try:
            x = self.backbone(tokens.long(), stop=first)
            return {"x": x, "src": self._st["src"], "start": first, "shape": tuple(tokens.shape)}
        finally:
            self._st = {}

    def forward(self, tokens: Tensor, labels: Optional[Tensor] = None, memory: Optional[Tensor] = None,
                mask: Optional[Tensor] = None, mode: str = "predicted", slots: Optional[Tensor] = None,
                mem_src: Optional[Tensor] = None, prefix: Optional[dict] = None) -> dict:
        if mode not in ("predicted", "target", "none", "mixed"):
            raise ValueError(f"mode {mode!r}: predicted, target, none or mixed")
        if mode in ("target", "mixed") and (memory is None or mask is None or (mode == "mixed" and mem_src is None)):
            raise ValueError(f"mode {mode!r} needs memory and mask (and mem_src for mixed)")
        B, T = tokens.shape
        if T % self.L:
            raise ValueError(f"sequence length {T} is not a multiple of the chunk length {self.L}")
        mask_b = None if mask is None else mask.bool()
        self._st = {"mode": mode, "memory": memory, "mask": mask_b, "slots": slots, "mem_src": mem_src}
        try:
            if prefix is None:
                out = self.backbone(tokens.long())
            else:  # the frozen blocks below the first fusion layer, computed once by prefix()
                if prefix["shape"] != tuple(tokens.shape):
                    raise ValueError(f"a prefix of tokens {prefix['shape']} for tokens {tuple(tokens.shape)}")
                self._st["src"] = prefix["src"]
                out = self.backbone(tokens.long(), start=prefix["start"], x=prefix["x"])
            logits = out.logits if hasattr(out, "logits") else out
            st = self._st
            res = {"logits": logits, "slots": st.get("slots"), "mse": 0.0, "cos": 0.0}
            loss = None
            if labels is not None:
                lab = labels.reshape(-1).long()
                n = int((lab >= 0).sum()) or 1
                res["ce"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab, ignore_index=-1,
                                            reduction="sum") / n
                loss = res["ce"]
            if memory is not None and mode != "none":
                err, res["mse"], res["cos"] = slot_stats(st["slots"], memory, mask_b)
                c = self.dfm.config
                nv = mask_b.sum().clamp(min=1)
                ploss = err / (nv * memory.shape[-1]) if c.get("pred_loss", "mse_elem") == "mse_elem" else err / nv
                res["pred_loss"] = ploss
                if loss is not None:
                    loss = loss + c.get("mse_weight", 1.0) * ploss
            res["loss"] = loss
            return res
        finally:
            self._st = {}

    @torch.no_grad()
    def generate(self, prompt: Tensor, new_tokens: int, T: Optional[int] = None, no_memory: bool = False) -> Tensor:
        """Greedy decoding as `dfm-train generate` (trainer/run/generate.h): the memory is predicted once from
        the prompt [n] and held fixed; chunk c <= n // L fuses the prompt's prediction for chunk c, later
        chunks that of chunk n // L. Returns the n + new_tokens ids."""
        n, total = prompt.shape[0], prompt.shape[0] + new_tokens
        T = T or -(-total // self.L) * self.L
        seq = torch.zeros(1, T, dtype=torch.long)
        seq[0, :n] = prompt
        slots = None
        if not no_memory:
            slots = self.dfm.predictor(self._source(seq))
            last = min(n // self.L, slots.shape[1] - 1)
            slots[:, last + 1:] = slots[:, last:last + 1]
        for pos in range(n, total):
            logits = self.forward(seq, mode="none" if no_memory else "predicted", slots=slots)["logits"]
            seq[0, pos] = logits[0, pos - 1].argmax()
        return seq[0, :total]

    def _source(self, tokens: Tensor) -> Tensor:
        """The predictor's input states of tokens (a backbone forward without fusion)."""
        self._st = {"mode": "none"}
        try:
            self.backbone(tokens)
            return self._st["src"]
        finally:
            self._st = {}


@torch.no_grad()
def evaluate(model: DFMModel, batches: Iterable, modes: Tuple[str, ...] = ("predicted", "none", "target"),
             control: bool = True) -> dict:
    """dfm-train eval's figures over batches (dfm.Batches(..., split="heldout", format="torch") gives eval's
    batches): ce_pred, ce_none, ce_target (mean over batches of each batch's mean CE), mse, cos (of the
    predicted slots, averaged over batches), batches. With control (dfm-train's --memory-control shuffle, at
    least 2 sequences) also ce_pred_shuffled / ce_target_shuffled: held-out sequence i of the n evaluated
    fuses the memory of sequence (i + n // 2) % n through the same modules, and memory_effect_pred /
    memory_effect_target, the shuffled CE minus the real memory's."""
    keys = {"predicted": "ce_pred", "none": "ce_none", "target": "ce_target"}
    acc = {k: 0.0 for k in ("ce_pred", "ce_none", "ce_target", "mse", "cos", "ce_pred_shuffled", "ce_target_shuffled")}
    batches = list(batches)
    slots, nb = [], len(batches)
    for b in batches:
        tokens, labels, memory, mask = b.tokens, b.labels, b.memory, b.mask
        pre = model.prefix(tokens)  # the frozen blocks below the fusion, once for every mode of the batch
        for mode in modes:
            if mode == "target" and memory is None:
                continue
            r = model(tokens, labels, memory, mask, mode=mode, prefix=pre)
            acc[keys[mode]] += float(r["ce"])
            if mode == "predicted":
                slots.append(r["slots"])
                if memory is not None:
                    acc["mse"] += r["mse"]
                    acc["cos"] += r["cos"]
    n = sum(int(b.tokens.shape[0]) for b in batches)
    control = control and n >= 2 and "predicted" in modes
    if control:
        all_slots = torch.cat(slots)
        mems = [b.memory for b in batches]
        all_mem = torch.cat(mems) if all(m is not None for m in mems) else None
        all_mask = torch.cat([b.mask for b in batches]) if all_mem is not None else None
        first = 0
        for b in batches:
            B = int(b.tokens.shape[0])
            pre = model.prefix(b.tokens)  # again, rather than held for every batch
            partner = (torch.arange(first, first + B) + n // 2) % n
            first += B
            pm = torch.ones(all_slots.shape[:3], dtype=torch.bool)[partner]  # [B, NC, K]: the predicted mode's mask
            if not model.dfm.config.get("fuse_first_chunk", False):
                pm[:, 0] = False
            r = model(b.tokens, b.labels, all_slots[partner], pm, mode="target", prefix=pre)
            acc["ce_pred_shuffled"] += float(r["ce"])
            if all_mem is not None and "target" in modes:
                r = model(b.tokens, b.labels, all_mem[partner], all_mask[partner], mode="target", prefix=pre)
                acc["ce_target_shuffled"] += float(r["ce"])
    out = {k: v / nb if nb else float("nan") for k, v in acc.items()}
    if not control:
        out.pop("ce_pred_shuffled"), out.pop("ce_target_shuffled")
    else:
        out["memory_effect_pred"] = out["ce_pred_shuffled"] - out["ce_pred"]
        if "target" in modes and all_mem is not None:
            out["memory_effect_target"] = out["ce_target_shuffled"] - out["ce_target"]
        else:
            out.pop("ce_target_shuffled")
    out["batches"] = nb
    return out
