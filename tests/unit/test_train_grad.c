/* Gradient checks of the trainer: every hand-written backward against central finite differences
 * on tiny shapes, per op and for the whole model (DFM mode and pretraining mode).
 *
 * For each op, loss = sum(out * R) with a fixed random R (accumulated in double), so the analytic
 * gradient is backward(dout = R). The error of a tensor is the norm-wise relative error
 * ||g_analytic - g_fd|| / max(||g_analytic||, ||g_fd||) over the checked entries (all of them for
 * small tensors, a fixed random sample for large ones). Every check prints its error; the worst one
 * is printed at the end. fp32 forward, eps = 1e-2 (inputs are O(1)): truncation and rounding both
 * stay near 1e-4, the tolerance is 1e-2. The denominator has an absolute floor of 1e-4 per checked
 * entry so that tensors with tiny gradients (|g| ~ 1e-3) are not judged by fp32 rounding noise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/model/model.h"
#include "trainer/kernels/ops.h"
#include "trainer/kernels/rng.h"
#include "trainer/run/margin.h"
#include "tests/cuda/check_compare.h"

static double g_worst = 0.0;
static char g_worst_name[128] = "";
#define TOL 1e-2
#define ABS_FLOOR 1e-4

typedef double (*loss_fn)(void *ctx);

static double check_grad(const char *name, float *x, size_t n, const float *g, loss_fn f, void *ctx, float eps,
                         int max_samples) {
    dfm_rng r;
    rng_seed(&r, 1234 + n);
    double diff2 = 0, num2 = 0, ana2 = 0, worst_el = 0;
    int cnt = (int)(n < (size_t)max_samples ? n : (size_t)max_samples);
    for (int s = 0; s < cnt; s++) {
        size_t i = n <= (size_t)max_samples ? (size_t)s : rng_u32(&r) % n;
        float orig = x[i];
        x[i] = orig + eps;
        double lp = f(ctx);
        x[i] = orig - eps;
        double lm = f(ctx);
        x[i] = orig;
        double num = (lp - lm) / (2.0 * eps), a = g[i];
        diff2 += (a - num) * (a - num);
        num2 += num * num;
        ana2 += a * a;
        double el = fabs(a - num);
        if (el > worst_el) worst_el = el;
    }
    /* absolute floor: fp32 forward noise / (2 eps) is ~1e-5 per entry on these shapes */
    double den = fmax(sqrt(num2), sqrt(ana2)) + ABS_FLOOR * sqrt((double)cnt);
    double rel = sqrt(diff2) / den;
    printf("  %-44s n=%-7zu checked=%-4d |g|=%.3e rel_err=%.2e max_abs_err=%.2e\n", name, n, cnt, sqrt(ana2), rel,
           worst_el);
    if (rel > g_worst) {
        g_worst = rel;
        snprintf(g_worst_name, sizeof g_worst_name, "%s", name);
    }
    return rel;
}

static float *randv(dfm_rng *r, size_t n, float std) {
    float *v = malloc(n * sizeof(float));
    rng_normal(r, v, n, std);
    return v;
}
static float *zerov(size_t n) { return calloc(n, sizeof(float)); }
static double dotR(const float *a, const float *R, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * R[i];
    return s;
}

/* ---- matmul ---------------------------------------------------------------------------------------- */
typedef struct {
    float *out, *inp, *w, *b, *R;
    int N, C, OC;
} MatmulCtx;
static double matmul_loss(void *p) {
    MatmulCtx *c = p;
    matmul_forward(c->out, c->inp, c->w, c->b, c->N, c->C, c->OC);
    return dotR(c->out, c->R, (size_t)c->N * c->OC);
}
static void test_matmul(void **state) {
    dfm_rng r;
    rng_seed(&r, 1);
    MatmulCtx c = {.N = 5, .C = 7, .OC = 6};
    c.inp = randv(&r, 35, 1);
    c.w = randv(&r, 42, 1);
    c.b = randv(&r, 6, 1);
    c.R = randv(&r, 30, 1);
    c.out = zerov(30);
    float *di = zerov(35), *dw = zerov(42), *db = zerov(6);
    matmul_backward(di, dw, db, c.R, c.inp, c.w, c.N, c.C, c.OC);
    assert_true(check_grad("matmul dinp", c.inp, 35, di, matmul_loss, &c, 1e-2f, 64) < TOL);
    assert_true(check_grad("matmul dweight", c.w, 42, dw, matmul_loss, &c, 1e-2f, 64) < TOL);
    assert_true(check_grad("matmul dbias", c.b, 6, db, matmul_loss, &c, 1e-2f, 64) < TOL);
    free(c.inp), free(c.w), free(c.b), free(c.R), free(c.out), free(di), free(dw), free(db);
}

/* ---- norms --------------------------------------------------------------------------------------- */
typedef struct {
    float *out, *inp, *w, *b, *m, *rs, *R;
    int N, C, layer;
} NormCtx;
static double norm_loss(void *p) {
    NormCtx *c = p;
    if (c->layer) layernorm_forward(c->out, c->m, c->rs, c->inp, c->w, c->b, c->N, c->C, 1e-5f);
    else rmsnorm_forward(c->out, c->rs, c->inp, c->w, c->N, c->C, 1e-6f);
    return dotR(c->out, c->R, (size_t)c->N * c->C);
}
static void test_norms(void **state) {
    for (int layer = 0; layer < 2; layer++) {
        dfm_rng r;
        rng_seed(&r, 2 + layer);
        NormCtx c = {.N = 4, .C = 9, .layer = layer};
        size_t n = 36;
        c.inp = randv(&r, n, 1);
        c.w = randv(&r, 9, 1);
        c.b = randv(&r, 9, 1);
        c.R = randv(&r, n, 1);
        c.out = zerov(n);
        c.m = zerov(4);
        c.rs = zerov(4);
        float *di = zerov(n), *dw = zerov(9), *db = zerov(9);
        norm_loss(&c);
        if (layer) layernorm_backward(di, dw, db, c.R, c.inp, c.w, c.m, c.rs, c.N, c.C);
        else rmsnorm_backward(di, dw, c.R, c.inp, c.w, c.rs, c.N, c.C);
        const char *nm = layer ? "layernorm" : "rmsnorm";
        char buf[64];
        snprintf(buf, sizeof buf, "%s dinp", nm);
        assert_true(check_grad(buf, c.inp, n, di, norm_loss, &c, 1e-2f, 64) < TOL);
        snprintf(buf, sizeof buf, "%s dweight", nm);
        assert_true(check_grad(buf, c.w, 9, dw, norm_loss, &c, 1e-2f, 64) < TOL);
        if (layer) assert_true(check_grad("layernorm dbias", c.b, 9, db, norm_loss, &c, 1e-2f, 64) < TOL);
        free(c.inp), free(c.w), free(c.b), free(c.R), free(c.out), free(c.m), free(c.rs);
        free(di), free(dw), free(db);
    }
}

/* ---- rope, swiglu, gelu -------------------------------------------------------------------------- */
typedef struct {
    float *out, *a, *b, *cs, *sn, *R;
    int B, T, nh, hd, which;
    size_t n;
} EwCtx;
static double ew_loss(void *p) {
    EwCtx *c = p;
    if (c->which == 0) rope_forward(c->out, c->a, c->cs, c->sn, c->B, c->T, c->nh, c->hd);
    else if (c->which == 1) swiglu_forward(c->out, c->a, c->b, c->n);
    else gelu_forward(c->out, c->a, c->n);
    return dotR(c->out, c->R, c->n);
}
static void test_elementwise(void **state) {
    dfm_rng r;
    rng_seed(&r, 3);
    EwCtx c = {.B = 2, .T = 5, .nh = 3, .hd = 8};
    c.n = (size_t)2 * 5 * 3 * 8;
    c.a = randv(&r, c.n, 1.5f);
    c.b = randv(&r, c.n, 1);
    c.R = randv(&r, c.n, 1);
    c.out = zerov(c.n);
    c.cs = zerov(5 * 4);
    c.sn = zerov(5 * 4);
    rope_tables(c.cs, c.sn, 5, 8, 10000.0f);
    float *da = zerov(c.n), *db = zerov(c.n);
    c.which = 0;
    rope_backward(da, c.R, c.cs, c.sn, c.B, c.T, c.nh, c.hd);
    assert_true(check_grad("rope dinp", c.a, c.n, da, ew_loss, &c, 1e-2f, 240) < TOL);
    c.which = 1;
    vec_zero(da, c.n);
    swiglu_backward(da, db, c.R, c.a, c.b, c.n);
    assert_true(check_grad("swiglu dgate", c.a, c.n, da, ew_loss, &c, 1e-2f, 240) < TOL);
    assert_true(check_grad("swiglu dup", c.b, c.n, db, ew_loss, &c, 1e-2f, 240) < TOL);
    c.which = 2;
    vec_zero(da, c.n);
    gelu_backward(da, c.R, c.a, c.n);
    assert_true(check_grad("gelu dinp", c.a, c.n, da, ew_loss, &c, 1e-2f, 240) < TOL);
    free(c.a), free(c.b), free(c.R), free(c.out), free(c.cs), free(c.sn), free(da), free(db);
}

