/* host_emu_cuda.h — a host (CPU) emulation of the small CUDA subset trainer/ rooms' .cu files use, so the kernels'
 * indexing, reductions and synchronisation can be checked where there is no GPU (tests/py/cuda/test_*_emu.py;
 * tests/cuda/README.md says what it sees and what it cannot).
 *
 * Not a CUDA implementation: kernels run on one OS thread, block after block; each GPU thread is a
 * cooperative fiber (its own stack; host_emu_launch.h) that switches only at __syncthreads / __syncwarp / __shfl_xor_sync.
 * cublasGemmEx is a naive column-major loop (double accumulation; bf16 and fp16 operands rounded to nearest even).
 * Passing here says the arithmetic, indexing and ordering match trainer/kernels/ops.c under every schedule tried;
 * only a GPU run (tests/gpu/gpu_check_trainer.sh) says the kernels are right on hardware.
 *
 * Strict where the GPU is loose, so that bugs the GPU may hide give wrong results or a report here:
 * - Launches (host_emu_launch.h): checked against an H200's limits and the kernel's __launch_bounds__,
 *   errors through cudaGetLastError; blocks in a seeded random order, threads between barriers in a
 *   seeded order (random, reverse or index: EMU_CUDA_SCHED, EMU_CUDA_SEED); __shared__ memory poisoned
 *   (0xFF) when each block reaches it.
 * - Device memory (host_emu_memory.h): its own pages between guard pages (out-of-bounds accesses fault;
 *   under ASan, `make SAN=1 emu-checks`, the slack is poisoned too); read-only while a kernel runs, so
 *   that two blocks writing the same bytes without atomics are reported (EMU_CUDA_RACE=0: off).
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
 * Environment variables, read at run time (tests/py/cuda/test_cuda_emu_strict.py uses them):
 *   EMU_CUDA_EAGER=1          the old behaviour: every call at once, zeroed memory, blocks and threads by
 *                             index, __shared__ zeroed once, no launch or race checks; to tell an
 *                             emulation-only difference from a bug, and to show what a mutant hid before
 *   EMU_CUDA_SCHED=random|reverse|index, EMU_CUDA_SEED=N, EMU_CUDA_RACE=0   see host_emu_launch.h
 *   EMU_CUDA_DROP=FILE:LINE[,FILE:LINE...]   make the synchronisations (cudaStreamSynchronize,
 *                             cudaEventSynchronize, cudaDeviceSynchronize, cudaStreamWaitEvent,
 *                             __syncthreads) and memsets (cudaMemset, cudaMemsetAsync) called on those
 *                             source lines no-ops: the source with that call deleted (a mutant), without
 *                             editing it. FILE as the compiler names it (trainer/kernels/ops_cuda.cu).
 *
 * Use: force-include this file (-include tests/cuda/host_emu_cuda.h), give the compiler empty cublas_v2.h,
 * cuda_runtime.h, cuda_runtime_api.h and cuda_bf16.h, and compile each .cu as host_emu_rewrite.py rewrites
 * it (launches, kernel entries, __shared__ declarations): `make emu-checks`.
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
#include <vector>
#include <math.h>
#define __global__
#define __device__
#define __forceinline__ inline
struct emu_dim { unsigned x = 0, y = 0, z = 0; };
inline emu_dim threadIdx, blockIdx, blockDim, gridDim;
typedef int cudaError_t;
enum {  // CUDA's numbers
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorLaunchOutOfResources = 701,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
#define cudaStreamNonBlocking 1
struct cudaDeviceProp {
    char name[256];
    int major, minor, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], warpSize, multiProcessorCount;
    size_t totalGlobalMem, sharedMemPerBlock;
};
inline const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error (host emulation)";
    }
}
// the last launch error, returned once by cudaGetLastError (launch errors are not sticky)
inline cudaError_t emu_g_last = cudaSuccess;
inline cudaError_t cudaGetLastError() {
    cudaError_t e = emu_g_last;
    emu_g_last = cudaSuccess;
    return e;
}
inline cudaError_t cudaPeekAtLastError() { return emu_g_last; }

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
// is the call at file:line one that EMU_CUDA_DROP deletes? (called at every __syncthreads: the list is
// parsed once, and an empty one costs a test)
inline bool emu_dropped(const char *file, int line) {
    static const std::vector<std::string> drop = [] {
        std::vector<std::string> v;
        const char *e = getenv("EMU_CUDA_DROP");
        for (const char *p = e; p && *p;) {
            const char *q = strchr(p, ',');
            size_t n = q ? (size_t)(q - p) : strlen(p);
            if (n) v.emplace_back(p, n);
            p = q ? q + 1 : p + n;
        }
        return v;
    }();
    if (drop.empty()) return false;
    char me[1024];
    snprintf(me, sizeof me, "%s:%d", file, line);
    if (std::find(drop.begin(), drop.end(), me) == drop.end()) return false;
    static std::vector<std::string> said;  // say it once per line
    if (std::find(said.begin(), said.end(), me) == said.end()) {
        said.push_back(me);
        fprintf(stderr, "host_emu_cuda: EMU_CUDA_DROP: %s dropped\n", me);
    }
    return true;
}
#include "tests/cuda/host_emu_memory.h"
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

// ---- memory: fresh allocations hold NaN (0xFF bytes), each in its own guarded pages (host_emu_memory.h) ----
inline const int emu_FRESH_BYTE = 0xFF;
inline cudaError_t cudaMalloc(void **p, size_t b) {
    *p = emu_dev_alloc(b, EMU_CUDA_EAGER ? 0 : emu_FRESH_BYTE);
    return *p ? cudaSuccess : (emu_g_last = cudaErrorMemoryAllocation);
}
template <class T> inline cudaError_t cudaMalloc(T **p, size_t b) { return cudaMalloc((void **)p, b); }
inline cudaError_t cudaMallocAsync(void **p, size_t b, cudaStream_t) { return cudaMalloc(p, b); }
template <class T> inline cudaError_t cudaMallocAsync(T **p, size_t b, cudaStream_t s) {
    return cudaMallocAsync((void **)p, b, s);
}
inline cudaError_t cudaFree(void *p) {  // cudaFree synchronises
    emu_flush_all(false);
    if (p) emu_dev_free(p);
    return 0;
}
inline cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    emu_enqueue(s, [p]() { if (p) emu_dev_free(p); });
    return 0;
}
// pinned (page-locked) host memory: the only host memory an async copy really reads or writes late
inline std::map<uintptr_t, size_t> emu_g_pinned;
inline bool emu_pinned(const void *p) {
    auto it = emu_g_pinned.upper_bound((uintptr_t)p);
    return it != emu_g_pinned.begin() && (uintptr_t)p < (--it)->first + it->second;
}
inline cudaError_t cudaMallocHost(void **p, size_t b) {  // host memory: plain malloc (ASan checks it)
    *p = malloc(b ? b : 1);
    if (!*p) return emu_g_last = cudaErrorMemoryAllocation;
    memset(*p, EMU_CUDA_EAGER ? 0 : emu_FRESH_BYTE, b);
    emu_g_pinned[(uintptr_t)*p] = b ? b : 1;
    return 0;
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
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int);  // after host_emu_launch.h
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
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
// fp16 (IEEE binary16), round to nearest even, subnormals and overflow to infinity as the hardware does
struct __half { uint16_t x; };
inline __half __float2half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    __half h;
    if (a >= 0x7f800000u) { h.x = (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0)); return h; }  // inf, NaN
    if (a >= 0x477ff000u) { h.x = (uint16_t)(sign | 0x7c00u); return h; }  // rounds past 65504: infinity
    if (a < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24, rounded to nearest even
        float v;
        memcpy(&v, &a, 4);
        h.x = (uint16_t)(sign | (uint32_t)rintf(v * 16777216.0f));  // exact scaling; 1024 is the smallest normal
        return h;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1);  // round to nearest even at bit 13
    h.x = (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    return h;
}
inline __half __float2half_rn(float f);
inline float __half2float(__half h) {
    uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ffu, u;
    if (e == 0x1f) u = sign | 0x7f800000u | (m << 13);
    else if (e) u = sign | ((e + 112) << 23) | (m << 13);
    else if (!m) u = sign;
    else {  // subnormal: normalise
        int k = 0;
        while (!(m & 0x400u)) m <<= 1, k++;
        u = sign | ((uint32_t)(113 - k) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __half __float2half_rn(float f) { return __float2half(f); }
// cublas
struct emu_Cublas { cudaStream_t stream = nullptr; };
typedef emu_Cublas *cublasHandle_t;
typedef int cublasStatus_t;
enum { CUBLAS_STATUS_SUCCESS = 0 };
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F } cudaDataType;
typedef cudaDataType cudaDataType_t;
enum { CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUBLAS_DEFAULT_MATH };
inline cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = new emu_Cublas; return 0; }
inline cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return 0; }
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->stream = s; return 0; }
inline cublasStatus_t cublasSetMathMode(cublasHandle_t, int) { return 0; }
inline const char *cublasGetStatusString(cublasStatus_t) { return "emu"; }
inline float emu_ld(const void *p, cudaDataType t, size_t i) {
    return t == CUDA_R_32F    ? ((const float *)p)[i]
           : t == CUDA_R_16BF ? emu_bf2f(((const __nv_bfloat16 *)p)[i])
                              : __half2float(((const __half *)p)[i]);
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
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }  // the GPU intrinsic is an approximation of expf (2 ulp + ...)
#include "tests/cuda/host_emu_launch.h"
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {  // an H200's launch limits
    memset(p, 0, sizeof *p);
    strcpy(p->name, "host-emu (H200 limits)");
    p->major = 9, p->minor = 0;
    p->totalGlobalMem = (size_t)141 << 30;
    p->maxThreadsPerBlock = (int)emu_h200.max_threads;
    for (int i = 0; i < 3; i++) p->maxThreadsDim[i] = (int)emu_h200.max_block[i], p->maxGridSize[i] = (int)emu_h200.max_grid[i];
    p->sharedMemPerBlock = emu_h200.shared_per_block;
    p->warpSize = (int)emu_h200.warp;
    p->multiProcessorCount = 132;
    return 0;
}
// ---- for trainer/kernels/attention_cuda.cu: float4 (__launch_bounds__ is turned into emu_kernel_entry by
// host_emu_rewrite.py) -------------------------------------------------------------------------------------
struct float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
