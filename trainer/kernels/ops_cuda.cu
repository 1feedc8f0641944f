// ops_cuda.cu — CUDA kernels of the trainer, one per CPU kernel of trainer/kernels/ops.c (see ops_cuda.h).
//
// Every matmul (attention's included) goes to cuBLAS; the rest are simple kernels: one thread per output
// element or one warp per row, two-stage reductions in a fixed order, no atomics, so every result is
// bit-reproducible. Flash-style attention is in attention_cuda.cu. Not done: cuBLASLt epilogues, fused
// residual + norm kernels, bf16 activations.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <vector>

extern "C" {
#include "common/error.h"
}
#include "common/cuda_check.h"
#include "common/cuda_warp.cuh"
#include "trainer/kernels/ops_cuda.h"

// elementwise kernels loop with a grid stride: at most 65536 blocks of 256
static inline unsigned ew_blocks(size_t n) {
    unsigned b = blocks_for(n, 256);
    return b < 65536 ? b : 65536;
}

// ---- context ----------------------------------------------------------------------------------------
extern "C" int ops_cuda_init(OpsCudaContext *ctx, int device, int bf16) {
    memset(ctx, 0, sizeof *ctx);
    ctx->bf16 = bf16 ? 1 : 0;
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
        return DFM_FAIL(DFM_ECUDA, "GPU %d requested, %d visible. HINT: check CUDA_VISIBLE_DEVICES", device, n);
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    cublasStatus_t s = cublasCreate(&ctx->cublas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        ops_cuda_free(ctx);
        return DFM_FAIL(DFM_ECUDA, "cublasCreate failed: status %d", (int)s);
    }
    // CUBLAS_COMPUTE_32F in the default math mode never uses TF32 (which would break fp32 parity)
    if ((s = cublasSetStream(ctx->cublas, ctx->stream)) != CUBLAS_STATUS_SUCCESS ||
        (s = cublasSetMathMode(ctx->cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        ops_cuda_free(ctx);
        return DFM_FAIL(DFM_ECUDA, "setting up cuBLAS failed: status %d (%s)", (int)s, cublasGetStatusString(s));
    }
    // the kernels' small stream-ordered temporaries (cudaMallocAsync) stay in the pool between steps
    // instead of going back to the driver at every synchronisation (the default threshold is 0)
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    return DFM_OK;
}

extern "C" void ops_cuda_free(OpsCudaContext *ctx) {
    if (!ctx) return;
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);  // the scratch (from the stream's pool) may be in use
    if (ctx->scratch) cudaFree(ctx->scratch);
    if (ctx->cublas) cublasDestroy(ctx->cublas);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    memset(ctx, 0, sizeof *ctx);
}

static int ctx_scratch(OpsCudaContext *ctx, size_t bytes) {
    if (bytes <= ctx->scratch_bytes) return DFM_OK;
    if (ctx->scratch) CUDA_CHECK(cudaFreeAsync(ctx->scratch, ctx->stream));
    ctx->scratch = NULL;
    ctx->scratch_bytes = 0;
    CUDA_CHECK(cudaMallocAsync(&ctx->scratch, bytes, ctx->stream));
    ctx->scratch_bytes = bytes;
    return DFM_OK;
}

__global__ void to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

// ---- matmul -----------------------------------------------------------------------------------------
extern "C" void ops_cuda_set_bf16_mirror(OpsCudaContext *ctx, const float *src, const uint16_t *mirror, size_t n) {
    ctx->mirror_src = src && mirror ? src : NULL;
    ctx->mirror16 = ctx->mirror_src ? mirror : NULL;
    ctx->mirror_n = ctx->mirror_src ? n : 0;
}
// the bf16 copy of X[elems] when X lies inside the context's mirror, else NULL (to be rounded into scratch)
static const __nv_bfloat16 *mirrored(const OpsCudaContext *ctx, const float *X, size_t elems) {
    uintptr_t x = (uintptr_t)X, lo = (uintptr_t)ctx->mirror_src;
    if (!ctx->mirror_src || x < lo || x + elems * sizeof(float) > lo + ctx->mirror_n * sizeof(float)) return NULL;
    return (const __nv_bfloat16 *)ctx->mirror16 + (X - ctx->mirror_src);
}
// Row-major X[N,C] is column-major X^T[C,N]; out^T[OC,N] = W[OC,C](col-major: W^T) ^T · inp^T, as llm.c.
// gemm(): column-major C[m,n] = op(A) op(B) * alpha + beta C, operands fp32 or bf16 copies (ctx->bf16).
static int gemm(OpsCudaContext *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                const float *A, int lda, size_t a_elems, const float *B, int ldb, size_t b_elems, float beta,
                float *Cm, int ldc) {
    const float one = 1.0f;
    if (!ctx->bf16) {
        CUBLAS_CHECK(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, &one, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, &beta,
                                  Cm, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return DFM_OK;
    }
    const __nv_bfloat16 *a16 = mirrored(ctx, A, a_elems), *b16 = mirrored(ctx, B, b_elems);
    size_t a_al = a16 ? 0 : (a_elems + 127) & ~(size_t)127;  // keep the second operand 256-byte aligned
    size_t b_n = b16 ? 0 : b_elems;
    if (a_al + b_n) DFM_TRY(ctx_scratch(ctx, (a_al + b_n) * sizeof(__nv_bfloat16)));
    __nv_bfloat16 *sa = (__nv_bfloat16 *)ctx->scratch, *sb = sa + a_al;
    if (!a16) {
        DFM_TRY(to_bf16_cuda((uint16_t *)sa, A, a_elems, ctx->stream));
        a16 = sa;
    }
    if (!b16) {
        DFM_TRY(to_bf16_cuda((uint16_t *)sb, B, b_elems, ctx->stream));
        b16 = sb;
    }
    CUBLAS_CHECK(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, &one, a16, CUDA_R_16BF, lda, b16, CUDA_R_16BF, ldb,
                              &beta, Cm, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DFM_OK;
}

// A already in bf16 (a frozen weight kept in bf16 on the device): only B is rounded into the scratch.
static int gemm_a16(OpsCudaContext *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const uint16_t *A, int lda, const float *B, int ldb, size_t b_elems, float beta, float *Cm,
                    int ldc) {
    const float one = 1.0f;
    const __nv_bfloat16 *b16 = mirrored(ctx, B, b_elems);
    if (!b16) {
        DFM_TRY(ctx_scratch(ctx, b_elems * sizeof(__nv_bfloat16)));
        __nv_bfloat16 *sb = (__nv_bfloat16 *)ctx->scratch;
        DFM_TRY(to_bf16_cuda((uint16_t *)sb, B, b_elems, ctx->stream));
        b16 = sb;
    }
    CUBLAS_CHECK(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, b16, CUDA_R_16BF, ldb, &beta,
                              Cm, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DFM_OK;
}

extern "C" int to_bf16_cuda(uint16_t *out, const float *in, size_t n, cudaStream_t stream) {
    to_bf16_kernel<<<ew_blocks(n), 256, 0, stream>>>((__nv_bfloat16 *)out, in, n);
    LAUNCH_CHECK("to_bf16_kernel");
    return DFM_OK;
}

// ---- column reductions: the parameter gradients of norms and biases ---------------------------------
// dw[c] (+ db[c]) += sum over rows n of a per-element term, deterministic and parallel over rows: stage 1,
// one block per (chunk of COLRED_ROWS rows, group of 32 columns), 8 row lanes per column, lanes added in a
// fixed order into partial[chunk][c]; stage 2, one thread per column adds the chunks in order. (A thread
// per column walking all N rows was the first version: with q/k norms of 64 columns over N*heads rows it
// left the GPU nearly idle.)
#define COLRED_ROWS 256
enum { COL_SUM = 0, COL_RMS = 1, COL_LN = 2 };
template <int MODE>
__global__ void colred_partial_kernel(float *pw, float *pb, const float *dout, const float *inp, const float *mean,
                                      const float *rstd, int N, int C, int ncg) {
    __shared__ float shw[8][32], shb[8][32];
    int cg = blockIdx.x % ncg, chunk = blockIdx.x / ncg, lane = threadIdx.x % 32, ty = threadIdx.x / 32;
    int c = cg * 32 + lane;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        int n0 = chunk * COLRED_ROWS, n1 = n0 + COLRED_ROWS < N ? n0 + COLRED_ROWS : N;
        for (int n = n0 + ty; n < n1; n += 8) {
            float dy = dout[(size_t)n * C + c];
            if (MODE == COL_SUM) sw += dy;
            else if (MODE == COL_RMS) sw += dy * inp[(size_t)n * C + c] * rstd[n];
            else {
                sw += dy * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
                sb += dy;
            }
        }
    }
    shw[ty][lane] = sw;
    shb[ty][lane] = sb;
    __syncthreads();
    if (ty == 0 && c < C) {
        float a = 0.0f, b = 0.0f;
        for (int i = 0; i < 8; i++) a += shw[i][lane], b += shb[i][lane];
        pw[(size_t)chunk * C + c] = a;
        if (MODE == COL_LN) pb[(size_t)chunk * C + c] = b;
    }
}
__global__ void colred_final_kernel(float *dw, float *db, const float *pw, const float *pb, int nchunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float a = 0.0f, b = 0.0f;
    for (int k = 0; k < nchunks; k++) {
        a += pw[(size_t)k * C + c];
        if (db) b += pb[(size_t)k * C + c];
    }
    if (dw) dw[c] += a;
    if (db) db[c] += b;
}
static int colred(int mode, float *dw, float *db, const float *dout, const float *inp, const float *mean,
                  const float *rstd, int N, int C, cudaStream_t stream) {
    if (N <= 0 || C <= 0) return DFM_OK;
    int nch = (N + COLRED_ROWS - 1) / COLRED_ROWS, ncg = (C + 31) / 32;
    float *part = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&part, (size_t)2 * nch * C * sizeof(float), stream));
    float *pb = part + (size_t)nch * C;
    if (mode == COL_SUM)
        colred_partial_kernel<COL_SUM><<<(unsigned)(nch * ncg), 256, 0, stream>>>(part, pb, dout, inp, mean, rstd, N,
                                                                                   C, ncg);
    else if (mode == COL_RMS)
        colred_partial_kernel<COL_RMS><<<(unsigned)(nch * ncg), 256, 0, stream>>>(part, pb, dout, inp, mean, rstd, N,
                                                                                   C, ncg);
    else
        colred_partial_kernel<COL_LN><<<(unsigned)(nch * ncg), 256, 0, stream>>>(part, pb, dout, inp, mean, rstd, N,
                                                                                  C, ncg);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        colred_final_kernel<<<blocks_for(C, 128), 128, 0, stream>>>(dw, mode == COL_LN ? db : NULL, part, pb, nch, C);
        e = cudaGetLastError();
    }
    cudaFreeAsync(part, stream);
    if (e != cudaSuccess) return DFM_FAIL(DFM_ECUDA, "column reduction kernels failed: %s", cudaGetErrorString(e));
    return DFM_OK;
}

