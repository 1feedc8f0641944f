"""dfm.torch against dfm-train: the held-out CE (predicted, fusion off, target memory), MSE and cosine of
trained DFM modules on their frozen backbone equal `dfm-train eval` to 1e-4 in fp32, and greedy
generation gives `dfm-train generate`'s ids.

Two small set-ups made in seconds (dfm-train synth, pretrain, train), covering the options the modules
read: a tied Qwen3 backbone, fusion after layers 0 and 1, memory_align next, the predictor on the input
embeddings, per-head gates, targets from a targets file; and an untied Llama backbone, fusion after layer
1 only, memory_align same, the predictor on layer 0's output, per-channel gates, the first chunk fused,
the content-only fusion with centred memory, targets from a target run read through libdfm. A forward from the
frozen prefix (DFMModel.prefix: the blocks below the first fusion layer run once, as evaluate does) gives every mode's
logits and slots bit for bit. The backbone is dfm.torch's plain PyTorch decoder over
the Hugging Face folder (transformers is not importable with the project venv's torch 1.13; see
bench/results/python_loader.md for the transformers run). Exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import dfm  # noqa: E402
import dfm.torch as dt  # noqa: E402
from train_cli import check, finish, run, worst_diff  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
T, L, VAL, B = 64, 16, 12, 4
TOL = 1e-4


def setup(w, name, arch_flags, dfm_flags, targets):
    pre, out = os.path.join(w, name + "-pre"), os.path.join(w, name + "-dfm")
    common = ["--seq-len", T, "--batch", B, "--val-seqs", VAL, "--threads", 1, "--no-ckpt"]
    run("pretrain", "--data", os.path.join(w, "syn", "tokens.bin"), "--out", pre, "--steps", 200, "--lr", 1e-2,
        "--layers", 2, "--hidden", 32, "--heads", 4, "--kv-heads", 2, *arch_flags, *common)
    run("train", "--backbone", os.path.join(pre, "model"), "--data", os.path.join(w, "syn", "tokens.bin"), "--targets",
        targets, "--out", out, "--chunk-len", L, "--steps", 15, "--lr", 5e-3, "--pred-hidden", 32, "--pred-heads", 2,
        *dfm_flags, *common)
    return os.path.join(pre, "model"), os.path.join(out, "dfm_modules.safetensors")


def compare(w, name, backbone, modules, targets):
    p = run("eval", "--backbone", backbone, "--modules", modules, "--data", os.path.join(w, "syn", "tokens.bin"),
            "--targets", targets, "--seq-len", T, "--batch", B, "--val-seqs", VAL, "--threads", 1)
    c = json.loads(p.stdout.strip().splitlines()[-1])
    model = dt.DFMModel(dt.load_backbone(backbone, use_transformers=False), dt.DFMModules.from_safetensors(modules)).eval()
    batches = dfm.Batches(None, T, B, data=os.path.join(w, "syn", "tokens.bin"), targets=targets, chunk_len=L,
                          val_seqs=VAL, split="heldout", format="torch")
    py = dt.evaluate(model, batches)
    keys = ("ce_pred", "ce_none", "ce_target", "mse", "cos", "ce_pred_shuffled", "ce_target_shuffled")
    worst = worst_diff((py[k] for k in keys), (c[k] for k in keys))
    check(worst < TOL and py["batches"] == c["batches"],
          "%s: dfm.torch %s vs dfm-train eval %s (worst |diff| %.2e < %g)" % (
              name, {k: round(py[k], 6) for k in keys}, {k: c[k] for k in keys}, worst, TOL))
    b = next(iter(dfm.Batches(None, T, B, data=os.path.join(w, "syn", "tokens.bin"), targets=targets, chunk_len=L,
                              val_seqs=VAL, split="heldout", format="torch")))
    # and a variant whose predictor reads the input embeddings, below the prefix's last block: its source is
    # then not the prefix's states
    mods2 = dt.DFMModules.from_safetensors(modules)
    mods2.config["pred_input_layer"] = 0
    for m, what in ((model, "the modules' own predictor input"), (dt.DFMModel(model.backbone, mods2).eval(),
                                                                  "the predictor on the input embeddings")):
        pre = m.prefix(b.tokens)
        same = []
        with torch.no_grad():
            for mode in ("predicted", "none", "target"):
                full = m(b.tokens, b.labels, b.memory, b.mask, mode=mode)
                part = m(b.tokens, b.labels, b.memory, b.mask, mode=mode, prefix=pre)
                same.append(torch.equal(full["logits"], part["logits"]) and
                            (full["slots"] is None or torch.equal(full["slots"], part["slots"])))
        check(all(same) and pre["start"] == min(m.fl),
              "%s, %s: with the frozen prefix computed once (blocks below layer %d), every mode's logits and slots "
              "are bit-identical to a full forward %s" % (name, what, pre["start"], same))
    gain = c["ce_none"] - c["ce_pred"]
    check(abs(gain) > 0 and abs(py["ce_none"] - py["ce_pred"] - gain) < TOL,
          "%s: the memory changes the CE (%.4f nats) and both agree on it" % (name, gain))
    prompt = dfm.load_tokens(os.path.join(w, "syn", "tokens.bin"))[0][-40:-21].tolist()  # held-out text
    g = run("generate", "--backbone", backbone, "--modules", modules, "--prompt-ids", ",".join(map(str, prompt)),
            "--max-new", 12)
    c_ids = [int(x) for x in g.stdout.strip().splitlines()[-1].split(":", 1)[1].split(",")]
    py_ids = model.generate(torch.tensor(prompt), 12)[len(prompt):].tolist()
    check(py_ids == c_ids, "%s: generate gives dfm-train generate's ids %s" % (name, c_ids))
    return len(set(c_ids))


def main():
    t0 = time.time()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
    with tempfile.TemporaryDirectory() as w:
        run("synth", "--out", os.path.join(w, "syn"), "--mode", "keyed", "--seqs", 120, "--seq-len", T, "--chunk-len", L)
        trun = os.path.join(w, "trun")
        subprocess.run([DFM, "write-targets", trun, "--synthetic", "481", "--k", "4", "--d", "32", "--target-shards", "2",
                        "--seq-chunks", str(T // L), "--dtype", "fp32"], env=env, check=True, stdout=subprocess.DEVNULL)
        tfile = os.path.join(w, "syn", "targets.bin")
        bb, mods = setup(w, "qwen3", ["--arch", "qwen3"], ["--fusion-layers", "0,1"], tfile)
        distinct = compare(w, "qwen3/next/file", bb, mods, tfile)
        bb, mods = setup(w, "llama", ["--arch", "llama", "--untied"],
                         ["--fusion-layers", "1", "--memory-align", "same", "--pred-input-layer", 1, "--pred-input-tokens", 5, "--pred-skip",
                          "--gate", "channel",
                          "--fuse-first-chunk", "--fusion-memory", "target", "--content-only-fusion", "--centre-memory"],
                         trun)
        distinct = max(distinct, compare(w, "llama/same/run", bb, mods, trun))
        check(distinct > 1, "a generation that is not one repeated token (the check can tell orders apart)")
    print("%.1f s" % (time.time() - t0))
    finish("dfm.torch modules on the backbone equal dfm-train eval and generate")


if __name__ == "__main__":
    main()
