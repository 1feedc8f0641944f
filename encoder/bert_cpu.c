/* bert_cpu.c — the CPU forward of the encoder. Same function names and shapes as bert_cuda.cu (in the
 * manner of llm.c); activations are packed (bert.h): M token rows, no padding.
 *
 * Parallel layout: a batch is cut into chunks of whole sequences (about CHUNK_ROWS tokens each) and one
 * OpenMP thread carries a chunk through every layer and the pooling: one parallel region per batch, no
 * barrier between operations (barriers cost most on a busy machine, where a descheduled thread stalls
 * the others), and a chunk's activations stay in that core's cache. Inside a chunk the linear layers run
 * over tiles of up to TILE_ROWS rows (bert_gemm.h: weights packed once at load), GELU applied in the
 * GEMM's registers, residual + LayerNorm right after each tile while its rows are in cache; the
 * feed-forward block goes tile by tile (up-projection, GELU, down-projection), so its [rows, intermediate] activations
 * never leave L2. Attention is fused per (sequence, head): scores, softmax and the weighted sum of
 * values in one pass over a [T, T] block.
 *
 * Every row's result depends only on its own sequence, never on the chunk, the tile or the thread, so
 * `dfm encode` output is identical for any OMP_NUM_THREADS and any number of ranks. */
#include "encoder/bert.h"
#include "encoder/bert_gemm.h"

#include "common/error.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* fp-contract: multiply-adds fuse into FMA where the CPU has it (the build is ISO C, where GCC keeps them
 * apart); the results stay within the encoder's tolerance, and do not depend on threads or batches */
