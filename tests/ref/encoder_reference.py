#!/usr/bin/env python3
"""encoder_reference.py — an independent NumPy reference for dfm's frozen encoder (encoder/).

Nothing here shares code with the C implementation: the safetensors file is parsed with json + numpy,
tokenisation is Hugging Face `tokenizers` itself, and the forward pass is a padded-batch BERT with an
attention mask in float64 (the C code packs sequences without padding and computes in float32).

    $DFM_PYTHON tests/ref/encoder_reference.py texts  --n 256 --out texts.jsonl   # real 32-token chunk texts
    $DFM_PYTHON tests/ref/encoder_reference.py golden [--out tests/data/encoder/wordpiece.golden.jsonl] [--check]
    $DFM_PYTHON tests/ref/encoder_reference.py embed  --texts texts.jsonl --out ref.npy [--max-len N]

"Real chunk texts" are made the way `dfm chunk` + `dfm encode` make them: GCIDE documents tokenised with
the LM tokenizer ($DFM_TOKENIZER, Qwen2.5 by default), cut into 32-token chunks, each decoded back to text.
"""
import argparse
import json
import math
import os
import random
import struct
import sys

import numpy as np

CACHE = os.environ.get("DFM_CACHE", "/var/cache/dfm")
MODEL = os.environ.get("DFM_MODEL", f"{CACHE}/models/all-MiniLM-L6-v2")
LM_TOKENIZER = os.environ.get("DFM_TOKENIZER", f"{CACHE}/tokenizers/qwen2.5/tokenizer.json")
CORPUS = os.environ.get("DFM_CORPUS", f"{CACHE}/corpus/gcide.jsonl")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- safetensors, read independently ----------------------------------------------------------------
def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8 : 8 + n])
    data = memoryview(buf)[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        dt = e["dtype"]
        if dt == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        elif dt == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = a.reshape(e["shape"]).astype(np.float64)
    return out


# ---- tokenisation (the truth: HF tokenizers) ------------------------------------------------------------
def hf_tokenizer(model_dir, max_len):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    if max_len:
        tok.enable_truncation(max_length=max_len)
    else:
        tok.no_truncation()
    return tok


def model_max_len(model_dir):
    p = os.path.join(model_dir, "sentence_bert_config.json")
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    m = min(512, cfg.get("max_position_embeddings", 512))
    if os.path.exists(p):
        m = json.load(open(p)).get("max_seq_length", m)
    return min(m, cfg.get("max_position_embeddings", 512))


# ---- the forward pass -----------------------------------------------------------------------------------
def erf(x):
    """erf in float64 via the Chebyshev-fitted erfc of Numerical Recipes (fractional error < 1.2e-7
    everywhere): vectorised, unlike math.erf. Checked against math.erf below (_check_erf)."""
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277
    for c in (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368,
              -1.26551223):
        p = c + t * p
    erfc = t * np.exp(-z * z + p)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0)


def _check_erf():
    g = np.linspace(-8, 8, 20001)
    err = np.max(np.abs(erf(g) - np.array([math.erf(v) for v in g])))
    assert err < 3e-7, f"erf approximation error {err}"


_check_erf()


