"""llama_numpy.py — an independent float64 NumPy forward of a Llama decoder read straight from a GGUF file
with llama.cpp's own reader (the `gguf` package): the reference the real-LM tests compare dfm-train with.

Nothing of dfm is used: the weights are dequantized by gguf.quants, the q/k rows are put back in Hugging
Face's order here (llama.cpp's converter interleaves the halves of each head for its RoPE), and the
decoder is the textbook one: RMSNorm, RoPE (rotate_half), causal GQA attention, SwiGLU, tied or untied
head.

    from tests.ref.llama_numpy import GGUFLlama
    m = GGUFLlama("SmolLM2-135M-Instruct.Q4_1.gguf")
    logits = m.logits(ids)           # [T, V] float64
    hidden = m.hidden(ids)           # [T, C] float64, after the final RMSNorm
"""
import numpy as np


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute_rows(w, heads):
    """Rows of head h stored as (h, j, a) -> Hugging Face's (h, a, j), for w [heads*hd, in]."""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


class GGUFLlama:
    def __init__(self, path):
        import gguf

        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{path}: architecture {arch}, this reference runs llama")
        a = lambda k, d=None: _field(r, f"llama.{k}", d)
        self.n_layers, self.C = a("block_count"), a("embedding_length")
        self.nh = a("attention.head_count")
        self.nkv = a("attention.head_count_kv", self.nh)
        self.hd = a("attention.key_length", self.C // self.nh)
        self.eps = float(a("attention.layer_norm_rms_epsilon"))
        self.theta = float(a("rope.freq_base", 10000.0))
        self.w = {}
        for t in r.tensors:
            x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
            shape = [int(v) for v in reversed(t.shape)]  # GGUF lists dimensions fastest first
            x = x.reshape(shape)
            if t.name.endswith("attn_q.weight"):
                x = unpermute_rows(x, self.nh)
            elif t.name.endswith("attn_k.weight"):
                x = unpermute_rows(x, self.nkv)
            self.w[t.name] = x
        self.head = self.w.get("output.weight", self.w["token_embd.weight"])

    def _rms(self, x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * g

    def _rope(self, x, T):
        hd = x.shape[-1]
        inv = 1.0 / self.theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * c - b * s, b * c + a * s], -1)

    def hidden(self, ids):
        ids = np.asarray(ids)
        T = len(ids)
        x = self.w["token_embd.weight"][ids]
        mask = np.triu(np.full((T, T), -np.inf), 1)
        rep = self.nh // self.nkv
        for l in range(self.n_layers):
            p = f"blk.{l}."
            h = self._rms(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.nh, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.nkv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.nkv, self.hd)
            q, k = self._rope(q, T), self._rope(k, T)
            k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
            s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(self.hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("htu,uhd->thd", s, v).reshape(T, self.nh * self.hd)
            x = x + o @ self.w[p + "attn_output.weight"].T
            h = self._rms(x, self.w[p + "ffn_norm.weight"])
            g, u = h @ self.w[p + "ffn_gate.weight"].T, h @ self.w[p + "ffn_up.weight"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ self.w[p + "ffn_down.weight"].T
        return self._rms(x, self.w["output_norm.weight"])

    def logits(self, ids):
        return self.hidden(ids) @ self.head.T


def mean_ce(logits, ids):
    """Mean next-token cross-entropy of logits [T, V] over ids[1:]."""
    lg = logits[:-1]
    m = lg.max(-1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(lg - m).sum(-1)))
    return float((lse - lg[np.arange(len(ids) - 1), np.asarray(ids[1:])]).mean())