/* ---- attention ------------------------------------------------------------------------------------ */
typedef struct {
    float *out, *att, *q, *k, *v, *R;
    int B, T, nh, nkv, hd;
} AttCtx;
static double att_loss(void *p) {
    AttCtx *c = p;
    attention_forward(c->out, c->att, c->q, c->k, c->v, c->B, c->T, c->nh, c->nkv, c->hd);
    return dotR(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}
static void test_attention(void **state) {
    dfm_rng r;
    rng_seed(&r, 4);
    AttCtx c = {.B = 2, .T = 6, .nh = 4, .nkv = 2, .hd = 4};
    size_t nq = (size_t)2 * 6 * 4 * 4, nk = (size_t)2 * 6 * 2 * 4, na = (size_t)2 * 4 * 6 * 6;
    c.q = randv(&r, nq, 1);
    c.k = randv(&r, nk, 1);
    c.v = randv(&r, nk, 1);
    c.R = randv(&r, nq, 1);
    c.out = zerov(nq);
    c.att = zerov(na);
    float *dq = zerov(nq), *dk = zerov(nk), *dv = zerov(nk), *datt = zerov(na);
    att_loss(&c);
    attention_backward(dq, dk, dv, datt, c.R, c.att, c.q, c.k, c.v, c.B, c.T, c.nh, c.nkv, c.hd);
    assert_true(check_grad("attention dq", c.q, nq, dq, att_loss, &c, 1e-2f, 200) < TOL);
    assert_true(check_grad("attention dk (GQA)", c.k, nk, dk, att_loss, &c, 1e-2f, 200) < TOL);
    assert_true(check_grad("attention dv (GQA)", c.v, nk, dv, att_loss, &c, 1e-2f, 200) < TOL);
    free(c.q), free(c.k), free(c.v), free(c.R), free(c.out), free(c.att), free(dq), free(dk), free(dv), free(datt);
}

/* ---- cross-attention and gate ------------------------------------------------------------------- */
typedef struct {
    float *out, *p, *q, *km, *vm, *R;
    uint8_t *mask;
    int B, T, L, shift, K, nh, hd;
} XCtx;
static double x_loss(void *p) {
    XCtx *c = p;
    crossattn_forward(c->out, c->p, c->q, c->km, c->vm, c->mask, c->B, c->T, c->L, c->shift, c->K, c->nh, c->hd);
    return dotR(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}
static void run_crossattn(int shift) {
    dfm_rng r;
    rng_seed(&r, 5);
    XCtx c = {.B = 2, .T = 8, .L = 4, .shift = shift, .K = 3, .nh = 2, .hd = 4};
    int NC = 2, S = 2 * NC * 3, C = 8;
    size_t nq = (size_t)2 * 8 * C, nm = (size_t)S * C;
    c.q = randv(&r, nq, 1);
    c.km = randv(&r, nm, 1);
    c.vm = randv(&r, nm, 1);
    c.R = randv(&r, nq, 1);
    c.out = zerov(nq);
    c.p = zerov((size_t)2 * 8 * 2 * 3);
    c.mask = malloc(S);
    for (int i = 0; i < S; i++) c.mask[i] = 1;
    for (int j = 0; j < 3; j++) c.mask[j] = 0; /* sequence 0 chunk 0: no memory */
    c.mask[2 * 3 + 1] = 0;                     /* sequence 1 chunk 0: one padded slot */
    float *dq = zerov(nq), *dk = zerov(nm), *dv = zerov(nm);
    x_loss(&c);
    crossattn_backward(dq, dk, dv, c.R, c.p, c.q, c.km, c.vm, c.B, c.T, c.L, c.shift, c.K, c.nh, c.hd);
    /* rows of sequence 0 that attend its masked chunk 0: no update; the row before it (shift 1) reads chunk 1 */
    for (int i = 0; i < (4 - shift) * C; i++) assert_true(c.out[i] == 0.0f);
    if (shift) {
        double a = 0;
        for (int i = 3 * C; i < 4 * C; i++) a += fabs(c.out[i]);
        assert_true(a > 0.0);
        for (int b = 0; b < 2; b++) /* a sequence's last row attends the chunk after it: nothing */
            for (int i = 0; i < C; i++) assert_true(c.out[((size_t)b * 8 + 7) * C + i] == 0.0f);
    }
    char nm_q[64], nm_k[64], nm_v[64];
    snprintf(nm_q, sizeof nm_q, "crossattn dq (shift %d)", shift);
    snprintf(nm_k, sizeof nm_k, "crossattn dkm (shift %d, masked slots)", shift);
    snprintf(nm_v, sizeof nm_v, "crossattn dvm (shift %d, masked slots)", shift);
    assert_true(check_grad(nm_q, c.q, nq, dq, x_loss, &c, 1e-2f, 200) < TOL);
    assert_true(check_grad(nm_k, c.km, nm, dk, x_loss, &c, 1e-2f, 200) < TOL);
    assert_true(check_grad(nm_v, c.vm, nm, dv, x_loss, &c, 1e-2f, 200) < TOL);
    free(c.q), free(c.km), free(c.vm), free(c.R), free(c.out), free(c.p), free(c.mask), free(dq), free(dk), free(dv);
}
static void test_crossattn(void **state) {
    run_crossattn(MEM_ALIGN_SAME);
    run_crossattn(MEM_ALIGN_NEXT);
}

typedef struct {
    float *out, *g, *gl, *h, *o, *R;
    int N, C, G;
} GCtx;
static double g_loss(void *p) {
    GCtx *c = p;
    gate_forward(c->out, c->g, c->gl, c->h, c->o, c->N, c->C, c->G);
    return dotR(c->out, c->R, (size_t)c->N * c->C);
}
static void test_gate(void **state) {
    for (int per_channel = 0; per_channel < 2; per_channel++) {
        dfm_rng r;
        rng_seed(&r, 6);
        GCtx c = {.N = 5, .C = 8, .G = per_channel ? 8 : 2};
        size_t n = 40, ng = (size_t)5 * c.G;
        c.h = randv(&r, n, 1);
        c.o = randv(&r, n, 1);
        c.gl = randv(&r, ng, 1);
        c.R = randv(&r, n, 1);
        c.out = zerov(n);
        c.g = zerov(ng);
        float *dh = zerov(n), *dgl = zerov(ng), *d_o = zerov(n);
        g_loss(&c);
        gate_backward(dh, dgl, d_o, c.R, c.g, c.o, c.N, c.C, c.G);
        assert_true(check_grad(per_channel ? "gate/channel dh" : "gate/head dh", c.h, n, dh, g_loss, &c, 1e-2f, 64) <
                    TOL);
        assert_true(check_grad(per_channel ? "gate/channel dgl" : "gate/head dgl", c.gl, ng, dgl, g_loss, &c, 1e-2f,
                               64) < TOL);
        assert_true(check_grad(per_channel ? "gate/channel do" : "gate/head do", c.o, n, d_o, g_loss, &c, 1e-2f, 64) <
                    TOL);
        free(c.h), free(c.o), free(c.gl), free(c.R), free(c.out), free(c.g), free(dh), free(dgl), free(d_o);
    }
}

/* ---- LM head + CE, MSE ----------------------------------------------------------------------------- */
typedef struct {
    float *x, *w, *scratch, *pred, *tgt;
    int *targets;
    uint8_t *mask;
    int N, C, V, S, D;
} CeCtx;
static double ce_loss(void *p) {
    CeCtx *c = p;
    return lmhead_ce_forward_backward(NULL, NULL, NULL, NULL, c->x, c->w, c->targets, c->N, c->C, c->V, 0, c->scratch) /
           c->N;
}
static double mse_loss(void *p) {
    CeCtx *c = p;
    return mse_forward_backward(NULL, c->pred, c->tgt, c->mask, c->S, c->D, 0);
}
static void test_ce_mse(void **state) {
    dfm_rng r;
    rng_seed(&r, 7);
    CeCtx c = {.N = 70, .C = 6, .V = 11, .S = 5, .D = 4}; /* N > CE_ROWS_BLOCK: two blocks */
    c.x = randv(&r, (size_t)c.N * c.C, 1);
    c.w = randv(&r, (size_t)c.V * c.C, 1);
    c.scratch = zerov((size_t)CE_ROWS_BLOCK * c.V);
    c.targets = malloc(c.N * sizeof(int));
    for (int i = 0; i < c.N; i++) c.targets[i] = rng_u32(&r) % c.V;
    c.targets[3] = c.targets[66] = -1; /* ignored rows */
    float *dx = zerov((size_t)c.N * c.C), *dw = zerov((size_t)c.V * c.C);
    lmhead_ce_forward_backward(NULL, NULL, dx, dw, c.x, c.w, c.targets, c.N, c.C, c.V, 1.0f / c.N, c.scratch);
    assert_true(check_grad("lmhead+ce dx", c.x, (size_t)c.N * c.C, dx, ce_loss, &c, 1e-2f, 200) < TOL);
    assert_true(check_grad("lmhead+ce dweight", c.w, (size_t)c.V * c.C, dw, ce_loss, &c, 1e-2f, 200) < TOL);
    c.pred = randv(&r, 20, 1);
    c.tgt = randv(&r, 20, 1);
    c.mask = malloc(5);
    uint8_t mk[5] = {0, 1, 1, 0, 1};
    memcpy(c.mask, mk, 5);
    float *dp = zerov(20);
    mse_forward_backward(dp, c.pred, c.tgt, c.mask, c.S, c.D, 1.0f);
    assert_true(check_grad("mse dpred (masked)", c.pred, 20, dp, mse_loss, &c, 1e-2f, 64) < TOL);
    free(c.x), free(c.w), free(c.scratch), free(c.targets), free(dx), free(dw), free(c.pred), free(c.tgt), free(c.mask),
        free(dp);
}

/* ---- whole model ------------------------------------------------------------------------------------ */
static BackboneConfig tiny_backbone(int qk_norm, int tie) {
    BackboneConfig bc;
    memset(&bc, 0, sizeof bc);
    snprintf(bc.arch, sizeof bc.arch, "Qwen3ForCausalLM");
    bc.vocab_size = 23;
    bc.max_seq = 12;
    bc.tie_embeddings = tie;
    bc.dec = (StackConfig){.n_layers = 3, .hidden = 8, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .ffn = 12,
                           .qk_norm = qk_norm, .eps = 1e-6f, .rope_theta = 10000.0f};
    return bc;
}

typedef struct {
    DfmModel *m;
    int *inp, *tgt;
    float *tmem;
    uint8_t *tmask;
    int B, T, mode;
} ModelCtx;
static double model_loss(void *p) {
    ModelCtx *c = p;
    int rc = model_forward(c->m, c->inp, c->tgt, c->tmem, c->tmask, c->B, c->T, c->mode, 0, 1.0f);
    assert_int_equal(rc, 0);
    return c->m->loss;
}

/* make the tiny model far from flat so finite differences see real gradients */
static void scale_all(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void run_model_check(int pretrain, int per_channel, int qk_norm, int tie) {
    BackboneConfig bc = tiny_backbone(qk_norm, tie);
    DfmConfig dc;
    dfm_config_defaults(&dc, &bc);
    dc.enabled = !pretrain;
    dc.chunk_len = 4;
    dc.n_slots = 3;
    dc.d_mem = 5;
    dc.pred = (StackConfig){.n_layers = 2, .hidden = 8, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4, .ffn = 10,
                            .qk_norm = 0, .eps = 1e-6f, .rope_theta = 10000.0f};
    dc.proj_hidden = 7;
    dc.n_fusion = 2;
    dc.fusion_layers[0] = 1;
    dc.fusion_layers[1] = 2;
    dc.xattn_heads = 2;
    dc.gate_per_channel = per_channel;
    dc.mse_weight = 0.5f;
    dc.init_std = 0.3f;
    dc.pred_input_layer = per_channel ? 1 : 0; /* predictor reads layer 0's output */
    dc.pred_skip = per_channel;                /* and, per-channel variant, the skip path to the slots */
    dc.mem_align = per_channel ? MEM_ALIGN_SAME : MEM_ALIGN_NEXT;
    dc.pred_loss = per_channel ? PRED_LOSS_MSE_ELEM : PRED_LOSS_MSE;
    DfmModel *m = NULL;
    assert_int_equal(model_create(&bc, &dc, 2, 12, &m), 0);
    model_init_backbone_random(m, 11);
    /* backbone: weights of std 0.3 instead of 0.02, non-trivial norms */
    TensorView *views = calloc(256, sizeof *views);
    int nv = model_backbone_tensors(m, views, 0);
    dfm_rng r;
    rng_seed(&r, 99);
    for (int i = 0; i < nv; i++) {
        if (views[i].ndim == 2) scale_all(views[i].data, views[i].numel, 15.0f);
        else
            for (size_t j = 0; j < views[i].numel; j++) views[i].data[j] = 1.0f + 0.3f * (rng_f32(&r) - 0.5f);
    }
    model_init_dfm_random(m, 12);
    if (!pretrain) { /* non-zero gates so every fusion weight gets a gradient */
        size_t G = per_channel ? 8 : 2;
        rng_normal(&r, m->dp.fu_wg, 2 * G * 8, 0.3f);
        rng_normal(&r, m->dp.fu_bg, 2 * G, 0.3f);
        rng_normal(&r, m->dp.pred_bin, 8, 0.3f);
        rng_normal(&r, m->dp.proj_b1, 7, 0.3f);
        if (m->dp.pred_wskip) rng_normal(&r, m->dp.pred_wskip, (size_t)3 * 5 * 8, 0.3f); /* [K*d, C] */
    }
    /* per-head variant: teacher forcing, chunks 1 of sequence 0 and 2 of sequence 1 fuse their targets */
    ModelCtx c = {.m = m, .B = 2, .T = 12, .mode = !pretrain && !per_channel ? MEM_MIXED : MEM_PREDICTED};
    if (c.mode == MEM_MIXED) {
        const uint8_t src[6] = {0, 1, 0, 0, 0, 1};
        assert_int_equal(model_set_memory_mix(m, src, 6), 0);
    }
    int N = 24, S = 2 * 3 * 3;
    c.inp = malloc(N * sizeof(int));
    c.tgt = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) c.inp[i] = rng_u32(&r) % 23, c.tgt[i] = rng_u32(&r) % 23;
    c.tgt[5] = c.tgt[17] = -1; /* padding: no target */
    c.tmem = randv(&r, (size_t)S * 5, 1);
    c.tmask = malloc(S);
    for (int i = 0; i < S; i++) c.tmask[i] = (i % 9) >= 3; /* chunk 0 of each sequence: absent */
    c.tmask[4 * 3 + 2] = 0;                                 /* one padded slot */

    model_zero_grad(m);
    assert_int_equal(model_forward(m, c.inp, c.tgt, c.tmem, c.tmask, 2, 12, c.mode, 1, 1.0f), 0);
    assert_int_equal(model_backward(m), 0);
    printf("  [model %s, gate per %s, qk_norm %d, tied %d, memory of the %s chunk, %s memory, %s] loss %.6f (ce %.6f "
           "mse %.6f)\n", pretrain ? "pretrain" : "dfm", per_channel ? "channel" : "head", qk_norm, tie,
           dc.mem_align == MEM_ALIGN_NEXT ? "next" : "same", c.mode == MEM_MIXED ? "mixed" : "predicted",
           dc.pred_loss == PRED_LOSS_MSE ? "mse" : "mse_elem", m->loss, m->ce, m->mse);
    TensorView *gv = calloc(256, sizeof *gv);
    int n = pretrain ? model_backbone_tensors(m, views, 0) : model_dfm_tensors(m, views, 0);
    int ng = pretrain ? model_backbone_tensors(m, gv, 1) : model_dfm_tensors(m, gv, 1);
    assert_int_equal(n, ng);
    /* the tied embedding's gradient holds both uses; copy grads first (the FD calls do not touch them) */
    for (int i = 0; i < n; i++) {
        char nm[140];
        snprintf(nm, sizeof nm, "%s %s", pretrain ? "bb" : "dfm", views[i].name);
        assert_true(check_grad(nm, views[i].data, views[i].numel, gv[i].data, model_loss, &c, pretrain ? 2e-3f : 1e-2f, 16) < TOL);
    }
    free(gv);
    free(views);
    free(c.inp), free(c.tgt), free(c.tmem), free(c.tmask);
    model_free(m);
}

static void test_model_dfm_head_gate(void **state) { run_model_check(0, 0, 1, 1); }
static void test_model_dfm_channel_gate(void **state) { run_model_check(0, 1, 0, 0); }
static void test_model_pretrain(void **state) { run_model_check(1, 0, 1, 0); }
static void test_model_pretrain_tied(void **state) { run_model_check(1, 0, 0, 1); }

/* ---- no leak: nothing a position sees depends on a later token ----------------------------------------
 * For every p, tokens at positions >= p are replaced; then the memory that any position r < p attends
 * (chunk (r+1)/L, or r/L with the old alignment) and the final hidden state (hence the logits) of every
 * r < p must not change: with predicted memory, and with target memory defined as the encoders define
 * it (chunk i's target is a function of chunks < i only). A deliberately leaky target (chunk i's target
 * read from chunk i itself) must be caught, so the check can fail. */
enum { LK_T = 12, LK_L = 4, LK_NC = 3, LK_K = 3, LK_D = 5, LK_C = 8, LK_V = 23 };

/* target slots of chunk i from the tokens of chunks < i (leaky: of chunks <= i); chunk 0 absent */
static void leak_targets(const int *tok, const float *table, int leaky, float *tmem, uint8_t *tmask) {
    for (int i = 0; i < LK_NC; i++)
        for (int j = 0; j < LK_K; j++) {
            float *t = tmem + ((size_t)i * LK_K + j) * LK_D;
            int end = (leaky ? i + 1 : i) * LK_L;
            for (int k = 0; k < LK_D; k++) {
                double a = 0;
                for (int s = 0; s < end; s++) a += table[((size_t)tok[s] * LK_K + j) * LK_D + k] * (1.0 + 0.1 * s);
                t[k] = (float)tanh(a);
            }
            tmask[i * LK_K + j] = (uint8_t)(end > 0);
        }
}

/* max |difference| over rows [0, p) of the final hidden state and over the memory rows those rows attend */
static void leak_diff(DfmModel *m, const int *a, const int *b, const float *table, int leaky, int mode, int p,
                      double *d_state, double *d_mem) {
    int tga[LK_T], tgb[LK_T];
    float ta[LK_NC * LK_K * LK_D], tb[LK_NC * LK_K * LK_D];
    uint8_t ma[LK_NC * LK_K], mb[LK_NC * LK_K];
    static float sa[LK_T * LK_C], mema[LK_NC * LK_K * LK_C];
    for (int i = 0; i < LK_T; i++) tga[i] = a[(i + 1) % LK_T], tgb[i] = b[(i + 1) % LK_T];
    leak_targets(a, table, leaky, ta, ma);
    leak_targets(b, table, leaky, tb, mb);
    assert_int_equal(model_forward(m, a, tga, ta, ma, 1, LK_T, mode, 0, 1.0f), 0);
    memcpy(sa, m->lnf_out, sizeof sa);
    memcpy(mema, m->mem, sizeof mema);
    assert_int_equal(model_forward(m, b, tgb, tb, mb, 1, LK_T, mode, 0, 1.0f), 0);
    *d_state = *d_mem = 0.0;
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < LK_C; i++) *d_state = check_max(*d_state, fabs(sa[r * LK_C + i] - m->lnf_out[r * LK_C + i]));
        int c = (r + m->dc.mem_align) / LK_L;
        for (int k = 0; c < LK_NC && k < LK_K * LK_C; k++)
            *d_mem = check_max(*d_mem, fabs(mema[(size_t)c * LK_K * LK_C + k] - m->mem[(size_t)c * LK_K * LK_C + k]));
    }
}