__global__ void add_bias_kernel(float *out, const float *bias, int N, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) out[i] += bias[i % OC];
}


extern "C" int matmul_forward_acc_cuda(float *out, const float *inp, const float *weight, int N, int C, int OC,
                                       OpsCudaContext *ctx) {
    return gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, (size_t)OC * C, inp, C, (size_t)N * C, 1.0f, out,
                OC);
}

extern "C" int matmul_forward_cuda(float *out, const float *inp, const float *weight, const float *bias, int N,
                                   int C, int OC, OpsCudaContext *ctx) {
    DFM_TRY(gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, (size_t)OC * C, inp, C, (size_t)N * C, 0.0f,
                 out, OC));
    if (bias) {
        add_bias_kernel<<<blocks_for((size_t)N * OC, 256), 256, 0, ctx->stream>>>(out, bias, N, OC);
        LAUNCH_CHECK("add_bias_kernel");
    }
    return DFM_OK;
}

extern "C" int matmul_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *weight, int N, int C, int OC, OpsCudaContext *ctx) {
    if (dinp)  // dinp^T[C,N] += W^T[C,OC] · dout^T[OC,N]
        DFM_TRY(gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, (size_t)OC * C, dout, OC, (size_t)N * OC,
                     1.0f, dinp, C));
    if (dweight)  // dW^T[C,OC] += inp^T[C,N] · dout[N,OC]
        DFM_TRY(gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, (size_t)N * C, dout, OC, (size_t)N * OC, 1.0f,
                     dweight, C));
    if (dbias) DFM_TRY(colred(COL_SUM, dbias, NULL, dout, NULL, NULL, NULL, N, OC, ctx->stream));
    return DFM_OK;
}

