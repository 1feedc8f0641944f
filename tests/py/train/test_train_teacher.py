"""The in-context teacher (`dfm-train teacher`, trainer/data/teacher.h) against an independent computation, and
training on it (`dfm-train train --teacher --distill-weight --gain-weighting`).

- A tiny real run (a few GCIDE documents: chunk, encode, index, retrieve with K = 4, write-targets) and a 1-layer
  backbone pretrained on its tokens for two steps.
- The teacher file, parsed here from its bytes (schemas/teacher_file.md, checksums with xxhash), equals what this
  test computes itself: the target records read by the pure-Python reader (python/dfm_targets.py), the chunk text
  read from the chunk shards, the pasted sequence built by the rule of teacher.h, and the forward of dfm.torch's
  PyTorch Backbone over the same folder: flags exactly, top ids exactly, log-probs, lp_teacher and lp_alone within
  1e-3. A planted misalignment (the previous chunk's record pasted) is caught by the same comparison.
- Training reads it: the log reports the KL, and with --distill-weight 0 and no gain weighting the run is byte for
  byte the run without --teacher; a file for other tokens and a damaged file are refused with their reasons.
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
from dfm.targets import open_run  # noqa: E402
from dfm.torch import Backbone  # noqa: E402
from test_train_reading import chunks, targets_run  # noqa: E402  (the chunk shards' tokens; dfm with MPI as root)
from train_cli import check, finish, run, workdir  # noqa: E402

LM = os.environ.get("DFM_LM", "/var/cache/dfm/models/smollm2-135m")
L, T, K, P, S = 16, 64, 4, 2, 8


def parse_teacher(path):
    """(header dict, ids [n, S], logp [n, S], lp_teacher [n], lp_alone [n], flags [n]) from the file's bytes."""
    b = open(path, "rb").read()
    assert b[:8] == b"DFMTCHR1", "magic"
    ver, hb, n_seq, T_, L_, top, paste, vocab, rb = struct.unpack_from("<IIQIIIIII", b, 8)
    bh, th, pb, px, hx, slots, gl = struct.unpack_from("<QQQQQII", b, 48)
    h = bytearray(b[:128])
    h[80:88] = bytes(8)
    assert xxhash.xxh3_64_intdigest(bytes(h)) == hx, "header checksum"
    assert xxhash.xxh3_64_intdigest(b[128:]) == px and len(b) == 128 + pb, "payload checksum and length"
    n = n_seq * T_
    rows = np.frombuffer(b, np.uint8, n * rb, 128).reshape(n, rb)
    ids = rows[:, :4 * top].copy().view("<u4")
    logp = rows[:, 4 * top:8 * top].copy().view("<f4")
    tail = rows[:, 8 * top:].copy()
    return (dict(version=ver, n_seq=n_seq, seq_len=T_, chunk_len=L_, top=top, paste=paste, vocab=vocab, slots=slots),
            ids, logp, tail[:, 0:4].copy().view("<f4")[:, 0], tail[:, 4:8].copy().view("<f4")[:, 0],
            tail[:, 8:12].copy().view("<u4")[:, 0])


def expected(run_dir, bb, n_seq, shift=0):
    """The teacher rows by teacher.h's rule, computed here (shift 1: each chunk pastes the previous chunk's record)."""
    ch = chunks(run_dir)
    stream = np.concatenate([t for t, _ in ch])
    pad = np.concatenate([np.arange(L) >= nv for _, nv in ch])
    tr = open_run(run_dir, backend="python")  # the pure-Python reader: independent of the C one
    NC, n = T // L, n_seq * T
    ids = np.zeros((n, S), np.int64)
    logp = np.zeros((n, S), np.float64)
    lpt, lpa, flags = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    with torch.no_grad():
        for s in range(n_seq):
            inp = stream[s * T:s * T + T]
            tgt = stream[s * T + 1:s * T + T + 1].copy()
            bad = pad[s * T:s * T + T] | pad[s * T + 1:s * T + T + 1]
            tgt[bad] = -1
            # (Debian's torch has no NumPy bridge here: values cross as lists)
            lg = torch.log_softmax(bb(torch.tensor([inp.tolist()], dtype=torch.long))[0].double(), -1)
            for r in range(T):
                if tgt[r] >= 0:
                    lpa[s * T + r], flags[s * T + r] = float(lg[r, int(tgt[r])]), 1
            for c in range(1, NC):
                rec = tr.get(s * NC + c - shift)
                valid = [int(rec["ids"][j]) for j in range(len(rec["ids"])) if rec["mask"][j]][:P]
                if not valid:
                    continue
                paste = [int(t) for cid in reversed(valid) for t in ch[cid][0][:ch[cid][1]]]
                first = c * L - 1
                seq = np.array(paste + list(inp[:first + L]), np.int64)
                lt = torch.log_softmax(bb(torch.tensor([seq.tolist()], dtype=torch.long))[0].double(), -1)
                rows = np.array(lt[len(paste) + first:len(paste) + first + L].tolist())
                for i in range(L):
                    r = first + i
                    if tgt[r] < 0:
                        continue
                    row = rows[i]
                    order = np.lexsort((np.arange(row.size), -row))[:S]
                    ids[s * T + r], logp[s * T + r] = order, row[order]
                    lpt[s * T + r], flags[s * T + r] = row[tgt[r]], 3
    return ids, logp, lpt, lpa, flags


