/* host_emu_launch.h — kernel launches of the host emulation of CUDA (included by host_emu_cuda.h; not on
 * its own): the launch checks, the blocks and their threads (one cooperative fiber each), __shared__
 * memory, barriers and warp shuffles.
 *
 * - A launch is checked when it is made, against an H200's limits (emu_h200: block at most 1024 threads
 *   and 1024 x 1024 x 64, grid at most 2^31-1 x 65535 x 65535, every dimension at least 1, dynamic
 *   shared memory at most 48 KiB) and against the kernel's __launch_bounds__ (read from the kernel itself:
 *   host_emu_rewrite.py makes its first statement emu_kernel_entry(bound), which a probe call reaches
 *   before anything else runs). A refused launch does not run; cudaGetLastError() returns its error once
 *   (cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources), as on the GPU, and a line on stderr
 *   says which launch and why.
 * - Blocks run one after another, in a seeded random order (EMU_CUDA_SCHED=random, the default), in
 *   reverse (reverse) or by index (index). Within a block, each thread runs until it reaches a barrier
 *   (__syncthreads, __syncwarp, a warp shuffle) or ends; the threads are resumed in that order too, a
 *   fresh random order at every barrier with random. With warps (blocks in random order), each warp in
 *   turn, in a fresh random order at each __syncthreads, runs on through its shuffles until every lane
 *   waits at a __syncthreads or ends: warps run ahead of each other, as they may on a GPU, which shows
 *   the write-after-read hazards the lockstep orders hide (a warp overwriting shared memory another warp
 *   has not read yet). EMU_CUDA_SEED (default 1) seeds the orders. A missing __syncthreads shows as a
 *   thread reading what another has not written yet, or has overwritten.
 * - __shared__ arrays (host_emu_rewrite.py registers each at its declaration) are filled with 0xFF bytes
 *   (NaN, -1) when a block first reaches them: a block reads nothing it did not write itself. Their total
 *   per block above 48 KiB stops the program (on a GPU it does not compile).
 * - Races between blocks: host_emu_memory.h (EMU_CUDA_RACE=0 turns the check off).
 * - EMU_CUDA_EAGER=1 (host_emu_cuda.h) also turns all of this off: blocks and threads by index, shared
 *   memory zeroed once and never again, no launch checks, no race check (the emulation as it was).
 * - EMU_CUDA_DROP (host_emu_cuda.h) can delete a __syncthreads too.
 */
#pragma once
#include <array>
#include <csetjmp>

// ---- the limits a launch is checked against: an H200 (sm_90), as cudaGetDeviceProperties gives them ----
struct emu_Limits {
    unsigned max_threads = 1024, max_block[3] = {1024, 1024, 64}, max_grid[3] = {2147483647u, 65535, 65535};
    size_t shared_per_block = 48 * 1024;  // static + dynamic, without cudaFuncSetAttribute's opt-in
    unsigned warp = 32;
};
inline const emu_Limits emu_h200;

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emu_cfg {
    dim3 g, b;
    size_t smem;
    cudaStream_t s;
    emu_cfg(dim3 g_, dim3 b_, size_t smem_ = 0, cudaStream_t s_ = 0) : g(g_), b(b_), smem(smem_), s(s_) {}
};
struct emu_site { const char *kernel, *file; int line; };