// ---- embedding --------------------------------------------------------------------------------------
__global__ void embedding_forward_kernel(float *out, const int *tokens, const float *wte, int N, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)N * C) return;
    size_t n = i / C, c = i % C;
    out[i] = wte[(size_t)tokens[n] * C + c];
}
// one block per (run of equal tokens, 128 channels): the rows of one token added in row order, as
// embedding_backward does, so the result is bit-identical to the CPU and needs no atomics
__global__ void embedding_backward_kernel(float *dwte, const float *dout, const int *perm, const int *seg_start,
                                          const int *seg_tok, int cgroups, int C) {
    int seg = blockIdx.x / cgroups, c = (blockIdx.x % cgroups) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *w = dwte + (size_t)seg_tok[seg] * C + c;
    float acc = *w;
    for (int i = seg_start[seg]; i < seg_start[seg + 1]; i++) acc += dout[(size_t)perm[i] * C + c];
    *w = acc;
}
extern "C" int embedding_forward_cuda(float *out, const int *tokens, const float *wte, int N, int C,
                                      cudaStream_t stream) {
    embedding_forward_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, stream>>>(out, tokens, wte, N, C);
    LAUNCH_CHECK("embedding_forward_kernel");
    return DFM_OK;
}
extern "C" int embedding_backward_cuda(float *dwte, const float *dout, const int *tokens, int N, int C,
                                       cudaStream_t stream) {
    if (N <= 0) return DFM_OK;
    // rows grouped by token (a stable sort on the host: N is a batch's tokens), so each dwte row has one
    // owner; the sync costs little: this is the last kernel of a pretraining backward
    std::vector<int> tok(N), perm(N), start, which;
    CUDA_CHECK(cudaMemcpyAsync(tok.data(), tokens, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int n = 0; n < N; n++) perm[n] = n;
    std::stable_sort(perm.begin(), perm.end(), [&](int a, int b) { return tok[a] < tok[b]; });
    for (int i = 0; i < N; i++)
        if (i == 0 || tok[perm[i]] != tok[perm[i - 1]]) start.push_back(i), which.push_back(tok[perm[i]]);
    int nseg = (int)start.size();
    start.push_back(N);
    int *d = NULL;  // perm[N], start[nseg + 1], which[nseg]
    CUDA_CHECK(cudaMallocAsync((void **)&d, ((size_t)N + 2 * nseg + 1) * sizeof(int), stream));
    cudaError_t e = cudaMemcpyAsync(d, perm.data(), (size_t)N * sizeof(int), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d + N, start.data(), (size_t)(nseg + 1) * sizeof(int), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(d + N + nseg + 1, which.data(), (size_t)nseg * sizeof(int), cudaMemcpyHostToDevice, stream);
    int cgroups = (C + 127) / 128;
    if (e == cudaSuccess) {
        embedding_backward_kernel<<<(unsigned)nseg * cgroups, 128, 0, stream>>>(dwte, dout, d, d + N, d + N + nseg + 1,
                                                                                 cgroups, C);
        e = cudaGetLastError();
    }
    // the host vectors are read by the copies above: wait for them before returning (they are freed here)
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    cudaFreeAsync(d, stream);
    if (e != cudaSuccess) return DFM_FAIL(DFM_ECUDA, "embedding backward failed: %s", cudaGetErrorString(e));
    return DFM_OK;
}

// ---- RMSNorm / LayerNorm: one warp per row ----------------------------------------------------------
#define ROW_WARPS 4  // warps (rows) per block
__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                       float eps) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    for (int c = lane; c < C; c += 32) out[(size_t)n * C + c] = x[c] * r * weight[c];
    if (lane == 0) rstd[n] = r;
}
__global__ void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                        const float *rstd, int N, int C) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    float r = rstd[n], dot = 0.0f;
    for (int c = lane; c < C; c += 32) dot += dy[c] * weight[c] * x[c] * r;
    float m = warp_sum(dot) / C;
    for (int c = lane; c < C; c += 32) dinp[(size_t)n * C + c] += r * (dy[c] * weight[c] - x[c] * r * m);
}
extern "C" int rmsnorm_forward_cuda(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                    float eps, cudaStream_t stream) {
    rmsnorm_forward_kernel<<<blocks_for(N, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(out, rstd, inp, weight, N, C,
                                                                                    eps);
    LAUNCH_CHECK("rmsnorm_forward_kernel");
    return DFM_OK;
}
extern "C" int rmsnorm_backward_cuda(float *dinp, float *dweight, const float *dout, const float *inp,
                                     const float *weight, const float *rstd, int N, int C, cudaStream_t stream) {
    rmsnorm_backward_kernel<<<blocks_for(N, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(dinp, dout, inp, weight, rstd,
                                                                                     N, C);
    LAUNCH_CHECK("rmsnorm_backward_kernel");
    if (dweight) DFM_TRY(colred(COL_RMS, dweight, NULL, dout, inp, NULL, rstd, N, C, stream));
    return DFM_OK;
}

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                         const float *bias, int N, int C, float eps) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C, v = 0.0f;
    for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
    float r = rsqrtf(warp_sum(v) / C + eps);
    for (int c = lane; c < C; c += 32) out[(size_t)n * C + c] = (x[c] - m) * r * weight[c] + bias[c];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = r;
    }
}
__global__ void layernorm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                          const float *mean, const float *rstd, int N, int C) {
    int n = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    float m = mean[n], r = rstd[n], a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - m) * r, dn = dy[c] * weight[c];
        a += dn;
        b += dn * xh;
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[c] - m) * r;
        dinp[(size_t)n * C + c] += r * (dy[c] * weight[c] - a - xh * b);
    }
}
extern "C" int layernorm_forward_cuda(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                      const float *bias, int N, int C, float eps, cudaStream_t stream) {
    layernorm_forward_kernel<<<blocks_for(N, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                                      bias, N, C, eps);
    LAUNCH_CHECK("layernorm_forward_kernel");
    return DFM_OK;
}
extern "C" int layernorm_backward_cuda(float *dinp, float *dweight, float *dbias, const float *dout,
                                       const float *inp, const float *weight, const float *mean, const float *rstd,
                                       int N, int C, cudaStream_t stream) {
    layernorm_backward_kernel<<<blocks_for(N, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(dinp, dout, inp, weight,
                                                                                       mean, rstd, N, C);
    LAUNCH_CHECK("layernorm_backward_kernel");
    if (dweight || dbias) DFM_TRY(colred(COL_LN, dweight, dbias, dout, inp, mean, rstd, N, C, stream));
    return DFM_OK;
}

// ---- RoPE -------------------------------------------------------------------------------------------
__global__ void rope_tables_kernel(float *cos_t, float *sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * half) return;
    int t = (int)(idx / half), i = (int)(idx % half);
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    float a = (float)t * inv;
    cos_t[idx] = cosf(a);
    sin_t[idx] = sinf(a);
}
// thread per (row, head, i < hd/2); backward = rotation by -angle, accumulated
template <int BACKWARD>
__global__ void rope_kernel(float *out, const float *inp, const float *cos_t, const float *sin_t, int B, int T, int nh,
                            int hd) {
    int half = hd / 2;
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * nh * half) return;
    int i = (int)(idx % half);
    size_t rh = idx / half;  // row * nh + head
    int t = (int)((rh / nh) % T);
    float cs = cos_t[(size_t)t * half + i], sn = sin_t[(size_t)t * half + i];
    const float *x = inp + rh * hd;
    float *y = out + rh * hd;
    float x1 = x[i], x2 = x[i + half];
    if (!BACKWARD) {
        y[i] = x1 * cs - x2 * sn;
        y[i + half] = x2 * cs + x1 * sn;
    } else {
        y[i] += x1 * cs + x2 * sn;
        y[i + half] += x2 * cs - x1 * sn;
    }
}
extern "C" int rope_tables_cuda(float *cos_t, float *sin_t, int T, int hd, float theta, cudaStream_t stream) {
    rope_tables_kernel<<<blocks_for((size_t)T * (hd / 2), 256), 256, 0, stream>>>(cos_t, sin_t, T, hd, theta);
    LAUNCH_CHECK("rope_tables_kernel");
    return DFM_OK;
}
extern "C" int rope_forward_cuda(float *out, const float *inp, const float *cos_t, const float *sin_t, int B, int T,
                                 int nh, int hd, cudaStream_t stream) {
    rope_kernel<0><<<blocks_for((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream>>>(out, inp, cos_t, sin_t, B, T,
                                                                                       nh, hd);
    LAUNCH_CHECK("rope_kernel<forward>");
    return DFM_OK;
}
extern "C" int rope_backward_cuda(float *dinp, const float *dout, const float *cos_t, const float *sin_t, int B,
                                  int T, int nh, int hd, cudaStream_t stream) {
    rope_kernel<1><<<blocks_for((size_t)B * T * nh * (hd / 2), 256), 256, 0, stream>>>(dinp, dout, cos_t, sin_t, B,
                                                                                       T, nh, hd);
    LAUNCH_CHECK("rope_kernel<backward>");
    return DFM_OK;
}

// ---- causal GQA self-attention ------------------------------------------------------------------------
// q row (b,t,h) at ((b*T+t)*nh+h)*hd; k/v row (b,u,kh) at ((b*T+u)*nkv+kh)*hd; att (b,h,t,u).
// The four products run as strided-batched cuBLAS GEMMs (tensor cores in bf16), as llm.c's first CUDA
// attention did, reading q/k/v in place through their leading dimensions: for each sequence b and each
// position g inside a query group, one call batched over the nkv groups (head h = j*grp + g uses kv head j),
// so strides are uniform and a GQA group's dK/dV contributions are added g = 0, 1, ... in a fixed order.
// Scores are computed for the whole T x T square; the softmax kernels zero the part above the diagonal.

// one warp per (b,h,t) row: causal softmax in place, zeros above the diagonal
__global__ void attn_softmax_kernel(float *att, int rows, int T) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    float *p = att + (size_t)row * T;
    float mx = -INFINITY;
    for (int u = lane; u <= t; u += 32) mx = fmaxf(mx, p[u]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        float e = expf(p[u] - mx);
        p[u] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int u = lane; u <= t; u += 32) p[u] *= inv;
    for (int u = t + 1 + lane; u < T; u += 32) p[u] = 0.0f;
}
// softmax backward per row in place: dS = P * (dP - sum(P dP)) * scale; zeros above the diagonal
__global__ void attn_softmax_backward_kernel(float *datt, const float *att, int rows, int T, float scale) {
    int row = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *p = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float pdp = 0.0f;
    for (int u = lane; u <= t; u += 32) pdp += p[u] * d[u];
    pdp = warp_sum(pdp);
    for (int u = lane; u <= t; u += 32) d[u] = p[u] * (d[u] - pdp) * scale;
    for (int u = t + 1 + lane; u < T; u += 32) d[u] = 0.0f;
}

// An operand of the batched GEMMs: fp32 in place, or (ctx->bf16) a bf16 copy in a stream-ordered temporary.
struct Operand {
    const void *p;
    cudaDataType type;
    void *tmp;
};
static int operand(OpsCudaContext *ctx, const float *x, size_t n, Operand *o) {
    o->tmp = NULL;
    if (!ctx->bf16) {
        o->p = x, o->type = CUDA_R_32F;
        return DFM_OK;
    }
    CUDA_CHECK(cudaMallocAsync(&o->tmp, n * sizeof(__nv_bfloat16), ctx->stream));
    o->p = o->tmp, o->type = CUDA_R_16BF;  // freed by operand_free, also when the launch below fails
    return to_bf16_cuda((uint16_t *)o->tmp, x, n, ctx->stream);
}
static void operand_free(OpsCudaContext *ctx, Operand *o) {
    if (o->tmp) cudaFreeAsync(o->tmp, ctx->stream);
    o->tmp = NULL;
}
// element offset -> pointer of an operand (fp32 or bf16)
static const void *at(const Operand *o, size_t off) {
    return o->type == CUDA_R_32F ? (const void *)((const float *)o->p + off)
                                 : (const void *)((const __nv_bfloat16 *)o->p + off);
}
// column-major C = alpha op(A) op(B) + beta C for nkv batches; A, B and C advance by sA, sB, sC elements
static int sbgemm(OpsCudaContext *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                  const Operand *A, size_t offA, int lda, long long sA, const Operand *B, size_t offB, int ldb,
                  long long sB, float beta, float *Cm, int ldc, long long sC, int batch) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha, at(A, offA), A->type, lda, sA,
                                            at(B, offB), B->type, ldb, sB, &beta, Cm, CUDA_R_32F, ldc, sC, batch,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return DFM_OK;
}

