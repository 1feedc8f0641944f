"""The flash attention CUDA kernels, run on the CPU through the host emulation of CUDA, match trainer/ops.c.

No GPU needed: trainer/attention_cuda.cu and its checker tests/cuda/attention_cuda_check.cu are compiled with g++
against tests/cuda/host_emu_cuda.h (every GPU thread a cooperative fiber; warp shuffles and barriers emulated;
__shared__ is a static; tests/py/cuda_emu.py), templated launches included. The checker must print
"RESULT: PASS": forward out and lse, backward dq, dk, dv against the CPU reference for several shapes
(partial tiles, grouped heads, padded head sizes), no writes past the outputs, determinism. This checks
indexing, masking, the online softmax and the GQA sums; it says nothing about races or speed on real
hardware (tests/gpu/gpu_check_trainer.sh runs the same checker on a GPU).
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emu  # noqa: E402


def main():
    t0 = time.time()
    src = open(os.path.join(cuda_emu.ROOT, "trainer", "attention_cuda.cu"), encoding="utf-8").read()
    if src.count("<<<") < 3:
        print("FAIL: attention_cuda.cu: expected the 3 kernel launches (forward, dq, dk/dv)")
        return 1
    with tempfile.TemporaryDirectory(prefix="dfm-attn-emu-") as tmp:
        exe = cuda_emu.build(tmp, ["trainer/attention_cuda.cu", "tests/cuda/attention_cuda_check.cu"],
                             ["trainer/ops.c", "common/error.c"], ["DFM_ATTN_CUDA_CHECK_MAIN"],
                             "attention_cuda_check_emu")
        if not exe:
            return 1
        t1 = time.time()
        r = cuda_emu.run_program(exe, timeout=600)
        print(r.stdout[-8000:], r.stderr[-2000:])
        print(f"(build {t1 - t0:.0f} s, emulated run {time.time() - t1:.0f} s)")
        if r.returncode != 0 or "RESULT: PASS" not in r.stdout:
            print(f"FAIL: the emulated flash attention kernels differ from trainer/ops.c (exit {r.returncode})")
            return 1
        print("ok: flash attention forward and backward, emulated on the host, match attention_forward/backward")
        return 0


sys.exit(main())
