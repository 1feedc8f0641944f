/* ops.c — CPU fp32 kernels of the trainer (see ops.h for the conventions). */
#include "trainer/kernels/ops.h"

#include "trainer/kernels/vecmath.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

void vec_add(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}
void vec_zero(float *x, size_t n) { memset(x, 0, n * sizeof(float)); }

/* ---- matmul ------------------------------------------------------------------------------------- */
void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                    int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC);
    if (bias) {
#pragma omp parallel for if ((size_t)N * OC > 65536)
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
    }
}

void matmul_forward_acc(float *out, const float *inp, const float *weight, int N, int C, int OC) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC);
}

void matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp,
                    C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
#pragma omp parallel for if ((size_t)N * OC > 65536)
        for (int o = 0; o < OC; o++) {
            float s = 0.0f;
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            dbias[o] += s;
        }
    }
}

/* ---- embedding ---------------------------------------------------------------------------------- */
void embedding_forward(float *out, const int *tokens, const float *wte, int N, int C) {
#pragma omp parallel for if (N > 256)
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, C * sizeof(float));
}

/* Rows in order (repeated tokens would race), SIMD over a block of EMB_COLS channels, threads over the
 * blocks: every element sums its rows in the same order whatever the thread count. */
#define EMB_COLS 64
void embedding_backward(float *dwte, const float *dout, const int *tokens, int N, int C) {
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int c0 = 0; c0 < C; c0 += EMB_COLS) {
        size_t w = C - c0 < EMB_COLS ? (size_t)(C - c0) : EMB_COLS;
        for (int n = 0; n < N; n++) vm_axpy(dwte + (size_t)tokens[n] * C + c0, 1.0f, dout + (size_t)n * C + c0, w);
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------------------ */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps) {
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++)
        rstd[n] = vm_rmsnorm_row(out + (size_t)n * C, inp + (size_t)n * C, weight, (size_t)C, eps);
}

void rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                      const float *rstd, int N, int C) {
    if (dweight) { /* one pass, rows in order: dweight's sums have one fixed order whatever the thread count */
        for (int n = 0; n < N; n++)
            vm_rmsnorm_backward_row(dinp + (size_t)n * C, dweight, dout + (size_t)n * C, inp + (size_t)n * C, weight,
                                    rstd[n], (size_t)C);
        return;
    }
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++)
        vm_rmsnorm_backward_row(dinp + (size_t)n * C, NULL, dout + (size_t)n * C, inp + (size_t)n * C, weight, rstd[n],
                                (size_t)C);
}

/* ---- LayerNorm ---------------------------------------------------------------------------------- */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                       const float *bias, int N, int C, float eps) {
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *y = out + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += ((double)x[c] - m) * ((double)x[c] - m);
        v /= C;
        float r = (float)(1.0 / sqrt(v + eps)), mf = (float)m;
        for (int c = 0; c < C; c++) y[c] = (x[c] - mf) * r * weight[c] + bias[c];
        mean[n] = mf;
        rstd[n] = r;
    }
}

void layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
        float *dx = dinp + (size_t)n * C;
        float m = mean[n], r = rstd[n];
        double dn_mean = 0.0, dnx_mean = 0.0;
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * r, dn = dy[c] * weight[c];
            dn_mean += dn;
            dnx_mean += (double)dn * xh;
        }
        float a = (float)(dn_mean / C), b = (float)(dnx_mean / C);
        for (int c = 0; c < C; c++) {
            float xh = (x[c] - m) * r;
            dx[c] += r * (dy[c] * weight[c] - a - xh * b);
        }
    }
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int c = 0; c < C; c++) {
        float sw = 0.0f, sb = 0.0f;
        for (int n = 0; n < N; n++) {
            float dy = dout[(size_t)n * C + c];
            sw += dy * (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            sb += dy;
        }
        if (dweight) dweight[c] += sw;
        if (dbias) dbias[c] += sb;
    }
}

