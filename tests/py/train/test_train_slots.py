"""Memory slots in the frozen LM's own space (`dfm-train slots`, trainer/data/lm_slots.h) against an independent
computation, and their use in training.

- A tiny real run (a few GCIDE documents: chunk, encode, index, retrieve with K = 4, write-targets) and the real
  frozen SmolLM2-135M, run to a shallow depth so the test stays cheap.
- The slots file, parsed here from its bytes (schemas/targets_file.md, XXH3 payload checksum), equals what this test
  computes itself: the target records read by the pure-Python reader, the chunk tokens from the chunk shards, the
  prompt "Text:" then the chunk through dfm.torch's PyTorch blocks up to --layer, averaged per group of L / pool valid
  tokens and scaled to unit norm: masks exactly, values within 1e-4. Neighbours mode (3 of 4 neighbours, 4 slots
  each) and own mode (one slot per token, filler masked) both; a planted misalignment (the previous chunk's record)
  and the wrong depth are caught by the same comparison.
- Use: `dump-batches --objective reconstruct --reading-slots OWN` hands each reading sequence the chunk's own slots
  of the file; `train --targets FILE` trains on the neighbours file; an own file with more slots than --slots, a
  depth past the backbone's and a pool that does not divide L are refused with their reasons.
Exits non-zero on failure. Env: DFM, DFM_TRAIN, DFM_CORPUS, DFM_LM (tests/run.sh sets them).
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import xxhash

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dfm.data import read_dump  # noqa: E402
from dfm.targets import open_run  # noqa: E402
from dfm.torch import Backbone, rope_tables  # noqa: E402
from test_train_reading import chunks, sh, targets_run  # noqa: E402  (the chunk shards' tokens; dfm with MPI as root)
from train_cli import check, finish, run, workdir  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
LM = os.environ.get("DFM_LM", "/var/cache/dfm/models/smollm2-135m")
L, T, K, LAYER = 16, 64, 4, 2


def parse_targets(path):
    """(k, d, chunk_len, mask [n, k], emb [n, k, d]) from a targets file's bytes."""
    b = open(path, "rb").read()
    assert b[:8] == b"DFMTGTS1", "magic"
    ver, k, d, cl, n, ck = struct.unpack_from("<IIIIQQ", b, 8)
    assert ver == 1 and xxhash.xxh3_64_intdigest(b[64:]) == ck and len(b) == 64 + n * k * (1 + 4 * d), "size, checksum"
    mask = np.frombuffer(b, np.uint8, n * k, 64).reshape(n, k)
    emb = np.frombuffer(b[64 + n * k:], "<f4").reshape(n, k, d)
    return k, d, cl, mask, emb


def states(bb, prompt, toks, layer):
    """The residual stream after `layer` blocks at the chunk's positions: [L, C] float64."""
    ids = torch.tensor([list(prompt) + [int(t) for t in toks]], dtype=torch.long)
    with torch.no_grad():
        x = bb.model.embed_tokens(ids)
        cos, sin = rope_tables(x.shape[1], bb.c["head_dim"], bb.c["rope_theta"], x.device)
        for blk in bb.model.layers[:layer]:
            x = blk(x, cos, sin)
    return np.array(x[0, len(prompt):].double().tolist())


def pooled(st, nv, pool):
    """[pool, C] unit-norm group means over the valid tokens, and [pool] masks."""
    g = L // pool
    out, m = np.zeros((pool, st.shape[1])), np.zeros(pool, np.uint8)
    for j in range(pool):
        rows = [t for t in range(j * g, (j + 1) * g) if t < nv]
        if rows:
            v = st[rows].mean(0)
            out[j], m[j] = v / np.linalg.norm(v), 1
    return out, m


def expected(run_dir, bb, prompt, pool, nb, layer, shift=0, own=False):
    ch = chunks(run_dir)
    cache = {}

    def of(j):
        if j not in cache:
            cache[j] = pooled(states(bb, prompt, ch[j][0], layer), ch[j][1], pool)
        return cache[j]
    n = len(ch)
    if own:
        mk = np.zeros((n, pool), np.uint8)
        em = np.zeros((n, pool, bb.c["hidden"]))
        for c in range(n):
            em[c], mk[c] = of(c)
        return mk, em
    tr = open_run(run_dir, backend="python")  # the pure-Python reader: independent of the C one
    mk = np.zeros((n, nb * pool), np.uint8)
    em = np.zeros((n, nb * pool, bb.c["hidden"]))
    for c in range(n):
        rec = tr.get(max(c - shift, 0))
        for j in range(nb):
            if rec["mask"][j]:
                e, m = of(int(rec["ids"][j]))
                em[c, j * pool:(j + 1) * pool], mk[c, j * pool:(j + 1) * pool] = e, m
    return mk, em


def differences(got, exp):
    (_, _, _, gm, ge), (em_, ee) = got, exp
    bad = []
    if gm.shape != em_.shape or (gm != em_).any():
        bad.append("masks differ in %d slots" % (int((gm != em_).sum()) if gm.shape == em_.shape else -1))
    elif not np.abs(ge.astype(np.float64) - ee)[gm.astype(bool)].max() <= 1e-4:
        bad.append("values differ by %.2e" % np.abs(ge.astype(np.float64) - ee)[gm.astype(bool)].max())
    elif np.abs(ge[~gm.astype(bool)]).max(initial=0) != 0:
        bad.append("an empty slot holds values")
    return bad


