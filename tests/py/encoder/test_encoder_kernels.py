#!/usr/bin/env python3
"""Every GEMM kernel of the CPU encoder (encoder/bert_gemm.h) against the float64 NumPy reference, at the
bound the encoder promises: max abs error <= 1e-5 per component, on the 24 texts of the committed
reference (tests/data/encoder/reference.jsonl, from tests/ref/encoder_reference.py unitref), and for
invariance on real chunk texts of mixed lengths (2 to 256 tokens, so chunks of one long sequence and
of many short ones both occur).

- the kernel the CPU picks (AVX-512 here), DFM_ENCODER_ISA=avx2 and DFM_ENCODER_ISA=blas (OpenBLAS);
  a kernel the CPU lacks is skipped with a SKIP line (counted by tests/run.sh);
- the AVX-512 and AVX2 kernels give byte-identical files (both sum each product in k order with one FMA
  per term, then add the bias);
- for each: 1 OpenMP thread at the default batching and 2 threads at --batch 3 give byte-identical
  files (a row's result depends only on its own text); the OpenBLAS fallback is only held to thread
  invariance, since OpenBLAS's blocking, and so its rounding, follows the row count of a call.
Exit status non-zero on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import encoder_reference as R  # noqa: E402

DFM = os.environ.get("DFM", os.path.join(ROOT, "build/dfm"))
BOUND = 1e-5


def cpu_has(flag):
    try:
        return any(flag in l.split() for l in open("/proc/cpuinfo") if l.startswith("flags"))
    except OSError:
        return False


def encode(tp, out, isa, threads, batch=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), DFM_PROGRESS="0")
    env.pop("DFM_ENCODER_ISA", None)
    if isa:
        env["DFM_ENCODER_ISA"] = isa
    cmd = [DFM, "encode", "--texts", tp, "--out", out, "--device", "cpu", "--model", R.MODEL]
    if batch:
        cmd += ["--batch", str(batch)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"FAIL: dfm encode ({isa or 'default'} kernel, {threads} threads) exited {r.returncode}")
    buf = open(out, "rb").read()
    return buf[128:], np.frombuffer(buf, dtype="<f4", offset=128).astype(np.float64).reshape(-1, 384)


def main():
    refrows = [json.loads(l) for l in open(os.path.join(ROOT, "tests/data/encoder/reference.jsonl"), encoding="utf-8")]
    ref = np.array([r["emb"] for r in refrows], dtype=np.float64)
    texts = R.chunk_texts(60, seed=7, chunk_len=32) + R.chunk_texts(6, seed=8, chunk_len=220) + R.HARD
    texts.append(" ".join(texts[:40]))  # over max_seq_length: truncated to 256 tokens
    ok = True
    outputs = {}
    kernels = [(None, "default (widest the CPU runs)", True), ("avx2", "AVX2", cpu_has("avx2") and cpu_has("fma")),
               ("blas", "OpenBLAS", True)]
    with tempfile.TemporaryDirectory() as d:
        rp, tp = os.path.join(d, "r.jsonl"), os.path.join(d, "t.jsonl")
        for path, rows in ((rp, [r["text"] for r in refrows]), (tp, texts)):
            with open(path, "w", encoding="utf-8") as f:
                for t in rows:
                    f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        for isa, name, have in kernels:
            if not have:
                print(f"SKIP: the {name} kernels (this CPU lacks them)")
                continue
            _, e = encode(rp, os.path.join(d, "r.bin"), isa, 1)
            raw1, _ = encode(tp, os.path.join(d, "a.bin"), isa, 1)
            raw2, _ = encode(tp, os.path.join(d, "b.bin"), isa, 2, batch=None if isa == "blas" else 3)
            err = float(np.abs(e - ref).max())
            good = err <= BOUND and raw1 == raw2
            print(f"{name}: max abs error {err:.3g} vs the float64 reference (bound {BOUND:g}); {len(texts)} texts "
                  f"at 1 thread vs 2 threads{'' if isa == 'blas' else ' and --batch 3'} "
                  f"{'identical' if raw1 == raw2 else 'DIFFER'} -> {'ok' if good else 'FAIL'}")
            ok &= good
            outputs[isa] = raw1
    if "avx2" in outputs and cpu_has("avx512f"):
        same = outputs["avx2"] == outputs[None]
        print(f"AVX-512 and AVX2 kernels: {'identical' if same else 'DIFFER'}")
        ok &= same
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
