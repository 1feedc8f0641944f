/* bert_gemm.c — packed-panel SGEMM of the CPU encoder (see bert_gemm.h). */
#include "encoder/bert_gemm.h"

#include "encoder/bert.h" /* dfm_erf_approx */

#include "common/error.h"

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("O3")

/* AVX-512: 8 rows x 32 columns = 16 zmm accumulators; per k two panel loads and 8 broadcasts feed 16
 * FMAs (FMA-bound on two FMA ports). AVX2: 6 x 16 = 12 ymm accumulators. */
#define MR512 8
#define NR512 32
#define MR256 6
#define NR256 16

#define ROUND_UP(x, m) (((x) + (m) - 1) / (m) * (m))

static int isa_nr(int isa) { return isa == BERT_ISA_AVX512 ? NR512 : NR256; }
/* inputs per 32-bit lane of a packed weight: 1 fp32, 2 bf16, 4 int8 */
static int prec_group(int prec) { return prec == BERT_PREC_BF16 ? 2 : prec == BERT_PREC_INT8 ? 4 : 1; }
/* a scratch row of converted inputs: k rounded up to 64 elements (whole vectors, the padding converted zeros) */
static size_t scratch_row(int k) { return ROUND_UP((size_t)k, 64); }
static int isa_mr(int isa) { return isa == BERT_ISA_AVX512 ? MR512 : MR256; }

/* GELU (erf form) of one value, the arithmetic of dfm_erf_approx; the AVX-512 form below does the same
 * IEEE operations lane by lane (no FMA contraction in this file), so both kernels agree bit for bit. */
static inline float gelu1(float y) { return 0.5f * y * (1.0f + dfm_erf_approx(y * 0.70710678118654752f)); }

__attribute__((target("avx512f"), always_inline)) static inline __m512 gelu16(__m512 y) {
    __m512 x = y * 0.70710678118654752f;
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(4.f)), _mm512_set1_ps(-4.f));
    __m512 x2 = x * x;
    __m512 p = _mm512_set1_ps(-2.72614225801306e-10f);
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 + -2.10102402082508e-06f;
    p = p * x2 + -5.69250639462346e-05f;
    p = p * x2 + -7.34990630326855e-04f;
    p = p * x2 + -2.95459980854025e-03f;
    p = p * x2 + -1.60960333262415e-02f;
    p = p * x;
    __m512 q = _mm512_set1_ps(-1.45660718464996e-05f);
    q = q * x2 + -2.13374055278905e-04f;
    q = q * x2 + -1.68282697438203e-03f;
    q = q * x2 + -7.37332916720468e-03f;
    q = q * x2 + -1.42647390514189e-02f;
    return 0.5f * y * (1.0f + p / q);
}

int bert_gemm_isa(void) {
    __builtin_cpu_init(); /* libgcc's checks include the OS's saved-state support (XGETBV) */
    int avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *want = getenv("DFM_ENCODER_ISA");
    if (want && !strcmp(want, "blas")) return BERT_ISA_BLAS;
    if (want && !strcmp(want, "avx2") && avx2) return BERT_ISA_AVX2;
    return avx512 ? BERT_ISA_AVX512 : avx2 ? BERT_ISA_AVX2 : BERT_ISA_BLAS;
}

const char *bert_gemm_isa_name(int isa) {
    return isa == BERT_ISA_AVX512 ? "avx512" : isa == BERT_ISA_AVX2 ? "avx2" : "blas";
}

int bert_gemm_prec_check(int isa, int prec) {
    if (prec == BERT_PREC_F32) return DFM_OK;
    const char *name = prec == BERT_PREC_BF16 ? "bf16" : prec == BERT_PREC_INT8 ? "int8" : NULL;
    if (!name) return DFM_FAIL(DFM_EARG, "encoder GEMM precision %d is not fp32, bf16 or int8", prec);
    const char *need = prec == BERT_PREC_BF16 ? "avx512_bf16 (vdpbf16ps)" : "avx512_vnni and avx512bw (vpdpbusd)";
    __builtin_cpu_init();
    int has = prec == BERT_PREC_BF16 ? __builtin_cpu_supports("avx512bf16")
                                     : __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
    if (isa != BERT_ISA_AVX512 || !has)
        return DFM_FAIL(DFM_EUNSUPPORTED, "--precision %s needs AVX-512 with %s; %s. HINT: use --precision fp32 on this "
                        "machine (or a CPU with %s: Intel Cooper Lake / Sapphire Rapids or later, AMD Zen 4 or later)",
                        name, need, isa != BERT_ISA_AVX512 ? "the GEMM kernel here is not AVX-512 (DFM_ENCODER_ISA or the CPU)"
                                                         : "this CPU does not have it", need);
    return DFM_OK;
}

