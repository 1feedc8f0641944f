// attention_cuda.cu — flash-style causal GQA attention, fp32 SIMT (see attention_cuda.h for the contract).
//
// FlashAttention-2 scheme on CUDA cores. Shapes are templated on HDM, the padded head size (32, 64, 128):
// a row (query or key) is owned by R = HDM/32 consecutive threads, thread r of the row holding the 8
// float4 chunks r, r+R, r+2R, ... of it in registers (so the R threads read adjacent 16-byte words of a
// shared-memory row and the other rows of the warp read the same words: broadcast, no bank conflicts).
// A dot product is 32 FMAs per thread plus log2(R) xor-shuffles; the butterfly gives all R threads the
// same bits, so they take identical softmax decisions. Tiles are static shared memory (<= 32 KiB), loaded
// with consecutive threads on consecutive floats of a row (coalesced), zero-padded past hd and past T.
//
//   forward   block = (b, h, 64 or 32 query rows);   loops over K/V tiles of 32 keys up to the diagonal;
//             online softmax per tile: m, l and the output accumulator in registers; writes out and lse.
//   dq        block = (b, h, query rows) as above;    writes delta = rowsum(dO*O) first, then loops over
//             K/V tiles: P = exp(s - lse), dS = P*(dP - delta)*scale, dq += dS K.
//   dk, dv    block = (b, kv head, 64 or 32 key rows); loops over the group's query heads in order, then
//             over Q/dO tiles of 32 rows from the diagonal on: dv += P^T dO, dk += dS^T Q.
// No atomics anywhere: each output element has one owner thread and a fixed summation order.
// Blocks with the most work (long causal rows / early key tiles) get the lowest block indices so they
// start first. Registers: __launch_bounds__ asks for 12 warps per SM (<= 168 registers a thread; ptxas
// -v: 168 everywhere, spills of 0..40 bytes). Not done yet: cp.async double buffering, tensor cores
// (bf16/tf32 mma), one forward block serving all nh/nkv heads of a group (K/V tiles read once per group),
// split-K when B*nh is too small to fill the GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "common/error.h"
}
#include "trainer/kernels/attention_cuda.h"
#include "common/cuda_check.h"

#define FA_DPT 32          // dimensions of a row held by one thread
#define FA_V4 (FA_DPT / 4)  // as float4 chunks
#define FA_BK 32           // keys per K/V tile (forward, dq)
#define FA_BQ 32           // query rows per Q/dO tile (dk/dv)
#define FA_CH_Q 4          // keys (dq) / queries (dk/dv) whose scores are computed together before their
#define FA_CH_KV 2         // reduction: ILP against registers (dk/dv holds 128 floats of state already)

template <int HDM>
struct FaShape {
    static constexpr int R = HDM / FA_DPT;               // threads per row: 1, 2, 4
    static constexpr int ROWS = HDM <= 64 ? 64 : 32;      // rows owned by a block
    static constexpr int NT = ROWS * R;                    // threads per block: 64, 128, 128
    static constexpr int W4 = HDM / 4;                     // float4 per shared-memory row
    static constexpr int MINB = 384 / NT;                  // blocks per SM asked of ptxas: 12 warps, <= 168 regs
    static_assert(ROWS % FA_BQ == 0 && ROWS % 32 == 0 && NT % 32 == 0, "tile shapes");
};

__device__ __forceinline__ float fa_dot4(float acc, float4 a, float4 b) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}
__device__ __forceinline__ void fa_axpy4(float4 &y, float a, float4 x) {  // y += a*x
    y.x = fmaf(a, x.x, y.x);
    y.y = fmaf(a, x.y, y.y);
    y.z = fmaf(a, x.z, y.z);
    y.w = fmaf(a, x.w, y.w);
}
__device__ __forceinline__ void fa_scale4(float4 &y, float a) {
    y.x *= a;
    y.y *= a;
    y.z *= a;
    y.w *= a;
}
__device__ __forceinline__ int fa_imin(int a, int b) { return a < b ? a : b; }
// A shared-memory load that neither nvcc nor ptxas may merge with an earlier load of the same address
// (volatile in the PTX too). The backward reads each Q/dO (dq: K) chunk twice, for the scores and then
// for the update; merged, the compiler keeps every chunk of a step live in between (64 floats per row of a chunk):
// 255 registers and kilobytes of spills, against about 170 registers and none when reloaded.
__device__ __forceinline__ float4 fa_lds4(const float4 *p) {
#ifdef __CUDA_ARCH__
    float4 x;
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
    return x;
#else
    return *p;
#endif
}