#pragma GCC optimize("O3", "fp-contract=fast")
/* the helpers below pass 64-byte vectors but are always inlined: no ABI crosses a call */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Row kernels are compiled for AVX-512F, AVX2 and the baseline; the loader picks the widest the CPU
 * runs (GCC's target_clones). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define CLONES
#endif

#define CHUNK_ROWS 128 /* tokens per chunk of sequences (at least; a chunk ends at a sequence end) */
#define TILE_ROWS 192  /* most rows per GEMM call: a tile's [rows, intermediate] stays in L2 */
#define VL 16          /* floats per vector below */
#define ROUND_UP(x, m) (((x) + (m) - 1) / (m) * (m))

typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef int vi __attribute__((vector_size(VL * sizeof(int))));

static inline __attribute__((always_inline)) vf vld(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* e^x for x <= 0 (softmax after the max is subtracted), as 2^y with y = x log2(e) = n + f, |f| <= 1/2:
 * 2^n from the exponent bits, 2^f by its Taylor series to degree 7 (relative error ~1e-7). y below -126
 * gives 0. */
static inline __attribute__((always_inline)) vf vexp_neg(vf x) {
    vf y = x * 1.4426950408889634f;
    vi tiny = y < -126.0f;
    y = (vf)((vi)y & ~tiny); /* 0 where tiny: keeps n in range; the result is zeroed below */
    const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds y to an integer in the low bits */
    vf t = y + round;
    vf n = t - round;
    vi ni = (vi)t - (vi)((vf){0} + round);
    vf f = y - n;
    vf p = (vf){0} + 1.5252733804059840e-05f;
    p = p * f + 1.5403530393381606e-04f;
    p = p * f + 1.3333558146428443e-03f;
    p = p * f + 9.6181291076284772e-03f;
    p = p * f + 5.5504108664821580e-02f;
    p = p * f + 2.4022650695910071e-01f;
    p = p * f + 6.9314718055994531e-01f;
    p = p * f + 1.0f;
    vf two_n = (vf)((ni + 127) << 23);
    return (vf)((vi)(p * two_n) & ~tiny);
}

/* x[t] = wte[ids[t]] + wpe[position of t in its sequence] + wtt[0], then LayerNorm */
static CLONES void layernorm_row(float *o, const float *x, const float *weight, const float *bias, int C, float eps) {
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

static CLONES void embed_row(float *o, const float *word, const float *pos, const float *type, int H) {
#pragma omp simd
    for (int i = 0; i < H; i++) o[i] = word[i] + pos[i] + type[i];
}

/* x[r] = LayerNorm(y[r] + x[r]) for m rows: the residual stream after a sublayer */
static CLONES void residual_layernorm(float *x, float *y, const float *weight, const float *bias, int m, int C, float eps) {
    for (int r = 0; r < m; r++) {
        float *yr = y + (size_t)r * C, *xr = x + (size_t)r * C;
#pragma omp simd
        for (int i = 0; i < C; i++) yr[i] += xr[i];
        layernorm_row(xr, yr, weight, bias, C, eps);
    }
}

/* floats of attention_head's work area for sequences of up to T tokens and heads of HS */
static size_t attention_work_floats(int T, int HS) {
    size_t Tp = ROUND_UP(T, VL), Tq = ROUND_UP(T, 4), HSp = ROUND_UP(HS, VL);
    return Tq * HS + (size_t)HS * Tp + Tp * HSp + Tq * Tp + 4 * HSp + Tq;
}

/* One (sequence, head): out[i, :HS] = softmax(q_i K^T / sqrt(HS)) V over the sequence's T tokens.
 * qkv rows (stride ld) are [q | k | v], head h at h*HS in each third; out rows have stride ldo. The head
 * is copied into padded blocks (K transposed) so that the score and value loops run 4 queries x 16 lanes
 * at a time from registers. */
static CLONES void attention_head(float *out, int ldo, const float *qkv, int ld, int T, int H, int HS, int h, float *w) {
    int Tp = ROUND_UP(T, VL), Tq = ROUND_UP(T, 4), HSp = ROUND_UP(HS, VL);
    float *q = w, *kt = q + (size_t)Tq * HS, *v = kt + (size_t)HS * Tp, *s = v + (size_t)Tp * HSp,
          *o4 = s + (size_t)Tq * Tp, *inv = o4 + 4 * HSp;
    const float *Q = qkv + (size_t)h * HS, *K = Q + H, *V = Q + 2 * H;
    memset(q + (size_t)T * HS, 0, (size_t)(Tq - T) * HS * sizeof(float));
    memset(v, 0, (size_t)Tp * HSp * sizeof(float));
    for (int i = 0; i < T; i++) {
        memcpy(q + (size_t)i * HS, Q + (size_t)i * ld, HS * sizeof(float));
        memcpy(v + (size_t)i * HSp, V + (size_t)i * ld, HS * sizeof(float));
    }
    for (int e = 0; e < HS; e++) {
        float *d = kt + (size_t)e * Tp;
        for (int j = 0; j < T; j++) d[j] = K[(size_t)j * ld + e];
        for (int j = T; j < Tp; j++) d[j] = 0.0f;
    }
    /* scores, 4 queries at a time */
    for (int i = 0; i < Tq; i += 4)
        for (int jb = 0; jb < Tp; jb += VL) {
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            const float *qi = q + (size_t)i * HS;
            for (int e = 0; e < HS; e++) {
                vf k = vld(kt + (size_t)e * Tp + jb);
                a0 += qi[e] * k;
                a1 += qi[HS + e] * k;
                a2 += qi[2 * HS + e] * k;
                a3 += qi[3 * HS + e] * k;
            }
            vst(s + (size_t)i * Tp + jb, a0);
            vst(s + (size_t)(i + 1) * Tp + jb, a1);
            vst(s + (size_t)(i + 2) * Tp + jb, a2);
            vst(s + (size_t)(i + 3) * Tp + jb, a3);
        }
    /* softmax over the T real keys, 16 at a time; the padding keys get probability 0; the division by
     * the sum is left to the output rows (inv) */
    float scale = 1.0f / sqrtf((float)HS);
    const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const vf ninf = (vf){0} - INFINITY;
    for (int i = 0; i < T; i++) {
        float *row = s + (size_t)i * Tp;
        vf mxv = ninf;
        for (int jb = 0; jb < Tp; jb += VL) {
            vi pad = lane + jb >= T;
            vf x = vld(row + jb) * scale;
            x = (vf)(((vi)x & ~pad) | ((vi)ninf & pad));
            vst(row + jb, x);
            vi gt = x > mxv;
            mxv = (vf)(((vi)x & gt) | ((vi)mxv & ~gt));
        }
        float mx = mxv[0];
        for (int l = 1; l < VL; l++) mx = mxv[l] > mx ? mxv[l] : mx;
        vf sv = {0};
        for (int jb = 0; jb < Tp; jb += VL) {
            vf e = vexp_neg(vld(row + jb) - mx);
            vst(row + jb, e);
            sv += e;
        }
        float sum = 0;
        for (int l = 0; l < VL; l++) sum += sv[l];
        inv[i] = 1.0f / sum;
    }
    /* out = P V, 4 queries x 16 lanes of the head at a time */
    for (int i = 0; i < Tq; i += 4)
        for (int eb = 0; eb < HSp; eb += VL) {
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            const float *p = s + (size_t)i * Tp;
            for (int j = 0; j < T; j++) {
                vf x = vld(v + (size_t)j * HSp + eb);
                a0 += p[j] * x;
                a1 += p[Tp + j] * x;
                a2 += p[2 * Tp + j] * x;
                a3 += p[3 * Tp + j] * x;
            }
            vst(o4 + eb, a0);
            vst(o4 + HSp + eb, a1);
            vst(o4 + 2 * HSp + eb, a2);
            vst(o4 + 3 * HSp + eb, a3);
            if (eb + VL >= HSp)
                for (int r = 0; r < 4 && i + r < T; r++) {
                    float *o = out + (size_t)(i + r) * ldo + (size_t)h * HS, f = inv[i + r];
                    const float *src = o4 + (size_t)r * HSp;
                    for (int e = 0; e < HS; e++) o[e] = src[e] * f;
                }
        }
}

/* out = pool(the T rows of one sequence), then L2-normalised */
static void pool_row(float *o, const float *x, int T, int H, int mode) {
    if (mode == DFM_POOL_CLS) {
        memcpy(o, x, H * sizeof(float));
    } else if (mode == DFM_POOL_MAX) {
        memcpy(o, x, H * sizeof(float));
        for (int t = 1; t < T; t++)
            for (int i = 0; i < H; i++) o[i] = fmaxf(o[i], x[(size_t)t * H + i]);
    } else {
        double acc[4096];
        for (int i = 0; i < H; i++) acc[i] = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H; i++) acc[i] += x[(size_t)t * H + i];
        for (int i = 0; i < H; i++) o[i] = (float)(acc[i] / T);
    }
    double nn = 0;
    for (int i = 0; i < H; i++) nn += (double)o[i] * o[i];
    float inv = (float)(1.0 / fmax(sqrt(nn), 1e-12));
    for (int i = 0; i < H; i++) o[i] *= inv;
}

/* ---- state: packed weights and per-thread work areas ------------------------------------------- */
struct bert_cpu {
    int isa, prec;   /* the GEMM kernel and its precision (bert_gemm.h) */
    struct bert_cpu_layer {
        bert_gemm_w qkv, ao, fc, proj;
    } *layer;
    int n_layers;
    int n_ws;        /* per-thread work areas */
    float **ws;
    size_t *ws_floats;
    int *chunk;      /* first sequence of each chunk of the current batch, [n_chunks + 1] */
    int chunk_cap;
};

int bert_cpu_init(dfm_encoder *enc) {
    const dfm_bert_config *c = &enc->cfg;
    struct bert_cpu *P = calloc(1, sizeof *P);
    if (!P) return DFM_FAIL(DFM_ENOMEM, "no memory");
    enc->cpu = P;
    P->isa = bert_gemm_isa();
    P->prec = enc->compute == DFM_COMPUTE_BF16 ? BERT_PREC_BF16 : enc->compute == DFM_COMPUTE_INT8 ? BERT_PREC_INT8 : BERT_PREC_F32;
    DFM_TRY(bert_gemm_prec_check(P->isa, P->prec));
    P->layer = calloc(c->layers, sizeof *P->layer);
    if (!P->layer) return DFM_FAIL(DFM_ENOMEM, "no memory");
    P->n_layers = c->layers;
    int H = c->hidden, FF = c->inter;
    for (int l = 0; l < c->layers; l++) {
        const struct bert_layer *L = &enc->w.layer[l];
        struct bert_cpu_layer *PL = &P->layer[l];
        DFM_TRY(bert_gemm_pack(&PL->qkv, L->qkv_w, 3 * H, H, P->isa, P->prec));
        DFM_TRY(bert_gemm_pack(&PL->ao, L->ao_w, H, H, P->isa, P->prec));
        DFM_TRY(bert_gemm_pack(&PL->fc, L->fc_w, FF, H, P->isa, P->prec));
        DFM_TRY(bert_gemm_pack(&PL->proj, L->proj_w, H, FF, P->isa, P->prec));
    }
    return DFM_OK;
}

void bert_cpu_free(dfm_encoder *enc) {
    struct bert_cpu *P = enc->cpu;
    if (!P) return;
    for (int l = 0; P->layer && l < P->n_layers; l++) {
        bert_gemm_free(&P->layer[l].qkv);
        bert_gemm_free(&P->layer[l].ao);
        bert_gemm_free(&P->layer[l].fc);
        bert_gemm_free(&P->layer[l].proj);
    }
    for (int t = 0; t < P->n_ws; t++) free(P->ws[t]);
    free(P->ws);
    free(P->ws_floats);
    free(P->layer);
    free(P->chunk);
    free(P);
    enc->cpu = NULL;
}

const char *bert_cpu_kernel(const dfm_encoder *enc) {
    if (enc->cpu && enc->cpu->prec == BERT_PREC_BF16) return "avx512_bf16";
    if (enc->cpu && enc->cpu->prec == BERT_PREC_INT8) return "avx512_vnni";
    return bert_gemm_isa_name(enc->cpu ? enc->cpu->isa : 0);
}

/* Rows per GEMM call for a chunk of R rows: as few equal tiles of at most TILE_ROWS as cover it (a small
 * remainder tile would stream every weight from L3 for little work), rounded up to 8 rows. */
static int chunk_tile(int R) {
    int n = (R + TILE_ROWS - 1) / TILE_ROWS;
    return ROUND_UP((R + n - 1) / n, 8);
}

/* A thread's work area for chunks of up to R rows and sequences of up to T tokens; every part starts on
 * a 64-byte boundary. */
typedef struct {
    float *x, *qkv, *att, *tmp, *fc, *attn;
    void *gemm; /* bert_gemm's scratch (bf16 / int8 input rows) */
} chunk_work;

static size_t carve_work(chunk_work *cw, float *base, int R, int T, const dfm_bert_config *c, int prec) {
    int H = c->hidden, FF = c->inter;
    float *gemm = NULL;
    size_t sizes[7] = {(size_t)R * H, (size_t)R * 3 * H, (size_t)R * H, (size_t)R * H, (size_t)TILE_ROWS * FF,
                       attention_work_floats(T, H / c->heads),
                       (bert_gemm_scratch_bytes(TILE_ROWS, H > FF ? H : FF, prec) + sizeof(float) - 1) / sizeof(float)};
    float **dst[7] = {&cw->x, &cw->qkv, &cw->att, &cw->tmp, &cw->fc, &cw->attn, &gemm};
    size_t off = 0;
    for (int i = 0; i < 7; i++) {
        if (base) *dst[i] = base + off;
        off += ROUND_UP(sizes[i], 16);
    }
    cw->gemm = gemm;
    return off;
}

/* sequences s0 .. s1-1 of the batch (rows off[s0] .. off[s1]-1) through the whole model into out */
static void forward_chunk(const dfm_encoder *enc, const dfm_bert_batch *b, int s0, int s1, const chunk_work *cw,
                          float *out) {
    const dfm_bert_config *c = &enc->cfg;
    const dfm_bert_weights *w = &enc->w;
    const struct bert_cpu *P = enc->cpu;
    int H = c->hidden, NH = c->heads, HS = H / NH, r0 = b->off[s0], R = b->off[s1] - r0;
    float *x = cw->x, *qkv = cw->qkv, *att = cw->att, *tmp = cw->tmp, *fc = cw->fc;
    int tile = chunk_tile(R);
    for (int s = s0; s < s1; s++)
        for (int t = b->off[s]; t < b->off[s + 1]; t++) {
            float *o = x + (size_t)(t - r0) * H;
            embed_row(o, w->wte + (size_t)b->ids[t] * H, w->wpe + (size_t)(t - b->off[s]) * H, w->wtt, H);
            layernorm_row(o, o, w->emb_ln_w, w->emb_ln_b, H, c->ln_eps);
        }
    for (int l = 0; l < c->layers; l++) {
        const struct bert_layer *L = &w->layer[l];
        const struct bert_cpu_layer *PL = &P->layer[l];
        /* qkv = x Wqkv + b; att = attention(qkv); x = LN1(att Wao + b + x); then per tile:
         * fc = GELU(x Wfc + b); x = LN2(fc Wproj + b + x) */
        for (int t = 0; t < R; t += tile) {
            int m = R - t < tile ? R - t : tile;
            bert_gemm(qkv + (size_t)t * 3 * H, x + (size_t)t * H, m, &PL->qkv, L->qkv_b, BERT_ACT_NONE, cw->gemm);
        }
        for (int s = s0; s < s1; s++) {
            int o = b->off[s] - r0, T = b->off[s + 1] - b->off[s];
            for (int h = 0; h < NH; h++)
                attention_head(att + (size_t)o * H, H, qkv + (size_t)o * 3 * H, 3 * H, T, H, HS, h, cw->attn);
        }
        for (int t = 0; t < R; t += tile) {
            int m = R - t < tile ? R - t : tile;
            float *xt = x + (size_t)t * H, *yt = tmp + (size_t)t * H;
            bert_gemm(yt, att + (size_t)t * H, m, &PL->ao, L->ao_b, BERT_ACT_NONE, cw->gemm);
            residual_layernorm(xt, yt, L->ln1_w, L->ln1_b, m, H, c->ln_eps);
            bert_gemm(fc, xt, m, &PL->fc, L->fc_b, BERT_ACT_GELU, cw->gemm);
            bert_gemm(yt, fc, m, &PL->proj, L->proj_b, BERT_ACT_NONE, cw->gemm);
            residual_layernorm(xt, yt, L->ln2_w, L->ln2_b, m, H, c->ln_eps);
        }
    }
    for (int s = s0; s < s1; s++)
        pool_row(out + (size_t)s * H, x + (size_t)(b->off[s] - r0) * H, b->off[s + 1] - b->off[s], H, c->pooling);
}

int bert_forward_cpu(dfm_encoder *enc, const dfm_bert_batch *b, float *out) {
    const dfm_bert_config *c = &enc->cfg;
    struct bert_cpu *P = enc->cpu;
    if (c->hidden > 4096) return DFM_FAIL(DFM_EUNSUPPORTED, "hidden size %d over 4096 is not supported on the CPU", c->hidden);
    if (!P) return DFM_FAIL(DFM_EARG, "the encoder was not loaded for the CPU (bert_cpu_init not run)");
    if (b->n_seq <= 0) return DFM_OK;
    /* chunks of whole sequences, about CHUNK_ROWS rows each */
    if (b->n_seq + 1 > P->chunk_cap) {
        int *nc = realloc(P->chunk, (size_t)(b->n_seq + 1) * sizeof *nc);
        if (!nc) return DFM_FAIL(DFM_ENOMEM, "no memory for %d sequences", b->n_seq);
        P->chunk = nc;
        P->chunk_cap = b->n_seq + 1;
    }
    int n_chunks = 0, max_rows = 0, max_T = 0;
    for (int s = 0; s < b->n_seq;) {
        int e = s;
        while (e < b->n_seq && (e == s || b->off[e] - b->off[s] < CHUNK_ROWS)) {
            int T = b->off[e + 1] - b->off[e];
            if (T > max_T) max_T = T;
            e++;
        }
        if (b->off[e] - b->off[s] > max_rows) max_rows = b->off[e] - b->off[s];
        P->chunk[n_chunks++] = s;
        s = e;
    }
    P->chunk[n_chunks] = b->n_seq;
    /* one work area per thread, grown on demand */
    int nt = omp_get_max_threads();
    if (nt > n_chunks) nt = n_chunks;
    if (nt > P->n_ws) {
        float **ws = realloc(P->ws, (size_t)nt * sizeof *ws);
        if (ws) P->ws = ws;
        size_t *wf = ws ? realloc(P->ws_floats, (size_t)nt * sizeof *wf) : NULL;
        if (wf) P->ws_floats = wf;
        if (!ws || !wf) return DFM_FAIL(DFM_ENOMEM, "no memory for %d threads' work areas", nt);
        for (int t = P->n_ws; t < nt; t++) P->ws[t] = NULL, P->ws_floats[t] = 0;
        P->n_ws = nt;
    }
    size_t need = carve_work(&(chunk_work){0}, NULL, max_rows, max_T, c, P->prec);
    for (int t = 0; t < nt; t++)
        if (P->ws_floats[t] < need) {
            free(P->ws[t]);
            P->ws[t] = aligned_alloc(64, need * sizeof(float));
            P->ws_floats[t] = P->ws[t] ? need : 0;
            if (!P->ws[t])
                return DFM_FAIL(DFM_ENOMEM, "no memory for the encoder's work area (%zu MB, chunks of %d tokens)",
                                need * sizeof(float) >> 20, max_rows);
        }
#pragma omp parallel num_threads(nt)
    {
        chunk_work cw;
        carve_work(&cw, P->ws[omp_get_thread_num()], max_rows, max_T, c, P->prec);
#pragma omp for schedule(dynamic, 1)
        for (int k = 0; k < n_chunks; k++) forward_chunk(enc, b, P->chunk[k], P->chunk[k + 1], &cw, out);
    }
    return DFM_OK;
}
