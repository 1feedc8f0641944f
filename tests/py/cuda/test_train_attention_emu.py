"""The flash attention CUDA kernels, run on the CPU through the host emulation of CUDA, match trainer/kernels/ops.c.

No GPU needed: `make SAN=1 emu-checks` builds trainer/kernels/attention_cuda.cu and its checker
tests/cuda/attention_cuda_check.cu for the host against tests/cuda/host_emu_cuda.h under ASan+UBSan (every
GPU thread a cooperative fiber; warp shuffles and barriers emulated; __shared__ poisoned per block; launches
checked against the kernels' __launch_bounds__), templated launches included. The checker must print
"RESULT: PASS" under three schedules (random; warps running ahead to each __syncthreads; reverse): forward
out and lse, backward dq, dk, dv against the CPU reference for several shapes (partial tiles, grouped heads,
padded head sizes), no writes past the outputs, determinism. This checks indexing, masking, the online
softmax, the GQA sums and the tile synchronisation; it says nothing about speed on real hardware
(tests/gpu/gpu_check_trainer.sh runs the same checker on a GPU).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_emu  # noqa: E402

src = open(os.path.join(cuda_emu.ROOT, "trainer", "kernels", "attention_cuda.cu"), encoding="utf-8").read()
if src.count("<<<") < 3:
    print("FAIL: attention_cuda.cu: expected the 3 kernel launches (forward, dq, dk/dv)")
    sys.exit(1)
t0 = time.time()
if cuda_emu.check("attention_cuda_check", 600, "the emulated flash attention kernels differ from trainer/kernels/ops.c",
                  schedules=("random", "warps", "reverse")):
    sys.exit(1)
print(f"ok: flash attention forward and backward, emulated on the host, match attention_forward/backward "
      f"({time.time() - t0:.0f} s with the build)")