def main():
    w = workdir("dfm-slots-")
    r = targets_run(w, 4, L, T, K)
    prompt = [int(x) for x in sh(DFM, "tokenize", "--tokenizer", os.path.join(LM, "tokenizer.json"), "Text:").split()]
    bb = Backbone.from_pretrained(LM, torch.float32, max_seq=L + len(prompt)).eval()
    ch = chunks(r)
    check(any(0 < nv < L for _, nv in ch), "the run has padded chunks (%d chunks)" % len(ch))

    nbf = os.path.join(w, "nb.bin")
    p = run("slots", "--backbone", LM, "--data", r, "--layer", LAYER, "--pool", 4, "--neighbours", 3, "--chunk-len", L,
            "--out", nbf, "--threads", 1)
    check("chunks x 12 slots of d 576" in p.stdout, "dfm-train slots reports its shape: %s" % p.stdout.strip()[-160:])
    got = parse_targets(nbf)
    check(got[0] == 12 and got[1] == 576 and got[2] == L and got[3].shape[0] == len(ch),
          "the file holds 3 neighbours x 4 slots of the LM's width for every chunk")
    bad = differences(got, expected(r, bb, prompt, 4, 3, LAYER))
    check(not bad and got[3].sum() > 20, "neighbours' slots equal PyTorch's blocks over prompt + chunk, pooled and "
          "normed (%d valid slots): %s" % (int(got[3].sum()), "; ".join(bad) or "all equal"))
    planted = differences(got, expected(r, bb, prompt, 4, 3, LAYER, shift=1))
    check(len(planted) > 0, "a planted misalignment (the previous chunk's record) is caught: %s" % planted[:1])
    deeper = differences(got, expected(r, bb, prompt, 4, 3, LAYER + 1))
    check(len(deeper) > 0, "the states of another depth are caught: %s" % deeper[:1])

    own = os.path.join(w, "own.bin")
    run("slots", "--backbone", LM, "--data", r, "--own", "--layer", LAYER, "--pool", L, "--chunk-len", L, "--out", own,
        "--threads", 1)
    go = parse_targets(own)
    bad = differences(go, expected(r, bb, prompt, L, 1, LAYER, own=True))
    check(not bad and go[0] == L and go[3].sum() == sum(nv for _, nv in ch),
          "own mode, one slot per token: each chunk's states, its filler masked (%d valid): %s" %
          (int(go[3].sum()), "; ".join(bad) or "all equal"))

    # the reading set reads the own file: sequence i's chunk 1 holds the i-th live chunk's own slots
    dump = os.path.join(w, "dump.bin")
    run("dump-batches", "--objective", "reconstruct", "--backbone", LM, "--data", r, "--chunk-len", L, "--slots", 2 * L,
        "--reading-slots", own, "--batch", 2, "--val-seqs", 2, "--seed", 3, "--out", dump)
    live = [c for c, (_, nv) in enumerate(ch) if nv > 0]
    ok, seen = True, 0
    for bt in read_dump(dump):
        for b, i in enumerate(bt.idx):
            c = live[int(i)]
            ok &= bool((bt.mask[b, 1, :L] == go[3][c]).all() and not bt.mask[b, 1, L:].any() and not bt.mask[b, 0].any())
            ok &= bool(np.array_equal(bt.memory[b, 1, :L][go[3][c].astype(bool)], go[4][c][go[3][c].astype(bool)]))
            seen += 1
    check(ok and seen > 4, "reading batches hold each chunk's own slots of the file in slots 0..L-1 (%d sequences)" % seen)
    p = run("dump-batches", "--objective", "reconstruct", "--backbone", LM, "--data", r, "--chunk-len", L, "--slots", 4,
            "--reading-slots", own, "--batch", 2, "--val-seqs", 2, "--out", dump, ok=False)
    check(p.returncode != 0 and "--slots %d" % L in p.stderr, "an own file with more slots than --slots is refused: %s" %
          (p.stderr.strip().splitlines() or ["(nothing)"])[-1])

    # DFM training reads the neighbours file as its targets
    run("train", "--backbone", LM, "--data", r, "--targets", nbf, "--chunk-len", L, "--seq-len", T, "--batch", 2,
        "--fusion-layers", 28, "--pred-hidden", 16, "--pred-heads", 2, "--steps", 2, "--val-seqs", 2, "--eval-batches", 1,
        "--threads", 1, "--no-ckpt", "--out", os.path.join(w, "tr"))
    lg = [e for e in (json.loads(l) for l in open(os.path.join(w, "tr", "log.jsonl"))) if "eval" not in e]
    check(len(lg) >= 2 and all(np.isfinite(e["mse"]) for e in lg), "train --targets FILE trains on 12 slots of d 576")

    for args, want in ((("--layer", 31), "30 decoder blocks"), (("--pool", 5), "divide the chunk length")):
        p = run("slots", "--backbone", LM, "--data", r, "--chunk-len", L, "--out", os.path.join(w, "x.bin"), *args,
                ok=False)
        check(p.returncode != 0 and want in p.stderr, "%s refused: %s" % (" ".join(map(str, args)),
                                                                         (p.stderr.strip().splitlines() or ["-"])[-1]))
    finish("memory slots in the LM's own space")


if __name__ == "__main__":
    main()
