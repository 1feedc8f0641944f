"""Run a CUDA checker of tests/cuda/ on the CPU, built by the Makefile through the host emulation of CUDA
under ASan+UBSan (`make SAN=1 emu-checks`: tests/cuda/host_emu_rewrite.py rewrites each .cu, the C++ compiler
builds against tests/cuda/host_emu_cuda.h; tests/cuda/README.md). Used by tests/py/cuda/test_*_emu.py.
"""
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def check(name, timeout, what, env_extra=None, tail=8000, schedules=("random",)):
    """`make SAN=1 build-san/emu/NAME` (a no-op when up to date), then run it on one thread once per schedule
    (EMU_CUDA_SCHED: random, warps, reverse, index; EMU_CUDA_SEED from the environment, default 1). Each run
    must exit 0, print "RESULT: PASS" and leave ASan and UBSan silent. Prints the output; returns 0 when
    every run passed, 1 otherwise (after saying why)."""
    exe = os.path.join("build-san", "emu", name)
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, "SAN=1", exe], capture_output=True, text=True)
    if r.returncode:
        print((r.stdout + r.stderr)[-4000:])
        print(f"FAIL: make SAN=1 {exe} (the checker does not build against the host emulation)")
        return 1
    bad = 0
    for sched in schedules:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", EMU_CUDA_SCHED=sched,
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", **(env_extra or {}))
        t0 = time.time()
        try:
            r = subprocess.run([os.path.join(ROOT, exe)], capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"FAIL: {exe} (EMU_CUDA_SCHED={sched}) ran past {timeout} s")
            bad += 1
            continue
        print(r.stdout[-tail:], r.stderr[-tail // 4:])
        sanitizer = "ERROR: AddressSanitizer" in r.stderr or "runtime error:" in r.stderr
        if r.returncode != 0 or "RESULT: PASS" not in r.stdout or sanitizer:
            print(f"FAIL: {what} (EMU_CUDA_SCHED={sched}, seed {env.get('EMU_CUDA_SEED', '1')}: exit {r.returncode}"
                  f"{', a sanitizer report' if sanitizer else ''})")
            bad += 1
        else:
            print(f"ok: {name} under ASan+UBSan, EMU_CUDA_SCHED={sched}, seed {env.get('EMU_CUDA_SEED', '1')}: "
                  f"RESULT: PASS in {time.time() - t0:.0f} s")
    return 1 if bad else 0
