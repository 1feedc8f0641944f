"""Whole training steps of the CUDA model (trainer/model/model_cuda.cu) equal the CPU model's, on the host.

tests/cuda/model_cuda_check.cu (DFM and pretraining variants, reference and flash attention, fp32 and the
bf16 frozen backbone, soft targets) is built by `make SAN=1 emu-checks` with the CUDA model, stack, kernels and flash
attention against the host emulation of CUDA, under ASan+UBSan, and linked with the CPU model; it must
print "RESULT: PASS" with blocks and threads in a seeded random order: loss terms and every trainable
gradient tensor within the stated bounds (no value that is not finite), bit-identical repeated steps,
evaluation modes, a 4 x 32 batch on a model made for 2 x 64 (DFM variants), three AdamW steps; all 9 variants (MODEL_CHECK_SET=quick: 6 of them, for a quicker
look by hand).
No GPU needed; real cuBLAS and timing are not exercised (tests/cuda/README.md;
tests/gpu/gpu_check_trainer.sh runs the same checker on a GPU).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_emu  # noqa: E402

if cuda_emu.check("model_cuda_check", 1500, "the emulated CUDA model differs from the CPU model", tail=12000):
    sys.exit(1)
print("ok: the CUDA model, emulated on the host, matches the CPU model step for step")
