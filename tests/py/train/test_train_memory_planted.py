"""Memory is used at all, and a broken memory path shows: the behavioural check of the memory path.

On the keyed-random corpus (`dfm-train synth --mode keyed-random`, trainer/data/synth.h: keys are
independent, so nothing before chunk c predicts its key; only chunk c's target memory does) a tiny
backbone is pretrained, then DFM modules are trained with --fusion-memory target. The held-out target CE
must be clearly below its shuffled control (another held-out sequence's memory through the same modules)
and below fusion off.

Then the same training runs on corrupted copies of the targets file (schemas/targets_file.md, written
here with its checksum; the tokens and every flag stay the same), each a memory-path bug planted in the
data the trainer reads:
  shift     chunk c holds chunk c-1's slots (memory one chunk late, the alignment off by one);
  zero      every slot all zeros;
  constant  every slot one and the same vector.
Each must remove the effect: the same assertion that passes on the real targets must fail on every
corrupted copy (the checks are evaluated on each and must say no), so the check can fail. So must the
trainer's matched-capacity control, `--memory-ablation zero` on the real targets file, and its random-vector
targets, `--memory-ablation random` (a fixed random direction per chunk and slot in place of each real slot).
Exits non-zero on any failure.
Run: $DFM_PYTHON tests/py/train/test_train_memory_planted.py   (DFM_TRAIN = path of dfm-train)
"""
import json
import os
import sys
import tempfile
import time

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from train_cli import ce_modes, check, finish, run  # noqa: E402

T, L, SEQS, VAL, PRE_STEPS, DFM_STEPS = 64, 16, 1200, 64, 300, 300
MIN_EFFECT = 0.1  # nats: the shuffled control minus target memory, and fusion off minus target memory
MAGIC, HEADER = b"DFMTGTS1", 64


def read_targets(path):
    """(k, d, chunk_len, mask [N, K] uint8, emb [N, K, d] float32) of a targets file, parsed here."""
    buf = open(path, "rb").read()
    assert buf[:8] == MAGIC, path
    ver, k, d, cl = np.frombuffer(buf, "<u4", 4, 8)
    n, ck = np.frombuffer(buf, "<u8", 2, 24)
    assert ver == 1 and xxhash.xxh3_64_intdigest(buf[HEADER:]) == int(ck), path
    k, d, n = int(k), int(d), int(n)
    mask = np.frombuffer(buf, np.uint8, n * k, HEADER).reshape(n, k).copy()
    emb = np.frombuffer(buf[HEADER + n * k:], "<f4").reshape(n, k, d).copy()
    return k, d, int(cl), mask, emb


def write_targets(path, k, d, cl, mask, emb):
    """A targets file with the given mask and slots (header, payload, XXH3-64 of the payload)."""
    pay = np.ascontiguousarray(mask, np.uint8).tobytes() + np.ascontiguousarray(emb, "<f4").tobytes()
    hdr = MAGIC + np.array([1, k, d, cl], "<u4").tobytes() + np.array([mask.shape[0], xxhash.xxh3_64_intdigest(pay)],
                                                                      "<u8").tobytes()
    with open(path, "wb") as f:
        f.write(hdr + b"\0" * (HEADER - len(hdr)) + pay)


def corrupt(how, mask, emb):
    """A planted memory-path bug: the (mask, emb) the trainer will read instead."""
    if how == "shift":  # chunk c gets chunk c-1's slots (chunk 0 of the stream gets none)
        m, e = np.zeros_like(mask), np.zeros_like(emb)
        m[1:], e[1:] = mask[:-1], emb[:-1]
        return m, e
    if how == "zero":
        return mask, np.zeros_like(emb)
    if how == "constant":
        return mask, np.broadcast_to(emb[1, 0], emb.shape).copy()
    raise ValueError(how)


