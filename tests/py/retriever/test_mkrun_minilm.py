"""retrieve_mkrun --minilm-like: synthetic embeddings with the statistics of real MiniLM embeddings.

Targets (tests/tools/retrieve_mkrun.c's header; issue 39): the demo run's all-MiniLM-L6-v2 embeddings,
measured by /tmp/issue39/embstats.py: mean pairwise cosine 0.19, mean top-1 neighbour cosine 0.63, mean
top-16 neighbour cosine 0.49. Checks, on 20,000 rows of d = 384 written in several blocks:
  - every row a unit vector, and the three statistics within 0.05 / 0.08 / 0.08 of the targets;
  - the same statistics of the default mode (32 clusters) are outside them (the check can fail);
  - row i is the same whatever N and BLOCK (rows are generated one by one from their own seed), and
    another seed gives other rows;
  - 100,000 rows (154 MB as floats) written with a peak RSS under 64 MB: one block in memory at a time.
The statistics are computed as embstats.py does (brute force, in slices of 2,000 queries), with the mean
pairwise cosine from the sum of the rows (exact for unit vectors). Exits non-zero on failure.
"""
import glob
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOOL = os.path.join(ROOT, "build", "tools", "retrieve_mkrun")
TARGET = {"mean_cos": (0.19, 0.05), "top1": (0.63, 0.08), "top16": (0.49, 0.08)}
N, DIM = 20000, 384
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def mkrun(run, n, block, seed, *extra):
    subprocess.run([TOOL, run, str(n), str(DIM), "8", str(block), str(seed)] + [str(e) for e in extra], check=True,
                   stdout=subprocess.DEVNULL)


def load(run):
    xs = []
    for f in sorted(glob.glob(run + "/encode/emb-*.bin")):
        b = open(f, "rb").read()
        dim, dtype = struct.unpack_from("<II", b, 16)
        n = struct.unpack_from("<Q", b, 32)[0]
        xs.append(np.frombuffer(b, {0: np.float32, 1: np.float16}[dtype], n * dim, 128).reshape(n, dim).astype(np.float32))
    return np.concatenate(xs)


def stats(x):
    n = len(x)
    s = x.sum(0, dtype=np.float64)
    mean_cos = (float(s @ s) - n) / (n * (n - 1))
    top1, top16 = np.empty(n, np.float32), np.empty(n, np.float32)
    for i in range(0, n, 2000):
        sim = x[i:i + 2000] @ x.T
        sim[np.arange(len(sim)), np.arange(i, i + len(sim))] = -2  # not itself
        part = -np.partition(-sim, 15, axis=1)[:, :16]
        top1[i:i + 2000] = part.max(1)
        top16[i:i + 2000] = part.min(1)
    return {"mean_cos": mean_cos, "top1": float(top1.mean()), "top16": float(top16.mean())}


def within(st):
    return all(abs(st[k] - t) <= tol for k, (t, tol) in TARGET.items())


def fmt(st):
    return ", ".join("%s %.3f" % (k, v) for k, v in st.items())


def main():
    subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "build/tools/retrieve_mkrun"], check=True)
    with tempfile.TemporaryDirectory() as w:
        # 20k rows in blocks of 3,000 (the last block short, generation slices of 4,096 across blocks)
        mkrun(w + "/m", N, 3000, 5, "fp32", "--minilm-like")
        x = load(w + "/m")
        check(x.shape == (N, DIM), "20,000 rows of 384 written (%s)" % (x.shape,))
        norms = np.linalg.norm(x, axis=1)
        check(np.abs(norms - 1).max() < 1e-5, "unit vectors (largest |norm - 1| %.2g)" % np.abs(norms - 1).max())
        st = stats(x)
        for k, (t, tol) in TARGET.items():
            check(abs(st[k] - t) <= tol, "%s %.3f within %.2f of MiniLM's %.2f" % (k, st[k], tol, t))
        # the default mode is not MiniLM-like: the same check says so
        mkrun(w + "/d", N, 3000, 5, "fp32")
        sd = stats(load(w + "/d"))
        check(not within(sd), "the default 32-cluster mode fails the same check (%s)" % fmt(sd))
        # row i does not depend on N or BLOCK; the seed matters; fp16 is the same rows rounded
        mkrun(w + "/p", 5000, 777, 5, "fp16", "2000", "3", "--minilm-like")
        p = load(w + "/p")
        check(np.array_equal(p, x[:5000].astype(np.float16).astype(np.float32)),
              "rows 0..4999 of a 5,000-row run in blocks of 777 (fp16) = the 20,000-row run's, rounded")
        mkrun(w + "/s", 100, 100, 6, "fp32", "--minilm-like")
        check(not np.array_equal(load(w + "/s"), x[:100]), "another seed, other rows")
        # 100k rows: never all in memory (154 MB as floats). Its peak RSS taken by a fresh, small Python:
        # a child's ru_maxrss counts its parent's peak up to the exec (Linux), and this one holds arrays
        argv = [TOOL, w + "/big", "100000", str(DIM), "8", "8192", "7", "fp16", "--minilm-like"]
        spawn = ("import os, sys\npid = os.posix_spawn(sys.argv[1], sys.argv[1:], dict(os.environ), "
                 "file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])\n"
                 "_, st, ru = os.wait4(pid, 0)\nprint(st, ru.ru_maxrss)")
        out = subprocess.run([sys.executable, "-S", "-c", spawn] + argv, check=True, capture_output=True, text=True).stdout.split()
        status, maxrss = int(out[0]), int(out[1])
        check(status == 0 and maxrss < 64 * 1024 and len(glob.glob(w + "/big/encode/emb-*.bin")) == 13,
              "100,000 x 384 written in 13 blocks with a peak RSS of %.1f MB (< 64)" % (maxrss / 1024))
    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