/* A tiny DFM model of the LK_* shape (batches of up to maxB sequences): memory alignment align, fusion
 * blocks after layers[0..nf), random backbone and modules. */
static DfmModel *lk_model(const BackboneConfig *bc, int align, int nf, const int *layers, float mse_weight, int maxB) {
    DfmConfig dc;
    dfm_config_defaults(&dc, bc);
    dc.chunk_len = LK_L;
    dc.n_slots = LK_K;
    dc.d_mem = LK_D;
    dc.pred = (StackConfig){.n_layers = 2, .hidden = 8, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4, .ffn = 10,
                            .eps = 1e-6f, .rope_theta = 10000.0f};
    dc.proj_hidden = 7;
    dc.n_fusion = nf;
    for (int i = 0; i < nf; i++) dc.fusion_layers[i] = layers[i];
    dc.xattn_heads = 2;
    dc.init_std = 0.3f;
    dc.mse_weight = mse_weight;
    dc.mem_align = align;
    DfmModel *m = NULL;
    assert_int_equal(model_create(bc, &dc, maxB, LK_T, &m), 0);
    model_init_backbone_random(m, 5);
    return m;
}

static void test_no_leak(void **state) {
    BackboneConfig bc = tiny_backbone(1, 1);
    dfm_rng r;
    rng_seed(&r, 77);
    float *table = randv(&r, (size_t)LK_V * LK_K * LK_D, 0.5f);
    for (int align = MEM_ALIGN_SAME; align <= MEM_ALIGN_NEXT; align++) {
        const int layers[2] = {0, 2};
        DfmModel *m = lk_model(&bc, align, 2, layers, 1.0f, 1);
        scale_all(m->bb_memory, m->bb_num, 5.0f);
        model_init_dfm_random(m, 6);
        rng_normal(&r, m->dp.fu_bg, 2 * 2, 1.0f); /* open gates: memory changes the states visibly */
        int a[LK_T], b[LK_T];
        for (int i = 0; i < LK_T; i++) a[i] = rng_u32(&r) % LK_V;
        double worst = 0.0, caught = 0.0;
        for (int p = 1; p < LK_T; p++) {
            memcpy(b, a, sizeof b);
            for (int i = p; i < LK_T; i++) b[i] = (a[i] + 1 + rng_u32(&r) % (LK_V - 1)) % LK_V;
            for (int mode = MEM_PREDICTED; mode <= MEM_TARGET; mode++) {
                double ds, dm;
                leak_diff(m, a, b, table, 0, mode, p, &ds, &dm);
                worst = check_max(check_max(worst, ds), dm);
                if (ds > 1e-6 || dm > 1e-6)
                    printf("  LEAK: align %s, %s memory, tokens >= %d change rows < %d by %.3e (memory %.3e)\n",
                           align ? "next" : "same", mode == MEM_TARGET ? "target" : "predicted", p, p, ds, dm);
            }
            double ds, dm; /* a leaky target definition must be detected */
            leak_diff(m, a, b, table, 1, MEM_TARGET, p, &ds, &dm);
            caught = check_max(caught, ds);
        }
        printf("  no leak, memory of the %s chunk: worst change of rows before the changed tokens %.3e; a leaky "
               "target changes them by %.3e\n", align ? "next" : "same", worst, caught);
        assert_true(worst <= 1e-6);
        assert_true(caught > 1e-3);
        model_free(m);
    }
    free(table);
}