// ---- the knobs -----------------------------------------------------------------------------------------
enum { EMU_SCHED_INDEX, EMU_SCHED_REVERSE, EMU_SCHED_RANDOM, EMU_SCHED_WARPS };
inline int emu_sched() {
    static const int s = [] {
        const char *e = getenv("EMU_CUDA_SCHED");
        if (EMU_CUDA_EAGER || (e && !strcmp(e, "index"))) return (int)EMU_SCHED_INDEX;
        if (e && !strcmp(e, "reverse")) return (int)EMU_SCHED_REVERSE;
        if (e && !strcmp(e, "warps")) return (int)EMU_SCHED_WARPS;
        if (e && *e && strcmp(e, "random")) {
            fprintf(stderr, "host_emu_cuda: EMU_CUDA_SCHED=%s: use random, warps, reverse or index\n", e);
            exit(2);
        }
        return (int)EMU_SCHED_RANDOM;
    }();
    return s;
}
inline unsigned long long emu_seed() {
    static const unsigned long long s = getenv("EMU_CUDA_SEED") ? strtoull(getenv("EMU_CUDA_SEED"), 0, 0) : 1;
    return s;
}
inline bool emu_race_check() {
    static const bool on = !EMU_CUDA_EAGER && !(getenv("EMU_CUDA_RACE") && !atoi(getenv("EMU_CUDA_RACE")));
    return on;
}
inline unsigned long long emu_mix(unsigned long long x) {  // splitmix64
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// 0..n-1 in the scheduler's order (rng: the launch's state, advanced)
inline void emu_order(std::vector<unsigned> &v, unsigned n, unsigned long long &rng) {
    v.resize(n);
    int s = emu_sched();
    for (unsigned i = 0; i < n; i++) v[i] = s == EMU_SCHED_REVERSE ? n - 1 - i : i;
    if (s == EMU_SCHED_RANDOM || s == EMU_SCHED_WARPS)
        for (unsigned i = n; i > 1; i--) {
            rng = emu_mix(rng);
            std::swap(v[i - 1], v[rng % i]);
        }
}

// ---- __shared__: registered at the declaration, poisoned when a block first reaches it -----------------
struct emu_Shared { unsigned long long epoch = 0; };
inline std::map<void *, emu_Shared> emu_g_shared;
inline unsigned long long emu_g_epoch = 0;  // one per block run
inline size_t emu_g_block_shared = 0;      // bytes of __shared__ the running block has reached
inline void emu_shared(void *p, size_t n) {
    emu_Shared &s = emu_g_shared[p];
    if (s.epoch == emu_g_epoch) return;
    s.epoch = emu_g_epoch;
    if (EMU_CUDA_EAGER) return;  // the old emulation: zeroed once, as a static
    memset(p, 0xFF, n);
    emu_g_block_shared += n;
    if (emu_g_block_shared > emu_h200.shared_per_block) {
        fprintf(stderr, "host_emu_cuda: kernel %s uses %zu bytes of __shared__ per block, more than the %zu of an H200 "
                "(without opt-in): nvcc refuses it\n", emu_g_track.kernel, emu_g_block_shared, emu_h200.shared_per_block);
        abort();
    }
}

// ---- extern __shared__ (dynamic shared memory): one buffer of the launch's size, poisoned for every block ----
// (host_emu_rewrite.py turns `extern __shared__ T name[];` into `T *name = (T *)emu_dynamic_shared();`)
inline std::vector<unsigned char> emu_g_dyn;  // the running launch's dynamic shared memory (+64 for alignment)
inline void *emu_dynamic_shared() {
    return (void *)(((uintptr_t)emu_g_dyn.data() + 63) & ~(uintptr_t)63);
}

// ---- fibers (one per GPU thread), barriers ---------------------------------------------------------------
// A switch between fibers saves the callee-saved registers and the stack pointer only (x86-64 System V):
// swapcontext also saves the signal mask with a system call at every switch, which was most of the time.
// Under ASan each switch is announced (__sanitizer_start/finish_switch_fiber), so that it knows the stacks.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
inline const size_t emu_STACK = 1024 * 1024;  // ASan's redzones make frames larger
#else
inline const size_t emu_STACK = 256 * 1024;
#endif
#if !defined(__x86_64__)
#error "host_emu_launch.h: the fiber switch is written for x86-64"
#endif
// emu_switch(&save, to): saves this context's stack pointer in *save, continues the one saved in `to`
extern "C" void emu_switch(void **save, void *to);
asm(R"(
    .text
    .weak emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
struct emu_Bar { unsigned count = 0, gen = 0; };
struct emu_Fiber {
    void *sp;
    char *stack;
    bool done;
    const emu_Bar *waits;  // the barrier it waits at (null: none) and that barrier's generation then
    unsigned wait_gen;
};
inline void *emu_g_sched_sp;                               // the scheduler's saved stack pointer
inline const void *emu_g_sched_bottom;                     // and its stack (for ASan)
inline size_t emu_g_sched_size;
inline std::vector<emu_Fiber> emu_g_f;
inline std::vector<emu_dim> emu_g_tid;  // thread index of each linear id of the launch's blocks
inline unsigned emu_g_cur;              // the linear id of the running thread
inline std::function<void()> *emu_g_fn;
inline emu_Bar emu_g_block;
inline std::vector<emu_Bar> emu_g_warp;                 // one per warp of the block
inline std::vector<std::array<float, 32>> emu_g_slots;  // a warp's shuffle values
inline unsigned long emu_g_progress;  // barriers completed + fibers finished: a pass without any is a deadlock

// stacks for n fibers (1024 at first; more only where a launch is not checked, EMU_CUDA_EAGER), each above an
// inaccessible guard page (an overflow faults)
inline std::vector<std::pair<char *, char *>> emu_g_stack_maps;
inline void emu_fibers(size_t n) {
    n = std::max(n, (size_t)emu_h200.max_threads);
    if (emu_g_f.size() >= n) return;
    size_t per = emu_STACK + emu_PAGE, k = n - emu_g_f.size();
    char *m = (char *)mmap(nullptr, per * k, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "host_emu_cuda: cannot map %zu MiB of fiber stacks\n", per * k >> 20);
        abort();
    }
    for (size_t i = 0; i < k; i++) {
        mprotect(m + i * per, emu_PAGE, PROT_NONE);
        emu_g_f.push_back(emu_Fiber{nullptr, m + i * per + emu_PAGE, true, nullptr, 0});
    }
    emu_g_stack_maps.emplace_back(m, m + per * k);
    emu_install_segv();
}
inline bool emu_in_fiber_guard(const char *a) {
    for (auto &r : emu_g_stack_maps)
        if (a >= r.first && a < r.second) return true;
    return false;
}
// switch from the running context (saved in *save; null: a fiber that has ended) to fiber/scheduler `to`
inline void emu_go(void **save, void *to, const void *to_bottom, size_t to_size) {
#if defined(__SANITIZE_ADDRESS__)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(save ? &fake : nullptr, to_bottom, to_size);
    static void *dead;
    emu_switch(save ? save : &dead, to);
    const void *from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(fake, &from_bottom, &from_size);
    if (!emu_g_sched_bottom) emu_g_sched_bottom = from_bottom, emu_g_sched_size = from_size;
#else
    static void *dead;
    (void)to_bottom, (void)to_size;
    emu_switch(save ? save : &dead, to);
#endif
}
extern "C" inline void emu_fiber_main() {
#if defined(__SANITIZE_ADDRESS__)
    const void *from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
    if (!emu_g_sched_bottom) emu_g_sched_bottom = from_bottom, emu_g_sched_size = from_size;
#endif
    (*emu_g_fn)();
    emu_g_f[emu_g_cur].done = true;
    emu_g_progress++;
    emu_go(nullptr, emu_g_sched_sp, emu_g_sched_bottom, emu_g_sched_size);  // never comes back
    abort();
}
// a fresh fiber t: its first switch "returns" into emu_fiber_main (see emu_switch's frame). Raw writes: the
// stack's top may still be poisoned by ASan from the frames of the fiber that used it last
EMU_RAW inline void emu_fiber_init(emu_Fiber &f) {
    uintptr_t a = ((uintptr_t)(f.stack + emu_STACK) - 16) & ~(uintptr_t)15;  // the return address, 16-aligned
    void **slot = (void **)a;
    slot[0] = (void *)&emu_fiber_main;
    for (int i = 1; i <= 6; i++) slot[-i] = nullptr;  // rbp rbx r12 r13 r14 r15
    uint32_t *fp = (uint32_t *)(slot - 7);            // mxcsr and the x87 control word: this thread's
    __asm__ volatile("stmxcsr %0" : "=m"(fp[0]));
    __asm__ volatile("fnstcw %0" : "=m"(*(uint16_t *)&fp[1]));
    f.sp = slot - 7;
    f.done = false;
    f.waits = nullptr;
}
inline void emu_resume_as(unsigned t) {  // the scheduler gives fiber t the CPU
    emu_g_cur = t;
    threadIdx = emu_g_tid[t];
    emu_go(&emu_g_sched_sp, emu_g_f[t].sp, emu_g_f[t].stack, emu_STACK);
}
inline void emu_yield() {
    unsigned me = emu_g_cur;
    emu_go(&emu_g_f[me].sp, emu_g_sched_sp, emu_g_sched_bottom, emu_g_sched_size);
    emu_g_cur = me;  // other fibers ran meanwhile
    threadIdx = emu_g_tid[me];
}
inline void emu_wait(emu_Bar &b, unsigned n) {
    unsigned gen = b.gen;
    if (++b.count == n) {
        b.count = 0;
        b.gen++;
        emu_g_progress++;
        return;
    }
    emu_Fiber &f = emu_g_f[emu_g_cur];
    f.waits = &b, f.wait_gen = gen;
    while (b.gen == gen) emu_yield();
    emu_g_f[emu_g_cur].waits = nullptr;
}
// with EMU_CUDA_SCHED=warps: fiber t can run on without another warp (it is not held at __syncthreads)
inline bool emu_runnable_in_warp(unsigned t) {
    const emu_Fiber &f = emu_g_f[t];
    return !f.done && !(f.waits == &emu_g_block && emu_g_block.gen == f.wait_gen);
}

// ---- a launch: probe, check, queue; run ------------------------------------------------------------------
inline bool emu_g_probing = false;
inline unsigned emu_g_probe_bound = 0;
inline jmp_buf emu_g_probe_jmp;
// every kernel's first statement (host_emu_rewrite.py): bound = its __launch_bounds__ (0: none)
inline void emu_kernel_entry(unsigned bound) {
    if (emu_g_probing) {
        emu_g_probe_bound = bound;
        longjmp(emu_g_probe_jmp, 1);
    }
}
inline unsigned long long emu_g_launches = 0;

inline void emu_run(emu_cfg c, emu_site site, std::function<void()> fn) {  // one launch, now
    emu_fibers((size_t)c.b.x * c.b.y * c.b.z);
    unsigned nt = c.b.x * c.b.y * c.b.z, nb = c.g.x * c.g.y * c.g.z;
    blockDim = emu_dim{c.b.x, c.b.y, c.b.z};
    gridDim = emu_dim{c.g.x, c.g.y, c.g.z};
    emu_g_fn = &fn;
    emu_g_dyn.assign(c.smem + 64, 0);
    emu_g_tid.resize(nt);
    for (unsigned t = 0; t < nt; t++) emu_g_tid[t] = emu_dim{t % c.b.x, t / c.b.x % c.b.y, t / (c.b.x * c.b.y)};
    unsigned long long rng = emu_mix(emu_seed() ^ emu_mix(++emu_g_launches));
    std::vector<unsigned> blocks, order, lanes;
    emu_order(blocks, nb, rng);
    bool track = emu_race_check();
    if (track) emu_track_begin(site.kernel, site.file, site.line);
    emu_g_track.kernel = site.kernel, emu_g_track.file = site.file, emu_g_track.line = site.line;
    for (unsigned bl : blocks) {
        blockIdx = emu_dim{bl % c.g.x, bl / c.g.x % c.g.y, bl / (c.g.x * c.g.y)};
        emu_g_track.block = (int)bl;
        emu_g_epoch++;
        emu_g_block_shared = c.smem;  // the dynamic part counts toward the block's 48 KiB
        if (!EMU_CUDA_EAGER && c.smem) memset(emu_dynamic_shared(), 0xFF, c.smem);
        emu_g_block = emu_Bar();
        emu_g_warp.assign((nt + 31) / 32, emu_Bar());
        emu_g_slots.resize((nt + 31) / 32);
        for (unsigned t = 0; t < nt; t++) emu_fiber_init(emu_g_f[t]);
        for (bool any = true; any;) {
            any = false;
            unsigned long before = emu_g_progress;
            if (emu_sched() == EMU_SCHED_WARPS) {  // each warp, in a random order, runs on to a __syncthreads
                unsigned nw = (nt + 31) / 32;
                emu_order(order, nw, rng);
                for (unsigned w : order) {
                    emu_order(lanes, std::min(32u, nt - w * 32), rng);
                    for (bool moved = true; moved;) {
                        moved = false;
                        unsigned long p0 = emu_g_progress;
                        for (unsigned l : lanes)
                            if (emu_runnable_in_warp(w * 32 + l)) emu_resume_as(w * 32 + l);
                        moved = emu_g_progress != p0;
                    }
                }
                for (unsigned t = 0; t < nt; t++) any |= !emu_g_f[t].done;
            } else {
                emu_order(order, nt, rng);
                for (unsigned t : order) {
                    if (emu_g_f[t].done) continue;
                    emu_resume_as(t);
                    if (!emu_g_f[t].done) any = true;
                }
            }
            if (any && emu_g_progress == before) {
                fprintf(stderr, "host_emu_cuda: deadlock in block %u of kernel %s (launched at %s:%d): a barrier some "
                        "threads never reach\n", bl, site.kernel, site.file, site.line);
                abort();
            }
        }
        if (track) emu_track_block_end();
    }
    emu_g_track.block = -1;
    if (track) emu_track_end();
}

// the error of a launch configuration on an H200, or 0; why: what is wrong, in words
inline cudaError_t emu_check_launch(const emu_cfg &c, unsigned bound, char *why, size_t n) {
    const emu_Limits &L = emu_h200;
    const unsigned b[3] = {c.b.x, c.b.y, c.b.z}, g[3] = {c.g.x, c.g.y, c.g.z};
    unsigned long long threads = (unsigned long long)c.b.x * c.b.y * c.b.z;
    for (int i = 0; i < 3; i++) {
        if (!b[i] || b[i] > L.max_block[i])
            return snprintf(why, n, "block dimension %c is %u (1..%u)", "xyz"[i], b[i], L.max_block[i]),
                   cudaErrorInvalidConfiguration;
        if (!g[i] || g[i] > L.max_grid[i])
            return snprintf(why, n, "grid dimension %c is %u (1..%u)", "xyz"[i], g[i], L.max_grid[i]),
                   cudaErrorInvalidConfiguration;
    }
    if (threads > L.max_threads)
        return snprintf(why, n, "%llu threads per block (at most %u)", threads, L.max_threads),
               cudaErrorInvalidConfiguration;
    if (c.smem > L.shared_per_block)
        return snprintf(why, n, "%zu bytes of dynamic shared memory (at most %zu without opt-in)", c.smem,
                        L.shared_per_block), cudaErrorInvalidValue;
    if (bound && threads > bound)
        return snprintf(why, n, "%llu threads per block, above the kernel's __launch_bounds__(%u)", threads, bound),
               cudaErrorLaunchOutOfResources;
    return cudaSuccess;
}

// the parameter types of a kernel: the rewritten launch converts its arguments to them at the launch
template <class F> struct emu_sig;
template <class... P> struct emu_sig<void (*)(P...)> { typedef std::tuple<P...> args; };
template <class... P> inline void emu_launch(emu_cfg c, void (*k)(P...), emu_site site, std::tuple<P...> a) {
    if (!EMU_CUDA_EAGER) {
        static std::map<void *, unsigned> bounds;  // per kernel: its __launch_bounds__, from a probe
        auto it = bounds.find((void *)k);
        if (it == bounds.end()) {
            emu_g_probing = true;
            if (!setjmp(emu_g_probe_jmp)) {
                std::apply(k, a);  // returns only if the kernel has no emu_kernel_entry
                emu_g_probing = false;
                fprintf(stderr, "host_emu_cuda: kernel %s has no emu_kernel_entry (not rewritten by "
                        "host_emu_rewrite.py?)\n", site.kernel);
                abort();
            }
            emu_g_probing = false;
            it = bounds.emplace((void *)k, emu_g_probe_bound).first;
        }
        char why[160];
        cudaError_t e = emu_check_launch(c, it->second, why, sizeof why);
        if (e) {
            fprintf(stderr, "host_emu_cuda: launch of %s at %s:%d refused (%s): %s\n", site.kernel, site.file, site.line,
                    cudaGetErrorString(e), why);
            emu_g_last = e;
            return;
        }
    }
    emu_enqueue(c.s, [c, k, a, site]() { emu_run(c, site, [&]() { std::apply(k, a); }); });
}

// ---- barriers and warp primitives ---------------------------------------------------------------------------
inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned w = emu_g_cur / 32, l = emu_g_cur % 32;
    emu_g_slots[w][l] = v;
    emu_wait(emu_g_warp[w], 32);
    float r = emu_g_slots[w][l ^ o];
    emu_wait(emu_g_warp[w], 32);
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu_wait(emu_g_warp[emu_g_cur / 32], 32); }
inline void emu_syncthreads(const char *file, int line) {
    if (emu_dropped(file, line)) return;
    emu_wait(emu_g_block, blockDim.x * blockDim.y * blockDim.z);
}
#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)

// ---- atomics (none of dfm's kernels uses them; here so that a kernel that does is emulated and exempt from
// the race check) ---------------------------------------------------------------------------------------------
template <class T> inline T emu_atomic_add(T *p, T v) {
    emu_track_atomic(p, sizeof(T));
    T old = *p;
    *p = old + v;
    return old;
}
inline float atomicAdd(float *p, float v) { return emu_atomic_add(p, v); }
inline double atomicAdd(double *p, double v) { return emu_atomic_add(p, v); }
inline int atomicAdd(int *p, int v) { return emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return emu_atomic_add(p, v); }