def layernorm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def bert_embed(model_dir, id_lists, batch=64):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    W = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    if "embeddings.word_embeddings.weight" not in W:
        W = {k[5:] if k.startswith("bert.") else k: v for k, v in W.items()}
    H, NH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    eps = cfg.get("layer_norm_eps", 1e-12)
    HS = H // NH
    pool = "mean"
    pc = os.path.join(model_dir, "1_Pooling", "config.json")
    if os.path.exists(pc):
        p = json.load(open(pc))
        pool = "cls" if p.get("pooling_mode_cls_token") else "max" if p.get("pooling_mode_max_tokens") else "mean"
    order = sorted(range(len(id_lists)), key=lambda i: len(id_lists[i]))  # less padding
    groups, cur = [], []
    for i in order:  # batches of at most `batch` texts and ~4096 padded tokens
        if cur and (len(cur) >= batch or (len(cur) + 1) * len(id_lists[i]) > 4096):
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    outs = []
    for g in groups:
        ids = [id_lists[i] for i in g]
        B, T = len(ids), max(len(x) for x in ids)
        tok = np.zeros((B, T), dtype=np.int64)
        mask = np.zeros((B, T))
        for i, x in enumerate(ids):
            tok[i, : len(x)] = x
            mask[i, : len(x)] = 1
        x = (W["embeddings.word_embeddings.weight"][tok] + W["embeddings.position_embeddings.weight"][None, :T]
             + W["embeddings.token_type_embeddings.weight"][0][None, None])
        x = layernorm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
        bias = (1.0 - mask)[:, None, None, :] * -1e30  # padding mask
        for l in range(L):
            p = f"encoder.layer.{l}."
            lin = lambda v, n: (v.reshape(-1, v.shape[-1]) @ W[p + n + ".weight"].T + W[p + n + ".bias"]).reshape(
                v.shape[:-1] + (-1,))
            q = lin(x, "attention.self.query").reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
            k = lin(x, "attention.self.key").reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
            v = lin(x, "attention.self.value").reshape(B, T, NH, HS).transpose(0, 2, 1, 3)
            sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HS) + bias
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            a = (sc @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
            x = layernorm(lin(a, "attention.output.dense") + x, W[p + "attention.output.LayerNorm.weight"],
                          W[p + "attention.output.LayerNorm.bias"], eps)
            h = lin(x, "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
            x = layernorm(lin(h, "output.dense") + x, W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], eps)
        if pool == "cls":
            e = x[:, 0]
        elif pool == "max":
            e = np.where(mask[..., None] > 0, x, -np.inf).max(1)
        else:
            e = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        outs.append(e)
    res = np.empty((len(id_lists), H))
    res[order] = np.concatenate(outs)
    return res


# ---- texts ---------------------------------------------------------------------------------------------
def chunk_texts(n, seed=1234, chunk_len=32):
    """n real chunk texts: LM-tokenised GCIDE documents cut into chunk_len-token chunks, decoded."""
    from tokenizers import Tokenizer

    lm = Tokenizer.from_file(LM_TOKENIZER)
    docs = [json.loads(l)["text"] for l in open(CORPUS, encoding="utf-8")]
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        d = docs[rng.randrange(len(docs))]
        ids = lm.encode(d, add_special_tokens=False).ids
        if len(ids) < chunk_len:
            continue
        s = rng.randrange(0, len(ids) - chunk_len + 1)
        s -= s % chunk_len
        out.append(lm.decode(ids[s : s + chunk_len], skip_special_tokens=False))
    return out


HARD = [
    "", " ", "\t\n\r ", "Hello, World!", "HELLO world", "Café crème brûlée à la façon de Zoë",
    "Ångström naïve résumé coöperate", "ÀÉÎÕÜ àéîõü ñÑ çÇ ß ẞ", "İstanbul DİYARBAKIR ıi", "Σίσυφος ΟΔΥΣΣΕΥΣ",
    "中文字符测试，你好世界！", "日本語のテキストとカタカナ", "한국어 텍스트", "mixed中English文text",
    "𠀀𠀁 supplementary CJK 𪜀", "emoji 😀👍🏽 and symbols ©®™ ∑∫√ ≤≥", "punct... !!! ??? (a)[b]{c} <d> \"e\" 'f'",
    "don't won't it's o'clock", "e-mail co-operate well-known -- — – ‒", "¡Hola! ¿Qué tal? «guillemets» „quotes“",
    "tab\there\x0bvt\x0cff\x1fus \x7fdel \u200bzwsp \u00adsoft\u00adhyphen \ufeffbom", "zero\x00byte", "\ufffdreplacement",
    "a" * 99, "b" * 100, "c" * 101, "supercalifragilisticexpialidocious " * 3, "x" * 300,
    "unaffable unbelievably antidisestablishmentarianism", "[CLS] special [SEP] tokens [MASK] in [UNK] text [PAD]",
    "[cls] lower [Sep] case", "1234567890 3.14159 1,000,000 $5.00 50% #1 @home", "http://example.com/a?b=c&d=e",
    "\u2028line\u2029para\u00a0nbsp\u3000ideographic space\u2003em", "Combining: e\u0301 a\u0308 n\u0303 (decomposed)",
    "ﬁ ligature ﬂ ﬀ ① ² ½ Ⅻ ｆｕｌｌｗｉｄｔｈ", "Ελληνικά, русский текст, עברית, العربية, हिन्दी",
    "Arrive \\Ar*rive\"\\, v. t. 1. To bring to shore. [Obs.] [1913 Webster]",
]


def golden_cases(model_dir):
    texts = chunk_texts(300, seed=7)
    max_len = model_max_len(model_dir)
    full = hf_tokenizer(model_dir, 0)
    trunc = hf_tokenizer(model_dir, max_len)
    cases = []
    for i, t in enumerate(texts):
        cases.append({"name": f"chunk/{i:03d}", "text": t, "max_len": 0, "ids": full.encode(t).ids})
    for i, t in enumerate(HARD):
        cases.append({"name": f"hard/{i:02d}", "text": t, "max_len": 0, "ids": full.encode(t).ids})
    long_text = " ".join(texts[:40])
    for ml in (2, 3, 8, 64, max_len):
        tk = hf_tokenizer(model_dir, ml)
        cases.append({"name": f"trunc/{ml}", "text": long_text, "max_len": ml, "ids": tk.encode(long_text).ids,
                      "truncated": len(full.encode(long_text).ids) > ml})
    cases.append({"name": "trunc/exact", "text": texts[0], "max_len": len(full.encode(texts[0]).ids),
                  "ids": full.encode(texts[0]).ids, "truncated": False})
    del trunc
    return cases


def cmd_golden(a):
    import tokenizers

    out = a.out or os.path.join(ROOT, "tests/data/encoder/wordpiece.golden.jsonl")
    cases = golden_cases(a.model)
    lines = [json.dumps({"golden": 1, "model": os.path.basename(a.model.rstrip("/")),
                         "tokenizers_version": tokenizers.__version__, "cases": len(cases)})]
    lines += [json.dumps(c, ensure_ascii=False) for c in cases]
    text = "\n".join(lines) + "\n"
    if a.check:
        old = open(out, encoding="utf-8").read()
        o, n = old.split("\n")[1:-1], text.split("\n")[1:-1]
        bad = [i for i, (x, y) in enumerate(zip(o, n)) if x != y]
        if len(o) != len(n) or bad:
            print(f"golden drift: {len(o)} vs {len(n)} cases, differing: {bad[:10]}")
            return 1
        print(f"golden ok: {len(n)} cases identical to HF tokenizers {tokenizers.__version__}")
        return 0
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "w", encoding="utf-8").write(text)
    print(f"wrote {out}: {len(cases)} cases")
    return 0