extern "C" int attention_forward_cuda(float *out, float *att, const float *q, const float *k, const float *v, int B,
                                      int T, int nh, int nkv, int hd, OpsCudaContext *ctx) {
    if (B <= 0 || T <= 0) return DFM_OK;
    int grp = nh / nkv, nq = nh * hd, nk = nkv * hd;
    size_t TT = (size_t)T * T;
    float scale = 1.0f / sqrtf((float)hd);
    Operand Q, K, V, P;
    memset(&Q, 0, sizeof Q), memset(&K, 0, sizeof K), memset(&V, 0, sizeof V), memset(&P, 0, sizeof P);
    int rc = operand(ctx, q, (size_t)B * T * nq, &Q);
    if (!rc) rc = operand(ctx, k, (size_t)B * T * nk, &K);
    if (!rc) rc = operand(ctx, v, (size_t)B * T * nk, &V);
    // S^T (u, t) = K Q^T, i.e. att row (b,h,t) = scale * q(b,t,h) . k(b,u,kh)
    for (int b = 0; b < B && !rc; b++)
        for (int g = 0; g < grp && !rc; g++)
            rc = sbgemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, &K, (size_t)b * T * nk, nk, hd, &Q,
                        (size_t)b * T * nq + (size_t)g * hd, nq, (long long)grp * hd, 0.0f,
                        att + ((size_t)b * nh + g) * TT, T, (long long)grp * TT, nkv);
    if (!rc) {
        attn_softmax_kernel<<<blocks_for((size_t)B * nh * T, ROW_WARPS), 32 * ROW_WARPS, 0, ctx->stream>>>(
            att, B * nh * T, T);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) rc = DFM_FAIL(DFM_ECUDA, "launching attn_softmax_kernel failed: %s", cudaGetErrorString(e));
    }
    if (!rc) rc = operand(ctx, att, (size_t)B * nh * TT, &P);
    // O^T (i, t) = V^T P^T: out row (b,t,h) = sum_u P(b,h,t,u) v(b,u,kh)
    for (int b = 0; b < B && !rc; b++)
        for (int g = 0; g < grp && !rc; g++)
            rc = sbgemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, &V, (size_t)b * T * nk, nk, hd, &P,
                        ((size_t)b * nh + g) * TT, T, (long long)grp * TT, 0.0f, out + (size_t)b * T * nq + (size_t)g * hd,
                        nq, (long long)grp * hd, nkv);
    operand_free(ctx, &Q), operand_free(ctx, &K), operand_free(ctx, &V), operand_free(ctx, &P);
    return rc;
}

extern "C" int attention_backward_cuda(float *dq, float *dk, float *dv, float *datt, const float *dout,
                                       const float *att, const float *q, const float *k, const float *v, int B, int T,
                                       int nh, int nkv, int hd, OpsCudaContext *ctx) {
    if (B <= 0 || T <= 0) return DFM_OK;
    int grp = nh / nkv, nq = nh * hd, nk = nkv * hd;
    size_t TT = (size_t)T * T;
    float scale = 1.0f / sqrtf((float)hd);
    Operand Q, K, V, DO, P, DS;
    memset(&Q, 0, sizeof Q), memset(&K, 0, sizeof K), memset(&V, 0, sizeof V);
    memset(&DO, 0, sizeof DO), memset(&P, 0, sizeof P), memset(&DS, 0, sizeof DS);
    int rc = operand(ctx, q, (size_t)B * T * nq, &Q);
    if (!rc) rc = operand(ctx, k, (size_t)B * T * nk, &K);
    if (!rc) rc = operand(ctx, v, (size_t)B * T * nk, &V);
    if (!rc) rc = operand(ctx, dout, (size_t)B * T * nq, &DO);
    if (!rc) rc = operand(ctx, att, (size_t)B * nh * TT, &P);
    // dP (b,h,t,u) = dO(b,t,h) . v(b,u,kh)  (as the scores, with dO for q and v for k)
    for (int b = 0; b < B && !rc; b++)
        for (int g = 0; g < grp && !rc; g++)
            rc = sbgemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, &V, (size_t)b * T * nk, nk, hd, &DO,
                        (size_t)b * T * nq + (size_t)g * hd, nq, (long long)grp * hd, 0.0f,
                        datt + ((size_t)b * nh + g) * TT, T, (long long)grp * TT, nkv);
    if (!rc) {
        attn_softmax_backward_kernel<<<blocks_for((size_t)B * nh * T, ROW_WARPS), 32 * ROW_WARPS, 0, ctx->stream>>>(
            datt, att, B * nh * T, T, scale);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            rc = DFM_FAIL(DFM_ECUDA, "launching attn_softmax_backward_kernel failed: %s", cudaGetErrorString(e));
    }
    if (!rc) rc = operand(ctx, datt, (size_t)B * nh * TT, &DS);
    for (int b = 0; b < B && !rc; b++)
        for (int g = 0; g < grp && !rc; g++) {
            size_t qo = (size_t)b * T * nq + (size_t)g * hd, ko = (size_t)b * T * nk, po = ((size_t)b * nh + g) * TT;
            // dQ^T (i, t) += K^T dS^T: dq(b,t,h) += sum_u dS(b,h,t,u) k(b,u,kh)
            rc = sbgemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, &K, ko, nk, hd, &DS, po, T, (long long)grp * TT,
                        1.0f, dq + qo, nq, (long long)grp * hd, nkv);
            // dK^T (i, u) += Q^T dS: dk(b,u,kh) += sum_t dS(b,h,t,u) q(b,t,h), heads g = 0.. of a group in order
            if (!rc)
                rc = sbgemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, &Q, qo, nq, (long long)grp * hd, &DS, po, T,
                            (long long)grp * TT, 1.0f, dk + ko, nk, hd, nkv);
            // dV^T (i, u) += dO^T P: dv(b,u,kh) += sum_t P(b,h,t,u) dO(b,t,h)
            if (!rc)
                rc = sbgemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, &DO, qo, nq, (long long)grp * hd, &P, po, T,
                            (long long)grp * TT, 1.0f, dv + ko, nk, hd, nkv);
        }
    operand_free(ctx, &Q), operand_free(ctx, &K), operand_free(ctx, &V), operand_free(ctx, &DO);
    operand_free(ctx, &P), operand_free(ctx, &DS);
    return rc;
}