/* fp32 to bf16, round to nearest even (NaN stays NaN), as vcvtne2ps2bf16 does */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

int bert_gemm_pack(bert_gemm_w *p, const float *w, int n, int k, int isa, int prec) {
    memset(p, 0, sizeof *p);
    p->n = n, p->k = k, p->isa = isa, p->prec = prec, p->w = w;
    DFM_TRY(bert_gemm_prec_check(isa, prec));
    if (isa == BERT_ISA_BLAS) return DFM_OK;
    int g = prec_group(prec), nr = isa_nr(isa), np = (n + nr - 1) / nr;
    size_t esz = prec == BERT_PREC_F32 ? 4 : prec == BERT_PREC_BF16 ? 2 : 1;
    p->kp = ROUND_UP(k, g);
    size_t bytes = (size_t)np * p->kp * nr * esz;
    p->panels = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (prec == BERT_PREC_INT8) {
        p->wscale = calloc((size_t)np * nr, sizeof *p->wscale);
        p->colsum = calloc((size_t)np * nr, sizeof *p->colsum);
    }
    if (!p->panels || (prec == BERT_PREC_INT8 && (!p->wscale || !p->colsum))) {
        bert_gemm_free(p);
        return DFM_FAIL(DFM_ENOMEM, "no memory to pack a %d x %d encoder weight (%zu MB)", n, k, bytes >> 20);
    }
    /* element (column col, input kk) sits in panel col / nr at group kk / g, lane col % nr, slot kk % g */
    for (int j = 0; j < np; j++)
        for (int c = 0; c < nr; c++) {
            int col = j * nr + c;
            const float *wr = col < n ? w + (size_t)col * k : NULL;
            float amax = 0, inv = 0;
            if (prec == BERT_PREC_INT8 && wr) {
                for (int kk = 0; kk < k; kk++) amax = fabsf(wr[kk]) > amax ? fabsf(wr[kk]) : amax;
                p->wscale[col] = amax / 127.0f;
                inv = amax > 0 ? 127.0f / amax : 0.0f;
            }
            int32_t sum = 0;
            for (int kk = 0; kk < p->kp; kk++) {
                float v = wr && kk < k ? wr[kk] : 0.0f;
                size_t at = (((size_t)j * (p->kp / g) + kk / g) * nr + c) * g + kk % g;
                if (prec == BERT_PREC_F32) {
                    ((float *)p->panels)[at] = v;
                } else if (prec == BERT_PREC_BF16) {
                    ((uint16_t *)p->panels)[at] = to_bf16(v);
                } else {
                    long q = lrintf(v * inv);
                    q = q > 127 ? 127 : q < -127 ? -127 : q;
                    ((int8_t *)p->panels)[at] = (int8_t)q;
                    sum += (int32_t)q;
                }
            }
            if (prec == BERT_PREC_INT8) p->colsum[col] = sum;
        }
    return DFM_OK;
}

size_t bert_gemm_scratch_bytes(int m, int k, int prec) {
    if (prec == BERT_PREC_BF16) return (size_t)m * scratch_row(k) * 2;
    if (prec == BERT_PREC_INT8) return (size_t)m * scratch_row(k) + (size_t)m * (sizeof(float) + sizeof(int32_t));
    return 0;
}

void bert_gemm_free(bert_gemm_w *p) {
    free(p->panels);
    free(p->wscale);
    free(p->colsum);
    p->panels = NULL, p->wscale = NULL, p->colsum = NULL;
}

/* C[r, :cols] = act(c[r] + bias) for the first rows rows of an AVX-512 tile's accumulators (every kernel's
 * last step, in fp32) */
__attribute__((target("avx512f"), always_inline)) static inline void store_tile512(float *restrict C, int ldc, const __m512 *c0,
                                                                                   const __m512 *c1, const float *restrict bias,
                                                                                   int rows, int cols, int act) {
    __mmask16 m0 = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
    __mmask16 m1 = cols >= 32 ? 0xffff : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    __m512 bb0 = _mm512_maskz_loadu_ps(m0, bias), bb1 = _mm512_maskz_loadu_ps(m1, bias + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++)
        if (r < rows) {
            __m512 y0 = _mm512_add_ps(c0[r], bb0), y1 = _mm512_add_ps(c1[r], bb1);
            if (act == BERT_ACT_GELU) y0 = gelu16(y0), y1 = gelu16(y1);
            _mm512_mask_storeu_ps(C + (size_t)r * ldc, m0, y0);
            _mm512_mask_storeu_ps(C + (size_t)r * ldc + 16, m1, y1);
        }
}

