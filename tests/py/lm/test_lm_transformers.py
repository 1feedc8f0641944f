"""The real LM (SmolLM2-135M, converted by `dfm-train import-gguf`) against the ecosystem's own loader:
transformers 5.24 in the pinned peers venv (bench/peers.sh), which reads the same GGUF directly.

1. Logits: dfm-train's forward (hidden states through the tied head) equals transformers' LlamaForCausalLM
   loaded from the converted folder, and loaded from the GGUF itself (from_pretrained(..., gguf_file=...)),
   within 1e-3 absolute on real text.
2. Token ids: `dfm tokenize` equals transformers' GGUF tokenizer on a varied text set (digits, code, Unicode,
   whitespace runs, special tokens). transformers 5.24's GGUF converter has no entry for the "smollm"
   pre-tokenizer, so it omits SmolLM2's Digits step: with that step put back, the ids must be equal on every
   text; without it, on every text that has no non-ASCII numeral (the only place the missing step shows).
3. The Python package on the real model: DFM modules trained by dfm-train on the frozen SmolLM2 run in
   dfm.torch on transformers' LlamaForCausalLM, and held-out CE in every mode equals `dfm-train eval` within
   1e-4.

Run by tests/run.sh with the project venv, where transformers does not import (Debian's torch 1.13): there
the bridge of 3 runs on dfm.torch's own PyTorch decoder over the same folder, then the test re-runs itself
with the peers venv's Python for 1-3. Without the peers venv those are reported as "SKIP: ..." lines, which
tests/run.sh counts as skipped (create the venv with `bash bench/peers.sh`).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CACHE = os.environ.get("DFM_CACHE", "/var/cache/dfm")
LM = os.environ.get("DFM_LM", os.path.join(CACHE, "models", "smollm2-135m"))
GGUF = os.environ.get("DFM_LM_GGUF", os.path.join(CACHE, "models", "smollm2-135m-gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"))

TEXTS = [
    "The capital of France is Paris. It had 2,148,271 inhabitants in 2020 (INSEE).",
    "def f(x):\n    return x**2 + 3.14159 * x  # comment\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; i++) { a[i] = b[i] * 0x1F; }  // C code",
    "Numbers: 0 1 22 333 4444 55555 123456789, 1.5e-10, v2.0.1-rc3, x86_64, COVID-19",
    "Non-ASCII numerals: \u0661\u0662\u0663 (Arabic-Indic), \u00bd \u00b2 \u2462 \u216b, \u0967\u0968 (Devanagari)",
    "Unicode: na\u00efve caf\u00e9, \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac, \u0440\u0443\u0441\u0441\u043a\u0438\u0439, "
    "\u4e2d\u6587\u5b57\u7b26, \u65e5\u672c\u8a9e, \ud55c\uad6d\uc5b4, emoji \U0001F917\U0001F680\U0001F44D\U0001F3FD",
    "   leading spaces, trailing spaces   \n\n\n  multiple\t\ttabs  and \r\n CRLF lines  ",
    " " * 17 + "x" + "\n" * 5 + "\t" * 3 + "y",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|><|endoftext|>",
    "It's they're we've I'm you'll he'd \u2014 \u201cquotes\u201d \u2018single\u2019 \u00abguillemets\u00bb \u2026",
    "URL https://example.com/a/b?c=1&d=2#frag and e-mail someone@example.org",
    "9" * 40,
    "Mixed    whitespace\u00a0nbsp\u2003emsp\u3000ideographic",
    "",
]


def outer():
    """Under the project venv: the bridge on dfm.torch's own decoder, then 1-3 in the peers venv."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from train_cli import FAILS, finish
    bridge(use_transformers=False)
    p = subprocess.run(["bash", os.path.join(ROOT, "bench", "peers.sh"), "--python"], capture_output=True, text=True)
    if p.returncode:
        print("SKIP: transformers 5.24 parity on SmolLM2 (logits from the folder and from the GGUF, the GGUF tokenizer's "
              "ids, dfm.torch on LlamaForCausalLM): the pinned peers venv is absent; create it with: bash bench/peers.sh")
    else:
        r = subprocess.run([p.stdout.strip(), os.path.abspath(__file__)], env=dict(os.environ, DFM_IN_PEERS="1"))
        if r.returncode:
            FAILS.append("the checks in the peers venv")
    finish("the real LM: dfm.torch's decoder here, transformers in the peers venv")


