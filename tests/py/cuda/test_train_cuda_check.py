"""The trainer's CUDA kernels keep the CPU names, and their GPU checkers build.

Runs without a GPU:
1. every function declared in trainer/kernels/ops_cuda.h is `<cpu name>_cuda` of a function declared in
   trainer/kernels/ops.h or trainer/kernels/adamw.h (or `<cpu name>_w16_cuda`, the same product with a frozen bf16
   weight, or the bf16 conversion to_bf16_cuda) and every CPU kernel has such a twin (llm.c style: one
   name, two backends), and tests/cuda/ops_cuda_check.cu calls each of them (so no kernel goes unchecked);
2. tests/gpu/gpu_check_trainer.sh (SKIP_MAKE=1: only `make CUDA=1 cuda-checks`, into a scratch build folder)
   builds the three checkers of tests/cuda/ (kernels, flash attention, whole model) with the CUDA compiler and runs
   them: without a GPU each must stop with exit 2 and "no CUDA device"; with one they must pass.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
failures = []


def check(cond, msg):
    print(("ok   " if cond else "FAIL ") + msg)
    if not cond:
        failures.append(msg)


def declared(path):
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"^\s*(?:int|void|double|float)\s+\*?(\w+)\s*\(", text, flags=re.M))


cuda = declared("trainer/kernels/ops_cuda.h")
cpu = declared("trainer/kernels/ops.h") | declared("trainer/kernels/adamw.h")
kernels = sorted(n for n in cuda if n.endswith("_cuda"))
check(len(kernels) >= 29, f"ops_cuda.h declares {len(kernels)} *_cuda kernels")
# every CPU kernel has a GPU twin (lr_schedule is a host-side scalar: none needed)
for name in sorted(declared("trainer/kernels/ops.h") | (declared("trainer/kernels/adamw.h") - {"lr_schedule"})):
    check(name + "_cuda" in cuda, f"{name} has a CUDA twin {name}_cuda")
for name in kernels:
    base = name[: -len("_w16_cuda")] if name.endswith("_w16_cuda") else name[: -len("_cuda")]
    check(base in cpu or name == "to_bf16_cuda", f"{name} has a CPU twin {base}")
checker = open(os.path.join(ROOT, "tests/cuda/ops_cuda_check.cu"), encoding="utf-8").read()
for name in kernels:
    check(re.search(r"\b%s\(" % name, checker) is not None, f"ops_cuda_check.cu calls {name}")

nvcc = subprocess.run(["bash", "-c", "command -v nvcc"], capture_output=True, text=True).stdout.strip()
check(bool(nvcc), "nvcc found (the CUDA toolkit is required to build the CUDA paths)")
if nvcc:
    with tempfile.TemporaryDirectory(prefix="dfm-cuda-check-") as tmp:
        env = dict(os.environ, SKIP_MAKE="1", OUT=tmp, BUILD_DIR=os.path.join(tmp, "build"))
        r = subprocess.run(["bash", os.path.join(ROOT, "tests/gpu/gpu_check_trainer.sh")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=900)
        out = r.stdout + r.stderr
        print(out[-3000:])
        for exe in ("ops_cuda_check", "attention_cuda_check", "model_cuda_check"):
            check(os.path.exists(os.path.join(tmp, "build", "checks", exe)), f"the checker {exe} compiled and linked")
        results = [f for f in os.listdir(tmp) if re.fullmatch(r"gpu_check_trainer_\d{4}-\d\d-\d\d\.txt", f)]
        check(len(results) == 1, "the results file carries the date")
        gpu = subprocess.run(["bash", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
        if gpu:
            check(r.returncode == 0 and out.count("RESULT: PASS") == 3, "on this GPU every check passes")
        else:
            check(r.returncode == 2 and out.count("no CUDA device") >= 3,
                  f"without a GPU the checkers refuse clearly (exit {r.returncode}, expected 2)")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