// ---- SwiGLU / GELU ----------------------------------------------------------------------------------
__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                       size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] += dout[i] * g * s;
    }
}
__global__ void gelu_forward_kernel(float *out, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    }
}
__global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}
extern "C" int swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t n, cudaStream_t stream) {
    swiglu_forward_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, gate, up, n);
    LAUNCH_CHECK("swiglu_forward_kernel");
    return DFM_OK;
}
extern "C" int swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                    size_t n, cudaStream_t stream) {
    swiglu_backward_kernel<<<ew_blocks(n), 256, 0, stream>>>(dgate, dup, dout, gate, up, n);
    LAUNCH_CHECK("swiglu_backward_kernel");
    return DFM_OK;
}
extern "C" int gelu_forward_cuda(float *out, const float *inp, size_t n, cudaStream_t stream) {
    gelu_forward_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, inp, n);
    LAUNCH_CHECK("gelu_forward_kernel");
    return DFM_OK;
}
extern "C" int gelu_backward_cuda(float *dinp, const float *dout, const float *inp, size_t n, cudaStream_t stream) {
    gelu_backward_kernel<<<ew_blocks(n), 256, 0, stream>>>(dinp, dout, inp, n);
    LAUNCH_CHECK("gelu_backward_kernel");
    return DFM_OK;
}

// ---- chunk cross-attention + gate -------------------------------------------------------------------
// one warp per (token row r, head h); scores go through p (lane 0 writes, __syncwarp orders them)
__global__ void crossattn_forward_kernel(float *out, float *p, const float *q, const float *km, const float *vm,
                                         const uint8_t *slot_mask, int B, int T, int L, int shift, int K, int nh,
                                         int hd, float scale) {
    size_t w = blockIdx.x * (size_t)ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * nh) return;
    int h = (int)(w % nh);
    size_t r = w / nh;
    int b = (int)(r / T), c = (int)((r % T + shift) / L), NC = T / L;
    size_t C = (size_t)nh * hd, m0 = ((size_t)b * NC + c) * K;
    const float *qr = q + r * C + (size_t)h * hd;
    float *pr = p + w * K, *o = out + r * C + (size_t)h * hd;
    float mx = -INFINITY;
    for (int j = 0; j < K && c < NC; j++) {  // c == NC: the chunk after the sequence, no memory
        if (!slot_mask[m0 + j]) continue;
        const float *kj = km + (m0 + j) * C + (size_t)h * hd;
        float s = 0.0f;
        for (int i = lane; i < hd; i += 32) s += qr[i] * kj[i];
        s = warp_sum(s) * scale;
        if (lane == 0) pr[j] = s;
        mx = fmaxf(mx, s);
    }
    __syncwarp();
    if (mx == -INFINITY) {  // no memory for this chunk
        for (int j = lane; j < K; j += 32) pr[j] = 0.0f;
        for (int i = lane; i < hd; i += 32) o[i] = 0.0f;
        return;
    }
    float sum = 0.0f;
    for (int j = 0; j < K; j++)
        if (slot_mask[m0 + j]) sum += expf(pr[j] - mx);
    float inv = 1.0f / sum;
    __syncwarp();
    for (int j = lane; j < K; j += 32) pr[j] = slot_mask[m0 + j] ? expf(pr[j] - mx) * inv : 0.0f;
    __syncwarp();
    for (int i = lane; i < hd; i += 32) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++)
            if (pr[j] != 0.0f) acc += pr[j] * vm[(m0 + j) * C + (size_t)h * hd + i];
        o[i] = acc;
    }
}
// warp per (r, h): ds[r,h,j] = p (dp_j - sum_j p dp) scale into scratch; dq += sum_j ds_j k_j
__global__ void crossattn_dq_kernel(float *dq, float *ds, const float *dout, const float *p, const float *km,
                                    const float *vm, int B, int T, int L, int shift, int K, int nh, int hd,
                                    float scale) {
    size_t w = blockIdx.x * (size_t)ROW_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)B * T * nh) return;
    int h = (int)(w % nh);
    size_t r = w / nh;
    int b = (int)(r / T), c = (int)((r % T + shift) / L), NC = T / L;
    const float *pr = p + w * K, *dor = dout + r * ((size_t)nh * hd) + (size_t)h * hd;
    float *dsr = ds + w * K;
    if (c >= NC) {  // attends nothing (p = 0): no gradient
        for (int j = lane; j < K; j += 32) dsr[j] = 0.0f;
        return;
    }
    size_t C = (size_t)nh * hd, m0 = ((size_t)b * NC + c) * K;
    float pdp = 0.0f;
    for (int j = 0; j < K; j++) {
        float acc = 0.0f;
        if (pr[j] != 0.0f) {
            const float *vj = vm + (m0 + j) * C + (size_t)h * hd;
            for (int i = lane; i < hd; i += 32) acc += dor[i] * vj[i];
            acc = warp_sum(acc);
        }
        if (lane == 0) dsr[j] = acc;
        pdp += pr[j] * acc;
    }
    __syncwarp();
    for (int j = lane; j < K; j += 32) dsr[j] = pr[j] != 0.0f ? pr[j] * (dsr[j] - pdp) * scale : 0.0f;
    __syncwarp();
    for (int i = lane; i < hd; i += 32) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc += dsr[j] * km[(m0 + j) * C + (size_t)h * hd + i];
        dq[r * C + (size_t)h * hd + i] += acc;
    }
}
// thread per memory element (b, c, j, channel): the chunk's L tokens summed in order
__global__ void crossattn_dkv_kernel(float *dkm, float *dvm, const float *ds, const float *p, const float *q,
                                     const float *dout, int B, int T, int L, int shift, int K, int nh, int hd) {
    size_t C = (size_t)nh * hd, NC = T / L;
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NC * K * C) return;
    size_t ch = idx % C, mrow = idx / C;  // mrow = (b*NC + c)*K + j
    int j = (int)(mrow % K);
    size_t bc = mrow / K, b = bc / NC, c = bc % NC;
    int h = (int)(ch / hd);
    float sk = 0.0f, sv = 0.0f;
    long s0 = (long)(c * L) - shift, s1 = (long)((c + 1) * L) - shift;
    for (long s = s0 < 0 ? 0 : s0; s < s1; s++) {
        size_t r = b * T + (size_t)s, pi = (r * nh + h) * K + j;
        sk += ds[pi] * q[r * C + ch];
        sv += p[pi] * dout[r * C + ch];
    }
    if (dkm) dkm[idx] += sk;
    if (dvm) dvm[idx] += sv;
}
extern "C" int crossattn_forward_cuda(float *out, float *p, const float *q, const float *km, const float *vm,
                                      const uint8_t *slot_mask, int B, int T, int L, int shift, int K, int nh,
                                      int hd, cudaStream_t stream) {
    crossattn_forward_kernel<<<blocks_for((size_t)B * T * nh, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(
        out, p, q, km, vm, slot_mask, B, T, L, shift, K, nh, hd, 1.0f / sqrtf((float)hd));
    LAUNCH_CHECK("crossattn_forward_kernel");
    return DFM_OK;
}
extern "C" int crossattn_backward_cuda(float *dq, float *dkm, float *dvm, const float *dout, const float *p,
                                       const float *q, const float *km, const float *vm, int B, int T, int L,
                                       int shift, int K, int nh, int hd, cudaStream_t stream) {
    float *ds = NULL;
    size_t nds = (size_t)B * T * nh * K;
    CUDA_CHECK(cudaMallocAsync((void **)&ds, (nds ? nds : 1) * sizeof(float), stream));
    crossattn_dq_kernel<<<blocks_for((size_t)B * T * nh, ROW_WARPS), 32 * ROW_WARPS, 0, stream>>>(
        dq, ds, dout, p, km, vm, B, T, L, shift, K, nh, hd, 1.0f / sqrtf((float)hd));
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && (dkm || dvm)) {
        size_t n = (size_t)B * (T / L) * K * nh * hd;
        crossattn_dkv_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dkm, dvm, ds, p, q, dout, B, T, L, shift, K, nh,
                                                                           hd);
        e = cudaGetLastError();
    }
    cudaFreeAsync(ds, stream);
    if (e != cudaSuccess)
        return DFM_FAIL(DFM_ECUDA, "crossattn backward kernels failed to launch: %s", cudaGetErrorString(e));
    return DFM_OK;
}