/* C[rows, cols] = A[rows, k] · B_panel[k][NR] + bias, rows <= MR, cols <= NR; A rows at a[0..MR) (rows past
 * `rows` repeat a real one and are not stored). pf: the next panel, fetched into L2 alongside (or NULL):
 * the weights come from L3 or memory, and a tile's first pass over a panel would otherwise wait on them. */
__attribute__((target("avx512f,fma"))) static void kernel_avx512(const float *const a[MR512], const float *restrict B, int k,
                                                                   float *restrict C, int ldc, const float *restrict bias,
                                                                   int rows, int cols, const float *pf, int act) {
    __m512 c0[MR512], c1[MR512];
    const float *ar[MR512];
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) c0[r] = c1[r] = _mm512_setzero_ps(), ar[r] = a[r];
    for (int kk = 0; kk < k; kk++) {
        __m512 b0 = _mm512_load_ps(B + (size_t)kk * NR512), b1 = _mm512_load_ps(B + (size_t)kk * NR512 + 16);
        if (pf) {
            _mm_prefetch((const char *)(pf + (size_t)kk * NR512), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + (size_t)kk * NR512 + 16), _MM_HINT_T1);
        }
#pragma GCC unroll 16
        for (int r = 0; r < MR512; r++) {
            __m512 av = _mm512_set1_ps(ar[r][kk]);
            c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
        }
    }
    store_tile512(C, ldc, c0, c1, bias, rows, cols, act);
}

__attribute__((target("avx2,fma"))) static void kernel_avx2(const float *const a[MR256], const float *restrict B, int k,
                                                             float *restrict C, int ldc, const float *restrict bias,
                                                             int rows, int cols, const float *pf, int act) {
    __m256 c0[MR256], c1[MR256];
    const float *ar[MR256];
#pragma GCC unroll 6
    for (int r = 0; r < MR256; r++) c0[r] = c1[r] = _mm256_setzero_ps(), ar[r] = a[r];
    for (int kk = 0; kk < k; kk++) {
        __m256 b0 = _mm256_load_ps(B + (size_t)kk * NR256), b1 = _mm256_load_ps(B + (size_t)kk * NR256 + 8);
        if (pf) _mm_prefetch((const char *)(pf + (size_t)kk * NR256), _MM_HINT_T1);
#pragma GCC unroll 6
        for (int r = 0; r < MR256; r++) {
            __m256 av = _mm256_broadcast_ss(ar[r] + kk);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    float t[MR256][NR256] __attribute__((aligned(32)));
#pragma GCC unroll 6
    for (int r = 0; r < MR256; r++) {
        _mm256_store_ps(t[r], c0[r]);
        _mm256_store_ps(t[r] + 8, c1[r]);
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float y = t[r][c] + bias[c];
            C[(size_t)r * ldc + c] = act == BERT_ACT_GELU ? gelu1(y) : y;
        }
}

/* The bf16 tile: A rows are bf16 (kp of them, pairs at a[r] + 2 kk), B a bf16 panel [kp / 2][NR][2]; one
 * vdpbf16ps adds the two products of a pair to each fp32 lane. */
__attribute__((target("avx512f,avx512bf16"))) static void kernel_bf16(const uint16_t *const a[MR512], const uint16_t *restrict B,
                                                                       int kp, float *restrict C, int ldc, const float *restrict bias,
                                                                       int rows, int cols, const uint16_t *pf, int act) {
    __m512 c0[MR512], c1[MR512];
    const uint16_t *ar[MR512];
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) c0[r] = c1[r] = _mm512_setzero_ps(), ar[r] = a[r];
    for (int kk = 0; kk < kp / 2; kk++) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(B + (size_t)kk * 2 * NR512),
                 b1 = (__m512bh)_mm512_load_si512(B + (size_t)kk * 2 * NR512 + 32);
        if (pf) {
            _mm_prefetch((const char *)(pf + (size_t)kk * 2 * NR512), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + (size_t)kk * 2 * NR512 + 32), _MM_HINT_T1);
        }
#pragma GCC unroll 16
        for (int r = 0; r < MR512; r++) {
            int32_t pair;
            memcpy(&pair, ar[r] + 2 * kk, 4);
            __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
            c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
        }
    }
    store_tile512(C, ldc, c0, c1, bias, rows, cols, act);
}