/* ---- RoPE --------------------------------------------------------------------------------------- */
void rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        /* as HF: inv_freq computed in fp32, angle = pos * inv_freq in fp32 */
        float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
        for (int t = 0; t < T; t++) {
            float a = (float)t * inv;
            cos_t[(size_t)t * half + i] = cosf(a);
            sin_t[(size_t)t * half + i] = sinf(a);
        }
    }
}

void rope_forward(float *out, const float *inp, const float *cos_t, const float *sin_t, int B, int T, int nh,
                  int hd) {
    int half = hd / 2;
#pragma omp parallel for if ((size_t)B * T * nh * hd > 65536)
    for (int r = 0; r < B * T; r++) {
        int t = r % T;
        const float *cs = cos_t + (size_t)t * half, *sn = sin_t + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            const float *x = inp + ((size_t)r * nh + h) * hd;
            float *y = out + ((size_t)r * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                y[i] = x1 * cs[i] - x2 * sn[i];
                y[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

void rope_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t, int B, int T,
                   int nh, int hd) {
    int half = hd / 2;
#pragma omp parallel for if ((size_t)B * T * nh * hd > 65536)
    for (int r = 0; r < B * T; r++) {
        int t = r % T;
        const float *cs = cos_t + (size_t)t * half, *sn = sin_t + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            const float *dy = dout + ((size_t)r * nh + h) * hd;
            float *dx = dinp + ((size_t)r * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                float d1 = dy[i], d2 = dy[i + half];
                dx[i] += d1 * cs[i] + d2 * sn[i];
                dx[i + half] += d2 * cs[i] - d1 * sn[i];
            }
        }
    }
}

/* ---- causal GQA self-attention -------------------------------------------------------------------
 * Per (sequence, head) and block of ATT_ROWS query rows: scores and products are sgemm calls on strided
 * views of q/k/v (a head's rows are hd floats every nh*hd) over the keys the block can see (columns
 * [0, end of block)), so the causal mask skips whole blocks above the diagonal (at T = 256, 62.5 % of the
 * square is computed); inside the diagonal block the upper triangle is computed and then zeroed. The
 * softmax rows are SIMD (vecmath.h). */
#define ATT_ROWS 64
void attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int B, int T,
                       int nh, int nkv, int hd) {
    int grp = nh / nkv;
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int kh = h / grp;
            const float *qh = q + (size_t)b * T * qs + (size_t)h * hd;
            const float *khp = k + (size_t)b * T * ks + (size_t)kh * hd;
            const float *vh = v + (size_t)b * T * ks + (size_t)kh * hd;
            float *p = att + ((size_t)b * nh + h) * T * T;
            float *oh = out + (size_t)b * T * qs + (size_t)h * hd;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                int R = T - r0 < ATT_ROWS ? T - r0 : ATT_ROWS, cols = r0 + R;
                float *pb = p + (size_t)r0 * T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, cols, hd, scale, qh + r0 * qs, (int)qs, khp,
                            (int)ks, 0.0f, pb, T);
#pragma omp parallel for if ((size_t)R * cols > 16384)
                for (int t = r0; t < r0 + R; t++) {
                    float *pr = p + (size_t)t * T;
                    float sum = vm_exp_sum(pr, (size_t)t + 1, vm_max(pr, (size_t)t + 1));
                    vm_scale(pr, (size_t)t + 1, 1.0f / sum);
                    memset(pr + t + 1, 0, (size_t)(T - t - 1) * sizeof(float));
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, hd, cols, 1.0f, pb, T, vh, (int)ks, 0.0f,
                            oh + r0 * qs, (int)qs);
            }
        }
}

