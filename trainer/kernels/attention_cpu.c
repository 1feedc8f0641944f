/* attention_cpu.c — causal GQA attention with AVX-512 FMA kernels (see attention_cpu.h). */
#include "trainer/kernels/attention_cpu.h"

#include "trainer/kernels/vecmath.h"

#include <math.h>
#include <string.h>

/* Per (sequence, KV head) and its query heads in order (dK and dV of a KV head sum its query heads in a fixed
 * order; threads take whole (sequence, KV head) items), in blocks of ATT_RB = 8 query rows: a block's scores
 * go up to its last row's diagonal (rounded up to 16 columns, masked stores), so the causal square is
 * computed to within an 8-row staircase. Scores are rows of K^T (K packed transposed once per item,
 * [hd][T16]), dP likewise with V^T; the products with P and dS stream V, K, Q and dO rows in place, and dK,
 * dV take each block's rank-8 update in row order. No [T, T] matrix: the forward keeps each row's
 * log-sum-exp and the backward recomputes the block's probabilities from it. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define ATT_RB 8
#define AVX512 __attribute__((target("avx512f")))

/* out[r][j] (+)= alpha * sum_{d < n} a[r][d] * b[d][j] for r < R (<= ATT_RB) and j < ncol (accumulate: add
 * to out, else overwrite); rows of a every lda, of b every ldb, of out every ldo. Scores: a = Q rows, b = K^T;
 * products: a = P or dS rows, b = V or K rows. */
AVX512 static void att_gemm(float *out, size_t ldo, const float *a, size_t lda, const float *b, size_t ldb, int R,
                            int ncol, int n, float alpha, int accumulate) {
    const float *ar[ATT_RB];
#pragma GCC unroll 8
    for (int r = 0; r < ATT_RB; r++) ar[r] = a + (size_t)(r < R ? r : 0) * lda;
    __m512 al = _mm512_set1_ps(alpha);
    for (int j = 0; j < ncol; j += 32) {
        __mmask16 m0 = ncol - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (ncol - j)) - 1);
        __mmask16 m1 = ncol - j >= 32 ? (__mmask16)0xFFFF : ncol - j <= 16 ? 0 : (__mmask16)((1u << (ncol - j - 16)) - 1);
        __m512 acc[ATT_RB][2];
#pragma GCC unroll 8
        for (int r = 0; r < ATT_RB; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int d = 0; d < n; d++) {
            const float *bd = b + (size_t)d * ldb + j;
            __m512 b0 = _mm512_maskz_loadu_ps(m0, bd), b1 = _mm512_maskz_loadu_ps(m1, bd + 16);
#pragma GCC unroll 8
            for (int r = 0; r < ATT_RB; r++) {
                __m512 x = _mm512_set1_ps(ar[r][d]);
                acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < ATT_RB; r++)
            if (r < R) {
                float *o = out + r * ldo + j;
                __m512 y0 = _mm512_mul_ps(acc[r][0], al), y1 = _mm512_mul_ps(acc[r][1], al);
                if (accumulate) {
                    y0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), y0);
                    y1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o + 16), y1);
                }
                _mm512_mask_storeu_ps(o, m0, y0);
                _mm512_mask_storeu_ps(o + 16, m1, y1);
            }
    }
}

/* dst[d][j] = src[j][d] for j < T (rows of src every lds), columns T..T16 zero. */
static void att_pack_t(float *dst, const float *src, size_t lds, int T, int T16, int hd) {
    for (int j0 = 0; j0 < T16; j0 += 16) /* 16 source rows at a time: each read line serves 16 columns */
        for (int d = 0; d < hd; d++) {
            float *o = dst + (size_t)d * T16 + j0;
            for (int j = 0; j < 16; j++) o[j] = j0 + j < T ? src[(size_t)(j0 + j) * lds + d] : 0.0f;
        }
}

static int att_fast(int hd) { return hd % 16 == 0 && __builtin_cpu_supports("avx512f"); }