/* The int8 tile: A rows are u8 with a scale and zero point per row (rs, rz), B an s8 panel [kp / 4][NR][4]
 * with a scale and weight sum per column (ws, cs); one vpdpbusd adds four u8 x s8 products to each int32
 * lane, exactly. Then y = (acc - zp * colsum) * row scale * column scale, in fp32. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void kernel_int8(const uint8_t *const a[MR512], const int8_t *restrict B,
                                                                               int kp, float *restrict C, int ldc, const float *restrict bias,
                                                                               const float *rs, const int32_t *rz, const float *ws,
                                                                               const int32_t *cs, int rows, int cols, const int8_t *pf, int act) {
    __m512i c0[MR512], c1[MR512];
    const uint8_t *ar[MR512];
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) c0[r] = c1[r] = _mm512_setzero_si512(), ar[r] = a[r];
    for (int kk = 0; kk < kp / 4; kk++) {
        __m512i b0 = _mm512_load_si512(B + (size_t)kk * 4 * NR512), b1 = _mm512_load_si512(B + (size_t)kk * 4 * NR512 + 64);
        if (pf) {
            _mm_prefetch((const char *)(pf + (size_t)kk * 4 * NR512), _MM_HINT_T1);
            _mm_prefetch((const char *)(pf + (size_t)kk * 4 * NR512 + 64), _MM_HINT_T1);
        }
#pragma GCC unroll 16
        for (int r = 0; r < MR512; r++) {
            int32_t quad;
            memcpy(&quad, ar[r] + 4 * kk, 4);
            __m512i av = _mm512_set1_epi32(quad);
            c0[r] = _mm512_dpbusd_epi32(c0[r], av, b0);
            c1[r] = _mm512_dpbusd_epi32(c1[r], av, b1);
        }
    }
    __m512 f0[MR512], f1[MR512];
    __m512 ws0 = _mm512_loadu_ps(ws), ws1 = _mm512_loadu_ps(ws + 16);
    __m512i cs0 = _mm512_loadu_si512(cs), cs1 = _mm512_loadu_si512(cs + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR512; r++) {
        __m512i z = _mm512_set1_epi32(rz[r < rows ? r : 0]);
        __m512 sc = _mm512_set1_ps(rs[r < rows ? r : 0]);
        f0[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c0[r], _mm512_mullo_epi32(z, cs0))), _mm512_mul_ps(sc, ws0));
        f1[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(c1[r], _mm512_mullo_epi32(z, cs1))), _mm512_mul_ps(sc, ws1));
    }
    store_tile512(C, ldc, f0, f1, bias, rows, cols, act);
}

/* m input rows of k floats into bf16 rows of scratch_row(k) (round to nearest even; the tail zeros) */
__attribute__((target("avx512f,avx512bf16"))) static void rows_to_bf16(uint16_t *dst, const float *inp, int m, int k) {
    size_t ld = scratch_row(k);
    for (int r = 0; r < m; r++)
        for (int kk = 0; kk < (int)ld; kk += 32) {
            __mmask16 lo = kk >= k ? 0 : k - kk >= 16 ? 0xffff : (__mmask16)((1u << (k - kk)) - 1);
            __mmask16 hi = kk + 16 >= k ? 0 : k - kk - 16 >= 16 ? 0xffff : (__mmask16)((1u << (k - kk - 16)) - 1);
            const float *x = inp + (size_t)r * k + kk;
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x));
            _mm512_store_si512(dst + (size_t)r * ld + kk, (__m512i)v);
        }
}

/* m input rows of k floats into u8 rows of scratch_row(k), each with its own scale and zero point:
 * lo = min(row, 0), hi = max(row, 0), scale = (hi - lo) / 255 (1 for a row of zeros), zp = round(-lo / scale),
 * q = clamp(round(x / scale) + zp, 0, 255), rounding to nearest even; the tail holds zp (times zero weights) */
