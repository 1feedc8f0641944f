/* bert_cpu.c — the CPU reference forward of the encoder: OpenBLAS SGEMM for the linear layers, OpenMP
 * for everything else. Same function names and shapes as bert_cuda.cu (in the manner of llm.c).
 * Activations are packed (bert.h): M token rows, no padding. */
#include "encoder/bert.h"

#include "common/error.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define HOT __attribute__((optimize("O3")))

/* x[t] = wte[ids[t]] + wpe[position of t in its sequence] + wtt[0] */
static HOT void embed_forward(float *x, const int32_t *ids, const int *off, int n_seq, const dfm_bert_weights *w,
                              int H) {
#pragma omp parallel for schedule(static)
    for (int s = 0; s < n_seq; s++)
        for (int t = off[s]; t < off[s + 1]; t++) {
            const float *a = w->wte + (size_t)ids[t] * H, *p = w->wpe + (size_t)(t - off[s]) * H, *ty = w->wtt;
            float *o = x + (size_t)t * H;
#pragma omp simd
            for (int i = 0; i < H; i++) o[i] = a[i] + p[i] + ty[i];
        }
}

/* one row of LayerNorm (two-pass mean / variance); o may equal x */
static HOT inline void layernorm_row(float *o, const float *x, const float *weight, const float *bias, int C, float eps) {
    float m = 0, v = 0;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < C; i++) m += x[i];
    m /= C;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    float rstd = 1.0f / sqrtf(v / C + eps);
#pragma omp simd
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * rstd * weight[i] + bias[i];
}

/* out = LayerNorm(inp) over the last dimension C (out may equal inp) */
static HOT void layernorm_forward(float *out, const float *inp, const float *weight, const float *bias, int M, int C,
                                  float eps) {
#pragma omp parallel for schedule(static)
    for (int r = 0; r < M; r++) layernorm_row(out + (size_t)r * C, inp + (size_t)r * C, weight, bias, C, eps);
}

/* x = 0.5 x (1 + erf(x / sqrt 2)), in place, on one thread's rows */
static HOT void gelu_rows(float *x, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + dfm_erf_approx(x[i] * 0.70710678118654752f));
}

/* What a GEMM tile does with its rows right after the GEMM, while they are in cache (fewer parallel
 * regions and barriers, which matter on a busy machine). */
enum { EPI_NONE = 0, EPI_GELU, EPI_RESIDUAL_LN };
typedef struct {
    int kind;
    const float *residual;        /* EPI_RESIDUAL_LN: out += residual; ln_out = LN(out) */
    const float *ln_w, *ln_b;
    float *ln_out;
    float eps;
} epilogue;

/* out[M, N] = inp[M, K] · weight[N, K]^T + bias[N]. Rows go in fixed tiles of GEMM_TILE, each a
 * single-threaded BLAS call inside an OpenMP loop: one thread pool only (OpenBLAS's own pool spinning
 * against OpenMP's made a 2-thread run 50x slower than a 1-thread one), and every row's result
 * depends only on the batch, never on the number of threads (outputs must not depend on ranks or
 * threads). */
#define GEMM_TILE 128
static HOT void matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int M, int K, int N,
                               const epilogue *ep) {
    int tiles = (M + GEMM_TILE - 1) / GEMM_TILE;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < tiles; t++) {
        int r0 = t * GEMM_TILE, r1 = r0 + GEMM_TILE < M ? r0 + GEMM_TILE : M;
        for (int r = r0; r < r1; r++) memcpy(out + (size_t)r * N, bias, N * sizeof(float));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, N, K, 1.0f, inp + (size_t)r0 * K, K, weight, K,
                    1.0f, out + (size_t)r0 * N, N);
        if (ep && ep->kind == EPI_GELU) {
            gelu_rows(out + (size_t)r0 * N, (size_t)(r1 - r0) * N);
        } else if (ep && ep->kind == EPI_RESIDUAL_LN) {
            for (int r = r0; r < r1; r++) {
                float *o = out + (size_t)r * N;
                const float *res = ep->residual + (size_t)r * N;
#pragma omp simd
                for (int i = 0; i < N; i++) o[i] += res[i];
                layernorm_row(ep->ln_out + (size_t)r * N, o, ep->ln_w, ep->ln_b, N, ep->eps);
            }
        }
    }
}

/* out[t, h*HS..] = softmax(q_t · K_s^T / sqrt(HS)) · V_s for each sequence s and head h, over the
 * sequence's own tokens only (the padding mask of a padded batch). qkv rows are [q | k | v]. */
