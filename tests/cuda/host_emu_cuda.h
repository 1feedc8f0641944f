/* host_emu_cuda.h — a host (CPU) emulation of the small CUDA subset trainer/ops_cuda.cu uses, so the
 * kernels' indexing and reductions can be checked where there is no GPU (tests/py/test_train_cuda_emu.py).
 *
 * Not a CUDA implementation: kernels run block after block on one OS thread; each GPU thread is a
 * cooperative fiber (ucontext) that switches only at __syncthreads / __syncwarp / __shfl_xor_sync, so the
 * emulation is deterministic and races inside a kernel are not exercised. cublasGemmEx is a naive
 * column-major loop (double accumulation; bf16 operands rounded to nearest even). Passing here says the
 * arithmetic and indexing match trainer/ops.c; only a GPU run (tests/gpu/gpu_check_trainer.sh) says the
 * kernels are right on hardware.
 *
 * Strict where the GPU is loose, so that host-side ordering bugs give wrong results here too:
 * - cudaMalloc, cudaMallocAsync and cudaMallocHost return memory filled with 0xFF bytes (NaN as fp32,
 *   fp16 and bf16; -1 as an integer), not zeros; cudaMemset still works.
 * - Work on a created stream (kernel launches, cudaMemcpyAsync, cudaMemsetAsync, cudaFreeAsync, cuBLAS
 *   on a handle's stream) is queued and runs only at a point where CUDA guarantees it has finished:
 *   cudaStreamSynchronize of that stream, cudaEventSynchronize of an event recorded after it,
 *   cudaDeviceSynchronize, cudaFree, cudaStreamDestroy, or when a stream that cudaStreamWaitEvent made
 *   wait on it reaches that point. Before the host waits for a stream, the other streams run what no
 *   event holds back (a legal schedule), so a consumer that misses its cudaStreamWaitEvent runs before
 *   its producer. Kernel arguments are taken at launch, as on the GPU. An async copy with pageable host
 *   memory behaves as CUDA documents: the source is taken at the call; a copy to the host waits for the
 *   stream and is done when the call returns. With pinned memory (cudaMallocHost) it happens later.
 * - The legacy default stream (0) runs at once, after the queued work of blocking streams (created
 *   without cudaStreamNonBlocking); the synchronous cudaMemcpy and cudaMemset run on it. So a host read
 *   (cudaMemcpy) of what a cudaStreamNonBlocking stream computes, without a synchronisation, reads the
 *   buffer as it was before the work: NaN for fresh memory.
 * Two environment variables, read at run time (tests/py/test_cuda_emu_strict.py uses both):
 *   EMU_CUDA_EAGER=1          the old behaviour (every call at once, zeroed memory), to tell an
 *                             emulation-only difference from a bug
 *   EMU_CUDA_DROP=FILE:LINE[,FILE:LINE...]   make the synchronisations (cudaStreamSynchronize,
 *                             cudaEventSynchronize, cudaDeviceSynchronize, cudaStreamWaitEvent) and
 *                             memsets (cudaMemset, cudaMemsetAsync) called on those source lines no-ops:
 *                             the source with that call deleted (a mutant), without editing it. FILE as
 *                             the compiler names it (trainer/ops_cuda.cu).
 *
 * Use: force-include this file (-include tests/cuda/host_emu_cuda.h), give the compiler empty cublas_v2.h,
 * cuda_runtime.h, cuda_runtime_api.h and cuda_bf16.h, and rewrite each `k<<<cfg>>>(args);` as
 * `emu_launch(emu_cfg(cfg), k, typename emu_sig<decltype(&k)>::args(args));` (host_emu_rewrite.py).
 */
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <ucontext.h>
#include <vector>
#include <math.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct emu_dim { unsigned x = 0, y = 0, z = 0; };
inline emu_dim threadIdx, blockIdx, blockDim, gridDim;
typedef int cudaError_t;
enum { cudaSuccess = 0 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
#define cudaStreamNonBlocking 1
struct cudaDeviceProp { char name[256]; int major, minor; size_t totalGlobalMem; };
inline const char *cudaGetErrorString(cudaError_t) { return "emu error"; }
inline cudaError_t cudaGetLastError() { return 0; }

// ---- streams: queues of deferred work ------------------------------------------------------------
struct emu_Op {
    std::function<void()> fn;
    struct emu_Stream *ws = nullptr;  // a cudaStreamWaitEvent: blocked until ws has run wseq ops
    unsigned long long wseq = 0;
};
struct emu_Stream {
    std::deque<emu_Op> q;
    unsigned long long queued = 0, done = 0;  // ops ever queued / ever run: an event is a value of `queued`
    bool blocking = true;
};
typedef emu_Stream *cudaStream_t;
inline std::vector<emu_Stream *> emu_g_streams;
inline bool emu_eager() {
    static const int on = getenv("EMU_CUDA_EAGER") && atoi(getenv("EMU_CUDA_EAGER")) != 0;
    return on;
}
#define EMU_CUDA_EAGER emu_eager()
// is the call at file:line one that EMU_CUDA_DROP deletes?
inline bool emu_dropped(const char *file, int line) {
    const char *list = getenv("EMU_CUDA_DROP");
    if (!list || !*list) return false;
    char me[1024];
    snprintf(me, sizeof me, "%s:%d", file, line);
    size_t n = strlen(me);
    for (const char *p = strstr(list, me); p; p = strstr(p + 1, me))
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) {
            static std::vector<std::string> said;  // say it once per line
            if (std::find(said.begin(), said.end(), me) == said.end()) {
                said.push_back(me);
                fprintf(stderr, "host_emu_cuda: EMU_CUDA_DROP: %s dropped\n", me);
            }
            return true;
        }
    return false;
}
// run s's queued work until `upto` ops have run (ops may run other streams' work: event waits)
inline void emu_flush(emu_Stream *s, unsigned long long upto) {
    while (s && s->done < upto && !s->q.empty()) {
        emu_Op op = std::move(s->q.front());
        s->q.pop_front();
        op.fn();
        s->done++;
    }
}
inline void emu_flush_all(bool blocking_only) {
    for (bool again = true; again;) {
        again = false;
        for (size_t i = 0; i < emu_g_streams.size(); i++) {
            emu_Stream *s = emu_g_streams[i];
            if ((!blocking_only || s->blocking) && !s->q.empty()) { emu_flush(s, s->queued); again = true; }
        }
    }
}
// before the host waits for stream x: the other streams' work up to a wait on an event not yet reached
inline void emu_run_others(emu_Stream *x) {
    for (bool again = true; again;) {
        again = false;
        for (size_t i = 0; i < emu_g_streams.size(); i++) {
            emu_Stream *y = emu_g_streams[i];
            while (y != x && !y->q.empty() && !(y->q.front().ws && y->q.front().ws->done < y->q.front().wseq)) {
                emu_flush(y, y->done + 1);
                again = true;
            }
        }
    }
}
// queue op on s; the default stream runs it now, after the blocking streams' work (legacy semantics)
inline void emu_enqueue(cudaStream_t s, std::function<void()> op) {
    if (!s || EMU_CUDA_EAGER) {
        emu_flush_all(true);
        op();
        return;
    }
    s->q.push_back(emu_Op{std::move(op)});
    s->queued++;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int flags) {
    *s = new emu_Stream;
    (*s)->blocking = !(flags & cudaStreamNonBlocking);
    emu_g_streams.push_back(*s);
    return 0;
}
inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (s) emu_run_others(s), emu_flush(s, s->queued); else emu_flush_all(true);
    return 0;
}
inline cudaError_t cudaDeviceSynchronize() { emu_flush_all(false); return 0; }
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {  // pending work still completes
    if (!s) return 0;
    emu_flush(s, s->queued);
    for (size_t i = 0; i < emu_g_streams.size(); i++)
        if (emu_g_streams[i] == s) { emu_g_streams.erase(emu_g_streams.begin() + i); break; }
    delete s;
    return 0;
}
// events: the point of a stream's queue at the last cudaEventRecord (null stream: already complete)
struct emu_Event { emu_Stream *s = nullptr; unsigned long long seq = 0; };
typedef emu_Event *cudaEvent_t;
#define cudaEventDisableTiming 2
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, int) { *e = new emu_Event; return 0; }
inline cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return 0; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!s || EMU_CUDA_EAGER) emu_flush_all(true), e->s = nullptr; else e->s = s, e->seq = s->queued;
    return 0;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e->s) emu_run_others(e->s), emu_flush(e->s, e->seq);
    return 0;
}
inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    emu_Stream *es = e->s;  // the record current now, as CUDA takes it
    unsigned long long seq = e->seq;
    if (!es || es == s) return 0;
    if (!s || EMU_CUDA_EAGER) { emu_flush(es, seq); return 0; }
    s->q.push_back(emu_Op{[es, seq]() { emu_flush(es, seq); }, es, seq});
    s->queued++;
    return 0;
}