// The R threads of a row each hold a partial sum: after this every one of them holds the total.
template <int R>
__device__ __forceinline__ float fa_row_sum(float x) {
#pragma unroll
    for (int o = 1; o < R; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Thread r's 32 dimensions of one row (hd floats from `row`), zero past hd.
template <int R>
__device__ __forceinline__ void fa_load_row(float4 (&x)[FA_V4], const float *row, int hd, int r) {
#pragma unroll
    for (int c = 0; c < FA_V4; c++) {
        int d = 4 * (r + R * c);
        x[c].x = d < hd ? row[d] : 0.0f;
        x[c].y = d + 1 < hd ? row[d + 1] : 0.0f;
        x[c].z = d + 2 < hd ? row[d + 2] : 0.0f;
        x[c].w = d + 3 < hd ? row[d + 3] : 0.0f;
    }
}
// row[d] (+)= x[d] for d < hd: the inverse of fa_load_row
template <int R, bool ACC>
__device__ __forceinline__ void fa_store_row(float *row, const float4 (&x)[FA_V4], int hd, int r) {
#pragma unroll
    for (int c = 0; c < FA_V4; c++) {
        int d = 4 * (r + R * c);
        const float e[4] = {x[c].x, x[c].y, x[c].z, x[c].w};
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (d + i < hd) row[d + i] = ACC ? row[d + i] + e[i] : e[i];
    }
}

// Rows row0 .. row0+NROWS-1 (stride floats apart, hd floats each) into a [NROWS][HDM] tile, zero past hd
// and past the `valid` first rows. Consecutive threads take consecutive floats of a row (coalesced).
template <int HDM, int NROWS, int NT>
__device__ __forceinline__ void fa_load_tile(float4 (*tile)[HDM / 4], const float *src, size_t stride, int valid,
                                             int hd) {
    float *t = &tile[0][0].x;
    for (int e = threadIdx.x; e < NROWS * HDM; e += NT) {
        int i = e / HDM, d = e % HDM;
        t[e] = (d < hd && i < valid) ? src[(size_t)i * stride + d] : 0.0f;
    }
}

// ---- forward -------------------------------------------------------------------------------------------
template <int HDM>
__global__ void __launch_bounds__(FaShape<HDM>::NT, FaShape<HDM>::MINB)
    flash_fwd_kernel(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ q,
                     const float *__restrict__ k, const float *__restrict__ v, int B, int T, int nh, int nkv, int hd,
                     float scale) {
    typedef FaShape<HDM> S;
    constexpr int R = S::R;
    __shared__ float4 Ks[FA_BK][S::W4], Vs[FA_BK][S::W4];
    int ntiles = (T + S::ROWS - 1) / S::ROWS;
    int bh = blockIdx.x % (B * nh), tile = ntiles - 1 - (int)(blockIdx.x / (B * nh));  // longest rows first
    int h = bh % nh, b = bh / nh, kh = h / (nh / nkv);
    int row = threadIdx.x / R, r = threadIdx.x % R;
    int q0 = tile * S::ROWS, t = q0 + row;
    int tq = fa_imin(t, T - 1);  // rows past T compute a copy of row T-1 (keeps barriers and shuffles uniform)
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    const float *kb = k + (size_t)b * T * ks + (size_t)kh * hd, *vb = v + (size_t)b * T * ks + (size_t)kh * hd;

    float4 qr[FA_V4], acc[FA_V4];
    fa_load_row<R>(qr, q + ((size_t)b * T + tq) * qs + (size_t)h * hd, hd, r);
#pragma unroll
    for (int c = 0; c < FA_V4; c++) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float m = -INFINITY, l = 0.0f;
    int kend = fa_imin(q0 + S::ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        __syncthreads();  // everyone is done with the previous tile
        fa_load_tile<HDM, FA_BK, S::NT>(Ks, kb + (size_t)k0 * ks, ks, T - k0, hd);
        fa_load_tile<HDM, FA_BK, S::NT>(Vs, vb + (size_t)k0 * ks, ks, T - k0, hd);
        __syncthreads();
        float s[FA_BK];
#pragma unroll
        for (int j = 0; j < FA_BK; j++) {
            float a = 0.0f;
#pragma unroll
            for (int c = 0; c < FA_V4; c++) a = fa_dot4(a, qr[c], Ks[j][r + R * c]);
            s[j] = a;
        }
#pragma unroll
        for (int j = 0; j < FA_BK; j++) s[j] = fa_row_sum<R>(s[j]);
        float mt = m;
#pragma unroll
        for (int j = 0; j < FA_BK; j++) {
            s[j] = k0 + j <= tq ? s[j] * scale : -INFINITY;  // causal; keys past T are past tq too
            mt = fmaxf(mt, s[j]);
        }
        float corr = expf(m - mt);  // 0 on the first tile (m = -inf; mt is finite: key 0 <= tq)
        l *= corr;
#pragma unroll
        for (int c = 0; c < FA_V4; c++) fa_scale4(acc[c], corr);
#pragma unroll
        for (int j = 0; j < FA_BK; j++) {
            float p = expf(s[j] - mt);
            l += p;
#pragma unroll
            for (int c = 0; c < FA_V4; c++) fa_axpy4(acc[c], p, Vs[j][r + R * c]);
        }
        m = mt;
    }
    if (t < T) {
        float inv = 1.0f / l;
#pragma unroll
        for (int c = 0; c < FA_V4; c++) fa_scale4(acc[c], inv);
        fa_store_row<R, false>(out + ((size_t)b * T + t) * qs + (size_t)h * hd, acc, hd, r);
        if (r == 0) lse[((size_t)b * nh + h) * T + t] = m + logf(l);
    }
}

// ---- backward: dq (and delta) --------------------------------------------------------------------------
template <int HDM>
__global__ void __launch_bounds__(FaShape<HDM>::NT, FaShape<HDM>::MINB)
    flash_bwd_dq_kernel(float *__restrict__ dq, float *__restrict__ delta, const float *__restrict__ dout,
                        const float *__restrict__ out, const float *__restrict__ lse, const float *__restrict__ q,
                        const float *__restrict__ k, const float *__restrict__ v, int B, int T, int nh, int nkv,
                        int hd, float scale) {
    typedef FaShape<HDM> S;
    constexpr int R = S::R;
    __shared__ float4 Ks[FA_BK][S::W4], Vs[FA_BK][S::W4];
    int ntiles = (T + S::ROWS - 1) / S::ROWS;
    int bh = blockIdx.x % (B * nh), tile = ntiles - 1 - (int)(blockIdx.x / (B * nh));
    int h = bh % nh, b = bh / nh, kh = h / (nh / nkv);
    int row = threadIdx.x / R, r = threadIdx.x % R;
    int q0 = tile * S::ROWS, t = q0 + row, tq = fa_imin(t, T - 1);
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    const float *kb = k + (size_t)b * T * ks + (size_t)kh * hd, *vb = v + (size_t)b * T * ks + (size_t)kh * hd;
    size_t qoff = ((size_t)b * T + tq) * qs + (size_t)h * hd;

    float4 qr[FA_V4], dor[FA_V4], acc[FA_V4];
    fa_load_row<R>(qr, q + qoff, hd, r);
    fa_load_row<R>(dor, dout + qoff, hd, r);
    fa_load_row<R>(acc, out + qoff, hd, r);  // acc holds O for a moment
    float dl = 0.0f;
#pragma unroll
    for (int c = 0; c < FA_V4; c++) {
        dl = fa_dot4(dl, dor[c], acc[c]);
        acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    dl = fa_row_sum<R>(dl);
    size_t lrow = ((size_t)b * nh + h) * T;
    float lt = lse[lrow + tq];
    if (t < T && r == 0) delta[lrow + t] = dl;  // read by flash_bwd_dkv_kernel, launched after this one

    int kend = fa_imin(q0 + S::ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        __syncthreads();
        fa_load_tile<HDM, FA_BK, S::NT>(Ks, kb + (size_t)k0 * ks, ks, T - k0, hd);
        fa_load_tile<HDM, FA_BK, S::NT>(Vs, vb + (size_t)k0 * ks, ks, T - k0, hd);
        __syncthreads();
#pragma unroll
        for (int j0 = 0; j0 < FA_BK; j0 += FA_CH_Q) {
            float s[FA_CH_Q], dp[FA_CH_Q];
#pragma unroll
            for (int j = 0; j < FA_CH_Q; j++) {
                float a = 0.0f, e = 0.0f;
#pragma unroll
                for (int c = 0; c < FA_V4; c++) {
                    a = fa_dot4(a, qr[c], Ks[j0 + j][r + R * c]);
                    e = fa_dot4(e, dor[c], Vs[j0 + j][r + R * c]);
                }
                s[j] = a;
                dp[j] = e;
            }
#pragma unroll
            for (int j = 0; j < FA_CH_Q; j++) {
                s[j] = fa_row_sum<R>(s[j]);
                dp[j] = fa_row_sum<R>(dp[j]);
            }
#pragma unroll
            for (int j = 0; j < FA_CH_Q; j++) {
                float p = k0 + j0 + j <= tq ? expf(s[j] * scale - lt) : 0.0f;
                float ds = p * (dp[j] - dl) * scale;
#pragma unroll
                for (int c = 0; c < FA_V4; c++) fa_axpy4(acc[c], ds, fa_lds4(&Ks[j0 + j][r + R * c]));
            }
        }
    }
    if (t < T) fa_store_row<R, true>(dq + qoff, acc, hd, r);
}

// ---- backward: dk, dv ----------------------------------------------------------------------------------
template <int HDM>
__global__ void __launch_bounds__(FaShape<HDM>::NT, FaShape<HDM>::MINB)
    flash_bwd_dkv_kernel(float *__restrict__ dk, float *__restrict__ dv, const float *__restrict__ dout,
                         const float *__restrict__ lse, const float *__restrict__ delta,
                         const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v, int B,
                         int T, int nh, int nkv, int hd, float scale) {
    typedef FaShape<HDM> S;
    constexpr int R = S::R;
    __shared__ float4 Qs[FA_BQ][S::W4], Ds[FA_BQ][S::W4];
    __shared__ float Ls[FA_BQ], Es[FA_BQ];  // lse and delta of the tile's query rows
    int bk = blockIdx.x % (B * nkv), tile = (int)(blockIdx.x / (B * nkv));  // first key tiles see most queries
    int kh = bk % nkv, b = bk / nkv, grp = nh / nkv;
    int row = threadIdx.x / R, r = threadIdx.x % R;
    int k0 = tile * S::ROWS, u = k0 + row, uk = fa_imin(u, T - 1);
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    size_t koff = ((size_t)b * T + uk) * ks + (size_t)kh * hd;

    float4 kr[FA_V4], vr[FA_V4], dka[FA_V4], dva[FA_V4];
    fa_load_row<R>(kr, k + koff, hd, r);
    fa_load_row<R>(vr, v + koff, hd, r);
#pragma unroll
    for (int c = 0; c < FA_V4; c++) {
        dka[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        dva[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int g = 0; g < grp; g++) {
        int h = kh * grp + g;
        const float *qb = q + (size_t)b * T * qs + (size_t)h * hd, *db = dout + (size_t)b * T * qs + (size_t)h * hd;
        size_t lrow = ((size_t)b * nh + h) * T;
        for (int q0 = k0 - k0 % FA_BQ; q0 < T; q0 += FA_BQ) {  // queries before k0 see none of these keys
            __syncthreads();
            fa_load_tile<HDM, FA_BQ, S::NT>(Qs, qb + (size_t)q0 * qs, qs, T - q0, hd);
            fa_load_tile<HDM, FA_BQ, S::NT>(Ds, db + (size_t)q0 * qs, qs, T - q0, hd);
            for (int i = threadIdx.x; i < FA_BQ; i += S::NT) {
                Ls[i] = q0 + i < T ? lse[lrow + q0 + i] : 0.0f;
                Es[i] = q0 + i < T ? delta[lrow + q0 + i] : 0.0f;
            }
            __syncthreads();
#pragma unroll 1
            for (int i0 = 0; i0 < FA_BQ; i0 += FA_CH_KV) {
                float s[FA_CH_KV], dp[FA_CH_KV];
#pragma unroll
                for (int j = 0; j < FA_CH_KV; j++) {
                    float a = 0.0f, e = 0.0f;
#pragma unroll
                    for (int c = 0; c < FA_V4; c++) {
                        a = fa_dot4(a, kr[c], Qs[i0 + j][r + R * c]);
                        e = fa_dot4(e, vr[c], Ds[i0 + j][r + R * c]);
                    }
                    s[j] = a;
                    dp[j] = e;
                }
#pragma unroll
                for (int j = 0; j < FA_CH_KV; j++) {
                    s[j] = fa_row_sum<R>(s[j]);
                    dp[j] = fa_row_sum<R>(dp[j]);
                }
#pragma unroll
                for (int j = 0; j < FA_CH_KV; j++) {
                    int i = q0 + i0 + j;
                    float p = uk <= i && i < T ? expf(s[j] * scale - Ls[i0 + j]) : 0.0f;
                    float ds = p * (dp[j] - Es[i0 + j]) * scale;
#pragma unroll
                    for (int c = 0; c < FA_V4; c++) {
                        fa_axpy4(dva[c], p, fa_lds4(&Ds[i0 + j][r + R * c]));
                        fa_axpy4(dka[c], ds, fa_lds4(&Qs[i0 + j][r + R * c]));
                    }
                }
            }
        }
    }
    if (u < T) {
        fa_store_row<R, true>(dk + koff, dka, hd, r);
        fa_store_row<R, true>(dv + koff, dva, hd, r);
    }
}

// ---- host ----------------------------------------------------------------------------------------------
extern "C" int attention_flash_supported(int T, int hd) { return T >= 1 && hd >= 1 && hd <= 128; }

// sizes the kernels take, and the grid of `rows`-row tiles over B*heads (<= 2^31-1 blocks)
static int fa_check_args(const char *fn, int B, int T, int nh, int nkv, int hd) {
    if (B < 0 || nh < 1 || nkv < 1 || nh % nkv != 0)
        return DFM_FAIL(DFM_EARG, "%s: B=%d nh=%d nkv=%d: need B >= 0, nh, nkv >= 1 and nh %% nkv == 0", fn, B, nh,
                        nkv);
    if (!attention_flash_supported(T, hd))
        return DFM_FAIL(DFM_EARG,
                        "%s: T=%d hd=%d not supported (needs T >= 1, 1 <= hd <= 128). HINT: check "
                        "attention_flash_supported() and use attention_forward_cuda/attention_backward_cuda",
                        fn, T, hd);
    long long blocks = (long long)B * nh * ((T + 31) / 32);
    if (blocks > 2147483647LL)
        return DFM_FAIL(DFM_EARG, "%s: B=%d nh=%d T=%d need %lld blocks, over the grid limit", fn, B, nh, T, blocks);
    return DFM_OK;
}

template <int HDM>
static int fa_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T, int nh,
                      int nkv, int hd, cudaStream_t stream) {
    typedef FaShape<HDM> S;
    unsigned grid = (unsigned)B * nh * ((T + S::ROWS - 1) / S::ROWS);
    float scale = 1.0f / sqrtf((float)hd);
    flash_fwd_kernel<HDM><<<grid, S::NT, 0, stream>>>(out, lse, q, k, v, B, T, nh, nkv, hd, scale);
    LAUNCH_CHECK("flash_fwd_kernel");
    return DFM_OK;
}

template <int HDM>
static int fa_backward(float *dq, float *dk, float *dv, float *delta, const float *dout, const float *out,
                       const float *lse, const float *q, const float *k, const float *v, int B, int T, int nh,
                       int nkv, int hd, cudaStream_t stream) {
    typedef FaShape<HDM> S;
    int ntiles = (T + S::ROWS - 1) / S::ROWS;
    float scale = 1.0f / sqrtf((float)hd);
    flash_bwd_dq_kernel<HDM><<<(unsigned)B * nh * ntiles, S::NT, 0, stream>>>(dq, delta, dout, out, lse, q, k, v, B,
                                                                              T, nh, nkv, hd, scale);
    LAUNCH_CHECK("flash_bwd_dq_kernel");
    flash_bwd_dkv_kernel<HDM><<<(unsigned)B * nkv * ntiles, S::NT, 0, stream>>>(dk, dv, dout, lse, delta, q, k, v,
                                                                                B, T, nh, nkv, hd, scale);
    LAUNCH_CHECK("flash_bwd_dkv_kernel");
    return DFM_OK;
}

extern "C" int attention_flash_forward_cuda(float *out, float *lse, const float *q, const float *k, const float *v,
                                            int B, int T, int nh, int nkv, int hd, cudaStream_t stream) {
    DFM_TRY(fa_check_args("attention_flash_forward_cuda", B, T, nh, nkv, hd));
    if (B == 0) return DFM_OK;
    if (hd <= 32) return fa_forward<32>(out, lse, q, k, v, B, T, nh, nkv, hd, stream);
    if (hd <= 64) return fa_forward<64>(out, lse, q, k, v, B, T, nh, nkv, hd, stream);
    return fa_forward<128>(out, lse, q, k, v, B, T, nh, nkv, hd, stream);
}

extern "C" int attention_flash_backward_cuda(float *dq, float *dk, float *dv, float *delta, const float *dout,
                                             const float *out, const float *lse, const float *q, const float *k,
                                             const float *v, int B, int T, int nh, int nkv, int hd,
                                             cudaStream_t stream) {
    DFM_TRY(fa_check_args("attention_flash_backward_cuda", B, T, nh, nkv, hd));
    if (B == 0) return DFM_OK;
    if (hd <= 32) return fa_backward<32>(dq, dk, dv, delta, dout, out, lse, q, k, v, B, T, nh, nkv, hd, stream);
    if (hd <= 64) return fa_backward<64>(dq, dk, dv, delta, dout, out, lse, q, k, v, B, T, nh, nkv, hd, stream);
    return fa_backward<128>(dq, dk, dv, delta, dout, out, lse, q, k, v, B, T, nh, nkv, hd, stream);
}