def compare(got, exp, what):
    _, gi, gl, gt, ga, gf = got
    ei, el, et, ea, ef = exp
    n = len(gf)
    bad = []
    if not np.array_equal(gf, ef[:n]):
        bad.append("flags differ in %d rows" % int((gf != ef[:n]).sum()))
    t = ef[:n] == 3
    if not np.array_equal(gi[t], ei[:n][t]):
        bad.append("top ids differ in %d rows" % int((gi[t] != ei[:n][t]).any(1).sum()))
    for name, a, e in (("log-probs", gl[t], el[:n][t]), ("lp_teacher", gt[t], et[:n][t]),
                       ("lp_alone", ga[gf > 0], ea[:n][gf > 0])):
        d = float(np.abs(a - e).max()) if a.size else 0.0
        if not d <= 1e-3:
            bad.append("%s differ by %.2e" % (name, d))
    return bad, int(t.sum())


def main():
    w = workdir("dfm-teacher-")
    r = targets_run(w, 6, L, T, K)
    common = ["--seq-len", T, "--batch", 2, "--val-seqs", 2, "--eval-batches", 1, "--threads", 1]
    run("pretrain", "--data", r, "--out", os.path.join(w, "pre"), "--layers", 1, "--hidden", 32, "--heads", 2,
        "--kv-heads", 1, "--steps", 2, *common)
    bbdir = os.path.join(w, "pre", "model")
    tfile = os.path.join(w, "teacher.bin")
    p = run("teacher", "--backbone", bbdir, "--data", r, "--out", tfile, "--seq-len", T, "--chunk-len", L, "--paste", P,
            "--top", S, "--threads", 1)
    check("rows with pasted text" in p.stdout, "dfm-train teacher reports its rows: %s" % p.stdout.strip()[-200:])
    got = parse_teacher(tfile)
    hdr = got[0]
    check(hdr["version"] == 1 and hdr["seq_len"] == T and hdr["chunk_len"] == L and hdr["top"] == S and hdr["paste"] == P,
          "the header records the shape: %s" % hdr)
    bb = Backbone.from_pretrained(bbdir, torch.float32, max_seq=2 * P * L + T).eval()
    n_seq = min(hdr["n_seq"], 6)
    got = tuple(x[:n_seq * T] if hasattr(x, "__len__") and not isinstance(x, dict) else x for x in got)
    bad, nt = compare(got, expected(r, bb, n_seq), "teacher")
    check(not bad and nt > 50, "the teacher rows of %d sequences equal PyTorch's forward of the pasted text (%d rows "
          "with a teacher): %s" % (n_seq, nt, "; ".join(bad) or "all equal"))
    planted, _ = compare(got, expected(r, bb, n_seq, shift=1), "planted")
    check(len(planted) > 0, "a planted misalignment (the previous chunk's neighbours pasted) is caught: %s" % planted[:2])

    # training on it
    tr = ["train", "--backbone", bbdir, "--data", r, "--targets", r, "--chunk-len", L, "--fusion-layers", 0,
          "--pred-hidden", 16, "--pred-heads", 2, "--steps", 3, "--no-ckpt", *common]
    run(*tr, "--out", os.path.join(w, "plain"))
    run(*tr, "--out", os.path.join(w, "t0"), "--teacher", tfile, "--distill-weight", 0)
    a = open(os.path.join(w, "plain", "dfm_modules.safetensors"), "rb").read()
    b = open(os.path.join(w, "t0", "dfm_modules.safetensors"), "rb").read()
    check(a == b, "--teacher with --distill-weight 0 and no gain weighting trains the same bytes as no teacher")
    run(*tr, "--out", os.path.join(w, "t1"), "--teacher", tfile, "--distill-weight", 1, "--gain-weighting", 0.5)
    lg = [json.loads(l) for l in open(os.path.join(w, "t1", "log.jsonl")) if '"kl_teacher"' in l]
    check(len(lg) == 3 and all(e["kl_teacher"] > 0 for e in lg), "the log reports KL(teacher || model) at every step: %s" %
          [round(e.get("kl_teacher", -1), 4) for e in lg])
    b1 = open(os.path.join(w, "t1", "dfm_modules.safetensors"), "rb").read()
    check(b1 != a, "--distill-weight 1 --gain-weighting 0.5 trains other modules than plain CE")
    # refusals: another sequence length (a file for other data), a damaged byte
    p = run(*[x if x != T else 2 * T for x in tr], "--out", os.path.join(w, "bad"), "--teacher", tfile, ok=False)
    check(p.returncode != 0 and "write it again" in p.stderr, "a teacher file for other sequences is refused: %s" %
          (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    dam = bytearray(open(tfile, "rb").read())
    dam[128 + 5] ^= 1
    open(os.path.join(w, "dam.bin"), "wb").write(bytes(dam))
    p = run(*tr, "--out", os.path.join(w, "bad"), "--teacher", os.path.join(w, "dam.bin"), ok=False)
    check(p.returncode != 0 and "checksum" in p.stderr, "a damaged teacher file is refused: %s" %
          (p.stderr.strip().splitlines() or ["(nothing)"])[-1])
    finish("the in-context teacher")


if __name__ == "__main__":
    main()
