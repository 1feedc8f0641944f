"""bench_faiss_build.py — the faiss-cpu wheel's side of bench/retrieval/bench_faiss_build.sh: the same IVF-PQ
training, adding and search as bench/retrieval/bench_faiss_build.c (Debian FAISS through its C API).

    python bench_faiss_build.py BASE.f32 QUERIES.f32 DIM FACTORY TRAIN_N NPROBE K LABELS_OUT

Prints one line: faiss=wheel-VERSION-SIMD train_s=.. train_cpu=.. add_s=.. add_cpu=.. search_s=..
search_cpu=.. (wall and process CPU seconds per phase). Single thread (faiss.omp_set_num_threads(1)).
FAISS_SIMD=AVX2 (a faiss.SIMDLevel_* name) pins the wheel's run-time SIMD dispatch to that level.
"""
import os
import sys
import time

import faiss
import numpy as np


def main():
    base, queries, dim, factory, train_n, nprobe, k, out = sys.argv[1:9]
    dim, train_n, nprobe, k = int(dim), int(train_n), int(nprobe), int(k)
    faiss.omp_set_num_threads(1)
    level = os.environ.get("FAISS_SIMD")  # e.g. AVX2: pin the wheel's dynamic dispatch to that level
    if level:
        faiss.SIMDConfig.set_level(getattr(faiss, "SIMDLevel_" + level))
    xb = np.fromfile(base, dtype="<f4").reshape(-1, dim)
    xq = np.fromfile(queries, dtype="<f4").reshape(-1, dim)
    if train_n <= 0 or train_n > len(xb):
        train_n = len(xb)
    idx = faiss.index_factory(dim, factory, faiss.METRIC_L2)
    w0, c0 = time.perf_counter(), time.process_time()
    idx.train(xb[:train_n])
    w1, c1 = time.perf_counter(), time.process_time()
    idx.add(xb)
    w2, c2 = time.perf_counter(), time.process_time()
    faiss.ParameterSpace().set_index_parameter(idx, "nprobe", nprobe)
    w3, c3 = time.perf_counter(), time.process_time()
    _, lab = idx.search(xq, k)
    w4, c4 = time.perf_counter(), time.process_time()
    lab.astype("<i8").tofile(out)
    if hasattr(faiss, "SIMDConfig"):  # faiss >= 1.13: one wheel, SIMD level chosen at run time
        simd = faiss.SIMDConfig.get_level_name()
    else:
        opts = faiss.get_compile_options().split()
        simd = next((o for o in ("AVX512_SPR", "AVX512", "AVX2", "NEON", "SVE") if o in opts), "generic")
    print(f"faiss=wheel-{faiss.__version__}-{simd} nb={len(xb)} nq={len(xq)} train_n={train_n} "
          f"train_s={w1 - w0:.3f} train_cpu={c1 - c0:.3f} add_s={w2 - w1:.3f} add_cpu={c2 - c1:.3f} "
          f"search_s={w4 - w3:.3f} search_cpu={c4 - c3:.3f}")


if __name__ == "__main__":
    main()
