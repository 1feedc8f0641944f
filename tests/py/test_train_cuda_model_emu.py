"""Whole training steps of the CUDA model (trainer/model_cuda.cu) equal the CPU model's, on the host.

tests/cuda/model_cuda_check.cu (DFM and pretraining variants, reference and flash attention, fp32 and the
bf16 frozen backbone) is built with the CUDA model, stack, kernels and flash attention against the host
emulation of CUDA (tests/py/cuda_emu.py) and linked with the CPU model; it must print "RESULT: PASS":
loss terms and every trainable gradient tensor within the stated bounds, bit-identical repeated steps,
evaluation modes, three AdamW steps. CI runs the quick set (6 of the 9 variants: the emulation is
slow); the GPU check runs all. No GPU needed; races and real cuBLAS behaviour are not exercised
(tests/gpu/gpu_check_trainer.sh runs the same checker on a GPU).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emu  # noqa: E402

CU = ["trainer/ops_cuda.cu", "trainer/attention_cuda.cu", "trainer/stack_cuda.cu", "trainer/model_cuda.cu",
      "tests/cuda/model_cuda_check.cu"]
C = ["trainer/model.c", "trainer/stack.c", "trainer/ops.c", "trainer/adamw.c", "common/error.c"]


def main():
    with tempfile.TemporaryDirectory(prefix="dfm-cuda-model-emu-") as tmp:
        exe = cuda_emu.build(tmp, CU, C, ["DFM_MODEL_CUDA_CHECK_MAIN"], "model_cuda_check_emu")
        if not exe:
            return 1
        r = cuda_emu.run_program(exe, timeout=1500, env_extra={"MODEL_CHECK_SET": "quick"})
        print(r.stdout[-12000:], r.stderr[-3000:])
        if r.returncode != 0 or "RESULT: PASS" not in r.stdout:
            print(f"FAIL: the emulated CUDA model differs from the CPU model (exit {r.returncode})")
            return 1
        print("ok: the CUDA model, emulated on the host, matches the CPU model step for step")
        return 0


sys.exit(main())