void attention_backward(float *dq, float *dk, float *dv, float *datt, const float *dout, const float *att,
                        const float *q, const float *k, const float *v, int B, int T, int nh, int nkv, int hd) {
    int grp = nh / nkv;
    size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            int kh = h / grp;
            const float *qh = q + (size_t)b * T * qs + (size_t)h * hd;
            const float *khp = k + (size_t)b * T * ks + (size_t)kh * hd;
            const float *vh = v + (size_t)b * T * ks + (size_t)kh * hd;
            const float *doh = dout + (size_t)b * T * qs + (size_t)h * hd;
            float *dqh = dq + (size_t)b * T * qs + (size_t)h * hd;
            float *dkh = dk + (size_t)b * T * ks + (size_t)kh * hd;
            float *dvh = dv + (size_t)b * T * ks + (size_t)kh * hd;
            const float *p = att + ((size_t)b * nh + h) * T * T;
            float *dp = datt + ((size_t)b * nh + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                int R = T - r0 < ATT_ROWS ? T - r0 : ATT_ROWS, cols = r0 + R;
                const float *pb = p + (size_t)r0 * T;
                float *db = dp + (size_t)r0 * T;
                /* dV[:cols] += P^T dO;  dP = dO V[:cols]^T */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hd, R, 1.0f, pb, T, doh + r0 * qs, (int)qs,
                            1.0f, dvh, (int)ks);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, cols, hd, 1.0f, doh + r0 * qs, (int)qs, vh,
                            (int)ks, 0.0f, db, T);
                /* softmax backward in place: dS = P * (dP - sum(P * dP)) * scale (zero above the diagonal) */
#pragma omp parallel for if ((size_t)R * cols > 16384)
                for (int t = r0; t < r0 + R; t++) {
                    float *dr = dp + (size_t)t * T;
                    vm_softmax_backward(dr, p + (size_t)t * T, (size_t)t + 1, scale);
                    memset(dr + t + 1, 0, (size_t)(cols - t - 1) * sizeof(float));
                }
                /* dQ += dS K[:cols];  dK[:cols] += dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, hd, cols, 1.0f, db, T, khp, (int)ks, 1.0f,
                            dqh + r0 * qs, (int)qs);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hd, R, 1.0f, db, T, qh + r0 * qs, (int)qs,
                            1.0f, dkh, (int)ks);
            }
        }
}

/* ---- SwiGLU / GELU ------------------------------------------------------------------------------ */
/* elementwise kernels run in blocks of EW_BLOCK (SIMD inside a block, threads over blocks) */
#define EW_BLOCK 16384
void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
    size_t nb = (n + EW_BLOCK - 1) / EW_BLOCK;
#pragma omp parallel for if (nb > 4)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * EW_BLOCK, k = n - i < EW_BLOCK ? n - i : EW_BLOCK;
        vm_swiglu_forward(out + i, gate + i, up + i, k);
    }
}

void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n) {
    size_t nb = (n + EW_BLOCK - 1) / EW_BLOCK;
#pragma omp parallel for if (nb > 4)
    for (size_t b = 0; b < nb; b++) {
        size_t i = b * EW_BLOCK, k = n - i < EW_BLOCK ? n - i : EW_BLOCK;
        vm_swiglu_backward(dgate + i, dup + i, dout + i, gate + i, up + i, k);
    }
}

void gelu_forward(float *out, const float *inp, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    }
}

void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}

/* ---- chunk cross-attention + gate ---------------------------------------------------------------- */
/* Per (sequence, chunk, head): the rows that read the chunk are contiguous (tokens [c*L - shift, (c+1)*L -
 * shift)), so scores, products and their gradients are small sgemm calls on strided views (a head's
 * columns every C floats; p's rows for one head every nh*K floats). */
static void crossattn_rows(int c, int L, int T, int shift, int *s0, int *s1) {
    *s0 = c * L - shift < 0 ? 0 : c * L - shift;
    *s1 = (c + 1) * L - shift > T ? T : (c + 1) * L - shift;
}

