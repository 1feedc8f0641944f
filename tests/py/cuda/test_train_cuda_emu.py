"""The trainer's CUDA kernels, run on the CPU through a host emulation of CUDA, match trainer/kernels/ops.c.

No GPU needed: `make SAN=1 emu-checks` builds trainer/kernels/ops_cuda.cu and its checker tests/cuda/ops_cuda_check.cu
for the host against tests/cuda/host_emu_cuda.h, under ASan+UBSan (every GPU thread a cooperative fiber; warp
shuffles and barriers emulated; cublasGemmEx a naive column-major loop; launches checked against an H200's
limits; __shared__ poisoned per block; device memory guarded and checked for races between blocks). The
checker must print "RESULT: PASS" twice: blocks and threads in a seeded random order, and with warps
running ahead of each other to each __syncthreads (tests/cuda/README.md). This checks indexing,
reductions, synchronisation and the cuBLAS operand layout against the CPU reference; it says nothing about
speed on real hardware (tests/gpu/gpu_check_trainer.sh does).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_emu  # noqa: E402

if cuda_emu.check("ops_cuda_check", 900, "the emulated CUDA kernels differ from trainer/kernels/ops.c", schedules=("random", "warps")):
    sys.exit(1)
print("ok: every CUDA kernel, emulated on the host under two schedules, matches its CPU twin")