def cmd_texts(a):
    with open(a.out, "w", encoding="utf-8") as f:
        for t in chunk_texts(a.n, seed=a.seed):
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return 0


def load_texts(path):
    return [json.loads(l)["text"] for l in open(path, encoding="utf-8") if l.strip()]


def cmd_embed(a):
    texts = load_texts(a.texts)
    tok = hf_tokenizer(a.model, a.max_len or model_max_len(a.model))
    ids = [e.ids for e in tok.encode_batch(texts)]
    e = bert_embed(a.model, ids)
    np.save(a.out, e)
    return 0


def cmd_unitref(a):
    """Small reference set committed for the C unit test: real chunks + edge cases, embeddings in float64."""
    texts = chunk_texts(a.n, seed=99) + ["", "Hello, World!", "中文字符测试，你好世界！", " ".join(chunk_texts(12, seed=5))]
    tok = hf_tokenizer(a.model, model_max_len(a.model))
    ids = [e.ids for e in tok.encode_batch(texts)]
    emb = bert_embed(a.model, ids)
    out = a.out or os.path.join(ROOT, "tests/data/encoder/reference.jsonl")
    with open(out, "w", encoding="utf-8") as f:
        for t, i, e in zip(texts, ids, emb):
            f.write(json.dumps({"text": t, "n_tokens": len(i), "emb": [float("%.9g" % v) for v in e]},
                               ensure_ascii=False) + "\n")
    print(f"wrote {out}: {len(texts)} texts")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("golden")
    g.add_argument("--out")
    g.add_argument("--check", action="store_true")
    t = sub.add_parser("texts")
    t.add_argument("--n", type=int, default=256)
    t.add_argument("--seed", type=int, default=1234)
    t.add_argument("--out", required=True)
    e = sub.add_parser("embed")
    e.add_argument("--texts", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--max-len", type=int, default=0)
    u = sub.add_parser("unitref")
    u.add_argument("--n", type=int, default=20)
    u.add_argument("--out")
    for p in (g, t, e, u):
        p.add_argument("--model", default=MODEL)
    a = ap.parse_args()
    return {"golden": cmd_golden, "texts": cmd_texts, "embed": cmd_embed, "unitref": cmd_unitref}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
