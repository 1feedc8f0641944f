"""The trainer's CUDA kernels, run on the CPU through a host emulation of CUDA, match trainer/ops.c.

No GPU needed: trainer/ops_cuda.cu and its checker trainer/ops_cuda_check.cu are compiled with g++ against
trainer/host_emu_cuda.h (every GPU thread a cooperative fiber; warp shuffles and barriers emulated;
cublasGemmEx a naive column-major loop), after rewriting each `kernel<<<cfg>>>(args);` launch. The checker
must print "RESULT: PASS". This checks indexing, reductions and the cuBLAS operand layout against the CPU
reference; it says nothing about races or speed on real hardware (scripts/gpu_check_trainer.sh does).
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = re.compile(r"(\w+(?:<\d+>)?)<<<(.*?)>>>\((.*?)\);", re.S)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        print(" ".join(cmd), "\n", (r.stdout + r.stderr)[-4000:])
    return r


def main():
    with tempfile.TemporaryDirectory(prefix="dfm-cuda-emu-") as tmp:
        inc = os.path.join(tmp, "include")
        os.makedirs(inc)
        for h in ("cublas_v2.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_bf16.h"):
            open(os.path.join(inc, h), "w").write("#pragma once\n")
        objs = []
        for name in ("ops_cuda", "ops_cuda_check"):
            src = open(os.path.join(ROOT, "trainer", name + ".cu"), encoding="utf-8").read()
            n = src.count("<<<")
            out = LAUNCH.sub(lambda m: "emu_launch(emu_cfg(%s), [&]() { %s(%s); });" % (m.group(2), m.group(1),
                                                                                            m.group(3)), src)
            if out.count("<<<"):
                print(f"FAIL: {name}.cu: {out.count('<<<')} of {n} launches not rewritten")
                return 1
            cpp = os.path.join(tmp, name + ".cpp")
            open(cpp, "w", encoding="utf-8").write(out)
            obj = cpp[:-4] + ".o"
            r = run(["g++", "-std=c++17", "-O1", "-w", "-I" + inc, "-I" + ROOT, "-I" + os.path.join(ROOT, "pipeline"),
                     "-include", os.path.join(ROOT, "trainer/host_emu_cuda.h"), "-DDFM_HAVE_CUDA=1",
                     "-DDFM_OPS_CUDA_CHECK_MAIN", "-c", cpp, "-o", obj])
            if r.returncode:
                print(f"FAIL: {name}.cu does not compile against the host emulation")
                return 1
            objs.append(obj)
        cflags = subprocess.run(["pkg-config", "--cflags", "openblas"], capture_output=True, text=True).stdout.split()
        libs = subprocess.run(["pkg-config", "--libs", "openblas"], capture_output=True, text=True).stdout.split()
        for f in ("trainer/ops.c", "trainer/adamw.c", "pipeline/common/error.c"):
            obj = os.path.join(tmp, os.path.basename(f)[:-2] + ".o")
            cc = ["cc", "-std=c11", "-O2", "-fopenmp", "-D_GNU_SOURCE", "-I" + ROOT,
                  "-I" + os.path.join(ROOT, "pipeline")]
            if run(cc + cflags + ["-c", os.path.join(ROOT, f), "-o", obj]).returncode:
                print(f"FAIL: compiling {f}")
                return 1
            objs.append(obj)
        exe = os.path.join(tmp, "ops_cuda_check_emu")
        if run(["g++", "-o", exe] + objs + (libs or ["-lopenblas"]) + ["-lgomp", "-lm"]).returncode:
            print("FAIL: linking the emulated checker")
            return 1
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        r = subprocess.run([exe], capture_output=True, text=True, env=env, timeout=900)
        print(r.stdout[-8000:], r.stderr[-2000:])
        if r.returncode != 0 or "RESULT: PASS" not in r.stdout:
            print(f"FAIL: the emulated CUDA kernels differ from trainer/ops.c (exit {r.returncode})")
            return 1
        print("ok: every CUDA kernel, emulated on the host, matches its CPU twin")
        return 0


sys.exit(main())
