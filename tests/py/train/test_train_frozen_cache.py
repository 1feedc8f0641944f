"""dfm-train train --cache-frozen gives the bytes of an uncached run.

The frozen prefix (decoder layers up to the first fusion layer, the predictor's pooled input) of each training
sequence is kept after its first forward and later epochs start at the first fusion layer. On a small
synthetic set trained for several epochs (so most batches take the cache), with the predictor on an
intermediate layer, teacher forcing and two batch sizes, the exported modules and every logged loss must be
identical to an uncached run's, and the log must show that batches did take the cache. Refusals: a
pretraining run; a CUDA device.
"""
import filecmp
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import check, finish, run  # noqa: E402


def losses(out):
    return [(j["step"], j["loss"], j["ce"], j["mse"]) for j in map(json.loads, open(os.path.join(out, "log.jsonl")))
            if "loss" in j] + [json.dumps(j["eval"], sort_keys=True) for j in map(json.loads, open(os.path.join(out, "log.jsonl")))
                               if "eval" in j]


def main():
    with tempfile.TemporaryDirectory() as w:
        syn, pre = os.path.join(w, "syn"), os.path.join(w, "pre")
        run("synth", "--out", syn, "--mode", "keyed", "--seqs", 40, "--seq-len", 64, "--chunk-len", 16)
        run("pretrain", "--data", os.path.join(syn, "tokens.bin"), "--out", pre, "--steps", 30, "--layers", 4, "--hidden", 32,
            "--heads", 4, "--kv-heads", 2, "--seq-len", 64, "--batch", 4, "--val-seqs", 4, "--threads", 1, "--no-ckpt")
        for B, steps, extra in ((4, 30, []), (3, 25, ["--fusion-memory", "predicted"])):
            outs = []
            for cache in (False, True):
                out = os.path.join(w, f"b{B}-{'cache' if cache else 'plain'}")
                p = run("train", "--backbone", os.path.join(pre, "model"), "--data", os.path.join(syn, "tokens.bin"),
                        "--targets", os.path.join(syn, "targets.bin"), "--out", out, "--chunk-len", 16, "--seq-len", 64,
                        "--batch", B, "--steps", steps, "--val-seqs", 4, "--fusion-layers", "2,3", "--pred-input-layer", 2,
                        "--pred-hidden", 32, "--eval-every", 10, "--threads", 1, "--seed", 3, *extra,
                        *(["--cache-frozen"] if cache else []))
                outs.append(out)
                if cache:
                    hits = [l for l in p.stderr.splitlines() if "batches started at layer" in l]
                    n = int(hits[0].split("--cache-frozen: ")[1].split()[0]) if hits else 0
                    check(n >= steps // 2, f"batch {B}: {n} of {steps} batches took the cache ({hits[:1]})")
            same = filecmp.cmp(os.path.join(outs[0], "dfm_modules.safetensors"),
                               os.path.join(outs[1], "dfm_modules.safetensors"), shallow=False)
            check(same, f"batch {B}: the cached run's modules equal the uncached run's, byte for byte")
            check(losses(outs[0]) == losses(outs[1]), f"batch {B}: every logged loss and evaluation is identical")
        p = run("pretrain", "--data", os.path.join(syn, "tokens.bin"), "--out", os.path.join(w, "x"), "--steps", 1,
                "--layers", 2, "--hidden", 32, "--heads", 4, "--seq-len", 64, "--cache-frozen", ok=False)
        check(p.returncode != 0, "pretrain refuses --cache-frozen (it is not one of its flags)")
        p = run("train", "--backbone", os.path.join(pre, "model"), "--data", os.path.join(syn, "tokens.bin"), "--targets",
                os.path.join(syn, "targets.bin"), "--out", os.path.join(w, "y"), "--chunk-len", 16, "--seq-len", 64,
                "--steps", 1, "--cache-frozen", "--device", "cuda", ok=False)
        check(p.returncode != 0 and ("--cache-frozen" in p.stderr or "CUDA" in p.stderr or "cuda" in p.stderr),
              "--device cuda with --cache-frozen is refused: " + (p.stderr.strip().splitlines() or [""])[-1][:160])
    finish("--cache-frozen")


if __name__ == "__main__":
    main()