/* The alignment itself: target memory of chunk 1 only reaches the rows attending it: with the next-chunk
 * alignment, rows L-1 .. 2L-2 (the one predicting chunk 1's first token included); with the same-chunk
 * alignment rows L .. 2L-1. */
static void test_alignment_rows(void **state) {
    BackboneConfig bc = tiny_backbone(1, 1);
    dfm_rng r;
    rng_seed(&r, 78);
    for (int align = MEM_ALIGN_SAME; align <= MEM_ALIGN_NEXT; align++) {
        const int last = 2; /* the last layer: a row's state changes only through its own fusion */
        DfmModel *m = lk_model(&bc, align, 1, &last, 1.0f, 1);
        model_init_dfm_random(m, 6);
        int tok[LK_T], tgt[LK_T];
        for (int i = 0; i < LK_T; i++) tok[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
        float *tm = randv(&r, (size_t)LK_NC * LK_K * LK_D, 1.0f), *s0 = zerov((size_t)LK_T * LK_C);
        uint8_t mask[LK_NC * LK_K];
        memset(mask, 1, sizeof mask);
        assert_int_equal(model_forward(m, tok, tgt, tm, mask, 1, LK_T, MEM_TARGET, 0, 1.0f), 0);
        memcpy(s0, m->lnf_out, (size_t)LK_T * LK_C * sizeof(float));
        for (int k = 0; k < LK_K * LK_D; k++) tm[LK_K * LK_D + k] += rng_f32(&r) - 0.5f; /* chunk 1's slots */
        assert_int_equal(model_forward(m, tok, tgt, tm, mask, 1, LK_T, MEM_TARGET, 0, 1.0f), 0);
        for (int row = 0; row < LK_T; row++) {
            double d = 0;
            for (int i = 0; i < LK_C; i++) d = check_max(d, fabs(s0[row * LK_C + i] - m->lnf_out[row * LK_C + i]));
            int reads = (row + align) / LK_L == 1;
            if (reads) assert_true(d > 1e-4);
            else assert_true(d == 0.0);
        }
        free(tm);
        free(s0);
        model_free(m);
    }
}

/* Teacher forcing: with every chunk fusing its target and no MSE, nothing reaches the predictor (the
 * projector and fusion still learn); the per-chunk draws are a function of (seed, sequence, chunk) with the
 * asked frequency. */
static void test_teacher_forcing(void **state) {
    BackboneConfig bc = tiny_backbone(1, 1);
    const int layers[2] = {1, 2};
    DfmModel *m = lk_model(&bc, MEM_ALIGN_NEXT, 2, layers, 0.0f, 1);
    model_init_dfm_random(m, 6);
    dfm_rng r;
    rng_seed(&r, 79);
    int tok[LK_T], tgt[LK_T];
    for (int i = 0; i < LK_T; i++) tok[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
    float *tm = randv(&r, (size_t)LK_NC * LK_K * LK_D, 1.0f);
    uint8_t mask[LK_NC * LK_K];
    memset(mask, 1, sizeof mask);
    for (int mode = MEM_PREDICTED; mode <= MEM_TARGET; mode++) {
        model_zero_grad(m);
        assert_int_equal(model_forward(m, tok, tgt, tm, mask, 1, LK_T, mode, 1, 1.0f), 0);
        assert_int_equal(model_backward(m), 0);
        size_t npred = (size_t)(m->dp_grad.proj_lnw - m->dp_grad.pred_win), nall = m->grad_num;
        double gp = 0, go = 0;
        for (size_t i = 0; i < npred; i++) gp += fabs(m->dp_grad.pred_win[i]);
        for (size_t i = npred; i < nall; i++) go += fabs(m->dp_grad.pred_win[i]);
        printf("  %s memory, no MSE: |grad| predictor %.3e, projector + fusion %.3e\n",
               mode == MEM_TARGET ? "target" : "predicted", gp, go);
        assert_true(go > 0.0);
        if (mode == MEM_TARGET) assert_true(gp == 0.0);
        else assert_true(gp > 0.0);
    }
    size_t seq[4] = {7, 3, 7, 1000};
    uint8_t src[4 * 50];
    model_memory_mix_draw(src, seq, 4, 50, 0.3, 42);
    assert_memory_equal(src, src + 100, 50); /* sequence 7 twice: the same draws */
    int n = 0;
    for (int i = 0; i < 200; i++) n += src[i];
    assert_true(n > 30 && n < 90); /* p = 0.3 of 200 */
    /* per-position CE: row s predicts the token at (s + 1) % L of its chunk; rows without a target skipped */
    const float rl[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int tg[8] = {0, 0, -1, 0, 0, 0, 0, 0};
    double sum[4] = {0};
    long cnt[4] = {0};
    model_ce_by_position(rl, tg, 2, 4, 4, sum, cnt);
    assert_true(sum[0] == 4 + 8 && cnt[0] == 2); /* a chunk's first token: predicted by the previous last row */
    assert_true(sum[1] == 1 + 5 && cnt[1] == 2);
    assert_true(sum[3] == 7 && cnt[3] == 1);
    free(tm);
    model_free(m);
}

/* ---- the memory path's gradient: d loss / d target memory ---------------------------------------------
 * Every chunk fuses its target (teacher forcing always) and there is no predictor loss, so the loss
 * depends on the target memory only through the projector and the fusion blocks. d loss / d target slots
 * (the projector's input gradient: its LayerNorm backward applied here to the d_pj_ln that model_backward
 * leaves) must equal central finite differences of the loss over every value; every valid slot must get a
 * nonzero gradient and every masked slot (chunk 0 of each sequence, a padded slot) exactly none, in both
 * the analytic and the finite-difference gradient. The same gradient attributed one chunk late (chunk c's
 * memory taken for chunk c-1's: a planted misalignment) must be caught. The projector and fusion weights'
 * gradients in this mode must be nonzero and equal finite differences too. */
enum { MG_B = 2, MG_NCB = MG_B * LK_NC, MG_S = MG_NCB * LK_K };

static void fd_grad(float *x, size_t n, loss_fn f, void *ctx, float eps, double *out) {
    for (size_t i = 0; i < n; i++) {
        float orig = x[i];
        x[i] = orig + eps;
        double lp = f(ctx);
        x[i] = orig - eps;
        double lm = f(ctx);
        x[i] = orig;
        out[i] = (lp - lm) / (2.0 * eps);
    }
}
/* check_grad's norm-wise relative error of a against fd (with its absolute floor) */
static double rel_err_fd(const float *a, const double *fd, size_t n) {
    double diff2 = 0, num2 = 0, ana2 = 0;
    for (size_t i = 0; i < n; i++) {
        diff2 += (a[i] - fd[i]) * (a[i] - fd[i]);
        num2 += fd[i] * fd[i];
        ana2 += (double)a[i] * a[i];
    }
    return sqrt(diff2) / (fmax(sqrt(num2), sqrt(ana2)) + ABS_FLOOR * sqrt((double)n));
}
static void mg_mask(uint8_t *tmask) { /* the loader's chunk 0 of each sequence: none; one padded slot */
    for (int i = 0; i < MG_S; i++) tmask[i] = (i / LK_K) % LK_NC != 0;
    tmask[(0 * LK_NC + 1) * LK_K + 2] = 0;
}

static void test_target_memory_grad(void **state) {
    BackboneConfig bc = tiny_backbone(1, 1);
    const int layers[2] = {1, 2};
    DfmModel *m = lk_model(&bc, MEM_ALIGN_NEXT, 2, layers, 0.0f, MG_B);
    TensorView *views = calloc(256, sizeof *views), *gv = calloc(256, sizeof *gv);
    int nv = model_backbone_tensors(m, views, 0); /* far from flat, as run_model_check makes it */
    dfm_rng r;
    rng_seed(&r, 81);
    for (int i = 0; i < nv; i++) {
        if (views[i].ndim == 2) scale_all(views[i].data, views[i].numel, 15.0f);
        else
            for (size_t j = 0; j < views[i].numel; j++) views[i].data[j] = 1.0f + 0.3f * (rng_f32(&r) - 0.5f);
    }
    model_init_dfm_random(m, 12);
    rng_normal(&r, m->dp.fu_wg, 2 * 2 * LK_C, 0.3f); /* open, input-dependent gates */
    rng_normal(&r, m->dp.fu_bg, 2 * 2, 0.3f);
    rng_normal(&r, m->dp.proj_b1, 7, 0.3f);
    int inp[MG_B * LK_T], tgt[MG_B * LK_T];
    for (int i = 0; i < MG_B * LK_T; i++) inp[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
    tgt[LK_T - 1] = -1; /* a padded token: no target */
    uint8_t tmask[MG_S];
    mg_mask(tmask);
    ModelCtx c = {.m = m, .inp = inp, .tgt = tgt, .tmem = randv(&r, (size_t)MG_S * LK_D, 1), .tmask = tmask,
                  .B = MG_B, .T = LK_T, .mode = MEM_TARGET};
    model_zero_grad(m);
    assert_int_equal(model_forward(m, inp, tgt, c.tmem, tmask, MG_B, LK_T, MEM_TARGET, 1, 1.0f), 0);
    assert_int_equal(model_backward(m), 0);
    const size_t n = (size_t)MG_S * LK_D;
    float *dt = zerov(n), *dw = zerov(LK_D), *db = zerov(LK_D), *late = zerov(n);
    layernorm_backward(dt, dw, db, m->d_pj_ln, m->mem_in, m->dp.proj_lnw, m->pj_mean, m->pj_rstd, MG_S, LK_D);
    double *fd = calloc(n, sizeof *fd);
    fd_grad(c.tmem, n, model_loss, &c, 1e-2f, fd);
    double rel = rel_err_fd(dt, fd, n), min_valid = INFINITY, masked = 0.0;
    for (int s = 0; s < MG_S; s++) {
        double a2 = 0.0;
        for (int k = 0; k < LK_D; k++) {
            a2 += (double)dt[s * LK_D + k] * dt[s * LK_D + k];
            if (!tmask[s]) masked = fmax(masked, fmax(fabs(dt[s * LK_D + k]), fabs(fd[s * LK_D + k])));
        }
        if (tmask[s]) min_valid = fmin(min_valid, sqrt(a2));
    }
    /* planted: chunk c's gradient reported for chunk c-1 of the same sequence (the memory one chunk late) */
    for (int i = 0; i < MG_NCB; i++)
        if (i % LK_NC) memcpy(late + (size_t)(i - 1) * LK_K * LK_D, dt + (size_t)i * LK_K * LK_D, LK_K * LK_D * sizeof(float));
    double rel_late = rel_err_fd(late, fd, n);
    printf("  d loss / d target memory (%zu values): rel_err %.2e against finite differences; smallest valid slot "
           "|g| %.3e; masked slots %.1e; the same gradient one chunk late: rel_err %.2e\n", n, rel, min_valid, masked,
           rel_late);
    if (rel > g_worst) g_worst = rel, snprintf(g_worst_name, sizeof g_worst_name, "d loss / d target memory");
    assert_true(rel < TOL);
    assert_true(min_valid > 1e-5);
    assert_true(masked == 0.0);
    assert_true(rel_late > 0.5);
    /* the projector and fusion weights, fed target memory only */
    int nt = model_dfm_tensors(m, views, 0), ng = model_dfm_tensors(m, gv, 1);
    assert_int_equal(nt, ng);
    for (int i = 0; i < nt; i++) {
        if (strstr(views[i].name, "predictor")) continue;
        double g2 = 0.0;
        for (size_t j = 0; j < gv[i].numel; j++) g2 += (double)gv[i].data[j] * gv[i].data[j];
        char nm[140];
        snprintf(nm, sizeof nm, "target memory: %s", views[i].name);
        assert_true(g2 > 0.0);
        assert_true(check_grad(nm, views[i].data, views[i].numel, gv[i].data, model_loss, &c, 1e-2f, 16) < TOL);
    }
    free(views), free(gv), free(dt), free(dw), free(db), free(late), free(fd), free(c.tmem);
    model_free(m);
}

/* ---- the cross-attention mask in the whole model ---------------------------------------------------------
 * Two sequences, target memory (and predicted memory for the attention weights), both alignments, the
 * loader's mask (chunk 0 of each sequence: no target) and a padded slot. A masked slot gets attention
 * weight exactly 0 from every row; rows whose chunk has no valid slot (chunk 0; with the next-chunk
 * alignment the last row of a sequence, which would read the chunk after the sequence) get a zero
 * cross-attention output. Changing the values of every masked slot changes no final hidden state, not the
 * loss (CE + predictor loss) and no gradient: no attention and no update. Planted: the padded slot
 * unmasked (the mask ignored) must change the rows reading its chunk. And the last row of sequence 0 must
 * not read sequence 1's chunk 0, even when that chunk is given valid slots: changing them changes only
 * sequence 1's rows that attend chunk 0. */
typedef struct {
    float s[MG_B * LK_T * LK_C], loss, *grad;
} MgOut;
static void mg_run(DfmModel *m, const int *inp, const int *tgt, const float *tm, const uint8_t *mask, MgOut *o) {
    model_zero_grad(m);
    assert_int_equal(model_forward(m, inp, tgt, tm, mask, MG_B, LK_T, MEM_TARGET, 1, 1.0f), 0);
    assert_int_equal(model_backward(m), 0);
    memcpy(o->s, m->lnf_out, sizeof o->s);
    o->loss = (float)m->loss;
    o->grad = realloc(o->grad, m->grad_num * sizeof(float));
    memcpy(o->grad, m->grad_memory, m->grad_num * sizeof(float));
}
static double mg_row_diff(const MgOut *a, const MgOut *b, int row) {
    double d = 0.0;
    for (int i = 0; i < LK_C; i++) {
        double e = fabs(a->s[row * LK_C + i] - b->s[row * LK_C + i]);
        if (!(e <= d)) d = e; /* a NaN difference is kept: it must fail the check */
    }
    return d;
}
static double mg_grad_diff(const MgOut *a, const MgOut *b, size_t n) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a->grad[i] - b->grad[i]);
        if (!(e <= d)) d = e; /* a NaN difference is kept: it must fail the check */
    }
    return d;
}

static void test_memory_mask(void **state) {
    BackboneConfig bc = tiny_backbone(1, 1);
    dfm_rng r;
    rng_seed(&r, 82);
    for (int align = MEM_ALIGN_SAME; align <= MEM_ALIGN_NEXT; align++) {
        const int last = 2; /* the last layer: a row's state changes only through its own fusion */
        DfmModel *m = lk_model(&bc, align, 1, &last, 1.0f, MG_B);
        model_init_dfm_random(m, 6);
        rng_normal(&r, m->dp.fu_bg, 2, 1.0f);
        int inp[MG_B * LK_T], tgt[MG_B * LK_T];
        for (int i = 0; i < MG_B * LK_T; i++) inp[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
        uint8_t tmask[MG_S];
        mg_mask(tmask);
        float *tm = randv(&r, (size_t)MG_S * LK_D, 1.0f), *tm2 = malloc((size_t)MG_S * LK_D * sizeof(float));
        /* attention weights and outputs, predicted and target memory */
        for (int mode = MEM_PREDICTED; mode <= MEM_TARGET; mode++) {
            assert_int_equal(model_forward(m, inp, tgt, tm, tmask, MG_B, LK_T, mode, 0, 1.0f), 0);
            FusionView v = model_fusion_view(m, &m->dp, 0);
            int bad = 0, empty_rows = 0;
            for (int b = 0; b < MG_B; b++)
                for (int s = 0; s < LK_T; s++) {
                    int ch = (s + align) / LK_L, row = b * LK_T + s, any = 0;
                    for (int h = 0; h < 2; h++)
                        for (int j = 0; j < LK_K; j++) {
                            int valid = ch < LK_NC && (mode == MEM_TARGET ? tmask[(b * LK_NC + ch) * LK_K + j] : ch > 0);
                            float p = v.p[((size_t)row * 2 + h) * LK_K + j];
                            any |= valid;
                            if (!valid && p != 0.0f) bad++;
                        }
                    if (!any) {
                        empty_rows++;
                        for (int i = 0; i < LK_C; i++) bad += v.y[(size_t)row * LK_C + i] != 0.0f;
                    }
                }
            printf("  align %s, %s memory: %d rows without memory; masked slots or empty rows with attention: %d\n",
                   align ? "next" : "same", mode == MEM_TARGET ? "target" : "predicted", empty_rows, bad);
            assert_int_equal(bad, 0);
            assert_int_equal(empty_rows, MG_B * LK_L); /* per sequence: chunk 0's L-1 rows and the last row, or chunk 0's L */
        }
        /* every masked slot's values changed: nothing changes */
        memcpy(tm2, tm, (size_t)MG_S * LK_D * sizeof(float));
        for (int s = 0; s < MG_S; s++)
            if (!tmask[s])
                for (int k = 0; k < LK_D; k++) tm2[s * LK_D + k] = 10.0f * (rng_f32(&r) - 0.5f);
        MgOut a = {.grad = NULL}, b = {.grad = NULL};
        mg_run(m, inp, tgt, tm, tmask, &a);
        mg_run(m, inp, tgt, tm2, tmask, &b);
        double ds = 0.0, dg = mg_grad_diff(&a, &b, m->grad_num);
        for (int row = 0; row < MG_B * LK_T; row++) ds = fmax(ds, mg_row_diff(&a, &b, row));
        /* planted: the padded slot unmasked, the same change of its values */
        uint8_t unmasked[MG_S];
        memcpy(unmasked, tmask, sizeof unmasked);
        unmasked[(0 * LK_NC + 1) * LK_K + 2] = 1;
        MgOut pa = {.grad = NULL}, pb = {.grad = NULL};
        mg_run(m, inp, tgt, tm, unmasked, &pa);
        mg_run(m, inp, tgt, tm2, unmasked, &pb);
        double caught = 0.0;
        for (int s = 0; s < LK_T; s++)
            if ((s + align) / LK_L == 1) caught = fmax(caught, mg_row_diff(&pa, &pb, s));
        double caught_g = mg_grad_diff(&pa, &pb, m->grad_num);
        printf("  align %s: masked slots' values changed: states %.1e, loss %.1e, gradients %.1e; the padded slot "
               "unmasked (planted): its chunk's rows change by %.3e, gradients by %.3e\n", align ? "next" : "same",
               ds, fabs(a.loss - b.loss), dg, caught, caught_g);
        assert_true(ds == 0.0 && a.loss == b.loss && dg == 0.0);
        assert_true(caught > 1e-4 && caught_g > 1e-6);
        /* sequence 1's chunk 0 given valid slots, then changed: only sequence 1's rows attending chunk 0 change */
        uint8_t first[MG_S];
        memcpy(first, tmask, sizeof first);
        memset(first + (size_t)1 * LK_NC * LK_K, 1, LK_K);
        memcpy(tm2, tm, (size_t)MG_S * LK_D * sizeof(float));
        for (int k = 0; k < LK_K * LK_D; k++) tm2[(size_t)1 * LK_NC * LK_K * LK_D + k] += rng_f32(&r) - 0.5f;
        mg_run(m, inp, tgt, tm, first, &a);
        mg_run(m, inp, tgt, tm2, first, &b);
        int wrong = 0;
        for (int row = 0; row < MG_B * LK_T; row++) {
            int reads = row >= LK_T && (row - LK_T + align) / LK_L == 0;
            double d = mg_row_diff(&a, &b, row);
            wrong += reads ? !(d > 1e-4) : d != 0.0;
        }
        printf("  align %s: sequence 1's chunk 0 changed: %d rows wrong (sequence 0's last row %.1e)\n",
               align ? "next" : "same", wrong, mg_row_diff(&a, &b, LK_T - 1));
        assert_int_equal(wrong, 0);
        free(a.grad), free(b.grad), free(pa.grad), free(pb.grad), free(tm), free(tm2);
        model_free(m);
    }
}

/* ---- the margin against shuffled memory (trainer/run/margin.h) -----------------------------------------
 * loss = CE(own) + mse part + W relu(M + CE(own) - CE(partner's memory)) by finite differences of forwards,
 * against margin_step's passes on a CPU engine: every DFM tensor, with the hinge active (M = 0.5) and not
 * (M = -100, where the gradient is the plain loss's). Teacher forcing mixed: the predicted chunks keep
 * their own slots, the forced ones read the partner's. The active gradient must differ from the plain
 * one (the term is really added), and the configured predictor weight must be back after the step. */
typedef struct {
    DfmModel *m;
    int *inp, *tgt;
    float *tmem, *shuf;
    uint8_t *tmask, *shufm;
    float w, mg;
} MarginCtx;
static double margin_loss(void *p) {
    MarginCtx *c = p;
    assert_int_equal(model_forward(c->m, c->inp, c->tgt, c->tmem, c->tmask, MG_B, LK_T, MEM_MIXED, 0, 1.0f), 0);
    double own = c->m->ce, loss = c->m->loss;
    assert_int_equal(model_forward(c->m, c->inp, c->tgt, c->shuf, c->shufm, MG_B, LK_T, MEM_MIXED, 0, 1.0f), 0);
    double gap = c->mg + own - c->m->ce;
    return loss + (gap > 0 ? c->w * gap : 0.0);
}

static void run_margin_check(float mg, int expect_active) {
    BackboneConfig bc = tiny_backbone(1, 1);
    const int layers[2] = {1, 2};
    DfmModel *m = lk_model(&bc, MEM_ALIGN_NEXT, 2, layers, 0.1f, MG_B);
    dfm_rng r;
    rng_seed(&r, 83);
    TensorView *views = calloc(256, sizeof *views), *gv = calloc(256, sizeof *gv);
    int nv = model_backbone_tensors(m, views, 0);
    for (int i = 0; i < nv; i++)
        if (views[i].ndim == 2) scale_all(views[i].data, views[i].numel, 15.0f);
    model_init_dfm_random(m, 13);
    rng_normal(&r, m->dp.fu_wg, 2 * 2 * LK_C, 0.3f);
    rng_normal(&r, m->dp.fu_bg, 2 * 2, 0.3f);
    const uint8_t src[MG_NCB] = {0, 1, 1, 0, 1, 0}; /* teacher-forced chunks */
    assert_int_equal(model_set_memory_mix(m, src, MG_NCB), 0);
    int inp[MG_B * LK_T], tgt[MG_B * LK_T];
    for (int i = 0; i < MG_B * LK_T; i++) inp[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
    uint8_t tmask[MG_S], shufm[MG_S];
    mg_mask(tmask);
    MarginCtx c = {.m = m, .inp = inp, .tgt = tgt, .tmem = randv(&r, (size_t)MG_S * LK_D, 1),
                   .shuf = zerov((size_t)MG_S * LK_D), .tmask = tmask, .shufm = shufm, .w = 2.0f, .mg = mg};
    margin_partner_memory(c.tmem, tmask, MG_B, (size_t)LK_NC * LK_K, LK_D, c.shuf, shufm);
    assert_memory_equal(c.shuf, c.tmem + (size_t)LK_NC * LK_K * LK_D, (size_t)LK_NC * LK_K * LK_D * sizeof(float));

    Engine *en = NULL;
    EngineOptions eo = {0};
    dfm_mpi mp = {.rank = 0, .size = 1};
    assert_int_equal(engine_create(m, &eo, &mp, &en), 0);
    assert_int_equal(engine_zero_grad(en), 0);
    float *scratch = zerov((size_t)MG_S * LK_D);
    uint8_t scratch_mask[MG_S];
    MarginBatch b = {inp, tgt, c.tmem, tmask, scratch, scratch_mask, MG_B, LK_T};
    MarginConfig mc = {c.w, c.mg};
    MarginResult res;
    assert_int_equal(engine_stage(en, inp, tgt, c.tmem, tmask, MG_B, LK_T), 0);
    assert_int_equal(margin_step(en, m, &mc, &b, MEM_MIXED, 1.0f, 0.1f, NULL, &res), 0);
    assert_true(m->dc.mse_weight == 0.1f);
    assert_int_equal(res.active, expect_active);
    printf("  [margin M %.1f, W %.1f] ce own %.6f, partner's memory %.6f, hinge %s, loss %.6f (finite differences: "
           "%.6f)\n", mg, c.w, res.ce_own, res.ce_shuf, res.active ? "active" : "inactive", res.loss, margin_loss(&c));
    assert_true(fabs(res.loss - margin_loss(&c)) < 1e-5);
    int nt = model_dfm_tensors(m, views, 0), ng = model_dfm_tensors(m, gv, 1);
    assert_int_equal(nt, ng);
    size_t ntot = 0;
    for (int i = 0; i < nt; i++) ntot += gv[i].numel;
    float *g_margin = zerov(ntot);
    for (int i = 0, o = 0; i < nt; o += (int)gv[i].numel, i++) {
        memcpy(g_margin + o, gv[i].data, gv[i].numel * sizeof(float));
        char nm[140];
        snprintf(nm, sizeof nm, "margin%s dfm %s", expect_active ? "" : " (inactive)", views[i].name);
        /* the predictor's input bias sees the scaled backbone's large embeddings: a curved loss, eps 2e-3 there
         * (truncation falls as eps^2: 1e-2 gives 1e-1, 2e-3 gives 4e-3); the fusion's tiny gradients need 1e-2 */
        float eps = strstr(views[i].name, "predictor") ? 2e-3f : 1e-2f;
        assert_true(check_grad(nm, views[i].data, views[i].numel, gv[i].data, margin_loss, &c, eps, 16) < TOL);
    }
    /* the plain loss's gradient of the projector and fusion (the predictor's is mostly its MSE's): equal where
     * the hinge is inactive, clearly not where it is active */
    model_zero_grad(m);
    assert_int_equal(model_forward(m, inp, tgt, c.tmem, tmask, MG_B, LK_T, MEM_MIXED, 1, 1.0f), 0);
    assert_int_equal(model_backward(m), 0);
    double d2 = 0.0, n2 = 0.0;
    for (int i = 0, o = 0; i < nt; o += (int)gv[i].numel, i++)
        for (size_t j = 0; !strstr(views[i].name, "predictor") && j < gv[i].numel; j++) {
            double e = (double)g_margin[o + j] - gv[i].data[j];
            d2 += e * e, n2 += (double)gv[i].data[j] * gv[i].data[j];
        }
    double rel = sqrt(d2 / (n2 + 1e-30));
    printf("  [margin M %.1f] its projector and fusion gradient against the plain loss's: rel diff %.3e\n", mg, rel);
    assert_true(expect_active ? rel > 0.1 : rel < 1e-6);
    engine_free(en);
    free(g_margin), free(scratch), free(c.tmem), free(c.shuf), free(views), free(gv);
    model_free(m);
}
static void test_margin_grad(void **state) {
    (void)state;
    run_margin_check(0.5f, 1);
    run_margin_check(-100.0f, 0);
}

/* ---- the content-only fusion (DfmConfig.content_only): no path around the memory ----------------------
 * With the projector's biases held at 0, a zero memory gives exactly the frozen LM's final states (every
 * position, compared as values) and CE, however the other modules are set; training gives those biases no
 * gradient. The default fusion, with the same weights, must differ on both (its biases carry a constant
 * value into the residual stream: the capacity shortcut), so the check can fail. */
static void test_content_only(void **state) {
    (void)state;
    BackboneConfig bc = tiny_backbone(1, 1);
    const int layers[2] = {1, 2};
    for (int co = 1; co >= 0; co--) {
        DfmModel *m = lk_model(&bc, MEM_ALIGN_NEXT, 2, layers, 0.5f, MG_B);
        m->dc.content_only = co;
        dfm_rng r;
        rng_seed(&r, 85);
        model_init_dfm_random(m, 14);
        int d = LK_D, H = m->dc.proj_hidden, C = LK_C;
        rng_normal(&r, m->dp.fu_wg, 2 * 2 * LK_C, 0.3f); /* open gates */
        rng_normal(&r, m->dp.fu_bg, 2 * 2, 0.3f);
        rng_normal(&r, m->dp.proj_lnb, d, 0.5f); /* as trained modules' biases would be */
        rng_normal(&r, m->dp.proj_b1, H, 0.5f);
        rng_normal(&r, m->dp.proj_b2, C, 0.5f);
        size_t nz = model_content_only_apply(m);
        assert_true(co ? nz == (size_t)(d + H + C) : nz == 0);
        int inp[MG_B * LK_T], tgt[MG_B * LK_T];
        for (int i = 0; i < MG_B * LK_T; i++) inp[i] = rng_u32(&r) % LK_V, tgt[i] = rng_u32(&r) % LK_V;
        uint8_t tmask[MG_S];
        for (int i = 0; i < MG_S; i++) tmask[i] = 1; /* every chunk fuses */
        float *zero = zerov((size_t)MG_S * LK_D), *frozen = zerov((size_t)MG_B * LK_T * LK_C);
        assert_int_equal(model_forward(m, inp, tgt, NULL, NULL, MG_B, LK_T, MEM_NONE, 0, 1.0f), 0);
        memcpy(frozen, m->lnf_out, (size_t)MG_B * LK_T * LK_C * sizeof(float));
        double ce_frozen = m->ce;
        assert_int_equal(model_forward(m, inp, tgt, zero, tmask, MG_B, LK_T, MEM_TARGET, 0, 1.0f), 0);
        double dmax = 0.0;
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)MG_B * LK_T * LK_C; i++) {
            double e = fabs((double)m->lnf_out[i] - frozen[i]);
            differ += m->lnf_out[i] != frozen[i];
            if (!(e <= dmax)) dmax = e;
        }
        printf("  [%s fusion] zero memory against the frozen LM: %zu of %d final-state values differ (max %.3e), "
               "CE %.9f vs %.9f\n", co ? "content-only" : "default", differ, MG_B * LK_T * LK_C, dmax, m->ce, ce_frozen);
        if (co) {
            assert_true(differ == 0);
            assert_true(m->ce == ce_frozen);
            /* centred memory (--centre-memory): a slot equal to the centre adds exactly nothing, zero now does */
            m->dc.n_centre = LK_D;
            rng_normal(&r, m->dc.mem_centre, LK_D, 0.5f);
            for (int i = 0; i < MG_S; i++) memcpy(zero + (size_t)i * LK_D, m->dc.mem_centre, LK_D * sizeof(float));
            assert_int_equal(model_forward(m, inp, tgt, zero, tmask, MG_B, LK_T, MEM_TARGET, 0, 1.0f), 0);
            size_t cdiffer = 0;
            for (size_t i = 0; i < (size_t)MG_B * LK_T * LK_C; i++) cdiffer += m->lnf_out[i] != frozen[i];
            memset(zero, 0, (size_t)MG_S * LK_D * sizeof(float));
            assert_int_equal(model_forward(m, inp, tgt, zero, tmask, MG_B, LK_T, MEM_TARGET, 0, 1.0f), 0);
            double zd = 0.0;
            for (size_t i = 0; i < (size_t)MG_B * LK_T * LK_C; i++) {
                double e = fabs((double)m->lnf_out[i] - frozen[i]);
                if (!(e <= zd)) zd = e;
            }
            printf("  [content-only fusion, centred memory] memory at the centre: %zu values differ from the frozen "
                   "LM; zero memory: max difference %.3e\n", cdiffer, zd);
            assert_true(cdiffer == 0 && zd > 1e-3);
            m->dc.n_centre = 0;
        } else {
            assert_true(dmax > 1e-3);
        }
        /* a training step: the held biases get no gradient (the default's do) */
        float *tm = randv(&r, (size_t)MG_S * LK_D, 1);
        model_zero_grad(m);
        assert_int_equal(model_forward(m, inp, tgt, tm, tmask, MG_B, LK_T, MEM_TARGET, 1, 1.0f), 0);
        assert_int_equal(model_backward(m), 0);
        double g2 = 0.0;
        const float *gb[3] = {m->dp_grad.proj_lnb, m->dp_grad.proj_b1, m->dp_grad.proj_b2};
        int gn[3] = {d, H, C};
        for (int t = 0; t < 3; t++)
            for (int i = 0; i < gn[t]; i++) g2 += (double)gb[t][i] * gb[t][i];
        printf("  [%s fusion] |gradient of the projector's biases| %.3e\n", co ? "content-only" : "default", sqrt(g2));
        assert_true(co ? g2 == 0.0 : g2 > 1e-12);
        free(zero), free(frozen), free(tm);
        model_free(m);
    }
}

static void test_print_worst(void **state) {
    printf("WORST relative FD error: %.3e (%s), tolerance %.0e\n", g_worst, g_worst_name, TOL);
    assert_true(g_worst < TOL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),         cmocka_unit_test(test_norms),
        cmocka_unit_test(test_elementwise),    cmocka_unit_test(test_attention),
        cmocka_unit_test(test_crossattn),      cmocka_unit_test(test_gate),
        cmocka_unit_test(test_ce_mse),         cmocka_unit_test(test_model_dfm_head_gate),
        cmocka_unit_test(test_model_dfm_channel_gate), cmocka_unit_test(test_model_pretrain),
        cmocka_unit_test(test_model_pretrain_tied),    cmocka_unit_test(test_no_leak),
        cmocka_unit_test(test_alignment_rows),         cmocka_unit_test(test_teacher_forcing),
        cmocka_unit_test(test_target_memory_grad),     cmocka_unit_test(test_memory_mask),
        cmocka_unit_test(test_margin_grad),          cmocka_unit_test(test_content_only),
        cmocka_unit_test(test_print_worst),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
