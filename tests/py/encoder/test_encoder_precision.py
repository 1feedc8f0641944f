#!/usr/bin/env python3
"""`dfm encode --precision bf16 | int8` on the CPU against fp32 (encoder/bert_gemm.h), judged by what matters
downstream: the cosine of each row to its fp32 row and the recall@16 of its nearest neighbours against the
fp32 neighbours, on 400 real GCIDE chunk texts (32 LM tokens each) plus the committed reference's 24 texts
and the hard cases.

Tolerances (measured on this set at the time of writing: bf16 min cosine 0.99997, mean 0.99999, recall@16
0.994; int8 min cosine 0.9935 (the empty text, [CLS][SEP] only; 0.9975 over the chunk texts), mean 0.9988,
recall@16 0.950):
  bf16  every row's cosine >= 0.9999, mean >= 0.9999, recall@16 >= 0.97
  int8  every row's cosine >= 0.99, mean >= 0.998, recall@16 >= 0.90
and both are different from fp32 (a precision that silently ran fp32 fails), identical at 1 thread and at
2 threads with --batch 3 (a row depends only on its own text: integer sums are exact, the bf16 pairs run
in a fixed order), and recorded in the output's describe line.
On a CPU without avx512_bf16 (or avx512_vnni), and always under DFM_ENCODER_ISA=avx2, the precision must be
refused with a message naming the instruction set, not computed some other way.
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
BOUNDS = {"bf16": (0.9999, 0.9999, 0.97), "int8": (0.99, 0.998, 0.90)}  # min cosine, mean cosine, recall@16
NEEDS = {"bf16": ["avx512f", "avx512_bf16"], "int8": ["avx512f", "avx512bw", "avx512_vnni"]}


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split()[2:])
    except OSError:
        pass
    return set()


def run(tp, out, prec, threads=1, batch=None, isa=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), DFM_PROGRESS="0")
    env.pop("DFM_ENCODER_ISA", None)
    if isa:
        env["DFM_ENCODER_ISA"] = isa
    cmd = [DFM, "encode", "--texts", tp, "--out", out, "--device", "cpu", "--model", R.MODEL, "--precision", prec]
    if batch:
        cmd += ["--batch", str(batch)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def encode(tp, out, prec, **kw):
    r = run(tp, out, prec, **kw)
    if r.returncode:
        print(r.stdout[-2000:], r.stderr[-2000:])
        raise SystemExit(f"FAIL: dfm encode --precision {prec} exited {r.returncode}")
    if f"cpu {prec}" not in r.stdout:
        raise SystemExit(f"FAIL: the summary line does not say 'cpu {prec}': {r.stdout.strip()}")
    buf = open(out, "rb").read()
    return buf[128:], np.frombuffer(buf, dtype="<f4", offset=128).astype(np.float64).reshape(-1, 384)


def neighbours(e, k=16):
    s = e @ e.T
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def main():
    refrows = [json.loads(l) for l in open(os.path.join(ROOT, "tests/data/encoder/reference.jsonl"), encoding="utf-8")]
    texts = R.chunk_texts(400, seed=11, chunk_len=32) + [r["text"] for r in refrows] + R.HARD
    flags = cpu_flags()
    ok = True
    with tempfile.TemporaryDirectory() as d:
        tp = os.path.join(d, "t.jsonl")
        with open(tp, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
        _, ref = encode(tp, os.path.join(d, "fp32.bin"), "fp32")
        nref = neighbours(ref[:400])
        for prec, (min_cos, mean_cos, min_recall) in BOUNDS.items():
            # refused under a non-AVX-512 kernel, whatever the CPU
            r = run(tp, os.path.join(d, "x.bin"), prec, isa="avx2")
            refused = r.returncode != 0 and f"--precision {prec} needs AVX-512" in r.stderr
            print(f"{prec} under DFM_ENCODER_ISA=avx2: {'refused' if refused else 'NOT REFUSED'}: {r.stderr.strip()[:160]}")
            ok &= refused
            missing = [fl for fl in NEEDS[prec] if fl not in flags]
            if missing:
                r = run(tp, os.path.join(d, "x.bin"), prec)
                refused = r.returncode != 0 and "needs AVX-512" in r.stderr
                print(f"{prec}: this CPU lacks {' '.join(missing)}: {'refused' if refused else 'NOT REFUSED'}")
                print(f"SKIP: {prec} parity (this CPU lacks {' '.join(missing)})")
                ok &= refused
                continue
            raw1, e = encode(tp, os.path.join(d, prec + ".bin"), prec)
            raw2, _ = encode(tp, os.path.join(d, prec + "2.bin"), prec, threads=2, batch=3)
            cos = (e * ref).sum(axis=1)
            recall = float(np.mean([len(set(a) & set(b)) / 16 for a, b in zip(nref, neighbours(e[:400]))]))
            differs = float(np.abs(e - ref).max()) > 1e-5
            good = (cos.min() >= min_cos and cos.mean() >= mean_cos and recall >= min_recall and raw1 == raw2
                    and differs)
            print(f"{prec}: cosine to fp32 min {cos.min():.6f} (bound {min_cos}) mean {cos.mean():.6f} (bound {mean_cos}); "
                  f"recall@16 of the fp32 neighbours {recall:.4f} (bound {min_recall}) over 400 texts; "
                  f"{'differs from fp32' if differs else 'SAME AS FP32 (not the precision asked)'}; "
                  f"1 thread vs 2 threads --batch 3 {'identical' if raw1 == raw2 else 'DIFFER'} -> {'ok' if good else 'FAIL'}")
            ok &= bool(good)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