def bridge(use_transformers):
    """3: modules dfm-train trains on the frozen SmolLM2, evaluated by dfm.torch on the same backbone folder."""
    import numpy as np
    import dfm
    import dfm.torch as dt
    from train_cli import check, run, worst_diff
    T2, L, VAL, B = 64, 16, 4, 2
    with tempfile.TemporaryDirectory() as w:
        run("synth", "--out", os.path.join(w, "syn"), "--mode", "keyed", "--seqs", 40, "--seq-len", T2, "--chunk-len", L)
        data, targets, out = os.path.join(w, "syn", "tokens.bin"), os.path.join(w, "syn", "targets.bin"), os.path.join(w, "dfm")
        common = ["--seq-len", T2, "--batch", B, "--val-seqs", VAL, "--threads", 2]
        run("train", "--backbone", LM, "--data", data, "--targets", targets, "--out", out, "--chunk-len", L, "--steps", 4,
            "--lr", 5e-3, "--warmup", 1, "--fusion-layers", "26,29", "--pred-input-layer", 16, "--no-ckpt", *common)
        mods = os.path.join(out, "dfm_modules.safetensors")
        p = run("eval", "--backbone", LM, "--modules", mods, "--data", data, "--targets", targets, *common)
        c = json.loads(p.stdout.strip().splitlines()[-1])
        bb = dt.load_backbone(LM, use_transformers=use_transformers)
        want = "LlamaForCausalLM" if use_transformers else "Backbone"
        check(type(bb).__name__ == want, f"dfm.torch.load_backbone gives {want} ({type(bb).__name__})")
        model = dt.DFMModel(bb, dt.DFMModules.from_safetensors(mods)).eval()
        batches = dfm.Batches(None, T2, B, data=data, targets=targets, chunk_len=L, val_seqs=VAL, split="heldout",
                              format="torch")
        py = dt.evaluate(model, batches)
        keys = ("ce_pred", "ce_none", "ce_target", "mse", "cos", "ce_pred_shuffled", "ce_target_shuffled")
        worst = worst_diff((py[k] for k in keys), (c[k] for k in keys))  # inf if a value is not finite
        check(worst < 1e-4 and py["batches"] == c["batches"] and all(np.isfinite(c[k]) for k in keys),
              f"dfm.torch on SmolLM2 ({want}) {{{', '.join(f'{k}: {py[k]:.6f}' for k in keys)}}} equals dfm-train "
              f"eval {{{', '.join(f'{k}: {c[k]:.6f}' for k in keys)}}} (worst |diff| {worst:.2e} < 1e-4)")


def inner():
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, os.path.join(ROOT, "python"))
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from train_cli import check, finish, run  # noqa: E402
    DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(2)
    gdir, gname = os.path.split(GGUF)

    # ---- 1. logits ----
    from tokenizers import Tokenizer
    tk = Tokenizer.from_file(os.path.join(LM, "tokenizer.json"))
    text = open("/usr/share/common-licenses/GPL-3").read()[:3000]
    T, S = 64, 3
    ids = tk.encode(text, add_special_tokens=False).ids[:S * T + 1]
    with tempfile.TemporaryDirectory() as w:
        hdr = np.zeros(256, np.int32)
        hdr[:3] = (20240801, 7, len(ids))
        with open(os.path.join(w, "t.bin"), "wb") as f:
            f.write(hdr.tobytes() + np.array(ids, np.uint32).tobytes())
        run("hidden", "--backbone", LM, "--data", os.path.join(w, "t.bin"), "--out", os.path.join(w, "h.bin"),
            "--seq-len", T, "--batch", 1, "--threads", 2)
        b = open(os.path.join(w, "h.bin"), "rb").read()
    nk, dim = struct.unpack("<Q", b[16:24])[0], struct.unpack("<I", b[24:28])[0]
    H = torch.from_numpy(np.frombuffer(b[128:128 + nk * dim * 4], np.float32).reshape(nk, dim).copy())
    x = torch.tensor(ids[:S * T]).view(S, T)
    for src, load in (("the converted folder", lambda: AutoModelForCausalLM.from_pretrained(LM, dtype=torch.float32)),
                      ("the GGUF directly", lambda: AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname,
                                                                                          dtype=torch.float32))):
        m = load().eval()
        with torch.no_grad():
            ref = m(x).logits.reshape(S * T, -1).double()
            ours = H.double() @ m.get_output_embeddings().weight.detach().double().T
        err = float((ours - ref).abs().max())
        check(nk == S * T and err < 1e-3, f"logits: dfm-train vs transformers from {src}, max |diff| {err:.2e} over "
                                          f"{S} x {T} tokens x {ref.shape[1]} (< 1e-3)")
        del m

    # ---- 2. token ids ----
    tg = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    backend = tg.backend_tokenizer
    from tokenizers import pre_tokenizers
    raw_pre = backend.pre_tokenizer
    patched = Tokenizer.from_str(backend.to_str())
    patched.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), raw_pre])
    bad_raw, bad_patched, bad_self = [], [], []
    for t in TEXTS:
        p = subprocess.run([DFM, "tokenize", "--tokenizer", os.path.join(LM, "tokenizer.json"), "-"], input=t.encode(),
                           capture_output=True)
        ours = [int(v) for v in p.stdout.split()]
        if p.returncode or ours != tk.encode(t, add_special_tokens=False).ids:
            bad_self.append(t[:30])
        if ours != tg(t, add_special_tokens=False)["input_ids"]:
            bad_raw.append(t)
        if ours != patched.encode(t, add_special_tokens=False).ids:
            bad_patched.append(t[:30])
    non_ascii_digits = lambda t: any(unicodedata.category(c).startswith("N") and not c.isascii() for c in t)
    check(not bad_self, f"dfm tokenize equals tokenizers on the built tokenizer.json ({bad_self})")
    check(not bad_patched, f"dfm tokenize equals transformers' GGUF tokenizer with SmolLM2's Digits step on all "
                           f"{len(TEXTS)} texts ({bad_patched})")
    check(all(non_ascii_digits(t) for t in bad_raw),
          f"dfm tokenize equals transformers' GGUF tokenizer as it is on every text without non-ASCII numerals "
          f"({len(TEXTS) - len(bad_raw)} of {len(TEXTS)} equal; the rest hold non-ASCII numerals: "
          f"{[t[:24] for t in bad_raw]})")

    # ---- 3. dfm.torch on transformers' LlamaForCausalLM ----
    bridge(use_transformers=True)
    finish("the real LM against transformers")


if __name__ == "__main__":
    inner() if os.environ.get("DFM_IN_PEERS") else outer()