void crossattn_forward(float *out, float *p, const float *q, const float *km, const float *vm,
                       const uint8_t *slot_mask, int B, int T, int L, int shift, int K, int nh, int hd) {
    int NC = T / L;
    size_t C = (size_t)nh * hd, pk = (size_t)nh * K;
    float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for collapse(2) if ((size_t)B * T * C * K > 262144)
    for (int b = 0; b < B; b++)
        for (int c = 0; c <= NC; c++) { /* c == NC: the rows past the last chunk (shift 1), no memory */
            int s0, s1;
            crossattn_rows(c, L, T, shift, &s0, &s1);
            if (s1 <= s0) continue;
            size_t r0 = (size_t)b * T + s0, R = (size_t)(s1 - s0), m0 = ((size_t)b * NC + c) * K;
            int any = 0;
            for (int j = 0; c < NC && j < K; j++) any |= slot_mask[m0 + j];
            if (!any) { /* no memory for these rows: no update */
                memset(out + r0 * C, 0, R * C * sizeof(float));
                memset(p + r0 * pk, 0, R * pk * sizeof(float));
                continue;
            }
            for (int h = 0; h < nh; h++) {
                float *ph = p + r0 * pk + (size_t)h * K;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, K, hd, scale, q + r0 * C + (size_t)h * hd,
                            (int)C, km + m0 * C + (size_t)h * hd, (int)C, 0.0f, ph, (int)pk);
                for (size_t r = 0; r < R; r++) {
                    float *pr = ph + r * pk, mx = -INFINITY, sum = 0.0f;
                    for (int j = 0; j < K; j++)
                        if (slot_mask[m0 + j] && pr[j] > mx) mx = pr[j];
                    for (int j = 0; j < K; j++) {
                        pr[j] = slot_mask[m0 + j] ? expf(pr[j] - mx) : 0.0f;
                        sum += pr[j];
                    }
                    vm_scale(pr, (size_t)K, 1.0f / sum);
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, hd, K, 1.0f, ph, (int)pk,
                            vm + m0 * C + (size_t)h * hd, (int)C, 0.0f, out + r0 * C + (size_t)h * hd, (int)C);
            }
        }
}