static HOT void attention_forward(float *out, const float *qkv, const int *off, int n_seq, int NH, int HS,
                                  int max_len) {
    int H = NH * HS, C3 = 3 * H;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel
    {
        float *sc = malloc((size_t)max_len * sizeof *sc);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seq; s++)
            for (int h = 0; h < NH; h++) {
                int t0 = off[s], T = off[s + 1] - off[s];
                for (int i = 0; i < T; i++) {
                    const float *q = qkv + (size_t)(t0 + i) * C3 + h * HS;
                    float mx = -INFINITY;
                    for (int j = 0; j < T; j++) {
                        const float *k = qkv + (size_t)(t0 + j) * C3 + H + h * HS;
                        float d = 0;
#pragma omp simd reduction(+ : d)
                        for (int e = 0; e < HS; e++) d += q[e] * k[e];
                        sc[j] = d * scale;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    float sum = 0;
                    for (int j = 0; j < T; j++) {
                        sc[j] = expf(sc[j] - mx);
                        sum += sc[j];
                    }
                    float inv = 1.0f / sum;
                    float *o = out + (size_t)(t0 + i) * H + h * HS;
                    for (int e = 0; e < HS; e++) o[e] = 0;
                    for (int j = 0; j < T; j++) {
                        const float *v = qkv + (size_t)(t0 + j) * C3 + 2 * H + h * HS;
                        float p = sc[j] * inv;
#pragma omp simd
                        for (int e = 0; e < HS; e++) o[e] += p * v[e];
                    }
                }
            }
        free(sc);
    }
}

/* out[s] = pool(x rows of sequence s), then L2-normalised */
static HOT void pool_forward(float *out, const float *x, const int *off, int n_seq, int H, int mode) {
#pragma omp parallel for schedule(static)
    for (int s = 0; s < n_seq; s++) {
        float *o = out + (size_t)s * H;
        int t0 = off[s], T = off[s + 1] - off[s];
        if (mode == DFM_POOL_CLS) {
            memcpy(o, x + (size_t)t0 * H, H * sizeof(float));
        } else if (mode == DFM_POOL_MAX) {
            memcpy(o, x + (size_t)t0 * H, H * sizeof(float));
            for (int t = 1; t < T; t++)
                for (int i = 0; i < H; i++) o[i] = fmaxf(o[i], x[(size_t)(t0 + t) * H + i]);
        } else {
            double acc[4096];
            for (int i = 0; i < H; i++) acc[i] = 0;
            for (int t = 0; t < T; t++)
                for (int i = 0; i < H; i++) acc[i] += x[(size_t)(t0 + t) * H + i];
            for (int i = 0; i < H; i++) o[i] = (float)(acc[i] / T);
        }
        double nn = 0;
        for (int i = 0; i < H; i++) nn += (double)o[i] * o[i];
        float inv = (float)(1.0 / fmax(sqrt(nn), 1e-12));
        for (int i = 0; i < H; i++) o[i] *= inv;
    }
}

int bert_forward_cpu(dfm_encoder *enc, const dfm_bert_batch *b, float *out) {
    const dfm_bert_config *c = &enc->cfg;
    const dfm_bert_weights *w = &enc->w;
    int M = b->n_tok, H = c->hidden, FF = c->inter, NH = c->heads, HS = H / NH;
    if (H > 4096) return DFM_FAIL(DFM_EUNSUPPORTED, "hidden size %d over 4096 is not supported on the CPU", H);
    size_t need = (size_t)M * (H + 3 * H + H + H + FF);
    if (need > enc->act_floats) {
        free(enc->act);
        enc->act = malloc(need * sizeof(float));
        enc->act_floats = enc->act ? need : 0;
        if (!enc->act) return DFM_FAIL(DFM_ENOMEM, "no memory for activations of %d tokens (%zu MB)", M, need * 4 >> 20);
    }
    float *x = enc->act, *qkv = x + (size_t)M * H, *att = qkv + (size_t)M * 3 * H, *tmp = att + (size_t)M * H,
          *fc = tmp + (size_t)M * H;
    embed_forward(x, b->ids, b->off, b->n_seq, w, H);
    layernorm_forward(x, x, w->emb_ln_w, w->emb_ln_b, M, H, c->ln_eps);
    for (int l = 0; l < c->layers; l++) {
        const struct bert_layer *L = &w->layer[l];
        /* x: residual stream; qkv = x Wqkv + b; att = attention(qkv); x = LN1(att Wao + b + x);
         * fc = GELU(x Wfc + b); x = LN2(fc Wproj + b + x) */
        epilogue ln1 = {EPI_RESIDUAL_LN, x, L->ln1_w, L->ln1_b, x, c->ln_eps};
        epilogue gelu = {EPI_GELU, NULL, NULL, NULL, NULL, 0};
        epilogue ln2 = {EPI_RESIDUAL_LN, x, L->ln2_w, L->ln2_b, x, c->ln_eps};
        matmul_forward(qkv, x, L->qkv_w, L->qkv_b, M, H, 3 * H, NULL);
        attention_forward(att, qkv, b->off, b->n_seq, NH, HS, b->max_seq_len);
        matmul_forward(tmp, att, L->ao_w, L->ao_b, M, H, H, &ln1);
        matmul_forward(fc, x, L->fc_w, L->fc_b, M, H, FF, &gelu);
        matmul_forward(tmp, fc, L->proj_w, L->proj_b, M, FF, H, &ln2);
    }
    pool_forward(out, x, b->off, b->n_seq, H, c->pooling);
    return DFM_OK;
}
