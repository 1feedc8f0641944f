#!/usr/bin/env python3
"""retrieval_reference.py — an independent NumPy brute-force reference for `dfm retrieve`.

Reads a run directory's files directly (manifest.json, chunk shards, embedding blocks, neighbour
blocks) with its own parsers — no dfm code — and recomputes every chunk's top-K by brute force:

  query of chunk i   mean of the W chunks before i in its sequence (W = 1: chunk i-1 as stored; W > 1:
                     float64 mean renormalised), skipping all-padding sources; none when i starts a
                     sequence, is all padding, or has no non-padding source
  score              float64 inner product (or squared L2) of the fp32 vectors, rounded to float32
  order              best float32 score first, then id ascending
  never returned     all-padding chunks; plus the --exclude policy: self = i and its sources,
                     sequence = i's training sequence, document = self + chunks whose document range
                     overlaps [doc_first(first source), doc_last(i)]

A query-only run (`dfm retrieve RUN --datastore DS`: its retrieve stage names DS) is checked against
DS's chunks and embeddings as the candidates: queries from RUN, neighbours from DS, no exclusions
but all-padding chunks.

  retrieval_reference.py RUN [--check] [--min-recall R] [--exclude P] [--k K] [--window W]
    --check         every row must equal the reference exactly (ids and mask; scores within 1e-5)
    --min-recall R  recall@K of the rows against the reference must be >= R (approximate indexes)
K, metric, exclusion and window default to what the neighbour blocks' headers say. Exit 1 on a
mismatch, printing the first differing rows.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

EXCLUDE = {0: "none", 1: "self", 2: "sequence", 3: "document"}


def load_chunks(run, man):
    st = man["stages"]["chunk"]
    metas, L, S = [], None, None
    for o in sorted(st["outputs"], key=lambda o: o.get("first_chunk", 0)):
        raw = open(os.path.join(run, o["file"]), "rb").read()
        assert raw[:8] == b"DFMCHNK1", o["file"]
        chunk_len, seq_len = struct.unpack_from("<II", raw, 16)
        first, n = struct.unpack_from("<QQ", raw, 32)
        L, S = chunk_len, seq_len
        rec = 24 + 4 * chunk_len
        dt = np.dtype([("doc_first", "<u8"), ("doc_last", "<u8"), ("n_valid", "<u2"), ("flags", "<u2"), ("res", "<u4"),
                       ("tok", "<u4", (chunk_len,))])
        assert dt.itemsize == rec
        metas.append((first, np.frombuffer(raw, dtype=dt, count=n, offset=128)))
    metas.sort(key=lambda t: t[0])
    m = np.concatenate([a for _, a in metas])
    return m["doc_first"].astype(np.int64), m["doc_last"].astype(np.int64), m["n_valid"].astype(np.int64), \
        m["flags"].astype(np.int64), S // L


def load_embeddings(run, man):
    st = man["stages"]["encode"]
    blocks = []
    for o in st["outputs"]:
        raw = open(os.path.join(run, o["file"]), "rb").read()
        assert raw[:8] == b"DFMEMBD1", o["file"]
        dim, dtype = struct.unpack_from("<II", raw, 16)
        first, n = struct.unpack_from("<QQ", raw, 24)
        if dtype == 0:
            x = np.frombuffer(raw, "<f4", n * dim, 128)
        elif dtype == 1:
            x = np.frombuffer(raw, "<f2", n * dim, 128).astype(np.float32)
        else:
            x = (np.frombuffer(raw, "<u2", n * dim, 128).astype(np.uint32) << 16).view(np.float32)
        blocks.append((first, x.reshape(n, dim)))
    blocks.sort(key=lambda t: t[0])
    return np.concatenate([b for _, b in blocks]).astype(np.float32)


def load_neighbours(run, man):
    st = man["stages"]["retrieve"]
    rows = []
    hdr0 = None
    for o in sorted(st["outputs"], key=lambda o: o["first_chunk"]):
        raw = open(os.path.join(run, o["file"]), "rb").read()
        assert raw[:8] == b"DFMNBRS1", o["file"]
        k, metric = struct.unpack_from("<II", raw, 16)
        first, n, row_bytes, total = struct.unpack_from("<QQQQ", raw, 24)
        exclude, window = struct.unpack_from("<II", raw, 56)
        k2 = (k + 1) & ~1
        assert row_bytes == 8 * k + 4 * k2 + 8
        dt = np.dtype([("ids", "<i8", (k,)), ("scores", "<f4", (k2,)), ("mask", "<u8")])
        rows.append(np.frombuffer(raw, dtype=dt, count=n, offset=128))
        hdr0 = hdr0 or dict(k=k, metric=metric, exclude=exclude, window=window)
    r = np.concatenate(rows)
    return r["ids"], r["scores"][:, :hdr0["k"]], r["mask"], hdr0


def reference(x, doc_first, doc_last, n_valid, flags, cps, k, metric, exclude, window, xd=None, n_valid_d=None):
    """xd, n_valid_d: a datastore's embeddings and valid-token counts (the candidates; else x's own)"""
    n = x.shape[0]
    ids = np.full((n, k), -1, np.int64)
    scores = np.zeros((n, k), np.float32)
    mask = np.zeros(n, np.uint64)
    x64 = x.astype(np.float64)
    seq_start = (np.arange(n) % cps == 0) | ((flags & 1) != 0)
    if xd is None:
        xd, n_valid_d = x, n_valid
    else:
        assert exclude == 0, "a datastore run is retrieved with --exclude none"
    xd64 = xd.astype(np.float64)
    all_ids = np.arange(xd.shape[0])
    for i in range(n):
        if n_valid[i] == 0 or seq_start[i]:
            continue
        first = i
        for _ in range(window):
            if first == 0:
                break
            first -= 1
            if seq_start[first]:
                break
        src = [j for j in range(first, i) if n_valid[j] > 0]
        if not src:
            continue
        if window == 1:
            q = x64[src[0]]
        else:
            q = x64[src].sum(axis=0)
            q = (q / np.linalg.norm(q)).astype(np.float32).astype(np.float64)
        if metric == 0:
            s = (xd64 @ q).astype(np.float32)
        else:
            s = ((xd64 - q) ** 2).sum(axis=1).astype(np.float32)
        ok = n_valid_d > 0
        if exclude == 1:
            ok &= ~((all_ids >= first) & (all_ids <= i))
        elif exclude == 2:
            ok &= (all_ids // cps) != (i // cps)
        elif exclude == 3:
            ok &= ~((all_ids >= first) & (all_ids <= i))
            ok &= ~((doc_first <= doc_last[i]) & (doc_last >= doc_first[first]))
        cand = all_ids[ok]
        cs = s[ok]
        order = np.lexsort((cand, -cs if metric == 0 else cs))[:k]
        m = len(order)
        ids[i, :m] = cand[order]
        scores[i, :m] = cs[order]
        mask[i] = (1 << m) - 1 if m < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    return ids, scores, mask


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--min-recall", type=float, default=None)
    args = ap.parse_args()
    man = json.load(open(os.path.join(args.run, "manifest.json")))
    doc_first, doc_last, n_valid, flags, cps = load_chunks(args.run, man)
    x = load_embeddings(args.run, man)
    got_ids, got_scores, got_mask, h = load_neighbours(args.run, man)
    k, metric, exclude, window = h["k"], h["metric"], h["exclude"], h["window"]
    ds = man["stages"]["retrieve"].get("datastore")
    xd = n_valid_d = None
    if ds:
        dman = json.load(open(os.path.join(ds["run"], "manifest.json")))
        n_valid_d = load_chunks(ds["run"], dman)[2]
        xd = load_embeddings(ds["run"], dman)
        assert xd.shape[0] == ds["chunks"] == n_valid_d.shape[0], "the datastore changed since the retrieval"
    ids, scores, mask = reference(x, doc_first, doc_last, n_valid, flags, cps, k, metric, exclude, window, xd, n_valid_d)
    n = x.shape[0]
    tag = f"K={k} metric={'ip' if metric == 0 else 'l2'} exclude={EXCLUDE[exclude]} window={window}, {n} chunks" + \
        (f" against a datastore of {xd.shape[0]}" if ds else "")
    if got_ids.shape != ids.shape:
        print(f"FAIL shape {got_ids.shape} vs reference {ids.shape}")
        return 1
    bad = 0
    if args.check:
        for i in range(n):
            same = np.array_equal(got_ids[i], ids[i]) and got_mask[i] == mask[i]
            real = ids[i] >= 0
            close = np.all(np.abs(got_scores[i][real] - scores[i][real]) <= 1e-5) and np.all(got_scores[i][~real] == 0)
            if not (same and close):
                bad += 1
                if bad <= 3:
                    print(f"row {i}: dfm ids {got_ids[i].tolist()} mask {int(got_mask[i]):#x}\n"
                          f"        ref ids {ids[i].tolist()} mask {int(mask[i]):#x}\n"
                          f"        dfm scores {got_scores[i].tolist()}\n        ref scores {scores[i].tolist()}")
        padded = int(sum(k - bin(int(m)).count("1") for m in mask if m))
        print(f"{'FAIL' if bad else 'OK'} exact check ({tag}): {bad} differing rows; {int((mask != 0).sum())} rows with "
              f"neighbours ({padded} empty slots among them), {int((mask == 0).sum())} without")
    if args.min_recall is not None:
        hit = tot = 0
        for i in range(n):
            r = set(ids[i][ids[i] >= 0].tolist())
            tot += len(r)
            hit += len(r & set(got_ids[i][got_ids[i] >= 0].tolist()))
        # the mask and padding rules hold whatever the index
        pad_ok = all(((got_ids[i] >= 0) == ((int(got_mask[i]) >> np.arange(k)) & 1).astype(bool)).all() for i in range(n))
        rec = hit / tot if tot else 1.0
        ok = rec >= args.min_recall and pad_ok
        print(f"{'OK' if ok else 'FAIL'} recall@{k} = {rec:.4f} (threshold {args.min_recall}) ({tag}); mask/padding consistent: {pad_ok}")
        bad += 0 if ok else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
