"""The host emulation of CUDA (tests/cuda/host_emu_cuda.h) catches a missing synchronisation and an
uninitialised device read: each mutant below is a checker of tests/cuda/ run with one call deleted
(EMU_CUDA_DROP=FILE:LINE makes the call on that line a no-op; the source is not edited). Every mutant must
FAIL under the strict emulation. The sync and uninit mutants must also PASS with EMU_CUDA_EAGER=1 (every
call at once, zeroed memory, as the emulation was before): the failure comes from the strictness, not
from the deletion breaking something any emulation would see (the event mutant is trivially harmless
there, and the model checker is slow, so it is not run twice).

  sync:    the cudaDeviceSynchronize before the attention checker's cudaMemcpy of a result. The kernels
           run on a cudaStreamNonBlocking stream, which the synchronous cudaMemcpy does not wait for: the
           host reads the result buffer before the kernel wrote it.
  uninit:  the cudaMemsetAsync that zeroes the AdamW first moment in the model checker: the moment is
           read fresh from cudaMalloc (NaN here, whatever the allocator left on a GPU).
  event:   the cudaStreamWaitEvent in trainer/model_cuda.cu that orders the compute stream after the
           copy stream's upload of a staged batch: the compute stream reads the inputs before they land.

The lines are found by their text, so the test follows edits of the sources. Runs on 2 processes.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_emu  # noqa: E402

ROOT = cuda_emu.ROOT
MODEL_VARIANT = "pretrain qwen3 tied"  # one variant of the model checker: enough, and 1/6 of its time


def line_of(path, text, offset=0):
    """FILE:LINE of the only line of path holding text (plus offset lines)."""
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().split("\n")
    hits = [i for i, ln in enumerate(lines) if text in ln]
    if len(hits) != 1:
        sys.exit(f"FAIL: {path}: {len(hits)} lines hold {text!r} (expected exactly 1): update this test")
    i = hits[0] + offset
    return f"{path}:{i + 1}", lines[i].strip()


def mutants():
    sync, sync_src = line_of("tests/cuda/attention_cuda_check.cu", "CT(cudaMemcpy(g.data(), dgpu", -1)
    if "cudaDeviceSynchronize" not in sync_src:
        sys.exit(f"FAIL: {sync} is {sync_src!r}, not the synchronisation before the read: update this test")
    uninit, _ = line_of("tests/cuda/model_cuda_check.cu", "cudaMemsetAsync(dm, 0")
    event, _ = line_of("trainer/model_cuda.cu", "cudaStreamWaitEvent(st, s->copied")
    only = {"MODEL_CHECK_ONLY": MODEL_VARIANT}
    return [("sync", "attention_cuda_check", sync, {}), ("uninit", "model_cuda_check", uninit, only),
            ("event", "model_cuda_check", event, only)]


def start(checker, env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **env_extra)
    return subprocess.Popen([os.path.join(ROOT, "build", "emu", checker)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def main():
    for checker in ("attention_cuda_check", "model_cuda_check"):
        r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, f"build/emu/{checker}"],
                           capture_output=True, text=True)
        if r.returncode:
            print((r.stdout + r.stderr)[-3000:])
            sys.exit(f"FAIL: make build/emu/{checker}")
    runs = []  # (mutant, mode, site, checker, env)
    for name, checker, site, env in mutants():
        runs.append((name, "strict", site, checker, dict(env, EMU_CUDA_DROP=site)))
        if name != "event":
            runs.append((name, "eager", site, checker, dict(env, EMU_CUDA_DROP=site, EMU_CUDA_EAGER="1")))
    bad = 0
    pending = list(runs)
    active = []
    while pending or active:
        while pending and len(active) < 2:
            r = pending.pop(0)
            active.append((r, start(r[3], r[4]), time.time()))
        (name, mode, site, checker, _), p, t0 = active.pop(0)
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"FAIL: {name} ({mode}, {checker} without {site}) ran past 900 s")
            bad += 1
            continue
        dt = time.time() - t0
        applied = f"EMU_CUDA_DROP: {site} dropped" in err
        passed = p.returncode == 0 and "RESULT: PASS" in out
        fails = [ln for ln in out.split("\n") if ln.startswith("FAIL")]
        print(f"{name:7s} {mode:6s} {checker} without {site}: exit {p.returncode}, "
              f"{'PASS' if passed else 'FAIL'} ({len(fails)} failed checks{', first: ' + fails[0][:90] if fails else ''})"
              f" in {dt:.0f} s")
        if not applied:
            print(f"FAIL: {site} was never reached: the mutant is not a mutant")
            bad += 1
        elif mode == "strict" and passed:
            print(f"FAIL: the strict emulation did not see the deleted call at {site}")
            bad += 1
        elif mode == "eager" and not passed:
            print(out[-2000:], err[-1000:])
            print(f"FAIL: with EMU_CUDA_EAGER=1 the mutant at {site} fails too: it does not show the strictness")
            bad += 1
    if bad:
        sys.exit(1)
    print("ok: every mutant fails under the strict emulation; the old, eager one passed the sync and uninit mutants")


if __name__ == "__main__":
    main()
