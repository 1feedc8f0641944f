/* bert_gemm.c — packed-panel SGEMM of the CPU encoder (see bert_gemm.h). */
#include "encoder/bert_gemm.h"

#include "encoder/bert.h" /* dfm_erf_approx */

#include "common/error.h"

#include <cblas.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC optimize("O3")

/* AVX-512: 8 rows x 32 columns = 16 zmm accumulators; per k two panel loads and 8 broadcasts feed 16
 * FMAs (FMA-bound on two FMA ports). AVX2: 6 x 16 = 12 ymm accumulators. */
#define MR512 8
#define NR512 32
#define MR256 6
#define NR256 16

static int isa_nr(int isa) { return isa == BERT_ISA_AVX512 ? NR512 : NR256; }
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

int bert_gemm_pack(bert_gemm_w *p, const float *w, int n, int k, int isa) {
    memset(p, 0, sizeof *p);
    p->n = n, p->k = k, p->isa = isa, p->w = w;
    if (isa == BERT_ISA_BLAS) return DFM_OK;
    int nr = isa_nr(isa), np = (n + nr - 1) / nr;
    size_t bytes = (size_t)np * k * nr * sizeof(float);
    p->panels = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p->panels) return DFM_FAIL(DFM_ENOMEM, "no memory to pack a %d x %d encoder weight (%zu MB)", n, k, bytes >> 20);
    for (int j = 0; j < np; j++)
        for (int kk = 0; kk < k; kk++) {
            float *dst = p->panels + ((size_t)j * k + kk) * nr;
            for (int c = 0; c < nr; c++) {
                int col = j * nr + c;
                dst[c] = col < n ? w[(size_t)col * k + kk] : 0.0f;
            }
        }
    return DFM_OK;
}

void bert_gemm_free(bert_gemm_w *p) {
    free(p->panels);
    p->panels = NULL;
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

void bert_gemm(float *out, const float *inp, int m, const bert_gemm_w *p, const float *bias, int act) {
    int n = p->n, k = p->k;
    if (p->isa == BERT_ISA_BLAS) {
        for (int r = 0; r < m; r++) memcpy(out + (size_t)r * n, bias, n * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, inp, k, p->w, k, 1.0f, out, n);
        if (act == BERT_ACT_GELU)
            for (size_t i = 0; i < (size_t)m * n; i++) out[i] = gelu1(out[i]);
        return;
    }
    int mr = isa_mr(p->isa), nr = isa_nr(p->isa), nb = (m + mr - 1) / mr, np = (n + nr - 1) / nr;
    /* each panel once from memory, reused by every MR-row block of the tile */
    for (int j = 0; j < np; j++) {
        const float *B = p->panels + (size_t)j * k * nr;
        int cols = n - j * nr < nr ? n - j * nr : nr;
        for (int b = 0; b < nb; b++) {
            int rows = m - b * mr < mr ? m - b * mr : mr;
            const float *a[MR512];
            for (int r = 0; r < mr; r++) a[r] = inp + (size_t)(b * mr + (r < rows ? r : 0)) * k;
            float *C = out + (size_t)b * mr * n + (size_t)j * nr;
            const float *pf = b == 0 && j + 1 < np ? B + (size_t)k * nr : NULL;
            if (p->isa == BERT_ISA_AVX512)
                kernel_avx512(a, B, k, C, n, bias + j * nr, rows, cols, pf, act);
            else
                kernel_avx2(a, B, k, C, n, bias + j * nr, rows, cols, pf, act);
        }
    }
}