void crossattn_backward(float *dq, float *dkm, float *dvm, const float *dout, const float *p, const float *q,
                        const float *km, const float *vm, int B, int T, int L, int shift, int K, int nh, int hd) {
    int NC = T / L;
    size_t C = (size_t)nh * hd, pk = (size_t)nh * K;
    float scale = 1.0f / sqrtf((float)hd);
    /* parallel over (b, chunk): the rows attending a chunk write the same memory rows */
#pragma omp parallel for collapse(2) if ((size_t)B * T * C * K > 262144)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < NC; c++) {
            int s0, s1;
            crossattn_rows(c, L, T, shift, &s0, &s1);
            if (s1 <= s0) continue;
            size_t r0 = (size_t)b * T + s0, R = (size_t)(s1 - s0), m0 = ((size_t)b * NC + c) * K;
            float ds[R * (size_t)K]; /* dP, then dS, of one head */
            for (int h = 0; h < nh; h++) {
                const float *ph = p + r0 * pk + (size_t)h * K, *doh = dout + r0 * C + (size_t)h * hd;
                const float *qh = q + r0 * C + (size_t)h * hd;
                size_t mo = m0 * C + (size_t)h * hd;
                /* dVm += P^T dO;  dP = dO Vm^T */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, hd, (int)R, 1.0f, ph, (int)pk, doh, (int)C, 1.0f,
                            dvm + mo, (int)C);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)R, K, hd, 1.0f, doh, (int)C, vm + mo, (int)C,
                            0.0f, ds, K);
                for (size_t r = 0; r < R; r++) /* a row with no memory has P = 0: dS = 0 */
                    vm_softmax_backward(ds + r * K, ph + r * pk, (size_t)K, scale);
                /* dQ += dS Km;  dKm += dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)R, hd, K, 1.0f, ds, K, km + mo, (int)C, 1.0f,
                            dq + r0 * C + (size_t)h * hd, (int)C);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, hd, (int)R, 1.0f, ds, K, qh, (int)C, 1.0f,
                            dkm + mo, (int)C);
            }
        }
}

void gate_forward(float *out, float *g, const float *gl, const float *h, const float *o, int N, int C, int G) {
    int per = C / G;
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < G; j++) g[(size_t)n * G + j] = 1.0f / (1.0f + expf(-gl[(size_t)n * G + j]));
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = h[(size_t)n * C + c] + g[(size_t)n * G + c / per] * o[(size_t)n * C + c];
    }
}

void gate_backward(float *dh, float *dgl, float *d_o, const float *dout, const float *g, const float *o, int N,
                   int C, int G) {
    int per = C / G;
#pragma omp parallel for if ((size_t)N * C > 65536)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < G; j++) {
            float gj = g[(size_t)n * G + j], acc = 0.0f;
            for (int c = j * per; c < (j + 1) * per; c++) {
                float d = dout[(size_t)n * C + c];
                if (dh) dh[(size_t)n * C + c] += d;
                d_o[(size_t)n * C + c] += d * gj;
                acc += d * o[(size_t)n * C + c];
            }
            dgl[(size_t)n * G + j] += acc * gj * (1.0f - gj);
        }
}

/* ---- chunk pooling -------------------------------------------------------------------------------- */
void chunk_pool_forward(float *out, const float *h, int B, int T, int L, int tail, int C) {
    int NC = T / L;
    float inv = 1.0f / (float)tail;
#pragma omp parallel for collapse(2) if ((size_t)B * T * C > 65536)
    for (int b = 0; b < B; b++)
        for (int c = 0; c < NC; c++) {
            float *o = out + ((size_t)b * NC + c) * C;
            for (int i = 0; i < C; i++) o[i] = 0.0f;
            if (c == 0) continue;
            for (int s = c * L - tail; s < c * L; s++) {
                const float *e = h + ((size_t)b * T + s) * C;
                for (int i = 0; i < C; i++) o[i] += e[i];
            }
            for (int i = 0; i < C; i++) o[i] *= inv;
        }
}

/* ---- fused LM head + cross-entropy ----------------------------------------------------------------- */
double lmhead_ce_forward_backward(float *losses, float *top1, float *dx, float *dweight, const float *x, const float *weight,
                                  const int *targets, int N, int C, int V, float dloss, float *scratch) {
    return lmhead_ce_soft_forward_backward(losses, top1, dx, dweight, x, weight, targets, N, C, V, dloss, scratch, NULL);
}

