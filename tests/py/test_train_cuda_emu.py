"""The trainer's CUDA kernels, run on the CPU through a host emulation of CUDA, match trainer/ops.c.

No GPU needed: trainer/ops_cuda.cu and its checker tests/cuda/ops_cuda_check.cu are compiled with g++ against
tests/cuda/host_emu_cuda.h (every GPU thread a cooperative fiber; warp shuffles and barriers emulated;
cublasGemmEx a naive column-major loop; tests/py/cuda_emu.py). The checker must print "RESULT: PASS".
This checks indexing, reductions and the cuBLAS operand layout against the CPU reference; it says nothing
about races or speed on real hardware (tests/gpu/gpu_check_trainer.sh does).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emu  # noqa: E402


def main():
    with tempfile.TemporaryDirectory(prefix="dfm-cuda-emu-") as tmp:
        exe = cuda_emu.build(tmp, ["trainer/ops_cuda.cu", "tests/cuda/ops_cuda_check.cu"],
                             ["trainer/ops.c", "trainer/adamw.c", "common/error.c"],
                             ["DFM_OPS_CUDA_CHECK_MAIN"], "ops_cuda_check_emu")
        if not exe:
            return 1
        r = cuda_emu.run_program(exe)
        print(r.stdout[-8000:], r.stderr[-2000:])
        if r.returncode != 0 or "RESULT: PASS" not in r.stdout:
            print(f"FAIL: the emulated CUDA kernels differ from trainer/ops.c (exit {r.returncode})")
            return 1
        print("ok: every CUDA kernel, emulated on the host, matches its CPU twin")
        return 0


sys.exit(main())