// ---- memory: fresh allocations hold NaN (0xFF bytes) ----------------------------------------------
inline const int emu_FRESH_BYTE = 0xFF;
inline cudaError_t cudaMalloc(void **p, size_t b) {
    *p = malloc(b ? b : 1);
    if (*p) memset(*p, EMU_CUDA_EAGER ? 0 : emu_FRESH_BYTE, b);
    return *p ? 0 : 2;
}
template <class T> inline cudaError_t cudaMalloc(T **p, size_t b) { return cudaMalloc((void **)p, b); }
inline cudaError_t cudaMallocAsync(void **p, size_t b, cudaStream_t) { return cudaMalloc(p, b); }
template <class T> inline cudaError_t cudaMallocAsync(T **p, size_t b, cudaStream_t s) {
    return cudaMallocAsync((void **)p, b, s);
}
inline cudaError_t cudaFree(void *p) { emu_flush_all(false); free(p); return 0; }  // cudaFree synchronises
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { emu_enqueue(s, [p]() { free(p); }); return 0; }
// pinned (page-locked) host memory: the only host memory an async copy really reads or writes late
inline std::map<uintptr_t, size_t> emu_g_pinned;
inline bool emu_pinned(const void *p) {
    auto it = emu_g_pinned.upper_bound((uintptr_t)p);
    return it != emu_g_pinned.begin() && (uintptr_t)p < (--it)->first + it->second;
}
inline cudaError_t cudaMallocHost(void **p, size_t b) {
    cudaError_t e = cudaMalloc(p, b);
    if (!e) emu_g_pinned[(uintptr_t)*p] = b ? b : 1;
    return e;
}
template <class T> inline cudaError_t cudaMallocHost(T **p, size_t b) { return cudaMallocHost((void **)p, b); }
inline cudaError_t cudaFreeHost(void *p) {
    emu_flush_all(false);
    emu_g_pinned.erase((uintptr_t)p);
    free(p);
    return 0;
}
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t b, cudaMemcpyKind) {
    emu_enqueue(nullptr, [=]() { memcpy(d, s, b); });
    return 0;
}
// As CUDA documents it: with pageable host memory, an async copy to the device takes the source at the
// call (staging) and lands later; one to the host returns once the copy is done, so it waits for the
// stream's earlier work. With pinned memory or device to device, the whole copy happens later.
inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t b, cudaMemcpyKind kind, cudaStream_t st) {
    if (kind == cudaMemcpyHostToDevice && !emu_pinned(s)) {
        auto staged = std::make_shared<std::vector<char>>((const char *)s, (const char *)s + b);
        emu_enqueue(st, [=]() { memcpy(d, staged->data(), b); });
    } else if (kind == cudaMemcpyDeviceToHost && !emu_pinned(d)) {
        if (st) emu_flush(st, st->queued);
        emu_enqueue(st, [=]() { memcpy(d, s, b); });
        if (st) emu_flush(st, st->queued);
    } else {
        emu_enqueue(st, [=]() { memcpy(d, s, b); });
    }
    return 0;
}
inline cudaError_t cudaMemset(void *d, int v, size_t b) { emu_enqueue(nullptr, [=]() { memset(d, v, b); }); return 0; }
inline cudaError_t cudaMemsetAsync(void *d, int v, size_t b, cudaStream_t st) {
    emu_enqueue(st, [=]() { memset(d, v, b); });
    return 0;
}
inline cudaError_t cudaSetDevice(int) { return 0; }
inline cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return 0; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
    strcpy(p->name, "host-emu");
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = (size_t)1 << 30;
    return 0;
}
typedef void *cudaMemPool_t;
enum { cudaMemPoolAttrReleaseThreshold = 4 };
inline cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *p, int) { *p = nullptr; return 0; }
inline cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, int, void *) { return 0; }
// the calls EMU_CUDA_DROP can delete carry their source line (these macros come after every use above)
#define cudaStreamSynchronize(s) (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaStreamSynchronize(s))
#define cudaEventSynchronize(e) (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaEventSynchronize(e))
#define cudaDeviceSynchronize() (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaDeviceSynchronize())
#define cudaMemset(d, v, b) (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaMemset(d, v, b))
#define cudaMemsetAsync(d, v, b, s) (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaMemsetAsync(d, v, b, s))
#define cudaStreamWaitEvent(s, e, f) (emu_dropped(__FILE__, __LINE__) ? cudaSuccess : cudaStreamWaitEvent(s, e, f))
// bf16
struct __nv_bfloat16 { uint16_t x; };
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even (no NaN handling needed here)
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    __nv_bfloat16 b;
    b.x = (uint16_t)(u >> 16);
    return b;
}
inline float emu_bf2f(__nv_bfloat16 b) { uint32_t u = (uint32_t)b.x << 16; float f; memcpy(&f, &u, 4); return f; }
inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf2f(b); }
// cublas
struct emu_Cublas { cudaStream_t stream = nullptr; };
typedef emu_Cublas *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUDA_R_32F, CUDA_R_16BF } cudaDataType;
enum { CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUBLAS_DEFAULT_MATH };
inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_Cublas; return 0; }
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return 0; }
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->stream = s; return 0; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, int) { return 0; }
inline const char *cublasGetStatusString(cublasStatus_t) { return "emu"; }
inline float emu_ld(const void *p, cudaDataType t, size_t i) {
    return t == CUDA_R_32F ? ((const float *)p)[i] : emu_bf2f(((const __nv_bfloat16 *)p)[i]);
}
// C = alpha op(A) op(B) + beta C, now (the cuBLAS calls below queue it on the handle's stream)
inline void emu_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha_, const void *A,
                     cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float beta_, void *C,
                     int ldc) {
    const float *alpha = &alpha_, *beta = &beta_;
    float *c = (float *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                float a = ta == CUBLAS_OP_N ? emu_ld(A, at, i + (size_t)p * lda) : emu_ld(A, at, p + (size_t)i * lda);
                float b = tb == CUBLAS_OP_N ? emu_ld(B, bt, p + (size_t)j * ldb) : emu_ld(B, bt, j + (size_t)p * ldb);
                s += (double)a * b;
            }
            float &o = c[i + (size_t)j * ldc];
            o = (float)(*alpha * s + (*beta == 0.0f ? 0.0 : (double)*beta * o));
        }
}
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                   const float *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                   cudaDataType bt, int ldb, const float *beta, void *C, cudaDataType, int ldc, int,
                                   int) {
    float al = *alpha, be = *beta;  // host pointer mode: the scalars are read at the call
    emu_enqueue(h->stream, [=]() { emu_gemm(ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ldc); });
    return 0;
}
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const float *alpha, const void *A, cudaDataType at,
                                                 int lda, long long sA, const void *B, cudaDataType bt, int ldb,
                                                 long long sB, const float *beta, void *C, cudaDataType ct, int ldc,
                                                 long long sC, int batch, int comp, int algo) {
    size_t ea = at == CUDA_R_32F ? 4 : 2, eb = bt == CUDA_R_32F ? 4 : 2;
    float al = *alpha, be = *beta;
    emu_enqueue(h->stream, [=]() {
        for (int i = 0; i < batch; i++)
            emu_gemm(ta, tb, m, n, k, al, (const char *)A + i * sA * ea, at, lda, (const char *)B + i * sB * eb, bt,
                     ldb, be, (float *)C + i * sC, ldc);
    });
    return 0;
}
// launch + warp primitives
struct emu_cfg {
    unsigned g, b;
    cudaStream_t s;
    emu_cfg(unsigned g_, unsigned b_, size_t = 0, cudaStream_t s_ = 0) : g(g_), b(b_), s(s_) {}
};
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// ---- fibers, barriers, launch ------------------------------------------------------------------
struct emu_Fiber { ucontext_t ctx; char *stack; bool done; };
inline const size_t emu_STK = 256 * 1024;
inline ucontext_t emu_g_sched;
inline std::vector<emu_Fiber> emu_g_f;
inline unsigned emu_g_cur;
inline std::function<void()> *emu_g_fn;
struct emu_Bar { unsigned count = 0, gen = 0; };
inline emu_Bar emu_g_block, emu_g_warp[32];
inline float emu_g_slots[32][32];
inline unsigned long emu_g_progress;  // barriers completed + fibers finished: a pass without any is a deadlock
inline void emu_entry() {
    (*emu_g_fn)();
    emu_g_f[emu_g_cur].done = true;
    emu_g_progress++;
}
inline void emu_yield() { swapcontext(&emu_g_f[emu_g_cur].ctx, &emu_g_sched); }
inline void emu_wait(emu_Bar &b, unsigned n) {
    unsigned gen = b.gen;
    if (++b.count == n) {
        b.count = 0;
        b.gen++;
        emu_g_progress++;
        return;
    }
    while (b.gen == gen) emu_yield();
}
inline void emu_run(emu_cfg c, std::function<void()> fn) {  // one launch, now
    blockDim.x = c.b; gridDim.x = c.g;
    emu_g_fn = &fn;
    if (emu_g_f.size() < c.b) {  // stacks are kept for the whole run
        size_t o = emu_g_f.size();
        emu_g_f.resize(c.b);
        for (size_t i = o; i < c.b; i++) emu_g_f[i].stack = (char *)malloc(emu_STK);
    }
    for (unsigned bl = 0; bl < c.g; bl++) {
        blockIdx.x = bl;
        emu_g_block = emu_Bar(); for (auto &w : emu_g_warp) w = emu_Bar();
        for (unsigned t = 0; t < c.b; t++) {
            emu_Fiber &f = emu_g_f[t];
            f.done = false;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack; f.ctx.uc_stack.ss_size = emu_STK; f.ctx.uc_link = &emu_g_sched;
            makecontext(&f.ctx, emu_entry, 0);
        }
        bool any = true;
        while (any) {
            any = false;
            unsigned long before = emu_g_progress;
            for (unsigned t = 0; t < c.b; t++) {
                if (emu_g_f[t].done) continue;
                emu_g_cur = t; threadIdx.x = t;
                swapcontext(&emu_g_sched, &emu_g_f[t].ctx);
                if (!emu_g_f[t].done) any = true;
            }
            if (any && emu_g_progress == before) {
                fprintf(stderr, "host_emu_cuda: deadlock in block %u: a barrier some threads never reach\n", bl);
                abort();
            }
        }
    }
}
// the parameter types of a kernel: the rewritten launch converts its arguments to them at the launch
template <class F> struct emu_sig;
template <class... P> struct emu_sig<void (*)(P...)> { typedef std::tuple<P...> args; };
template <class... P> inline void emu_launch(emu_cfg c, void (*k)(P...), std::tuple<P...> a) {
    emu_enqueue(c.s, [c, k, a]() { emu_run(c, [&]() { std::apply(k, a); }); });
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
    unsigned w = threadIdx.x / 32, l = threadIdx.x % 32, me = emu_g_cur;
    emu_g_slots[w][l] = v;
    emu_wait(emu_g_warp[w], 32);
    threadIdx.x = me;
    float r = emu_g_slots[w][l ^ o];
    emu_wait(emu_g_warp[w], 32);
    threadIdx.x = me;
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) {
    unsigned me = emu_g_cur;
    emu_wait(emu_g_warp[threadIdx.x / 32], 32);
    threadIdx.x = me;  // other fibers ran meanwhile
}
inline void __syncthreads() { unsigned me = emu_g_cur; emu_wait(emu_g_block, blockDim.x); threadIdx.x = me; }
// ---- for trainer/attention_cuda.cu: float4, __launch_bounds__ (ignored) --------------------------------
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
#define __launch_bounds__(...)