double lmhead_ce_soft_forward_backward(float *losses, float *top1, float *dx, float *dweight, const float *x,
                                       const float *weight, const int *targets, int N, int C, int V, float dloss,
                                       float *scratch, CeSoft *soft) {
    double total = 0.0;
    int need_grad = dx || dweight, S = soft ? soft->S : 0;
    if (soft) soft->kl_sum = soft->wce_sum = 0.0, soft->n_teacher = 0;
    for (int r0 = 0; r0 < N; r0 += CE_ROWS_BLOCK) {
        int R = N - r0 < CE_ROWS_BLOCK ? N - r0 : CE_ROWS_BLOCK;
        const float *xb = x + (size_t)r0 * C;
        matmul_forward(scratch, xb, weight, NULL, R, C, V);
        /* summed serially below: a fixed order, bit-reproducible */
        double row_loss[CE_ROWS_BLOCK], row_kl[CE_ROWS_BLOCK], row_wce[CE_ROWS_BLOCK];
#pragma omp parallel for if ((size_t)R * V > 65536)
        for (int r = 0; r < R; r++) {
            float *lg = scratch + (size_t)r * V;
            row_kl[r] = row_wce[r] = 0.0;
            if (targets[r0 + r] < 0) { /* ignored position: no loss, no gradient */
                if (losses) losses[r0 + r] = 0.0f;
                if (top1) top1[r0 + r] = 0.0f;
                row_loss[r] = 0.0;
                if (need_grad)
                    for (int v = 0; v < V; v++) lg[v] = 0.0f;
                continue;
            }
            float mx = vm_max(lg, (size_t)V);
            int tgt = targets[r0 + r];
            float lt = lg[tgt];
            int has = soft && soft->has[r0 + r];
            const int *ids = has ? soft->ids + (size_t)(r0 + r) * S : NULL;
            const float *p = has ? soft->p + (size_t)(r0 + r) * S : NULL;
            float zs[CE_MAX_SOFT]; /* the teacher ids' logits, read before the exps overwrite them */
            for (int i = 0; has && i < S; i++) zs[i] = lg[ids[i]];
            double sum = vm_exp_sum(lg, (size_t)V, mx); /* one exp per logit, kept in place for the gradient */
            double lse = log(sum) + mx, loss = lse - lt;
            if (losses) losses[r0 + r] = (float)loss;
            if (top1) top1[r0 + r] = lt >= mx ? 1.0f : 0.0f;
            row_loss[r] = loss;
            float w = soft && soft->row_w ? soft->row_w[r0 + r] : 1.0f;
            if (soft) row_wce[r] = (double)w * loss;
            double tail = 1.0; /* the teacher's tail over the student's: p_rest / q_rest (1 without a teacher) */
            if (has) {
                double kl = 0.0, ps = 0.0, es = 0.0;
                for (int i = 0; i < S; i++) {
                    if (p[i] > 0.0f) kl += (double)p[i] * (log((double)p[i]) - ((double)zs[i] - lse));
                    ps += p[i];
                    es += exp((double)zs[i] - mx);
                }
                double pr = ps < 1.0 ? 1.0 - ps : 0.0, qr = (sum - es) / sum;
                if (qr < 1e-6) qr = 1e-6; /* the difference of two sums: below this it is rounding */
                if (pr > 0.0) kl += pr * (log(pr) - log(qr));
                tail = pr / qr;
                row_kl[r] = kl;
            }
            if (need_grad) {
                /* (w + λ)q − w·onehot − λ·p on the teacher's ids, and λ·q·(1 − p_rest/q_rest) on the others */
                float lam = has ? soft->weight : 0.0f;
                vm_scale(lg, (size_t)V, (float)(1.0 / sum) * dloss * (float)(w + lam * (1.0 - tail)));
                lg[tgt] -= dloss * w;
                for (int i = 0; has && i < S; i++)
                    lg[ids[i]] += dloss * lam * (float)(tail * exp((double)zs[i] - lse) - p[i]);
            }
        }
        double block_sum = 0.0;
        for (int r = 0; r < R; r++) block_sum += row_loss[r];
        total += block_sum;
        if (soft)
            for (int r = 0; r < R; r++) {
                soft->wce_sum += row_wce[r];
                if (targets[r0 + r] >= 0 && soft->has[r0 + r]) soft->kl_sum += row_kl[r], soft->n_teacher++;
            }
        if (need_grad) matmul_backward(dx ? dx + (size_t)r0 * C : NULL, dweight, NULL, scratch, xb, weight, R, C, V);
    }
    return total;
}

/* ---- MSE ------------------------------------------------------------------------------------------ */
double mse_forward_backward(float *dpred, const float *pred, const float *target, const uint8_t *mask, int S,
                            int D, float dloss) {
    size_t nvalid = 0;
    for (int s = 0; s < S; s++) nvalid += mask[s] != 0;
    if (nvalid == 0) return 0.0;
    double denom = (double)nvalid * D, sum = 0.0;
    float g = (float)(2.0 / denom) * dloss;
    for (int s = 0; s < S; s++) {
        if (!mask[s]) continue;
        const float *p = pred + (size_t)s * D, *t = target + (size_t)s * D;
        for (int i = 0; i < D; i++) {
            float d = p[i] - t[i];
            sum += (double)d * d;
            if (dpred) dpred[(size_t)s * D + i] += g * d;
        }
    }
    return sum / denom;
}