__global__ void gate_forward_kernel(float *out, float *g, const float *gl, const float *h, const float *o, int N, int C,
                                    int G) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * C) return;
    int per = C / G, c = (int)(idx % C);
    size_t n = idx / C, gi = n * G + c / per;
    float gv = 1.0f / (1.0f + expf(-gl[gi]));
    if (c % per == 0) g[gi] = gv;
    out[idx] = h[idx] + gv * o[idx];
}
__global__ void gate_backward_kernel(float *dh, float *dgl, float *d_o, const float *dout, const float *g,
                                     const float *o, int N, int C, int G) {
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * G) return;
    int per = C / G, j = (int)(idx % G);
    size_t n = idx / G;
    float gj = g[idx], acc = 0.0f;
    for (int c = j * per; c < (j + 1) * per; c++) {
        size_t k = n * C + c;
        float d = dout[k];
        if (dh) dh[k] += d;
        d_o[k] += d * gj;
        acc += d * o[k];
    }
    dgl[idx] += acc * gj * (1.0f - gj);
}
extern "C" int gate_forward_cuda(float *out, float *g, const float *gl, const float *h, const float *o, int N, int C,
                                 int G, cudaStream_t stream) {
    gate_forward_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, stream>>>(out, g, gl, h, o, N, C, G);
    LAUNCH_CHECK("gate_forward_kernel");
    return DFM_OK;
}
extern "C" int gate_backward_cuda(float *dh, float *dgl, float *d_o, const float *dout, const float *g, const float *o,
                                  int N, int C, int G, cudaStream_t stream) {
    gate_backward_kernel<<<blocks_for((size_t)N * G, 128), 128, 0, stream>>>(dh, dgl, d_o, dout, g, o, N, C, G);
    LAUNCH_CHECK("gate_backward_kernel");
    return DFM_OK;
}

// ---- chunk pooling ------------------------------------------------------------------------------------
__global__ void chunk_pool_kernel(float *out, const float *h, int B, int T, int L, int tail, int C) {
    int NC = T / L;
    size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NC * C) return;
    int i = (int)(idx % C), c = (int)((idx / C) % NC);
    size_t b = idx / ((size_t)C * NC);
    float s = 0.0f;
    if (c > 0) {
        for (int t = c * L - tail; t < c * L; t++) s += h[(b * T + t) * C + i];
        s *= 1.0f / (float)tail;
    }
    out[idx] = s;
}
extern "C" int matmul_forward_w16_cuda(float *out, const float *inp, const uint16_t *weight, const float *bias,
                                       int N, int C, int OC, OpsCudaContext *ctx) {
    DFM_TRY(gemm_a16(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, (size_t)N * C, 0.0f, out, OC));
    if (bias) {
        add_bias_kernel<<<blocks_for((size_t)N * OC, 256), 256, 0, ctx->stream>>>(out, bias, N, OC);
        LAUNCH_CHECK("add_bias_kernel");
    }
    return DFM_OK;
}

extern "C" int matmul_backward_w16_cuda(float *dinp, const float *dout, const uint16_t *weight, int N, int C, int OC,
                                        OpsCudaContext *ctx) {
    if (!dinp) return DFM_OK;
    return gemm_a16(ctx, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight, C, dout, OC, (size_t)N * OC, 1.0f, dinp, C);
}

__global__ void embedding_forward_w16_kernel(float *out, const int *tokens, const __nv_bfloat16 *wte, int N, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < (size_t)N * C) out[i] = __bfloat162float(wte[(size_t)tokens[i / C] * C + i % C]);
}
extern "C" int embedding_forward_w16_cuda(float *out, const int *tokens, const uint16_t *wte, int N, int C,
                                          cudaStream_t stream) {
    embedding_forward_w16_kernel<<<blocks_for((size_t)N * C, 256), 256, 0, stream>>>(
        out, tokens, (const __nv_bfloat16 *)wte, N, C);
    LAUNCH_CHECK("embedding_forward_w16_kernel");
    return DFM_OK;
}

extern "C" int chunk_pool_forward_cuda(float *out, const float *h, int B, int T, int L, int tail, int C,
                                       cudaStream_t stream) {
    chunk_pool_kernel<<<blocks_for((size_t)B * (T / L) * C, 256), 256, 0, stream>>>(out, h, B, T, L, tail, C);
    LAUNCH_CHECK("chunk_pool_kernel");
    return DFM_OK;
}