static int att_threads(size_t work) {
#ifdef _OPENMP
    return work > 65536 ? omp_get_max_threads() : 1;
#else
    (void)work;
    return 1;
#endif
}

static int att_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* out[j][:hd] += sum_{r < R} p[r][j] * x[r][:hd] for j < n (rows of P every ldp, of X every ldx): a block's
 * rank-R update of dK or dV, each out row summing the block's rows in order. */
AVX512 static void att_outer(float *out, size_t ldo, const float *p, size_t ldp, const float *x, size_t ldx, int R,
                             int n, int hd) {
    for (int c0 = 0; c0 < hd; c0 += 32) {
        __mmask16 m1 = hd - c0 >= 32 ? (__mmask16)0xFFFF : 0;
        __m512 x0[ATT_RB], x1[ATT_RB];
        const float *pr[ATT_RB];
#pragma GCC unroll 8
        for (int r = 0; r < ATT_RB; r++) {
            __mmask16 k0 = r < R ? (__mmask16)0xFFFF : 0;
            const float *xr = x + (size_t)(r < R ? r : 0) * ldx + c0;
            x0[r] = _mm512_maskz_loadu_ps(k0, xr);
            x1[r] = _mm512_maskz_loadu_ps(k0 & m1, xr + 16);
            pr[r] = p + (size_t)(r < R ? r : 0) * ldp;
        }
        for (int j = 0; j < n; j++) {
            float *o = out + (size_t)j * ldo + c0;
            __m512 a0 = _mm512_loadu_ps(o), a1 = _mm512_maskz_loadu_ps(m1, o + 16);
#pragma GCC unroll 8
            for (int r = 0; r < ATT_RB; r++) {
                __m512 w = _mm512_set1_ps(pr[r][j]);
                a0 = _mm512_fmadd_ps(w, x0[r], a0);
                a1 = _mm512_fmadd_ps(w, x1[r], a1);
            }
            _mm512_storeu_ps(o, a0);
            _mm512_mask_storeu_ps(o + 16, m1, a1);
        }
    }
}

/* the scores of a block of R query rows against keys [0, ncol) into s [ATT_RB][T16], then the probabilities
 * of each row t (columns <= t; zero up to ncol): exp(score - max) / sum, or with lse_in exp(score - lse) */
static void att_probs(float *s, const float *qb, size_t qs, const float *kt, int T16, int i0, int R, int ncol, int hd,
                      float scale, float *lse_out, const float *lse_in) {
    att_gemm(s, T16, qb, qs, kt, T16, R, ncol, hd, scale, 0);
    for (int r = 0; r < R; r++) {
        int t = i0 + r;
        float *pr = s + (size_t)r * T16;
        if (lse_in) {
            vm_exp_sum(pr, (size_t)t + 1, lse_in[t]);
        } else {
            float mx = vm_max(pr, (size_t)t + 1), sum = vm_exp_sum(pr, (size_t)t + 1, mx);
            vm_scale(pr, (size_t)t + 1, 1.0f / sum);
            lse_out[t] = mx + logf(sum);
        }
        memset(pr + t + 1, 0, (size_t)(ncol - t - 1) * sizeof(float));
    }
}

int attention_flash_cpu_supported(int hd) { return att_fast(hd); }

size_t attention_flash_scratch_floats(int T, int hd) {
    size_t T16 = ((size_t)T + 15) / 16 * 16;
    return (2 * (size_t)ATT_RB + 2 * (size_t)hd) * T16;
}

static int att_flash_threads(const AttnFlashScratch *fs, size_t work) {
    int n = att_threads(work);
    return n < fs->threads ? n : fs->threads;
}

