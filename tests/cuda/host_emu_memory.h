/* host_emu_memory.h — device memory of the host emulation of CUDA (included by host_emu_cuda.h; not on its
 * own): each allocation in its own pages between two inaccessible guard pages, and, while a kernel runs,
 * read-only, so that the blocks' writes can be told apart.
 *
 * - Layout: the buffer ends at the last data page's end, rounded up to CUDA's 256-byte alignment; the
 *   guard pages before and after make any access beyond the pages fault, and under ASan the slack inside
 *   them (before the buffer, and the < 256 bytes after it) is poisoned, so every out-of-bounds access of
 *   device memory is reported where it happens, with the allocation it missed.
 * - Races between blocks (emu_track_*, driven by host_emu_launch.h): during a launch every allocation is
 *   read-only. A block's first write to a page faults; the handler saves the page as it was and lets the
 *   block write. When the block ends, the bytes it changed are compared with those the launch's earlier
 *   blocks changed: a byte changed by two blocks is a race (two blocks wrote it, without atomics, in one
 *   launch: its final value depends on their order on a GPU, and a read-modify-write such as
 *   `out[i] += x` loses updates), reported with the kernel, the allocation and both blocks. Bytes
 *   written through the emulation's atomics are exempt. A write that leaves a byte as it was is not seen
 *   (it cannot change the result); an accumulation whose two blocks change disjoint bytes of one value
 *   would escape (each changes its lowest mantissa byte but for a 1-in-256 chance).
 */
#pragma once
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMU_ASAN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define EMU_ASAN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define EMU_ASAN_POISON(p, n) ((void)(p), (void)(n))
#define EMU_ASAN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

inline const size_t emu_PAGE = 4096, emu_ALIGN = 256, emu_UNIT = 1;  // the race check's unit: a byte (no
                                                                      // false report for adjacent uint8)

struct emu_Alloc {
    char *map;         // the mapping: guard page, data pages, guard page
    size_t map_bytes;
    char *data, *end;  // the data pages
    char *p;           // what cudaMalloc returned: p + bytes <= end, p % 256 == 0
    size_t bytes;
};
inline std::map<uintptr_t, emu_Alloc> emu_g_allocs;  // by map address

// the allocation whose mapping holds a, or null
inline emu_Alloc *emu_alloc_at(const void *a) {
    auto it = emu_g_allocs.upper_bound((uintptr_t)a);
    if (it == emu_g_allocs.begin()) return nullptr;
    --it;
    emu_Alloc &al = it->second;
    return (const char *)a < al.map + al.map_bytes ? &al : nullptr;
}

inline void *emu_dev_alloc(size_t bytes, int fill) {
    size_t r = ((bytes ? bytes : 1) + emu_ALIGN - 1) / emu_ALIGN * emu_ALIGN;
    size_t data = (r + emu_PAGE - 1) / emu_PAGE * emu_PAGE, total = data + 2 * emu_PAGE;
    char *m = (char *)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, emu_PAGE, PROT_NONE);
    mprotect(m + emu_PAGE + data, emu_PAGE, PROT_NONE);
    emu_Alloc al{m, total, m + emu_PAGE, m + emu_PAGE + data, m + emu_PAGE + data - r, bytes};
    memset(al.p, fill, bytes);
    EMU_ASAN_POISON(al.data, (size_t)(al.p - al.data));
    EMU_ASAN_POISON(al.p + bytes, r - bytes);
    emu_g_allocs[(uintptr_t)m] = al;
    return al.p;
}

inline void emu_dev_free(void *p) {
    emu_Alloc *al = emu_alloc_at(p);
    if (!al || al->p != p) {
        fprintf(stderr, "host_emu_cuda: cudaFree(%p): not a pointer cudaMalloc returned (or freed twice)\n", p);
        abort();
    }
    EMU_ASAN_UNPOISON(al->data, (size_t)(al->end - al->data));
    munmap(al->map, al->map_bytes);
    emu_g_allocs.erase((uintptr_t)al->map);
}

// ---- races between the blocks of a launch --------------------------------------------------------------
// whole pages, ASan's poisoned slack included: copied and compared without its checks (and without the
// library's memcpy/memcmp, which it intercepts)
#define EMU_RAW __attribute__((no_sanitize_address, optimize("no-tree-loop-distribute-patterns")))
EMU_RAW inline void emu_raw_copy(char *dst, const char *src) {
    for (size_t i = 0; i < emu_PAGE / 8; i++) ((uint64_t *)dst)[i] = ((const uint64_t *)src)[i];
}
EMU_RAW inline bool emu_raw_same(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}
struct emu_Dirty { char *page; std::vector<char> before; };
struct emu_Track {
    bool on = false;                                  // a launch is tracked now
    int block = -1;                                   // the block running (linear id)
    const char *kernel = "", *file = "";
    int line = 0;
    std::vector<emu_Dirty> dirty;                     // pages the running block wrote, as they were before
    std::map<uintptr_t, std::vector<int>> writer;     // per page written in this launch: the block of each byte
    std::map<uintptr_t, std::vector<char>> atomic;    // per page: bytes written through atomics
    size_t races = 0;
};
inline emu_Track emu_g_track;
inline struct sigaction emu_g_old_segv;
inline bool emu_g_segv_installed = false;
inline bool emu_in_fiber_guard(const char *a);  // host_emu_launch.h: a is in the fibers' stack mappings