// ---- fused LM head + cross-entropy --------------------------------------------------------------------
#define CE_THREADS 512
__device__ float block_reduce(float v, bool is_max) {
    __shared__ float sh[CE_THREADS / 32];
    int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(r) : warp_sum(r);
}
// with soft targets (CeSoft): a row block's slice of the device arrays and each row's outputs, summed afterwards
struct CeSoftRows {
    const int *ids;       // [R*S]
    const float *p;       // [R*S]
    const uint8_t *has;   // [R]
    const float *row_w;   // [R] or NULL (1)
    int S;
    float weight;
    float *kl, *wce, *n;  // [R] out: KL (rows with a teacher and a target), w*CE, 1 where the KL counts
};
static_assert(CE_MAX_SOFT <= CE_THREADS, "thread i < S holds teacher id i");
// one block per row of the logits block lg[R, V]: loss into row_loss, gradient (softmax - onehot)*dloss in place.
// SOFT: lmhead_ce_soft_forward_backward's row (ops.h): the teacher's top-S ids plus its tail bucket. Thread i < S
// owns the row's teacher id i: it reads the id's logit before the gradient overwrites it, writes its KL term and
// exp(z_i - mx); thread 0 adds them (and the p_i) in id order, in double like the CPU, and gives the block
// tail = p_rest / q_rest through shared memory before the logits are scaled by (w + weight*(1 - tail)) q; after a
// barrier each id's thread adds weight*(tail*q_i - p_i) (the ids of a row are distinct: no two threads write one
// element). SOFT = 0 is the plain kernel, unchanged.
template <int SOFT>
__global__ void ce_rows_kernel(float *lg, float *row_loss, float *top1, const int *targets, int V, float dloss,
                               int need_grad, CeSoftRows so) {
    __shared__ double kl_terms[SOFT ? CE_MAX_SOFT : 1], e_terms[SOFT ? CE_MAX_SOFT : 1], tail_sh[1];
    int r = blockIdx.x;
    float *x = lg + (size_t)r * V;
    int tgt = targets[r];
    if (tgt < 0) {  // ignored position
        if (threadIdx.x == 0) row_loss[r] = 0.0f;
        if (threadIdx.x == 0 && top1) top1[r] = 0.0f;
        if (SOFT && threadIdx.x == 0) so.kl[r] = so.wce[r] = so.n[r] = 0.0f;
        if (need_grad)
            for (int v = threadIdx.x; v < V; v += blockDim.x) x[v] = 0.0f;
        return;
    }
    int has = SOFT && so.has[r];  // uniform across the block
    int id = has && (int)threadIdx.x < so.S ? so.ids[(size_t)r * so.S + threadIdx.x] : -1;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, x[v]);
    mx = block_reduce(mx, true);
    float lt = x[tgt];  // read before anyone overwrites it below
    float z = id >= 0 ? x[id] : 0.0f;  // so is the teacher id's logit
    float s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(x[v] - mx);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) row_loss[r] = logf(s) + mx - lt;
    if (threadIdx.x == 0 && top1) top1[r] = lt >= mx ? 1.0f : 0.0f;
    float w = SOFT && so.row_w ? so.row_w[r] : 1.0f, lam = has ? so.weight : 0.0f, pi = 0.0f;
    double lse = log((double)s) + (double)mx, tail = 1.0;  // tail: p_rest / q_rest (1 without a teacher)
    if (SOFT) {
        if (id >= 0) {  // p_i (log p_i - log q_i) and exp(z_i - mx), in double like the CPU
            pi = so.p[(size_t)r * so.S + threadIdx.x];
            kl_terms[threadIdx.x] = pi > 0.0f ? (double)pi * (log((double)pi) - ((double)z - lse)) : 0.0;
            e_terms[threadIdx.x] = exp((double)z - (double)mx);
        }
        __syncthreads();  // the ids' terms are written
        if (threadIdx.x == 0) {
            double kl = 0.0, ps = 0.0, es = 0.0, t = 1.0;
            for (int i = 0; has && i < so.S; i++) {  // in id order, as the CPU
                kl += kl_terms[i];
                ps += so.p[(size_t)r * so.S + i];
                es += e_terms[i];
            }
            if (has) {  // the tail bucket: p_rest (log p_rest - log q_rest)
                double pr = ps < 1.0 ? 1.0 - ps : 0.0, qr = ((double)s - es) / (double)s;
                if (qr < 1e-6) qr = 1e-6;  // the difference of two sums: below this it is rounding
                if (pr > 0.0) kl += pr * (log(pr) - log(qr));
                t = pr / qr;
            }
            tail_sh[0] = t;
            so.kl[r] = (float)kl;
            so.wce[r] = (float)((double)w * (logf(s) + mx - lt));
            so.n[r] = has ? 1.0f : 0.0f;
        }
        __syncthreads();  // tail is set
        tail = tail_sh[0];
    }
    if (need_grad) {
        float sc = dloss / s, dt = dloss;
        if (SOFT) {
            sc = dloss * (float)(w + lam * (1.0 - tail)) / s;
            dt = dloss * w;
        }
        for (int v = threadIdx.x; v < V; v += blockDim.x) x[v] = expf(x[v] - mx) * sc - (v == tgt ? dt : 0.0f);
    }
    if (SOFT) {
        __syncthreads();  // the row's gradient is complete
        if (need_grad && id >= 0) x[id] += dloss * lam * (float)(tail * exp((double)z - lse) - pi);
    }
}
// single block: sum of n floats in double, fixed order (thread-strided partials, then a tree)
__global__ void sum_double_kernel(double *out, const float *x, size_t n) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += (double)x[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sh[0];
}
// weight is fp32 (weight) or bf16 (weight16, frozen: no dweight); soft NULL: the plain CE
static int lmhead_ce_impl(double *total, float *losses, float *top1, float *dx, float *dweight, const float *x, const float *weight,
                          const uint16_t *weight16, const int *targets, int N, int C, int V, float dloss,
                          float *scratch, CeSoft *soft, OpsCudaContext *ctx) {
    cudaStream_t st = ctx->stream;
    int need_grad = dx || dweight, S = soft ? soft->S : 0;
    if (soft && (S < 1 || S > CE_MAX_SOFT || !soft->ids || !soft->p || !soft->has))
        return DFM_FAIL(DFM_EARG, "soft targets need ids, p and has and 1..%d ids per row (S = %d)", CE_MAX_SOFT, S);
    float *rl = losses, *soft_rows = NULL;  // soft_rows: [3N] the rows' KL, w*CE and counts
    double *dsum = NULL, sums[4] = {0, 0, 0, 0};  // the plain CE; KL, w*CE, rows with a teacher
    int rc = DFM_OK, nsum = soft ? 4 : 1;
    if (!rl) CUDA_CHECK(cudaMallocAsync((void **)&rl, (N ? N : 1) * sizeof(float), st));
    cudaError_t e = cudaMallocAsync((void **)&dsum, nsum * sizeof(double), st);
    if (e == cudaSuccess && soft) e = cudaMallocAsync((void **)&soft_rows, (size_t)3 * (N ? N : 1) * sizeof(float), st);
    if (e != cudaSuccess) rc = DFM_FAIL(DFM_ECUDA, "cudaMallocAsync failed: %s", cudaGetErrorString(e));
    for (int r0 = 0; rc == DFM_OK && r0 < N; r0 += CE_ROWS_BLOCK_CUDA) {
        int R = N - r0 < CE_ROWS_BLOCK_CUDA ? N - r0 : CE_ROWS_BLOCK_CUDA;
        const float *xb = x + (size_t)r0 * C;
        rc = weight16 ? matmul_forward_w16_cuda(scratch, xb, weight16, NULL, R, C, V, ctx)
                      : matmul_forward_cuda(scratch, xb, weight, NULL, R, C, V, ctx);
        if (rc) break;
        if (soft) {
            CeSoftRows so = {soft->ids + (size_t)r0 * S, soft->p + (size_t)r0 * S, soft->has + r0,
                             soft->row_w ? soft->row_w + r0 : NULL, S, soft->weight,
                             soft_rows + r0, soft_rows + N + r0, soft_rows + 2 * (size_t)N + r0};
            ce_rows_kernel<1><<<R, CE_THREADS, 0, st>>>(scratch, rl + r0, top1 ? top1 + r0 : NULL, targets + r0, V,
                                                        dloss, need_grad, so);
        } else {
            ce_rows_kernel<0><<<R, CE_THREADS, 0, st>>>(scratch, rl + r0, top1 ? top1 + r0 : NULL, targets + r0, V,
                                                        dloss, need_grad, CeSoftRows{});
        }
        if ((e = cudaGetLastError()) != cudaSuccess) {
            rc = DFM_FAIL(DFM_ECUDA, "ce_rows_kernel launch failed: %s", cudaGetErrorString(e));
            break;
        }
        if (need_grad && weight16)
            rc = matmul_backward_w16_cuda(dx ? dx + (size_t)r0 * C : NULL, scratch, weight16, R, C, V, ctx);
        else if (need_grad)
            rc = matmul_backward_cuda(dx ? dx + (size_t)r0 * C : NULL, dweight, NULL, scratch, xb, weight, R, C, V,
                                      ctx);
    }
    if (rc == DFM_OK) {
        sum_double_kernel<<<1, 256, 0, st>>>(dsum, rl, (size_t)N);
        for (int k = 1; k < nsum && (e = cudaGetLastError()) == cudaSuccess; k++)
            sum_double_kernel<<<1, 256, 0, st>>>(dsum + k, soft_rows + (size_t)(k - 1) * N, (size_t)N);
        if ((e = cudaGetLastError()) == cudaSuccess)
            e = cudaMemcpyAsync(sums, dsum, nsum * sizeof(double), cudaMemcpyDeviceToHost, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) rc = DFM_FAIL(DFM_ECUDA, "CE loss reduction failed: %s", cudaGetErrorString(e));
    }
    if (rc == DFM_OK) {
        *total = sums[0];
        if (soft) soft->kl_sum = sums[1], soft->wce_sum = sums[2], soft->n_teacher = (long)sums[3];
    }
    if (dsum) cudaFreeAsync(dsum, st);
    if (soft_rows) cudaFreeAsync(soft_rows, st);
    if (!losses && rl) cudaFreeAsync(rl, st);
    return rc;
}

