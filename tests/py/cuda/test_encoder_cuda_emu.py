"""The CUDA encoder (encoder/bert_cuda.cu) in fp32, bf16 and fp16, run on the CPU through the host emulation of
CUDA, matches the CPU encoder in fp32 (tests/cuda/encoder_cuda_check.cu states the bounds).

No GPU needed: `make SAN=1 build-san/emu/encoder_cuda_check` builds bert_cuda.cu and the checker for the host
against tests/cuda/host_emu_cuda.h under ASan+UBSan (every GPU thread a fiber, dynamic shared memory poisoned
per block, cublasGemmEx a naive loop rounding bf16 / fp16 operands to nearest even; tests/cuda/README.md). This
checks the kernels' indexing, reductions, synchronisation, the operand layout of the GEMMs and the precision
conversions; it says nothing about speed on a GPU (tests/gpu/gpu_check_encoder.sh does).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_emu  # noqa: E402

if cuda_emu.check("encoder_cuda_check", 900, "the emulated CUDA encoder differs from the CPU encoder"):
    sys.exit(1)
print("ok: the CUDA encoder in fp32, bf16 and fp16, emulated on the host, matches the CPU encoder")
