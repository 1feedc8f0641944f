"""PyTorch parity of the CPU reference trainer (dfm-train), in the manner of llm.c's test_gpt2.

`dfm-train debug-state` builds a tiny random model, runs one training forward + backward and dumps
parameters, inputs, loss, every trainable gradient and some activations (safetensors). The independent
PyTorch model (tests/ref/dfm_torch.py, float64, autograd, manual attention) recomputes everything from
the dumped parameters and inputs, and this file compares tensor by tensor with per-tensor tolerances.
It prints the worst error of each kind and exits non-zero on any mismatch.

Variants: dfm-head (Qwen3 with QK-norm, tied head, per-head gates, memory of the next chunk, teacher
forcing on every third chunk, predictor loss summed over d), dfm-channel (Llama, untied, per-channel
gates, memory of the token's own chunk, per-element MSE), pretrain (backbone trainable: gradients of
every backbone weight).
Run: $DFM_PYTHON tests/py/train/test_train_torch_parity.py   (DFM_TRAIN = path of dfm-train)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
from dfm_torch import DfmTorch, read_safetensors  # noqa: E402

DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
DT = torch.float64

# tolerances: fp32 C vs float64 PyTorch, norm-wise relative error of a tensor
TOL_LOSS = 1e-6
TOL_ACT = 1e-5
TOL_GRAD = 1e-4


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
    mem_src = T.get("in.mem_src")
    r = DfmTorch(bc, dc).forward(params, T["in.tokens"], T["in.targets"],
                                 tgt_mem.to(DT) if tgt_mem is not None else None, T.get("in.tgt_mask"),
                                 mem="mixed" if mem_src is not None else "predicted", mem_src=mem_src, keep_acts=True)
    loss, ce, mse, acts = r["loss"], r["ce"], r["mse"], r["acts"]
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
