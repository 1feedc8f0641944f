"""The host emulation of CUDA (tests/cuda/host_emu_cuda.h) catches each class of bug it claims to: every mutant
below, a checker of tests/cuda/ run with one deliberate bug, must FAIL under the strict emulation (as the
`strict` runs set it), and the mutants of the classes the old emulation could not see must PASS with
EMU_CUDA_EAGER=1 (every call at once, zeroed memory, blocks and threads by index, __shared__ zeroed once, no
launch or race check: the emulation as it was), so that the failure comes from the strictness and not
from a bug any emulation would see. A bug is made without editing the tree: EMU_CUDA_DROP=FILE:LINE turns
one call into a no-op, or a changed copy of one source is built as a mutant checker (`make EMU_MUT=NAME`,
the copies under build/emu/mut/NAME/).

  sync:        the cudaDeviceSynchronize before the attention checker's cudaMemcpy of a result: the kernels
               run on a cudaStreamNonBlocking stream, which the synchronous cudaMemcpy does not wait for.
  uninit:      the cudaMemsetAsync that zeroes the AdamW first moment in the model checker: the moment is
               read fresh from cudaMalloc (NaN here, whatever the allocator left on a GPU).
  event:       the cudaStreamWaitEvent in trainer/model/model_cuda.cu that orders the compute stream after the
               copy stream's upload of a staged batch.
  syncthreads: the __syncthreads at the start of block_reduce (trainer/kernels/ops_cuda.cu) that keeps a warp from
               writing the shared partials while another warp still reads the previous call's: a
               write-after-read hazard. The lockstep orders (index, reverse, random) never let one warp run
               that far ahead; EMU_CUDA_SCHED=warps does.
  race:        grad_norm_cuda's partial sums accumulated by every block into one zeroed double
               (partial[0] += ...) instead of one slot per block and a second kernel: the blocks' sum is
               right when they run one after another, so only the race check (two blocks wrote the same
               bytes in one launch) sees it; it must pass with EMU_CUDA_RACE=0.
  shared:      mse_total_kernel's threads store their partial into shared memory only when they have a
               slot (threadIdx.x < S; the checker's S is 64 of 256 threads): the tree then reads shared
               memory no thread of the block wrote (zero in the old emulation's statics, by luck).
  launch:      vec_add_cuda launches 2048 threads per block (the kernel loops with a grid stride, so the
               result would be right): more than an H200's 1024, refused through cudaGetLastError.
  bounds:      the flash forward kernel declares __launch_bounds__ of half the threads it is launched with:
               refused as on a GPU (too many resources requested for launch).
  oob:         add_kernel's loop runs to i <= n: one float read past two buffers and written past a third.
               The strict run is the checker built under ASan (`make SAN=1`, build-san/emu/mut/oob/), where
               the slack after each device buffer is poisoned; the eager run is built without, as before.

Source lines are found by their text, so the test follows edits of the sources. Runs on 2 processes.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cuda_emu  # noqa: E402

ROOT = cuda_emu.ROOT
MODEL_VARIANT = "pretrain qwen3 tied"  # one variant of the model checker: enough, and 1/6 of its time
EAGER = {"EMU_CUDA_EAGER": "1"}


def line_of(path, text, offset=0):
    """FILE:LINE of the only line of path holding text (plus offset lines), and that line."""
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().split("\n")
    hits = [i for i, ln in enumerate(lines) if text in ln]
    if len(hits) != 1:
        sys.exit(f"FAIL: {path}: {len(hits)} lines hold {text!r} (expected exactly 1): update this test")
    i = hits[0] + offset
    return f"{path}:{i + 1}", lines[i].strip()


def mutants():
    """(name, checker, env of every run, EMU_CUDA_DROP site or None, source edits [(path, old, new)],
    runs [(mode, env, must pass, text stderr must hold when it fails, built under ASan)])."""
    sync, sync_src = line_of("tests/cuda/attention_cuda_check.cu", "CT(cudaMemcpy(g.data(), dgpu", -1)
    if "cudaDeviceSynchronize" not in sync_src:
        sys.exit(f"FAIL: {sync} is {sync_src!r}, not the synchronisation before the read: update this test")
    uninit, _ = line_of("tests/cuda/model_cuda_check.cu", "cudaMemsetAsync(dm, 0")
    event, _ = line_of("trainer/model/model_cuda.cu", "cudaStreamWaitEvent(st, s->copied")
    war, war_src = line_of("trainer/kernels/ops_cuda.cu", "// sh may still be read by a previous call")
    if "__syncthreads()" not in war_src:
        sys.exit(f"FAIL: {war} is {war_src!r}, not block_reduce's first __syncthreads: update this test")
    model = {"MODEL_CHECK_ONLY": MODEL_VARIANT}
    strict = ("strict", {}, False, "", False)
    eager = ("eager", EAGER, True, "", False)
    ops = "trainer/kernels/ops_cuda.cu"
    return [
        ("sync", "attention_cuda_check", {}, sync, [], [strict, eager]),
        ("uninit", "model_cuda_check", model, uninit, [], [strict, eager]),
        ("event", "model_cuda_check", model, event, [], [strict]),
        ("syncthreads", "ops_cuda_check", {"OPS_CHECK_ONLY": "losses"}, war, [],
         [("strict", {"EMU_CUDA_SCHED": "warps"}, False, "", False), eager]),
        ("race", "ops_cuda_check", {"OPS_CHECK_ONLY": "optimizer"}, None, [
            (ops, "    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];",
             "    if (threadIdx.x == 0) partial[0] += sh[0];"),
            (ops, "    sumsq_partial_kernel<<<NORM_BLOCKS, 256, 0, ctx->stream>>>(partial, g, n);",
             "    cudaMemsetAsync(partial, 0, sizeof(double), ctx->stream); "
             "sumsq_partial_kernel<<<NORM_BLOCKS, 256, 0, ctx->stream>>>(partial, g, n);"),
            (ops, "sum_partials_kernel<<<1, 32, 0, ctx->stream>>>(partial, NORM_BLOCKS);",
             "sum_partials_kernel<<<1, 32, 0, ctx->stream>>>(partial, 1);"),
        ], [("strict", {}, False, "race between blocks", False), ("no race check", {"EMU_CUDA_RACE": "0"}, True, "", False),
            eager]),
        ("shared", "ops_cuda_check", {"OPS_CHECK_ONLY": "losses"}, None, [
            (ops, "t += slot_sum[s];\n    sh[threadIdx.x] = t;",
             "t += slot_sum[s];\n    if ((int)threadIdx.x < S) sh[threadIdx.x] = t;"),
        ], [strict, eager]),
        ("launch", "ops_cuda_check", {"OPS_CHECK_ONLY": "optimizer"}, None, [
            (ops, "add_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, a, b, n);",
             "add_kernel<<<ew_blocks(n) / 8 + 1, 2048, 0, stream>>>(out, a, b, n);"),
        ], [("strict", {}, False, "refused (invalid configuration argument)", False), eager]),
        ("bounds", "attention_cuda_check", {}, None, [
            ("trainer/kernels/attention_cuda.cu", "__launch_bounds__(FaShape<HDM>::NT, FaShape<HDM>::MINB)\n    flash_fwd_kernel(",
             "__launch_bounds__(FaShape<HDM>::NT / 2, FaShape<HDM>::MINB)\n    flash_fwd_kernel("),
        ], [("strict", {}, False, "above the kernel's __launch_bounds__", False), eager]),
        ("oob", "ops_cuda_check", {"OPS_CHECK_ONLY": "optimizer"}, None, [
            (ops, "i < n; i += (size_t)gridDim.x * blockDim.x)\n        out[i] = a[i] + b[i];",
             "i <= n; i += (size_t)gridDim.x * blockDim.x)\n        out[i] = a[i] + b[i];"),
        ], [("strict, ASan", {}, False, "ERROR: AddressSanitizer", True), eager]),
    ]


def make(target, *flags):
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", ROOT, *flags, target], capture_output=True, text=True)
    if r.returncode:
        print((r.stdout + r.stderr)[-3000:])
        sys.exit(f"FAIL: make {' '.join(flags)} {target}")


def build_mutant(name, checker, edits, san):
    """The checker linked with changed copies of the sources (build/emu/mut/NAME/..., or build-san/ with san);
    its path."""
    copies = {}
    for path, old, new in edits:
        src = copies.get(path) or open(os.path.join(ROOT, path), encoding="utf-8").read()
        if src.count(old) != 1:
            sys.exit(f"FAIL: {path}: {src.count(old)} places hold {old!r} (expected exactly 1): update mutant {name}")
        copies[path] = src.replace(old, new)
    base = os.path.join("build-san" if san else "build", "emu", "mut", name)
    for path, text in copies.items():
        dst = os.path.join(ROOT, base, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst) or open(dst, encoding="utf-8").read() != text:  # keep the mtime: no rebuild
            open(dst, "w", encoding="utf-8").write(text)
    make(os.path.join(base, checker), f"EMU_MUT={name}", *(["SAN=1"] if san else []))
    return os.path.join(base, checker)


def main():
    for checker in ("attention_cuda_check", "model_cuda_check", "ops_cuda_check"):
        make(f"build/emu/{checker}")
    runs = []  # (mutant, mode, program, site, env, must pass, text)
    for name, checker, env, site, edits, modes in mutants():
        for mode, menv, must_pass, text, san in modes:
            prog = build_mutant(name, checker, edits, san) if edits else os.path.join("build", "emu", checker)
            e = dict(env, UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", **menv)
            if site:
                e["EMU_CUDA_DROP"] = site
            runs.append((name, mode, prog, site, e, must_pass, text))
    bad = 0
    pending, active = list(runs), []
    while pending or active:
        while pending and len(active) < 2:
            r = pending.pop(0)
            env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **r[4])
            p = subprocess.Popen([os.path.join(ROOT, r[2])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
            active.append((r, p, time.time()))
        (name, mode, prog, site, env, must_pass, text), p, t0 = active.pop(0)
        try:
            out, err = p.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            p.kill()
            print(f"FAIL: {name} ({mode}, {prog}) ran past 900 s")
            bad += 1
            continue
        passed = p.returncode == 0 and "RESULT: PASS" in out
        fails = [ln for ln in out.split("\n") if ln.startswith("FAIL")]
        said = [ln for ln in err.split("\n") if (ln.startswith("host_emu_cuda:") and "EMU_CUDA_DROP" not in ln)
                or "ERROR: AddressSanitizer" in ln]
        what = f"{prog}" + (f" without {site}" if site else "")
        print(f"{name:11s} {mode:13s} {what}: exit {p.returncode}, {'PASS' if passed else 'FAIL'} ({len(fails)} failed "
              f"checks{', first: ' + fails[0][:80] if fails else ''}{'; ' + said[0][:160] if said else ''}) in "
              f"{time.time() - t0:.0f} s")
        if site and f"EMU_CUDA_DROP: {site} dropped" not in err:
            print(f"FAIL: {site} was never reached: the mutant is not a mutant")
            bad += 1
        elif not must_pass and passed:
            print(f"FAIL: the {mode} emulation did not see mutant {name}")
            bad += 1
        elif not must_pass and text and text not in err:
            print(err[-1500:])
            print(f"FAIL: mutant {name} failed, but not with {text!r}: not for the reason it is there for")
            bad += 1
        elif must_pass and not passed:
            print(out[-2000:], err[-1000:])
            print(f"FAIL: mutant {name} fails in mode {mode} too: it does not show what the strict emulation adds")
            bad += 1
    if bad:
        sys.exit(1)
    print(f"ok: all {len(runs)} runs: every mutant fails under the strict emulation, for its reason; the old, eager "
          "emulation passed all but the event mutant")


if __name__ == "__main__":
    main()