inline void emu_segv(int sig, siginfo_t *si, void *uc) {
    char *a = (char *)si->si_addr;
    emu_Alloc *al = emu_alloc_at(a);
    if (al && a >= al->data && a < al->end && emu_g_track.on) {  // a block's first write to a read-only page
        char *page = (char *)((uintptr_t)a & ~(uintptr_t)(emu_PAGE - 1));
        emu_g_track.dirty.push_back(emu_Dirty{page, std::vector<char>(emu_PAGE)});
        emu_raw_copy(emu_g_track.dirty.back().before.data(), page);
        mprotect(page, emu_PAGE, PROT_READ | PROT_WRITE);
        return;  // the write runs again, now allowed
    }
    char msg[512];
    int n = 0;
    if (al) {
        long off = (long)(a - al->p);
        n = snprintf(msg, sizeof msg, "host_emu_cuda: out-of-bounds access of device memory: byte %ld of a "
                     "%zu-byte cudaMalloc buffer (%s)", off, al->bytes, off < 0 ? "before its start" : "past its end");
    } else if (emu_in_fiber_guard(a)) {
        n = snprintf(msg, sizeof msg, "host_emu_cuda: a GPU thread's stack overflowed (emu_STACK)");
    }
    if (n) {
        if (emu_g_track.block >= 0)
            n += snprintf(msg + n, sizeof msg - n, " in kernel %s (launched at %s:%d), block %d", emu_g_track.kernel,
                          emu_g_track.file, emu_g_track.line, emu_g_track.block);
        fprintf(stderr, "%s\n", msg);
        abort();
    }
    // not ours: as if we were not here
    sigaction(SIGSEGV, &emu_g_old_segv, nullptr);
    if ((emu_g_old_segv.sa_flags & SA_SIGINFO) && emu_g_old_segv.sa_sigaction)
        emu_g_old_segv.sa_sigaction(sig, si, uc);
    else if (emu_g_old_segv.sa_handler != SIG_DFL && emu_g_old_segv.sa_handler != SIG_IGN)
        emu_g_old_segv.sa_handler(sig);
}

inline void emu_install_segv() {
    if (emu_g_segv_installed) return;
    static std::vector<char> alt(256 * 1024);  // the handler runs here: a fiber whose stack overflowed has none
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = emu_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &emu_g_old_segv);
    emu_g_segv_installed = true;
}

inline void emu_protect_all(int prot) {
    for (auto &kv : emu_g_allocs) mprotect(kv.second.data, (size_t)(kv.second.end - kv.second.data), prot);
}

inline void emu_track_begin(const char *kernel, const char *file, int line) {
    emu_install_segv();
    emu_g_track.on = true;
    emu_g_track.kernel = kernel, emu_g_track.file = file, emu_g_track.line = line;
    emu_protect_all(PROT_READ);
}

// the emulation's atomics: this unit may be written by every block
inline void emu_track_atomic(const void *a, size_t n) {
    if (!emu_g_track.on) return;
    for (size_t i = 0; i < n; i += emu_UNIT) {
        uintptr_t u = (uintptr_t)a + i, page = u & ~(uintptr_t)(emu_PAGE - 1);
        std::vector<char> &v = emu_g_track.atomic[page];
        if (v.empty()) v.assign(emu_PAGE / emu_UNIT, 0);
        v[(u - page) / emu_UNIT] = 1;
    }
}

// the running block is done: what it changed, against the launch's other blocks; its pages read-only again
inline void emu_track_block_end() {
    emu_Track &t = emu_g_track;
    for (emu_Dirty &d : t.dirty) {
        if (!emu_raw_same(d.page, d.before.data(), emu_PAGE)) {
            std::vector<int> &w = t.writer[(uintptr_t)d.page];
            if (w.empty()) w.assign(emu_PAGE / emu_UNIT, -1);
            auto at = t.atomic.find((uintptr_t)d.page);
            for (size_t u = 0; u < emu_PAGE / emu_UNIT; u++) {
                if (emu_raw_same(d.page + u * emu_UNIT, d.before.data() + u * emu_UNIT, emu_UNIT)) continue;
                if (at != t.atomic.end() && at->second[u]) continue;
                if (w[u] >= 0 && w[u] != t.block) {
                    if (t.races++ < 4) {
                        emu_Alloc *al = emu_alloc_at(d.page);
                        fprintf(stderr, "host_emu_cuda: race between blocks %d and %d of kernel %s (launched at %s:%d): "
                                "both wrote byte %ld of a %zu-byte cudaMalloc buffer, without atomics\n",
                                w[u], t.block, t.kernel, t.file, t.line, (long)(d.page + u * emu_UNIT - al->p),
                                al->bytes);
                    }
                }
                w[u] = t.block;
            }
        }
        mprotect(d.page, emu_PAGE, PROT_READ);
    }
    t.dirty.clear();
}

inline void emu_track_end() {
    emu_Track &t = emu_g_track;
    emu_protect_all(PROT_READ | PROT_WRITE);
    t.on = false;
    t.writer.clear();
    t.atomic.clear();
    if (t.races) {
        fprintf(stderr, "host_emu_cuda: %zu bytes written by more than one block of kernel %s (launched at %s:%d). "
                "HINT: give each output one owner block, or reduce in a second kernel (set EMU_CUDA_RACE=0 to run on "
                "without this check)\n", t.races, t.kernel, t.file, t.line);
        abort();
    }
}
