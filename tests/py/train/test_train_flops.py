"""dfm-train's FLOP count (trainer/model/flops.c, behind its MFU) equals the benchmark's (tests/ref/train_flops.py).

Both sides of bench/trainer/bench_train_gpu.sh must divide by the same model FLOPs: dfm-train prints its count
per token when training starts; tests/ref/train_flops.py computes it independently from the same flags.
Checked for pretraining (Qwen3, tied; Llama, untied) and DFM mode (per-head and per-channel gates,
several fusion layers), to a relative 1e-6.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
FAILS = []


def run(*args):
    r = subprocess.run([TRAIN] + [str(a) for a in args], capture_output=True, text=True)
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"FAIL: dfm-train {args[0]} exited {r.returncode}")
    m = re.search(r"([0-9.eE+-]+) GFLOP per token", r.stdout + r.stderr)
    return float(m.group(1)) * 1e9


def flops_py(args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "ref", "train_flops.py")] + [str(a) for a in args],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["flops_per_token"]


def check(c, what):
    print(("ok: " if c else "FAIL: ") + what)
    if not c:
        FAILS.append(what)


def main():
    with tempfile.TemporaryDirectory() as w:
        data = os.path.join(w, "s")
        subprocess.run([TRAIN] + [str(x) for x in ["synth", "--out", data, "--seqs", 40, "--seq-len", 64,
                                                   "--chunk-len", 16, "--vocab", 300, "--slots", 4, "--d-mem", 24]],
                       check=True, capture_output=True)
        common = ["--seq-len", 64, "--batch", 2, "--steps", 1, "--val-seqs", 4, "--eval-batches", 1, "--threads", 1]
        shapes = {
            "qwen3 tied": ["--layers", 4, "--hidden", 64, "--heads", 4, "--kv-heads", 2],
            "llama untied": ["--arch", "llama", "--layers", 3, "--hidden", 48, "--heads", 6, "--kv-heads", 3,
                             "--ffn", 100, "--untied"],
        }
        for name, shape in shapes.items():
            out = os.path.join(w, name.replace(" ", "_"))
            got = run("pretrain", "--data", os.path.join(data, "tokens.bin"), "--out", out, *shape, *common)
            ref = flops_py(["--mode", "pretrain", "--vocab", 320, *shape, "--seq-len", 64])
            check(abs(got - ref) <= 1e-6 * ref, f"pretrain {name}: dfm-train {got:.6g} vs tests/ref {ref:.6g} FLOP/token")
        backbone = os.path.join(w, "qwen3_tied", "model")
        for gate, fl in (("head", "1,3"), ("channel", "0,2,3")):
            extra = ["--chunk-len", 16, "--fusion-layers", fl, "--gate", gate, "--pred-hidden", 32, "--proj-hidden", 40]
            got = run("train", "--backbone", backbone, "--data", os.path.join(data, "tokens.bin"), "--targets",
                      os.path.join(data, "targets.bin"), "--out", os.path.join(w, "dfm_" + gate), *extra, *common)
            ref = flops_py(["--mode", "dfm", "--vocab", 320, *shapes["qwen3 tied"], "--seq-len", 64, "--slots", 4,
                            "--d-mem", 24, *extra])
            check(abs(got - ref) <= 1e-6 * ref, f"dfm {gate} gates, fusion {fl}: dfm-train {got:.6g} vs tests/ref {ref:.6g}")
    print(f"{len(FAILS)} failure(s)")
    return 1 if FAILS else 0


sys.exit(main())
