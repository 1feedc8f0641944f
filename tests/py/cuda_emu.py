"""Build CUDA sources of the trainer for the CPU through tests/cuda/host_emu_cuda.h (no GPU needed).

Each `kernel<<<cfg>>>(args);` launch is rewritten as `emu_launch(emu_cfg(cfg), [&]() { kernel(args); });`,
the .cu files are compiled with g++ against empty CUDA headers and the emulation header, the C files with
cc (OpenMP, OpenBLAS), and everything is linked into one program. Used by tests/py/test_train_*_emu.py.
"""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# kernel<<<grid, block, smem, stream>>>(args);  kernel may carry template arguments: k<HDM>, k<COL_SUM>
LAUNCH = re.compile(r"(\w+(?:<[\w:,\s]+>)?)<<<(.*?)>>>\((.*?)\);", re.S)
CUDA_HEADERS = ("cublas_v2.h", "cuda_runtime.h", "cuda_runtime_api.h", "cuda_bf16.h")


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        print(" ".join(cmd), "\n", (r.stdout + r.stderr)[-4000:])
    return r


def rewrite_launches(src):
    """The source with every <<<>>> launch replaced by emu_launch; raises if one is left."""
    n = src.count("<<<")
    out = LAUNCH.sub(lambda m: "emu_launch(emu_cfg(%s), [&]() { %s(%s); });" % (m.group(2), m.group(1), m.group(3)),
                     src)
    if out.count("<<<"):
        raise ValueError(f"{out.count('<<<')} of {n} launches not rewritten")
    return out


def build(tmp, cu_files, c_files, defines, exe_name):
    """Compile cu_files (paths relative to the repo) under the emulation and c_files natively, link.
    Returns the program's path, or None after printing why."""
    inc = os.path.join(tmp, "include")
    os.makedirs(inc, exist_ok=True)
    for h in CUDA_HEADERS:
        open(os.path.join(inc, h), "w").write("#pragma once\n")
    objs = []
    for f in cu_files:
        name = os.path.basename(f)[:-3]
        try:
            src = rewrite_launches(open(os.path.join(ROOT, f), encoding="utf-8").read())
        except ValueError as e:
            print(f"FAIL: {f}: {e}")
            return None
        cpp = os.path.join(tmp, name + ".cpp")
        open(cpp, "w", encoding="utf-8").write(src)
        obj = cpp[:-4] + ".o"
        r = run(["g++", "-std=c++17", "-O2", "-w", "-I" + inc, "-I" + ROOT, "-I" + os.path.join(ROOT, "pipeline"),
                 "-include", os.path.join(ROOT, "tests/cuda/host_emu_cuda.h"), "-DDFM_HAVE_CUDA=1"]
                + ["-D" + d for d in defines] + ["-c", cpp, "-o", obj])
        if r.returncode:
            print(f"FAIL: {f} does not compile against the host emulation")
            return None
        objs.append(obj)
    cflags = subprocess.run(["pkg-config", "--cflags", "openblas"], capture_output=True, text=True).stdout.split()
    libs = subprocess.run(["pkg-config", "--libs", "openblas"], capture_output=True, text=True).stdout.split()
    for f in c_files:
        obj = os.path.join(tmp, os.path.basename(f)[:-2] + ".o")
        cc = ["cc", "-std=c11", "-O2", "-fopenmp", "-D_GNU_SOURCE", "-I" + ROOT, "-I" + os.path.join(ROOT, "pipeline")]
        if run(cc + cflags + ["-c", os.path.join(ROOT, f), "-o", obj]).returncode:
            print(f"FAIL: compiling {f}")
            return None
        objs.append(obj)
    exe = os.path.join(tmp, exe_name)
    if run(["g++", "-o", exe] + objs + (libs or ["-lopenblas"]) + ["-lgomp", "-lm"]).returncode:
        print("FAIL: linking the emulated program")
        return None
    return exe


def run_program(exe, timeout=900, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run([exe], capture_output=True, text=True, env=env, timeout=timeout)