extern "C" int lmhead_ce_forward_backward_cuda(double *total, float *losses, float *top1, float *dx, float *dweight,
                                               const float *x, const float *weight, const int *targets, int N, int C,
                                               int V, float dloss, float *scratch, OpsCudaContext *ctx) {
    return lmhead_ce_impl(total, losses, top1, dx, dweight, x, weight, NULL, targets, N, C, V, dloss, scratch, NULL,
                          ctx);
}
extern "C" int lmhead_ce_forward_backward_w16_cuda(double *total, float *losses, float *top1, float *dx, const float *x,
                                                   const uint16_t *weight, const int *targets, int N, int C, int V,
                                                   float dloss, float *scratch, OpsCudaContext *ctx) {
    return lmhead_ce_impl(total, losses, top1, dx, NULL, x, NULL, weight, targets, N, C, V, dloss, scratch, NULL, ctx);
}
extern "C" int lmhead_ce_soft_forward_backward_cuda(double *total, float *losses, float *top1, float *dx,
                                                    float *dweight, const float *x, const float *weight,
                                                    const int *targets, int N, int C, int V, float dloss,
                                                    float *scratch, CeSoft *soft, OpsCudaContext *ctx) {
    return lmhead_ce_impl(total, losses, top1, dx, dweight, x, weight, NULL, targets, N, C, V, dloss, scratch, soft,
                          ctx);
}
extern "C" int lmhead_ce_soft_forward_backward_w16_cuda(double *total, float *losses, float *top1, float *dx,
                                                        const float *x, const uint16_t *weight, const int *targets,
                                                        int N, int C, int V, float dloss, float *scratch,
                                                        CeSoft *soft, OpsCudaContext *ctx) {
    return lmhead_ce_impl(total, losses, top1, dx, NULL, x, NULL, weight, targets, N, C, V, dloss, scratch, soft, ctx);
}

// ---- MSE ----------------------------------------------------------------------------------------------
// three deterministic stages: count the valid slots (one block); one block per slot: gradient and the slot's
// sum of squares in double (fixed tree); the slots' sums added in a fixed order (sum_double_kernel's way)
__global__ void mse_count_kernel(int *nvalid, const uint8_t *mask, int S) {
    __shared__ int sh[256];
    int c = 0;
    for (int s = threadIdx.x; s < S; s += blockDim.x) c += mask[s] != 0;
    sh[threadIdx.x] = c;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *nvalid = sh[0];
}
__global__ void mse_slot_kernel(double *slot_sum, float *dpred, const float *pred, const float *target,
                                const uint8_t *mask, const int *nvalid, int D, float dloss) {
    __shared__ double sh[128];
    int s = blockIdx.x;
    double sum = 0.0;
    if (mask[s] && *nvalid > 0) {  // uniform across the block
        float g = (float)(2.0 / ((double)*nvalid * D)) * dloss;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            size_t k = (size_t)s * D + i;
            float d = pred[k] - target[k];
            sum += (double)d * d;
            if (dpred) dpred[k] += g * d;
        }
    }
    sh[threadIdx.x] = sum;
    __syncthreads();
    for (int o = 64; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) slot_sum[s] = sh[0];
}
__global__ void mse_total_kernel(double *result, const double *slot_sum, const int *nvalid, int S, int D) {
    __shared__ double sh[256];
    double t = 0.0;
    for (int s = threadIdx.x; s < S; s += blockDim.x) t += slot_sum[s];
    sh[threadIdx.x] = t;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = *nvalid > 0 ? sh[0] / ((double)*nvalid * D) : 0.0;
}
extern "C" int mse_forward_backward_cuda(double *result, float *dpred, const float *pred, const float *target,
                                         const uint8_t *mask, int S, int D, float dloss, OpsCudaContext *ctx) {
    cudaStream_t st = ctx->stream;
    if (S <= 0) {
        *result = 0.0;
        return DFM_OK;
    }
    double *buf = NULL;  // [0]: result, [1..S]: per-slot sums, then the count (an int)
    CUDA_CHECK(cudaMallocAsync((void **)&buf, ((size_t)S + 2) * sizeof(double), st));
    int *nvalid = (int *)(buf + S + 1);
    mse_count_kernel<<<1, 256, 0, st>>>(nvalid, mask, S);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) {
        mse_slot_kernel<<<S, 128, 0, st>>>(buf + 1, dpred, pred, target, mask, nvalid, D, dloss);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) {
        mse_total_kernel<<<1, 256, 0, st>>>(buf, buf + 1, nvalid, S, D);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(result, buf, sizeof(double), cudaMemcpyDeviceToHost, st);
    cudaFreeAsync(buf, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) return DFM_FAIL(DFM_ECUDA, "MSE kernels failed: %s", cudaGetErrorString(e));
    return DFM_OK;
}

// ---- AdamW, gradient norm and scaling ---------------------------------------------------------------
__global__ void adamw_kernel(float *params, const float *grads, float *m, float *v, const unsigned char *decay,
                             size_t n, float lr, float b1, float b2, float eps, float wdv, float b1c, float b2c) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grads[i];
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float wd = (decay && decay[i]) ? wdv : 0.0f;
        params[i] -= lr * ((mi / b1c) / (sqrtf(vi / b2c) + eps) + wd * params[i]);
    }
}
extern "C" int adamw_update_cuda(float *params, const float *grads, float *m, float *v, const unsigned char *decay,
                                 size_t n, const AdamWConfig *c, long t, cudaStream_t stream) {
    // bias corrections on the host with powf, exactly as adamw_update
    float b1c = 1.0f - powf(c->beta1, (float)t), b2c = 1.0f - powf(c->beta2, (float)t);
    adamw_kernel<<<ew_blocks(n), 256, 0, stream>>>(params, grads, m, v, decay, n, c->lr, c->beta1, c->beta2, c->eps,
                                                   c->weight_decay, b1c, b2c);
    LAUNCH_CHECK("adamw_kernel");
    return DFM_OK;
}

#define NORM_BLOCKS 256
__global__ void sumsq_partial_kernel(double *partial, const float *g, size_t n) {
    __shared__ double sh[256];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * g[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}
__global__ void sum_partials_kernel(double *partial, int n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    partial[0] = s;
}
extern "C" int grad_norm_cuda(double *norm, const float *g, size_t n, OpsCudaContext *ctx) {
    double *partial = NULL, h = 0.0;
    CUDA_CHECK(cudaMallocAsync((void **)&partial, NORM_BLOCKS * sizeof(double), ctx->stream));
    sumsq_partial_kernel<<<NORM_BLOCKS, 256, 0, ctx->stream>>>(partial, g, n);
    sum_partials_kernel<<<1, 32, 0, ctx->stream>>>(partial, NORM_BLOCKS);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaMemcpyAsync(&h, partial, sizeof(double), cudaMemcpyDeviceToHost, ctx->stream);
    cudaFreeAsync(partial, ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) return DFM_FAIL(DFM_ECUDA, "gradient norm kernels failed: %s", cudaGetErrorString(e));
    *norm = sqrt(h);
    return DFM_OK;
}

__global__ void scale_kernel(float *g, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] *= s;
}
__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}
extern "C" int grad_scale_cuda(float *g, size_t n, float s, cudaStream_t stream) {
    scale_kernel<<<ew_blocks(n), 256, 0, stream>>>(g, n, s);
    LAUNCH_CHECK("scale_kernel");
    return DFM_OK;
}
extern "C" int vec_add_cuda(float *out, const float *a, const float *b, size_t n, cudaStream_t stream) {
    add_kernel<<<ew_blocks(n), 256, 0, stream>>>(out, a, b, n);
    LAUNCH_CHECK("add_kernel");
    return DFM_OK;
}
extern "C" int vec_zero_cuda(float *x, size_t n, cudaStream_t stream) {
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream));
    return DFM_OK;
}