__attribute__((target("avx512f,avx512bw"))) static void rows_to_u8(uint8_t *dst, float *scale, int32_t *zp, const float *inp, int m, int k) {
    size_t ld = scratch_row(k);
    for (int r = 0; r < m; r++) {
        const float *x = inp + (size_t)r * k;
        __m512 lo = _mm512_setzero_ps(), hi = lo;
        for (int kk = 0; kk < k; kk += 16) {
            __mmask16 mk = k - kk >= 16 ? 0xffff : (__mmask16)((1u << (k - kk)) - 1);
            __m512 v = _mm512_maskz_loadu_ps(mk, x + kk);
            lo = _mm512_min_ps(lo, v), hi = _mm512_max_ps(hi, v);
        }
        float l = _mm512_reduce_min_ps(lo), h = _mm512_reduce_max_ps(hi);
        float s = (h - l) / 255.0f;
        if (!(s > 0)) s = 1.0f;
        float z = nearbyintf(-l / s);
        z = z < 0 ? 0 : z > 255 ? 255 : z;
        scale[r] = s, zp[r] = (int32_t)z;
        __m512 inv = _mm512_set1_ps(1.0f / s);
        __m512i zv = _mm512_set1_epi32((int32_t)z), zero = _mm512_setzero_si512();
        for (int kk = 0; kk < (int)ld; kk += 16) {
            __mmask16 mk = kk >= k ? 0 : k - kk >= 16 ? 0xffff : (__mmask16)((1u << (k - kk)) - 1);
            __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(mk, x + kk), inv)), zv);
            _mm_store_si128((__m128i *)(dst + (size_t)r * ld + kk), _mm512_cvtusepi32_epi8(_mm512_max_epi32(q, zero)));
        }
    }
}

void bert_gemm(float *out, const float *inp, int m, const bert_gemm_w *p, const float *bias, int act, void *scratch) {
    int n = p->n, k = p->k;
    if (p->isa == BERT_ISA_BLAS) {
        for (int r = 0; r < m; r++) memcpy(out + (size_t)r * n, bias, n * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, inp, k, p->w, k, 1.0f, out, n);
        if (act == BERT_ACT_GELU)
            for (size_t i = 0; i < (size_t)m * n; i++) out[i] = gelu1(out[i]);
        return;
    }
    /* the input rows as the kernel reads them: fp32 in place, or converted into scratch */
    size_t ld = scratch_row(k);
    uint8_t *q8 = scratch;
    float *rs = NULL;
    int32_t *rz = NULL;
    if (p->prec == BERT_PREC_BF16) rows_to_bf16(scratch, inp, m, k);
    if (p->prec == BERT_PREC_INT8) {
        rs = (float *)(q8 + (size_t)m * ld), rz = (int32_t *)(rs + m);
        rows_to_u8(q8, rs, rz, inp, m, k);
    }
    size_t esz = p->prec == BERT_PREC_F32 ? 4 : p->prec == BERT_PREC_BF16 ? 2 : 1;
    int mr = isa_mr(p->isa), nr = isa_nr(p->isa), nb = (m + mr - 1) / mr, np = (n + nr - 1) / nr;
    size_t panel = (size_t)p->kp * nr * esz; /* bytes */
    /* each panel once from memory, reused by every MR-row block of the tile */
    for (int j = 0; j < np; j++) {
        const char *B = (const char *)p->panels + (size_t)j * panel;
        int cols = n - j * nr < nr ? n - j * nr : nr;
        for (int b = 0; b < nb; b++) {
            int rows = m - b * mr < mr ? m - b * mr : mr;
            const void *a[MR512];
            for (int r = 0; r < mr; r++) {
                size_t row = (size_t)(b * mr + (r < rows ? r : 0));
                a[r] = p->prec == BERT_PREC_F32 ? (const void *)(inp + row * k)
                       : p->prec == BERT_PREC_BF16 ? (const void *)((const uint16_t *)scratch + row * ld)
                                                   : (const void *)(q8 + row * ld);
            }
            float *C = out + (size_t)b * mr * n + (size_t)j * nr;
            const void *pf = b == 0 && j + 1 < np ? B + panel : NULL;
            if (p->prec == BERT_PREC_BF16)
                kernel_bf16((const uint16_t *const *)a, (const uint16_t *)B, p->kp, C, n, bias + j * nr, rows, cols, pf, act);
            else if (p->prec == BERT_PREC_INT8)
                kernel_int8((const uint8_t *const *)a, (const int8_t *)B, p->kp, C, n, bias + j * nr, rs + b * mr, rz + b * mr,
                            p->wscale + j * nr, p->colsum + j * nr, rows, cols, pf, act);
            else if (p->isa == BERT_ISA_AVX512)
                kernel_avx512((const float *const *)a, (const float *)B, k, C, n, bias + j * nr, rows, cols, pf, act);
            else
                kernel_avx2((const float *const *)a, (const float *)B, k, C, n, bias + j * nr, rows, cols, pf, act);
        }
    }
}
