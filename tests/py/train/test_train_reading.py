"""Reading pretraining (`dfm-train train --objective reconstruct`, trainer/data/reading.h) against an independent reader.

- the reading set: `dfm-train dump-batches --objective reconstruct` hands the model, for sequence i, the prompt then
  the i-th chunk of the run that holds a token, read here from the chunk shards themselves (schemas/chunk_shard.md);
  labels only on that chunk's valid tokens (the prompt's last token predicting its first); target memory: none for
  chunk 0, and for chunk 1 exactly one slot, the chunk's own row of the encode stage's embedding shards
  (schemas/embedding_shard.md, read here with NumPy), the other slots masked;
- a planted off-by-one (the next chunk's embedding in place of the chunk's own) is caught by the same comparison;
- a short reconstruct run trains and evaluates own slot against the shuffled control (finite CE and top-1 token
  accuracy, both reported); `dfm-train eval --objective reconstruct` of its modules gives the same evaluation;
- `train --init-modules` starts DFM training from those modules: with --lr 0 the exported modules equal them.
Exits non-zero on failure. Env: DFM, DFM_TRAIN, DFM_CORPUS, DFM_LM, DFM_MODEL (tests/run.sh sets them).
"""
import glob
import json
import os
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dfm.data import read_dump  # noqa: E402
from train_cli import check, finish, run, worst_diff, workdir  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
CORPUS = os.environ.get("DFM_CORPUS", "/var/cache/dfm/corpus/gcide-1mb.jsonl")
LM = os.environ.get("DFM_LM", "/var/cache/dfm/models/smollm2-135m")
MODEL = os.environ.get("DFM_MODEL", "/var/cache/dfm/models/all-MiniLM-L6-v2")
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
L, K = 16, 4


def sh(*args):
    p = subprocess.run([str(a) for a in args], env=ENV, capture_output=True, text=True)
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("failed: " + " ".join(str(a) for a in args[:3]))
    return p.stdout


def targets_run(w, docs, chunk_len, seq_len, k):
    """A tiny real run in w/run with target records: the first `docs` documents of CORPUS chunked (doc-aligned),
    encoded on the CPU, indexed, retrieved with k neighbours, targets written. Returns its folder."""
    open(os.path.join(w, "c.jsonl"), "w").writelines([l for l in open(CORPUS)][:docs])
    r = os.path.join(w, "run")
    sh(DFM, "chunk", r, os.path.join(w, "c.jsonl"), "--tokenizer", os.path.join(LM, "tokenizer.json"), "--chunk-len",
       chunk_len, "--seq-len", seq_len, "--doc-aligned")
    sh(DFM, "encode", r, "--device", "cpu")
    sh(DFM, "index", r)
    sh(DFM, "retrieve", r, "--k", k)
    sh(DFM, "write-targets", r)
    return r


