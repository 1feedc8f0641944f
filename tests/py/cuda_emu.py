"""Run a CUDA checker of tests/cuda/ on the CPU, built by the Makefile through the host emulation of CUDA
(`make emu-checks`: tests/cuda/host_emu_rewrite.py turns each <<<>>> launch into emu_launch, the C++ compiler
builds against tests/cuda/host_emu_cuda.h). Used by tests/py/test_train_*_emu.py.
"""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(name, timeout, what, env_extra=None, tail=8000):
    """`make build/emu/NAME` (a no-op when up to date), run it on one thread; the checker must exit 0 and
    print "RESULT: PASS". Prints its output; returns 0 on a pass, 1 otherwise (after saying why)."""
    exe = os.path.join("build", "emu", name)
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, exe], capture_output=True, text=True)
    if r.returncode:
        print((r.stdout + r.stderr)[-4000:])
        print(f"FAIL: make {exe} (the checker does not build against the host emulation)")
        return 1
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env_extra or {}))
    try:
        r = subprocess.run([os.path.join(ROOT, exe)], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"FAIL: {exe} ran past {timeout} s")
        return 1
    print(r.stdout[-tail:], r.stderr[-tail // 4:])
    if r.returncode != 0 or "RESULT: PASS" not in r.stdout:
        print(f"FAIL: {what} (exit {r.returncode})")
        return 1
    return 0