def memory_used(ev):
    """The verdict on one run: (passes, why). Target memory must beat its shuffled control and fusion off."""
    eff, gain = ev["memory_effect_target"], ev["ce_none"] - ev["ce_target"]
    return eff >= MIN_EFFECT and gain >= MIN_EFFECT, ("target CE %.4f: %.4f nats below its shuffled control %.4f, "
                                                      "%.4f below fusion off %.4f (each >= %.2f)"
                                                      % (ev["ce_target"], eff, ev["ce_target_shuffled"], gain,
                                                         ev["ce_none"], MIN_EFFECT))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as w:
        common = ["--seq-len", T, "--batch", 8, "--val-seqs", VAL, "--threads", 2, "--no-ckpt"]
        syn = os.path.join(w, "syn")
        run("synth", "--out", syn, "--mode", "keyed-random", "--seqs", SEQS, "--seq-len", T, "--chunk-len", L)
        pre = os.path.join(w, "pre")
        run("pretrain", "--data", os.path.join(syn, "tokens.bin"), "--out", pre, "--steps", PRE_STEPS, "--lr", 3e-3,
            "--warmup", 20, "--layers", 2, "--hidden", 64, "--heads", 4, "--kv-heads", 2, *common)
        k, d, cl, mask, emb = read_targets(os.path.join(syn, "targets.bin"))
        check(cl == L and mask.shape[0] * L >= SEQS * T,
              "targets file: K=%d d=%d L=%d, %d chunks" % (k, d, cl, mask.shape[0]))

        def train(name, m, e, *extra):
            tg = os.path.join(w, name + ".bin")
            write_targets(tg, k, d, cl, m, e)
            out = os.path.join(w, name + "-dfm")
            run("train", "--backbone", os.path.join(pre, "model"), "--data", os.path.join(syn, "tokens.bin"),
                "--targets", tg, "--out", out, "--steps", DFM_STEPS, "--chunk-len", L, "--lr", 5e-3, "--warmup", 20,
                "--fusion-layers", "0,1", "--pred-hidden", 64, "--fusion-memory", "target", *common, *extra)
            ev = [r for r in map(json.loads, open(os.path.join(out, "log.jsonl"))) if "eval" in r][-1]["eval"]
            ce_modes(ev, name)
            ok, why = memory_used(ev)
            print("%s targets: %s -> %s; top-1 token accuracy target %.4f, shuffled %.4f, fusion off %.4f"
                  % (name, why, "memory used" if ok else "no memory effect", ev["acc_target"],
                     ev["acc_target_shuffled"], ev["acc_none"]))
            return ok, why, ev

        ok, why, ev = train("real", mask, emb)
        check(ok, "real targets: " + why)
        check(all(0 <= ev[k] <= 1 for k in ("acc_target", "acc_target_shuffled", "acc_none", "acc_pred")) and
              ev["acc_target"] >= ev["acc_target_shuffled"] + 0.01,
              "real targets: top-1 token accuracy with own memory %.4f, at least 0.01 above the shuffled control's %.4f"
              % (ev["acc_target"], ev["acc_target_shuffled"]))
        for how in ("shift", "zero", "constant"):
            ok, why, _ = train(how, *corrupt(how, mask, emb))
            check(not ok, "planted corruption '%s' removes the effect (the check fails on it): %s" % (how, why))
        # the trainer's own matched-capacity control: the real targets file, every slot zeroed in training
        ok, why, _ = train("ablation-zero", mask, emb, "--memory-ablation", "zero")
        check(not ok, "--memory-ablation zero (real targets, slots zeroed in training) has no memory effect: " + why)
        # random-vector targets: a fixed random code per (chunk, slot) in training says nothing about the text, so
        # the modules cannot read the real held-out memory either
        ok, why, _ = train("ablation-random", mask, emb, "--memory-ablation", "random")
        check(not ok, "--memory-ablation random (real targets replaced by fixed random directions in training) has no "
              "memory effect: " + why)
    finish("memory used, and each planted corruption removes the effect (%.0f s)" % (time.time() - t0))


if __name__ == "__main__":
    main()