def chunks(run):
    """[(tokens[L], n_valid)] in chunk-id order, from the chunk shards' bytes."""
    out = {}
    for path in sorted(glob.glob(os.path.join(run, "chunk", "chunks-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMCHNK1", path
        cl = struct.unpack_from("<I", b, 16)[0]
        first, n = struct.unpack_from("<QQ", b, 32)
        rec = 24 + 4 * cl
        for i in range(n):
            off = 128 + i * rec
            nv = struct.unpack_from("<H", b, off + 16)[0]
            out[first + i] = (np.frombuffer(b, "<u4", cl, off + 24).astype(np.int64), nv)
    return [out[i] for i in range(len(out))]


def embeddings(run):
    """[n_chunks, d] float32 from the encode stage's blocks (fp32 / fp16 / bf16 rows)."""
    rows = {}
    for path in sorted(glob.glob(os.path.join(run, "encode", "emb-*.bin"))):
        b = open(path, "rb").read()
        assert b[:8] == b"DFMEMBD1", path
        dim, dtype = struct.unpack_from("<II", b, 16)
        first, n = struct.unpack_from("<QQ", b, 24)
        if dtype == 0:
            a = np.frombuffer(b, "<f4", n * dim, 128)
        elif dtype == 1:
            a = np.frombuffer(b, "<f2", n * dim, 128).astype(np.float32)
        else:
            a = (np.frombuffer(b, "<u2", n * dim, 128).astype(np.uint32) << 16).view(np.float32)
        rows[first] = a.reshape(n, dim)
    return np.concatenate([rows[k] for k in sorted(rows)])


def expected(ch, emb, prompt_last, shift=0):
    """Per reading sequence: (chunk-1 inputs, labels of the whole sequence, slot-0 vector) by the rule of reading.h."""
    out = []
    live = [c for c in range(len(ch)) if ch[c][1] > 0]
    for i, c in enumerate(live):
        tok, nv = ch[c]
        lab = np.full(2 * L, -1, np.int64)
        lab[L - 1] = tok[0]
        lab[L:L + nv - 1] = tok[1:nv]
        out.append((tok, lab, emb[min(c + shift, len(emb) - 1)], prompt_last))
    return out


def differences(batches, exp):
    """What differs between the dumped batches and the expected sequences (empty: nothing)."""
    bad = []
    for bt in batches:
        for b, i in enumerate(bt.idx):
            tok, lab, vec, last = exp[int(i)]
            t = np.asarray(bt.tokens[b], np.int64)
            if not np.array_equal(t[L:], tok):
                bad.append("seq %d: chunk 1 tokens" % i)
            if t[L - 1] != last:
                bad.append("seq %d: the prompt's last token" % i)
            if not np.array_equal(np.asarray(bt.labels[b], np.int64), lab):
                bad.append("seq %d: labels" % i)
            mk = np.asarray(bt.mask[b])
            if mk[0].any() or mk[1][0] != 1 or mk[1][1:].any():
                bad.append("seq %d: mask %s" % (i, mk.tolist()))
            if not np.allclose(np.asarray(bt.memory[b][1][0]), vec, atol=1e-6):
                bad.append("seq %d: slot 0 is not the chunk's own embedding" % i)
    return bad


def compare(batches, exp, what):
    bad = differences(batches, exp)
    check(not bad, "%s: %d batches (%s)" % (what, len(batches), "; ".join(bad[:4]) or "all equal"))


def main():
    w = workdir("dfm-reading-")
    docs = [l for l in open(CORPUS)][:3]
    open(os.path.join(w, "c.jsonl"), "w").writelines(docs)
    run_dir = os.path.join(w, "run")
    sh(DFM, "chunk", run_dir, os.path.join(w, "c.jsonl"), "--tokenizer", os.path.join(LM, "tokenizer.json"),
       "--chunk-len", L, "--seq-len", 4 * L, "--doc-aligned")
    sh(DFM, "encode", run_dir, "--model", MODEL, "--device", "cpu")
    ch, emb = chunks(run_dir), embeddings(run_dir)
    n_live = sum(1 for c in ch if c[1] > 0)
    check(n_live > 12 and any(c[1] < L for c in ch), "the run has %d chunks with tokens, some padded" % n_live)

    prompt_ids = [int(x) for x in sh(DFM, "tokenize", "--tokenizer", os.path.join(LM, "tokenizer.json"),
                                     "Text:").split()]
    dump = os.path.join(w, "dump.bin")
    run("dump-batches", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--chunk-len", L,
        "--slots", K, "--batch", 3, "--val-seqs", 3, "--seed", 5, "--out", dump)
    batches = read_dump(dump)
    seen = sorted(int(i) for bt in batches for i in bt.idx)
    check(len(seen) == len(set(seen)) and len(seen) == (n_live - 3) // 3 * 3,
          "one epoch of the training split: %d distinct sequences of %d" % (len(set(seen)), n_live - 3))
    compare(batches, expected(ch, emb, prompt_ids[-1]), "reading batches against the chunk and embedding shards")
    # the check can fail: the next chunk's embedding in place of the chunk's own
    planted = differences(batches, expected(ch, emb, prompt_ids[-1], shift=1))
    check(len(planted) > 0, "a planted off-by-one in the slot is caught: %s" % (planted[:1] or "nothing reported"))
    run("dump-batches", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--chunk-len", L, "--slots", K,
        "--batch", 3, "--val-seqs", 3, "--split", "heldout", "--out", dump)
    held = read_dump(dump)
    check([int(i) for bt in held for i in bt.idx] == list(range(n_live - 3, n_live)),
          "the held-out split is the run's last chunks")
    compare(held, expected(ch, emb, prompt_ids[-1]), "held-out reading batches")

    out = os.path.join(w, "read")
    last = str(json.load(open(os.path.join(LM, "config.json")))["num_hidden_layers"] - 1)  # fusion after the top layer
    run("train", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--out", out, "--chunk-len", L,
        "--slots", K, "--batch", 2, "--steps", 3, "--fusion-layers", last, "--val-seqs", 2, "--threads", 2, "--no-ckpt",
        "--pred-layers", 1, "--lr", "1e-3")
    ev = [json.loads(l)["eval"] for l in open(os.path.join(out, "log.jsonl")) if '"eval"' in l][-1]
    check(all(isinstance(ev.get(k), float) for k in ("ce_none", "ce_target", "ce_target_shuffled")),
          "reconstruct evaluates own slot %.4f, shuffled slot %.4f, fusion off %.4f" %
          (ev.get("ce_target", float("nan")), ev.get("ce_target_shuffled", float("nan")), ev.get("ce_none", float("nan"))))
    check(ev.get("trained_with_target") is True, "reconstruct trains on the target slot")
    check(all(0 <= ev.get(k, -1) <= 1 for k in ("acc_target", "acc_target_shuffled", "acc_none")),
          "reconstruct reports top-1 token accuracy: own slot %s, shuffled slot %s, fusion off %s" %
          (ev.get("acc_target"), ev.get("acc_target_shuffled"), ev.get("acc_none")))
    # `dfm-train eval --objective reconstruct` of the exported modules: the training run's final evaluation
    p = run("eval", "--objective", "reconstruct", "--backbone", LM, "--modules", os.path.join(out, "dfm_modules.safetensors"),
            "--data", run_dir, "--batch", 2, "--val-seqs", 2, "--threads", 2)
    ev2 = json.loads(p.stdout.strip().splitlines()[-1])
    keys = ("ce_none", "ce_target", "ce_target_shuffled", "acc_target", "acc_target_shuffled", "acc_none")
    check(worst_diff([ev2.get(k) for k in keys], [ev.get(k) for k in keys]) <= 1e-6,
          "eval --objective reconstruct gives the training's final evaluation: %s" % {k: ev2.get(k) for k in keys})

    # DFM training from the reading modules: with lr 0 they come out unchanged
    mods = os.path.join(out, "dfm_modules.safetensors")
    out2 = os.path.join(w, "dfm")
    run("train", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--out", out2, "--chunk-len", L,
        "--slots", K, "--batch", 2, "--steps", 1, "--fusion-layers", last, "--val-seqs", 2, "--threads", 2, "--no-ckpt",
        "--pred-layers", 1, "--lr", 0, "--wd", 0, "--init-modules", mods, "--memory-control", "none")
    a, b = open(mods, "rb").read(), open(os.path.join(out2, "dfm_modules.safetensors"), "rb").read()
    check(a == b, "--init-modules: modules trained at lr 0 from the reading modules are the reading modules, byte for byte")
    bad = run("train", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--out", out2, "--chunk-len", L,
              "--slots", K, "--batch", 2, "--steps", 1, "--fusion-layers", "0", "--val-seqs", 2, "--no-ckpt",
              "--pred-layers", 1, "--init-modules", mods, ok=False)
    check(bad.returncode != 0 and "fusion_layers differs" in bad.stderr + bad.stdout,
          "--init-modules refuses modules of another shape: %s" % (bad.stderr.strip().splitlines() or ["(nothing)"])[-1])
    # the predictor's input and a skip path the reading modules lack change no tensor they hold: a DFM run with them
    # starts from those modules, the skip path at zero; modules with a skip path refuse a model without one
    out3 = os.path.join(w, "dfm-skip")
    run("train", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--out", out3, "--chunk-len", L,
        "--slots", K, "--batch", 2, "--steps", 1, "--fusion-layers", last, "--val-seqs", 2, "--threads", 2, "--no-ckpt",
        "--pred-layers", 1, "--lr", 0, "--wd", 0, "--init-modules", mods, "--memory-control", "none", "--pred-skip",
        "--pred-input-tokens", 4)
    from dfm.torch import load_safetensors
    t0, t1 = load_safetensors(mods)[0], load_safetensors(os.path.join(out3, "dfm_modules.safetensors"))[0]
    skip = t1.pop("dfm.predictor.skip.weight", None)
    check(skip is not None and tuple(skip.shape) == (K * 384, 576) and float(skip.abs().max()) == 0.0
          and sorted(t0) == sorted(t1) and all(bool((t0[k] == t1[k]).all()) for k in t0),
          "--init-modules into --pred-skip --pred-input-tokens 4: every tensor of the reading modules, the skip path "
          "at zero (%s)" % ((None if skip is None else tuple(skip.shape)),))
    bad = run("train", "--objective", "reconstruct", "--backbone", LM, "--data", run_dir, "--out", out2, "--chunk-len", L,
              "--slots", K, "--batch", 2, "--steps", 1, "--fusion-layers", last, "--val-seqs", 2, "--no-ckpt",
              "--pred-layers", 1, "--init-modules", os.path.join(out3, "dfm_modules.safetensors"), ok=False)
    check(bad.returncode != 0 and "pred_skip" in bad.stderr + bad.stdout,
          "--init-modules refuses modules with a skip path into a model without one: %s"
          % (bad.stderr.strip().splitlines() or ["(nothing)"])[-1])
    finish("reading pretraining")


if __name__ == "__main__":
    main()
