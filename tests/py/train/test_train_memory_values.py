"""The target memory dfm-train trains on, end to end: from the pipeline's files to the loader's batches.

A synthetic run in the real file formats (build/tools/retrieve_mkrun: chunk and encode stages; sequences
of 4 chunks of 4 tokens, some all-padding chunks) goes through `dfm index` (Flat), `dfm retrieve --k 4`
and `dfm write-targets`; `dfm-train dump-batches` writes the batches its loader (trainer/data/data.c
data_batch through shard/target_reader.h) hands the model, train split and held-out split. This test
reads the embedding blocks and the neighbour blocks itself (tests/ref/retrieval_reference.py's parsers,
no dfm code) and checks:
  - alignment: the neighbours of chunk c are the exact top-K of chunk c-1's embedding (the query, window 1;
    retrieval_reference.py --check), and each stored score is that query's product with the neighbour;
  - values: every batch's memory for sequence s, chunk c is the embeddings of chunk s*NC+c's neighbours in
    rank order (fp32 bit for bit; fp16 as NumPy rounds them), its mask the neighbour mask (a second run with K above
    the candidates outside a sequence has padded slots), chunk 0 of every sequence masked.
Each check must fail on planted corruptions: the neighbour rows shifted by one chunk (the reference check),
and copies of the batches with the memory shifted by one chunk, zeroed, a constant, or chunk 0 unmasked.
Exits non-zero on failure. Env: DFM, DFM_TRAIN (tests/run.sh sets them).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dfm  # noqa: E402
from retrieval_reference import load_embeddings, load_neighbours  # noqa: E402
from train_cli import check, finish, worst_diff  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build", "dfm"))
DFM_TRAIN = os.environ.get("DFM_TRAIN", os.path.join(ROOT, "build", "dfm-train"))
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", DFM_LOG_LEVEL="warn")
DIM, CPS, L, B = 24, 4, 4, 4
# (chunks, K, held-out sequences): the second run has fewer candidates than K outside a sequence: padded slots
RUNS = ((400, 4, 8), (48, 46, 4))
T = CPS * L


def sh(*args, ok=True):
    p = subprocess.run([str(a) for a in args], env=ENV, capture_output=True, text=True)
    if ok and p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:])
        raise SystemExit("failed: " + " ".join(str(a) for a in args[:3]))
    return p


def reference_check(run):
    """(passes, last line) of retrieval_reference.py --check on run."""
    p = sh(sys.executable, os.path.join(ROOT, "tests", "ref", "retrieval_reference.py"), run, "--check", ok=False)
    return p.returncode == 0, (p.stdout.strip().splitlines() or [""])[-1]


def expected(run, K):
    """Independent: (emb [N, DIM] float32, ids [N, K], scores [N, K], mask bits [N, K] bool) from the files."""
    man = json.load(open(os.path.join(run, "manifest.json")))
    x = load_embeddings(run, man)
    ids, scores, mask, hdr = load_neighbours(run, man)
    bits = ((mask[:, None].astype(np.uint64) >> np.arange(K, dtype=np.uint64)) & 1).astype(bool)
    return x, ids, scores, bits, hdr


def mismatches(batches, x, ids, bits, cast, K):
    """What differs between the batches and the files: a list of descriptions (empty: all equal)."""
    bad = []
    for bi, b in enumerate(batches):
        for r, s in enumerate(b.idx):
            for c in range(CPS):
                q = int(s) * CPS + c
                want = bits[q] if c > 0 else np.zeros(K, bool)
                got = b.mask[r, c].astype(bool)
                if not np.array_equal(got, want):
                    bad.append("batch %d seq %d chunk %d: mask %s, the neighbour block says %s" %
                               (bi, s, c, "".join(map(str, got.astype(int))), "".join(map(str, want.astype(int)))))
                    continue
                for j in np.nonzero(want)[0]:
                    if b.memory[r, c, j].tobytes() != cast(x[ids[q, j]]).tobytes():
                        bad.append("batch %d seq %d chunk %d slot %d: not the embedding of neighbour %d (chunk %d)"
                                   % (bi, s, c, j, ids[q, j], q))
    return bad


def planted(batches, how):
    """Copies of the batches with a memory-path bug planted."""
    out = []
    for b in batches:
        mem, mk = b.memory.copy(), b.mask.copy()
        if how == "shift":  # chunk c gets chunk c-1's memory (one chunk late)
            mem[:, 1:], mk[:, 1:] = b.memory[:, :-1], b.mask[:, :-1]
        elif how == "zero":
            mem[:] = 0
        elif how == "constant":
            mem[:] = b.memory[0, 1, 0]
        elif how == "chunk0":  # chunk 0 unmasked
            mk[:, 0] = 1
        out.append(b._replace(memory=mem, mask=mk))
    return out


def main():
    with tempfile.TemporaryDirectory() as w:
        subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "build/tools/retrieve_mkrun"], check=True)
        for N, K, val in RUNS:
            run = os.path.join(w, "run%d" % N)
            sh(os.path.join(ROOT, "build", "tools", "retrieve_mkrun"), run, N, DIM, CPS, 100, 3, "fp32")
            sh(DFM, "index", run, "--index", "Flat")
            sh(DFM, "retrieve", run, "--k", K)
            x, ids, scores, bits, hdr = expected(run, K)
            # alignment in the pipeline: chunk c's neighbours are those of chunk c-1's embedding
            ok, line = reference_check(run)
            check(ok and hdr["window"] == 1, "neighbours = exact top-%d of the query, chunk c-1's embedding: %s"
                  % (K, line))
            qs = [(q, j) for q in range(N) for j in range(K) if q % CPS and bits[q, j]]
            err = worst_diff([float(np.dot(x[q - 1].astype(np.float64), x[ids[q, j]])) for q, j in qs],
                             [float(scores[q, j]) for q, j in qs])
            check(len(qs) > 0 and err < 1e-5, "%d stored scores = chunk c-1's embedding . neighbour's (max error %.1e)"
                  % (len(qs), err))
            bad = os.path.join(w, "shifted%d" % N)  # planted: neighbour rows one chunk late
            shutil.copytree(run, bad)
            man = json.load(open(os.path.join(bad, "manifest.json")))
            first = sorted(man["stages"]["retrieve"]["outputs"], key=lambda o: o["first_chunk"])[0]
            f = os.path.join(bad, first["file"])
            raw = bytearray(open(f, "rb").read())
            rb = K * 8 + ((K + 1) & ~1) * 4 + 8  # a row: ids, scores (padded to even), mask
            n0 = (len(raw) - 128) // rb
            raw[128 + rb:128 + n0 * rb] = raw[128:128 + (n0 - 1) * rb]
            open(f, "wb").write(raw)
            ok, line = reference_check(bad)
            check(not ok, "planted: neighbour rows shifted by one chunk fail the reference check: %s" % line)

            for dtype, cast in (("fp32", lambda v: v.astype("<f4")),
                                ("fp16", lambda v: v.astype(np.float16).astype("<f4"))):
                sh(DFM, "write-targets", run, "--target-shards", 2, "--dtype", dtype, "--force")
                dumps = {}
                for split in ("train", "heldout"):
                    out = os.path.join(w, "%d-%s-%s.bin" % (N, dtype, split))
                    sh(DFM_TRAIN, "dump-batches", "--data", run, "--targets", run, "--out", out, "--seq-len", T,
                       "--batch", B, "--chunk-len", L, "--split", split, "--val-seqs", val, "--seed", 5)
                    dumps[split] = dfm.read_dump(out)
                    bs = dumps[split]
                    seqs = sorted(int(s) for b in bs for s in b.idx)
                    slots = sum(int(b.mask.sum()) for b in bs)
                    part = sum(int((K - b.mask.sum(-1))[b.mask.any(-1)].sum()) for b in bs)  # padded slots
                    m = mismatches(bs, x, ids, bits, cast, K)
                    check(not m and len(bs) > 0 and slots > 0 and len(set(seqs)) == len(seqs) and (K < 10 or part > 0),
                          "%d chunks, K=%d, %s targets, %s split: %d batches, %d sequences, %d valid slots equal the "
                          "neighbours' embeddings in rank order, masks (%d padded slots) equal the neighbour blocks' "
                          "(chunk 0 masked)%s" % (N, K, dtype, split, len(bs), len(seqs), slots, part,
                                                  "" if not m else ": " + "; ".join(m[:3])))
                for how in ("shift", "zero", "constant", "chunk0"):
                    m = mismatches(planted(dumps["train"], how), x, ids, bits, cast, K)
                    check(len(m) > 0, "%d chunks, %s, planted '%s': the check fails (%d mismatches; first: %s)"
                          % (N, dtype, how, len(m), m[0] if m else "none"))
    finish("target memory values and alignment, pipeline files to loader batches")


if __name__ == "__main__":
    main()