void attention_flash_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                             int nh, int nkv, int hd, const AttnFlashScratch *fs) {
    int grp = nh / nkv, T16 = (T + 15) / 16 * 16;
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nthr = att_flash_threads(fs, (size_t)B * nh * T * T);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr) if (nthr > 1)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < nkv; kh++) {
            float *kt = fs->buf + (size_t)att_thread() * fs->per_thread, *sb = kt + (size_t)hd * T16;
            size_t kvo = (size_t)b * T * ks + (size_t)kh * hd;
            att_pack_t(kt, k + kvo, ks, T, T16, hd);
            for (int h = kh * grp; h < (kh + 1) * grp; h++) {
                size_t qo = (size_t)b * T * qs + (size_t)h * hd;
                float *lh = lse + ((size_t)b * nh + h) * T;
                for (int i0 = 0; i0 < T; i0 += ATT_RB) {
                    int R = T - i0 < ATT_RB ? T - i0 : ATT_RB, ncol = i0 + R;
                    att_probs(sb, q + qo + i0 * qs, qs, kt, T16, i0, R, ncol, hd, scale, lh, NULL);
                    att_gemm(out + qo + i0 * qs, qs, sb, T16, v + kvo, ks, R, hd, ncol, 1.0f, 0);
                }
            }
        }
}

void attention_flash_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                              const float *k, const float *v, int B, int T, int nh, int nkv, int hd,
                              const AttnFlashScratch *fs) {
    int grp = nh / nkv, T16 = (T + 15) / 16 * 16;
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    int nthr = att_flash_threads(fs, (size_t)B * nh * T * T);
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthr) if (nthr > 1)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < nkv; kh++) {
            float *kt = fs->buf + (size_t)att_thread() * fs->per_thread, *vt = kt + (size_t)hd * T16;
            float *pb = vt + (size_t)hd * T16, *db = pb + (size_t)ATT_RB * T16;
            size_t kvo = (size_t)b * T * ks + (size_t)kh * hd;
            att_pack_t(kt, k + kvo, ks, T, T16, hd);
            att_pack_t(vt, v + kvo, ks, T, T16, hd);
            for (int h = kh * grp; h < (kh + 1) * grp; h++) {
                size_t qo = (size_t)b * T * qs + (size_t)h * hd;
                const float *lh = lse + ((size_t)b * nh + h) * T;
                for (int i0 = 0; i0 < T; i0 += ATT_RB) {
                    int R = T - i0 < ATT_RB ? T - i0 : ATT_RB, ncol = i0 + R;
                    /* P recomputed from the saved log-sum-exp; dP = dO V^T; dS = P * (dP - sum(P * dP)) * scale */
                    att_probs(pb, q + qo + i0 * qs, qs, kt, T16, i0, R, ncol, hd, scale, NULL, lh);
                    att_gemm(db, T16, dout + qo + i0 * qs, qs, vt, T16, R, ncol, hd, 1.0f, 0);
                    for (int r = 0; r < R; r++) {
                        int t = i0 + r;
                        float *dr = db + (size_t)r * T16;
                        vm_softmax_backward(dr, pb + (size_t)r * T16, (size_t)t + 1, scale);
                        memset(dr + t + 1, 0, (size_t)(ncol - t - 1) * sizeof(float));
                    }
                    /* dQ += dS K;  dV[:ncol] += P^T dO;  dK[:ncol] += dS^T Q */
                    att_gemm(dq + qo + i0 * qs, qs, db, T16, k + kvo, ks, R, hd, ncol, 1.0f, 1);
                    att_outer(dv + kvo, ks, pb, T16, dout + qo + i0 * qs, qs, R, ncol, hd);
                    att_outer(dk + kvo, ks, db, T16, q + qo + i0 * qs, qs, R, ncol, hd);
                }
            }
        }
}
#else
int attention_flash_cpu_supported(int hd) { return 0; }
size_t attention_flash_scratch_floats(int T, int hd) { return 0; }
void attention_flash_forward(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                             int nh, int nkv, int hd, const AttnFlashScratch *fs) {}
void attention_flash_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *q,
                              const float *k, const float *v, int B, int T, int nh, int nkv, int hd,
                              const AttnFlashScratch *fs) {}
#endif

