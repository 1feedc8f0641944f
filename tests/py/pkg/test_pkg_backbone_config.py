"""dfm.torch's Backbone refuses exactly the config.json that dfm-train refuses, and load_backbone falls back
to it only when transformers is not installed.

A tiny backbone from `dfm-train pretrain` (seconds); then for each change of its config.json (a Llama-3
rope_scaling, attention_bias, a sliding window shorter or longer than the sequence, another activation
or architecture, heads that do not group, values out of range or of the wrong type, ...) both loaders
give the same verdict, the one in the table: `dfm-train hidden --seq-len T` (trainer/model/model_config.c) and
Backbone.from_pretrained(max_seq=T) (check_hf_config). A refusal names the same field in both messages.
An accepted config also runs a forward of T tokens in PyTorch; a longer one than its sliding window is
refused there. Then load_backbone: with a stand-in `transformers` whose loader raises, the error comes
through (no silent fallback to Backbone, which would run a model transformers could not load); without
`transformers`, Backbone. Exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import dfm.torch as dt  # noqa: E402
from train_cli import DFM_TRAIN, check, finish, run  # noqa: E402

T = 64
DROP = object()  # a change that removes the key
# (what, {key: new value or DROP}, accepted by dfm-train)
CASES = [
    ("as written by dfm-train", {}, True),
    ("Llama-3 rope_scaling", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}, False),
    ("linear rope_scaling", {"rope_scaling": {"type": "linear", "factor": 2.0}}, False),
    ("rope_scaling null", {"rope_scaling": None}, True),
    ("attention_bias true", {"attention_bias": True}, False),
    ("attention_bias false", {"attention_bias": False}, True),
    ("sliding_window shorter than the sequence", {"sliding_window": T // 2}, False),
    ("the same window, use_sliding_window false", {"sliding_window": T // 2, "use_sliding_window": False}, True),
    ("sliding_window as long as the sequence", {"sliding_window": T}, True),
    ("sliding_window null", {"sliding_window": None}, True),
    ("hidden_act gelu", {"hidden_act": "gelu"}, False),
    ("MistralForCausalLM (Llama's tensors)", {"architectures": ["MistralForCausalLM"]}, True),
    ("GPT2LMHeadModel", {"architectures": ["GPT2LMHeadModel"]}, False),
    ("no architectures", {"architectures": DROP}, False),
    ("num_key_value_heads 3 of 4 heads", {"num_key_value_heads": 3}, False),
    ("num_key_value_heads above the heads", {"num_key_value_heads": 8}, False),
    ("odd head_dim", {"head_dim": 7}, False),
    ("rms_norm_eps 0", {"rms_norm_eps": 0}, False),
    ("rms_norm_eps 1.5", {"rms_norm_eps": 1.5}, False),
    ("rms_norm_eps as a string", {"rms_norm_eps": "1e-6"}, False),
    ("rms_norm_eps below fp32", {"rms_norm_eps": 1e-50}, False),
    ("rope_theta -1", {"rope_theta": -1.0}, False),
    ("vocab_size true", {"vocab_size": True}, False),
    ("vocab_size 2^24 + 1", {"vocab_size": (1 << 24) + 1}, False),
    ("no hidden_size", {"hidden_size": DROP}, False),
    ("num_hidden_layers 2.0", {"num_hidden_layers": 2.0}, False),
    ("max_position_embeddings 0", {"max_position_embeddings": 0}, False),
]


def variant(w, base, i, change):
    d = os.path.join(w, "v%02d" % i)
    os.makedirs(d)
    cfg = dict(base)
    for k, v in change.items():
        if v is DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    os.symlink(os.path.join(w, "pre", "model", "model.safetensors"), os.path.join(d, "model.safetensors"))
    return d, cfg


def main():
    with tempfile.TemporaryDirectory() as w:
        run("synth", "--out", os.path.join(w, "data"), "--seqs", 16, "--seq-len", T, "--chunk-len", 16, "--vocab", 120)
        tokens = os.path.join(w, "data", "tokens.bin")
        run("pretrain", "--data", tokens, "--out", os.path.join(w, "pre"), "--arch", "llama", "--steps", 1, "--layers", 1,
            "--hidden", 32, "--heads", 4, "--kv-heads", 2, "--seq-len", T, "--batch", 2, "--val-seqs", 2, "--threads", 1,
            "--no-ckpt")
        base = json.load(open(os.path.join(w, "pre", "model", "config.json")))
        check(base["architectures"] == ["LlamaForCausalLM"], "the base backbone is Llama-shaped: %s" % base["architectures"])
        ids = torch.arange(T).remainder(base["vocab_size"]).view(1, T)
        for i, (what, change, accepted) in enumerate(CASES):
            d, cfg = variant(w, base, i, change)
            p = subprocess.run([DFM_TRAIN, "hidden", "--backbone", d, "--data", tokens, "--out", os.path.join(d, "h.bin"),
                                "--seq-len", str(T), "--batch", "1", "--max-tokens", "1", "--threads", "1"],
                               capture_output=True, text=True, errors="replace")
            c_ok = p.returncode == 0
            try:
                bb = dt.Backbone.from_pretrained(d, max_seq=T)
                py_ok, py_err = True, ""
            except ValueError as e:
                py_ok, py_err = False, str(e)
            check(c_ok == accepted and py_ok == accepted,
                  "%s: dfm-train %s, dfm.torch %s (expected: %s)%s" % (
                      what, "accepts" if c_ok else "refuses", "accepts" if py_ok else "refuses",
                      "accepted" if accepted else "refused",
                      "" if c_ok == py_ok == accepted else "\n    dfm-train: %s\n    dfm.torch: %s" % (
                          p.stderr.strip()[-400:], py_err)))
            if not accepted and not py_ok:  # the same reason: dfm.torch's message is dfm-train's
                try:
                    dt.check_hf_config(cfg, T)
                    msg = ""
                except ValueError as e:
                    msg = str(e)
                check(msg != "" and msg.split(". HINT")[0] in p.stderr,
                      "%s: dfm-train's message holds dfm.torch's %r" % (what, msg))
            if accepted and py_ok:
                with torch.no_grad():
                    out = bb(ids)
                check(tuple(out.shape) == (1, T, base["vocab_size"]) and bool(torch.isfinite(out).all()),
                      "%s: a forward of %d tokens gives finite logits" % (what, T))
        # a sliding window accepted for T is enforced on longer sequences
        d, _ = variant(w, base, len(CASES), {"sliding_window": T})
        bb = dt.Backbone.from_pretrained(d, max_seq=T)
        try:
            bb(torch.zeros(1, T + 1, dtype=torch.long))
            longer = "ran"
        except ValueError as e:
            longer = str(e)
        check("sliding_window" in longer, "a forward of %d tokens with sliding_window %d is refused: %s" % (T + 1, T, longer))

        # load_backbone: only an ImportError of transformers falls back
        good = os.path.join(w, "pre", "model")
        fake = types.ModuleType("transformers")

        class Auto:
            @staticmethod
            def from_pretrained(*a, **k):
                raise RuntimeError("this transformers cannot load the model")

        fake.AutoModelForCausalLM = Auto
        saved = sys.modules.get("transformers")
        sys.modules["transformers"] = fake
        try:
            dt.load_backbone(good)
            got = "fell back to Backbone"
        except RuntimeError as e:
            got = "raised: %s" % e
        finally:
            if saved is None:
                del sys.modules["transformers"]
            else:
                sys.modules["transformers"] = saved
        check(got.startswith("raised"), "a transformers that fails to load the model is not replaced silently (%s)" % got)
        sys.modules["transformers"] = None  # `import transformers` raises ImportError
        try:
            m = dt.load_backbone(good)
            check(isinstance(m, dt.Backbone) and not any(p.requires_grad for p in m.parameters()),
                  "without transformers: the frozen Backbone")
            try:
                dt.load_backbone(good, use_transformers=True)
                check(False, "use_transformers=True without transformers raises ImportError")
            except ImportError:
                check(True, "use_transformers=True without transformers raises ImportError")
        finally:
            if saved is None:
                del sys.modules["transformers"]
            else:
                sys.modules["transformers"] = saved
    finish("Backbone refuses what dfm-train refuses; load_backbone falls back only on ImportError")


if __name__ == "__main__":
    main()
